"""Consumer scenarios against a real Kafka 4.x (the session's ``real_kafka``), plus what the
embedded cluster cannot model: sticky `uniform` assignment, rebalance on partition increase,
RE2J full-match regex subscription, UNRELEASED_INSTANCE_ID and ConsumerGroupDescribe."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from consumer_sdk import Consumer, KafkaException, MemberState
from consumer_sdk.testing import KafkaCluster
from tests.runtime.harness import Member, Timeline, wait_for

pytestmark = pytest.mark.realkafka


def _topic(admin: AdminClient, partitions: int, prefix: str = "rk") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(30)
    return name


def _produce(servers: str, topic: str, n: int) -> None:
    producer = Producer({"bootstrap.servers": servers})
    for i in range(n):
        producer.produce(topic, f"v{i}".encode())
    producer.flush(30)


def _config(servers: str, group: str, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": servers,
        "group.id": group,
        "auto.offset.reset": "earliest",
        **{k.replace("_", "."): v for k, v in extra.items()},
    }


@pytest.fixture
def servers(real_kafka: KafkaCluster) -> str:
    return real_kafka.bootstrap_servers


@pytest.fixture
def admin(real_kafka: KafkaCluster) -> AdminClient:
    return real_kafka.admin()


def test_members_share_and_consume_everything(servers: str, admin: AdminClient) -> None:
    topic, group = _topic(admin, 6), f"g-{uuid.uuid4().hex[:6]}"
    _produce(servers, topic, 300)
    timeline = Timeline()
    members = [Member(f"m{i}", _config(servers, group), [topic], timeline) for i in range(3)]
    try:
        wait_for(
            lambda: sum(len(m.owned) for m in members) == 6 and all(m.owned for m in members),
            timeout=60,
        )
        wait_for(lambda: len({r[:3] for m in members for r in m.records}) == 300, timeout=60)
        assert timeline.overlaps() == []
    finally:
        for m in members:
            m.stop()


def test_uniform_assignment_is_sticky(servers: str, admin: AdminClient) -> None:
    topic, group = _topic(admin, 6), f"g-{uuid.uuid4().hex[:6]}"
    timeline = Timeline()
    a = Member("a", _config(servers, group, group_remote_assignor="uniform"), [topic], timeline)
    b = Member("b", _config(servers, group, group_remote_assignor="uniform"), [topic], timeline)
    try:
        wait_for(lambda: len(a.owned) == 3 and len(b.owned) == 3, timeout=60)
        before_a = set(a.owned)
        c = Member("c", _config(servers, group, group_remote_assignor="uniform"), [topic], timeline)
        wait_for(lambda: len(a.owned) == len(b.owned) == len(c.owned) == 2, timeout=60)
        assert a.owned <= before_a, "uniform keeps a member's partitions while rebalancing"
        c.stop()
    finally:
        a.stop()
        b.stop()


def test_partition_increase_triggers_a_rebalance(servers: str, admin: AdminClient) -> None:
    topic, group = _topic(admin, 2), f"g-{uuid.uuid4().hex[:6]}"
    m = Member("m", _config(servers, group), [topic], Timeline())
    try:
        wait_for(lambda: len(m.owned) == 2, timeout=60)
        for future in admin.create_partitions([NewPartitions(topic, 4)]).values():
            future.result(30)
        wait_for(lambda: len(m.owned) == 4, timeout=60)
    finally:
        m.stop()


def test_regex_subscription_is_a_full_match(servers: str, admin: AdminClient) -> None:
    prefix = f"rx{uuid.uuid4().hex[:6]}"
    t1 = _topic(admin, 1, prefix)
    group = f"g-{uuid.uuid4().hex[:6]}"
    anchored_only = Member("x", _config(servers, group + "x"), [f"^{prefix}"], Timeline())
    full = Member("y", _config(servers, group), [f"^{prefix}.*"], Timeline())
    try:
        wait_for(lambda: full.owned == {(t1, 0)}, timeout=60)
        assert anchored_only.owned == set(), "RE2J full match: '^prefix' matches no topic"
    finally:
        anchored_only.stop()
        full.stop()


def test_second_live_static_instance_gets_unreleased_instance_id(
    servers: str, admin: AdminClient
) -> None:
    topic, group = _topic(admin, 2), f"g-{uuid.uuid4().hex[:6]}"
    first = Member("a", _config(servers, group, group_instance_id="i-1"), [topic], Timeline())
    second = Consumer(_config(servers, group, group_instance_id="i-1"))
    try:
        wait_for(lambda: len(first.owned) == 2, timeout=60)
        second.subscribe([topic])
        with pytest.raises(KafkaException, match="UNRELEASED_INSTANCE_ID") as info:
            wait_for(lambda: second.poll(0.2) and False, timeout=30)
        assert info.value.args[0].fatal()
        assert second.state is MemberState.FATAL
    finally:
        second.close(timeout=5)
        first.stop()


def test_consumer_group_describe(real_kafka: KafkaCluster, admin: AdminClient) -> None:
    topic, group = _topic(admin, 3), f"g-{uuid.uuid4().hex[:6]}"
    m = Member("m", _config(real_kafka.bootstrap_servers, group), [topic], Timeline())
    try:
        wait_for(lambda: len(m.owned) == 3, timeout=60)
        described = wait_for(lambda: real_kafka.describe_group(group), timeout=30)
        [member] = described.members
        assert member.member_id == m.consumer.member_id
        assert member.member_epoch == m.consumer.member_epoch
        assert member.partitions == {(topic, p) for p in range(3)}
        assert described.state.lower() == "stable"
    finally:
        m.stop()
