"""The wire layer against EmbeddedKafka (real sockets, librdkafka's mock brokers)."""

from __future__ import annotations

import base64
import itertools
import socket
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from consumer_sdk.domain import HeartbeatRequest
from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.errors import (
    KafkaTimeoutError,
    KafkaTransportError,
    ProtocolError,
    UnsupportedBrokerError,
)
from consumer_sdk.protocol.client import ClusterClient
from consumer_sdk.protocol.connection import BrokerConnection
from consumer_sdk.protocol.security import ConnectionSettings
from consumer_sdk.testing import EmbeddedKafka, EmbeddedKafkaError
from consumer_sdk.testing.faulty_proxy import FaultyProxy
from tests.protocol.stub_broker import StubBroker


def new_member_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def join_request(group: str, member_id: str, topics: tuple[str, ...]) -> HeartbeatRequest:
    return HeartbeatRequest(
        group_id=group,
        member_id=member_id,
        member_epoch=0,
        rebalance_timeout_ms=30_000,
        subscribed_topic_names=topics,
        subscribed_topic_regex="",
        topic_partitions=(),
    )


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[float, str, Mapping[str, Any]]] = []

    def __call__(self, event: str, info: Mapping[str, Any]) -> None:
        self.events.append((time.monotonic(), event, dict(info)))

    def named(self, event: str) -> list[tuple[float, Mapping[str, Any]]]:
        return [(t, i) for t, e, i in self.events if e == event]


@pytest.fixture
def client(embedded_kafka: EmbeddedKafka) -> Iterator[ClusterClient]:
    with ClusterClient({"bootstrap.servers": embedded_kafka.bootstrap_servers}) as c:
        yield c


def test_api_versions_negotiation_steps_down_to_what_the_broker_offers(
    embedded_kafka: EmbeddedKafka,
) -> None:
    host, port = embedded_kafka.broker_address(1)
    with BrokerConnection(host, port, ConnectionSettings()) as conn:
        conn.open(5)
        # The mock offers ApiVersions v0-2: v4 and v3 are answered UNSUPPORTED_VERSION.
        assert conn.api_versions_version == 2
        assert conn.api_versions[68] == (1, 1)
        assert conn.version_for(9, (6, 7, 8, 9)) == 6
        assert conn.version_for(10, (3, 4, 5, 6)) == 3
        assert conn.version_for(69, (0, 1)) is None


def test_api_versions_downgrade_rereads_the_v0_body_of_a_real_style_broker() -> None:
    stub = StubBroker({18: (0, 3), 10: (0, 6), 68: (0, 1)})
    try:
        with BrokerConnection("127.0.0.1", stub.port, ConnectionSettings()) as conn:
            conn.open(5)
            assert conn.api_versions_version == 3
            assert [v for k, v in stub.requests if k == 18] == [4, 3]
            assert conn.api_versions[10] == (0, 6)
    finally:
        stub.close()


def test_metadata_maps_topic_ids_both_ways(
    embedded_kafka: EmbeddedKafka, client: ClusterClient
) -> None:
    embedded_kafka.create_topic("wire-md-a", partitions=3)
    embedded_kafka.create_topic("wire-md-b", partitions=5)
    md = client.metadata(["wire-md-a", "wire-md-b"], timeout_s=10)
    a, b = md.topic("wire-md-a"), md.topic("wire-md-b")
    assert a is not None and b is not None
    assert (a.partition_count, b.partition_count) == (3, 5)
    assert a.topic_id != b.topic_id and a.topic_id.int != 0
    assert md.topic_name(a.topic_id) == "wire-md-a" and md.topic_id("wire-md-b") == b.topic_id
    assert client.topic_name(b.topic_id) == "wire-md-b"
    assert sorted(br.node_id for br in md.brokers) == [1, 2, 3]


def test_find_coordinator_v3_single_key_form(
    embedded_kafka: EmbeddedKafka, client: ClusterClient
) -> None:
    embedded_kafka.set_group_coordinator("wire-fc", broker_id=3)
    coordinator = client.find_coordinator("wire-fc", 10)
    assert coordinator.node_id == 3
    assert (coordinator.host, coordinator.port) == embedded_kafka.broker_address(3)
    assert client.coordinator("wire-fc") == coordinator


def test_find_coordinator_v4_batched_form() -> None:
    stub = StubBroker({18: (0, 3), 10: (0, 6)}, coordinator_port=19092)
    try:
        with ClusterClient({"bootstrap.servers": stub.address}) as c:
            coordinator = c.find_coordinator("g-batched", 5)
        assert (coordinator.node_id, coordinator.port) == (7, 19092)
        assert (10, 6) in stub.requests
    finally:
        stub.close()


def test_consumer_group_heartbeat_join_returns_an_assignment(
    embedded_kafka: EmbeddedKafka, client: ClusterClient
) -> None:
    embedded_kafka.create_topic("wire-hb", partitions=4)
    md = client.metadata(["wire-hb"], 10)
    response = client.heartbeat(join_request("wire-hb-g", new_member_id(), ("wire-hb",)), 10)
    assert response.error_code == 0
    assert response.member_epoch > 0
    assert response.heartbeat_interval_ms == 500
    assert response.assignment is not None
    [owned] = response.assignment
    assert owned.topic_id == md.topic_id("wire-hb")
    assert sorted(owned.partitions) == [0, 1, 2, 3]


def test_coordinator_moved_gives_not_coordinator_then_rediscovery(
    embedded_kafka: EmbeddedKafka, client: ClusterClient
) -> None:
    group = "wire-moved"
    embedded_kafka.create_topic("wire-moved-t", partitions=2)
    embedded_kafka.set_group_coordinator(group, broker_id=1)
    member = new_member_id()
    first = client.heartbeat(join_request(group, member, ("wire-moved-t",)), 10)
    assert first.error_code == 0 and client.coordinator(group).node_id == 1  # type: ignore[union-attr]

    embedded_kafka.set_group_coordinator(group, broker_id=2)
    moved = client.heartbeat(join_request(group, member, ("wire-moved-t",)), 10)
    assert moved.error_code == ErrorCode.NOT_COORDINATOR
    assert client.coordinator(group) is None

    again = client.heartbeat(join_request(group, member, ("wire-moved-t",)), 10)
    assert again.error_code == 0
    assert client.coordinator(group).node_id == 2  # type: ignore[union-attr]


def test_broker_down_then_reconnect_with_backoff(embedded_kafka: EmbeddedKafka) -> None:
    recorder = Recorder()
    config = {
        "bootstrap.servers": embedded_kafka.bootstrap_servers,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 400,
    }
    with ClusterClient(config, trace=recorder) as c:
        c.metadata(timeout_s=10)
        c.connection(2, 5)
        embedded_kafka.broker_down(2)
        try:
            with pytest.raises((KafkaTransportError, KafkaTimeoutError, ProtocolError)):
                c.connection(2, 5).request(*_metadata_call(), timeout_s=2)
            with pytest.raises((KafkaTransportError, KafkaTimeoutError)):
                c.connection(2, 1.0)
        finally:
            embedded_kafka.broker_up(2)
        conn = c.connection(2, 10)
        assert conn.is_open
    attempts = [t for t, info in recorder.named("connect.attempt") if info["node_id"] == 2]
    failures = [t for t, info in recorder.named("connect.failed") if info["node_id"] == 2]
    assert len(failures) >= 3
    # attempts[0] is the first connect; [1] the first reconnect after the broker went down.
    gaps = [b - a for a, b in itertools.pairwise(attempts[1:])]
    # Exponential backoff: later gaps grow (with jitter) instead of spinning.
    assert gaps and min(gaps) >= 0.04
    assert max(gaps) >= 2 * min(gaps) * 0.8


def _metadata_call() -> tuple[Any, Any]:
    from consumer_sdk.protocol import messages

    return messages.metadata_call(None, 12)


def test_unreachable_bootstrap_fails_clearly_within_the_timeout() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed port: nothing listens once the socket is closed
    with ClusterClient({"bootstrap.servers": f"127.0.0.1:{port}"}) as c:
        started = time.monotonic()
        with pytest.raises(KafkaTransportError, match="could not connect to any bootstrap server"):
            c.metadata(timeout_s=1.5)
        assert time.monotonic() - started < 3.0


@pytest.mark.parametrize(
    "fault", ["truncate", "garble", "wrong_correlation_id", "oversize_length", "disconnect"]
)
def test_bad_frames_raise_protocol_error_and_the_client_reconnects(
    embedded_kafka: EmbeddedKafka, fault: str
) -> None:
    host, port = embedded_kafka.broker_address(1)
    with FaultyProxy(host, port) as proxy, ClusterClient({"bootstrap.servers": proxy.address}) as c:
        conn = c._bootstrap_connection(time.monotonic() + 5)
        proxy.inject(fault, api_key=3)  # type: ignore[arg-type]
        started = time.monotonic()
        with pytest.raises((ProtocolError, KafkaTransportError)) as info:
            conn.request(*_metadata_call(), timeout_s=5)
        assert time.monotonic() - started < 4.0, "a bad frame must not hang the connection"
        assert not conn.is_open
        expected = {
            "truncate": "truncated frame",
            "garble": "cannot decode MetadataResponse",
            "wrong_correlation_id": "does not match the awaited request",
            "oversize_length": "exceeds the limit",
            "disconnect": "closed by the broker",
        }[fault]
        assert expected in info.value.args[0].str()
        md = c.metadata(timeout_s=10)
        assert len(md.brokers) == 3
        assert proxy.connections_accepted == 2


def test_missing_consumer_group_heartbeat_fails_fast(embedded_kafka_factory: Any) -> None:
    kafka: EmbeddedKafka = embedded_kafka_factory(brokers=1)
    kafka.set_api_version(68, -1, -1)
    with ClusterClient({"bootstrap.servers": kafka.bootstrap_servers}) as c:
        with pytest.raises(UnsupportedBrokerError, match=r"ConsumerGroupHeartbeat \(API 68\)"):
            c.heartbeat(join_request("g", new_member_id(), ("t",)), 5)
        with pytest.raises(UnsupportedBrokerError, match=r"Apache Kafka 4\.0"):
            c.require_group_protocol("g", 5)


def test_offset_commit_below_v9_fails_fast(embedded_kafka_factory: Any) -> None:
    kafka: EmbeddedKafka = embedded_kafka_factory(brokers=1)
    kafka.set_api_version(8, 0, 8)
    with (
        ClusterClient({"bootstrap.servers": kafka.bootstrap_servers}) as c,
        pytest.raises(UnsupportedBrokerError, match="lacks OffsetCommit v9"),
    ):
        c.require_group_protocol("g", 5)


def test_killed_mock_child_raises_embedded_kafka_error(embedded_kafka_factory: Any) -> None:
    kafka: EmbeddedKafka = embedded_kafka_factory(brokers=1)
    kafka.create_topic("doomed", partitions=1)
    kafka.kill()
    with pytest.raises(EmbeddedKafkaError, match=r"(?i)(killed|signal|exit)"):
        kafka.create_topic("after-death", partitions=1)
    with (
        ClusterClient({"bootstrap.servers": kafka.bootstrap_servers}) as c,
        pytest.raises(KafkaTransportError),
    ):
        c.metadata(timeout_s=1)
    kafka.close()
