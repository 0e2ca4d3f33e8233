"""The wire layer against the real broker: the API versions it offers and the SDK negotiates,
Metadata topic ids, and ConsumerGroupHeartbeat join / leave / errors with real error codes."""

from __future__ import annotations

import base64
import time
import uuid

import pytest

from consumer_sdk.domain import HeartbeatRequest
from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.protocol import messages as m
from consumer_sdk.protocol.client import ClusterClient
from consumer_sdk.protocol.connection import BrokerConnection
from consumer_sdk.protocol.security import ConnectionSettings
from consumer_sdk.testing import KafkaCluster
from tests.realkafka.support import unique

pytestmark = pytest.mark.realkafka


def _member_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def test_negotiated_api_versions(real_kafka: KafkaCluster) -> None:
    host, port = real_kafka.bootstrap_servers.split(",")[0].rsplit(":", 1)
    with BrokerConnection(host, int(port), ConnectionSettings()) as conn:
        conn.open(10)
        offered = conn.api_versions
        # Kafka 4.x: what the SDK needs is there, at versions the mock does not offer
        assert offered[m.API_CONSUMER_GROUP_HEARTBEAT][1] >= 1
        assert offered[m.API_CONSUMER_GROUP_DESCRIBE][1] >= 1
        assert offered[m.API_OFFSET_COMMIT][1] >= 10  # v10 (topic ids) is not used by the SDK
        chosen = {
            api: conn.version_for(api, m.SUPPORTED_VERSIONS[api]) for api in m.SUPPORTED_VERSIONS
        }
    # the SDK's newest version of every API it uses is accepted by a Kafka 4.x broker
    assert chosen == {api: max(versions) for api, versions in m.SUPPORTED_VERSIONS.items()}


def test_heartbeat_join_leave_and_broker_errors(real_kafka: KafkaCluster) -> None:
    topic, group = unique("wire"), unique("wire-g")
    real_kafka.create_topic(topic, 4)
    member = _member_id()
    with ClusterClient({"bootstrap.servers": real_kafka.bootstrap_servers}) as client:
        topic_id = client.metadata([topic], 10).topic_id(topic)
        assert topic_id is not None and client.topic_name(topic_id) == topic
        join = HeartbeatRequest(
            group_id=group,
            member_id=member,
            member_epoch=0,
            rebalance_timeout_ms=30_000,
            subscribed_topic_names=(topic,),
            subscribed_topic_regex=None,
            rack_id="r1",
            topic_partitions=(),
        )
        response = client.heartbeat(join, 10)
        assert response.error_code == 0 and response.member_epoch >= 1
        assert response.heartbeat_interval_ms == 500  # the cluster's group timing
        # the assignment may come with a later heartbeat (the broker assigns asynchronously)
        epoch, assignment = response.member_epoch, response.assignment
        deadline = time.monotonic() + 30  # paced by the heartbeat interval: a loaded broker
        while not assignment and time.monotonic() < deadline:  # may take seconds to assign
            time.sleep(response.heartbeat_interval_ms / 1000)
            beat = client.heartbeat(
                HeartbeatRequest(group_id=group, member_id=member, member_epoch=epoch), 10
            )
            assert beat.error_code == 0
            epoch, assignment = beat.member_epoch, beat.assignment
        assert [(a.topic_id, sorted(a.partitions)) for a in assignment or ()] == [
            (topic_id, [0, 1, 2, 3])
        ]
        described = real_kafka.describe_group(group)
        assert described.members[0].rack == "r1"

        # a wrong epoch is fenced, an unknown member id too (the broker's own codes)
        fenced = client.heartbeat(
            HeartbeatRequest(group_id=group, member_id=member, member_epoch=epoch + 5), 10
        )
        assert fenced.error_code == ErrorCode.FENCED_MEMBER_EPOCH
        unknown = client.heartbeat(
            HeartbeatRequest(group_id=group, member_id=_member_id(), member_epoch=1), 10
        )
        assert unknown.error_code == ErrorCode.UNKNOWN_MEMBER_ID

        leave = client.heartbeat(
            HeartbeatRequest(group_id=group, member_id=member, member_epoch=-1), 10
        )
        assert leave.error_code == 0 and leave.member_epoch == -1
    assert real_kafka.describe_group(group).members == []
