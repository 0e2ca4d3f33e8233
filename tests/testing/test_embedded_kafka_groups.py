"""KIP-848 groups on EmbeddedKafka, observed through confluent-kafka `group.protocol=consumer`."""

from __future__ import annotations

import itertools
import statistics
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer

from consumer_sdk.testing import EmbeddedKafka, close_client, wait_until

CONSUMER_GROUP_HEARTBEAT, FIND_COORDINATOR = 68, 10
FENCED_MEMBER_EPOCH = 110


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class Member:
    """A KIP-848 confluent-kafka consumer plus what its rebalance callbacks saw."""

    def __init__(self, bootstrap: str, group: str, topic: str) -> None:
        self.events: list[tuple[str, list[int]]] = []
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "group.protocol": "consumer",
                "auto.offset.reset": "earliest",
            }
        )
        self.consumer.subscribe(
            [topic],
            on_assign=self._callback("assign"),
            on_revoke=self._callback("revoke"),
            on_lost=self._callback("lost"),
        )

    def _callback(self, kind: str) -> Callable[[Any, list[Any]], None]:
        def record(_consumer: Any, partitions: list[Any]) -> None:
            self.events.append((kind, sorted(p.partition for p in partitions)))

        return record

    def partitions(self) -> set[int]:
        return {tp.partition for tp in self.consumer.assignment()}

    def poll_until(self, predicate: Callable[[], bool], timeout: float, what: str) -> None:
        def step() -> bool:
            self.consumer.poll(0.1)
            return predicate()

        wait_until(step, timeout=timeout, interval=0, description=what)


@pytest.fixture
def members(embedded_kafka: EmbeddedKafka) -> Iterator[Callable[[str, str], Member]]:
    created: list[Member] = []

    def make(group: str, topic: str) -> Member:
        member = Member(embedded_kafka.bootstrap_servers, group, topic)
        created.append(member)
        return member

    yield make
    for member in created:
        assert close_client(member.consumer, timeout=10.0)


def test_injected_fenced_member_epoch_makes_the_member_lose_and_rejoin(
    embedded_kafka: EmbeddedKafka, members: Callable[[str, str], Member]
) -> None:
    topic, group = _name("fence"), _name("g-fence")
    embedded_kafka.create_topic(topic, partitions=3)
    member = members(group, topic)
    member.poll_until(lambda: member.partitions() == {0, 1, 2}, 15.0, "initial assignment")
    member_id = member.consumer.memberid()

    embedded_kafka.push_request_errors(CONSUMER_GROUP_HEARTBEAT, [FENCED_MEMBER_EPOCH])
    member.poll_until(lambda: any(kind == "lost" for kind, _ in member.events), 10.0, "on_lost")
    member.poll_until(lambda: member.partitions() == {0, 1, 2}, 10.0, "re-assignment")
    lost_at = next(i for i, (kind, _) in enumerate(member.events) if kind == "lost")
    assert ("assign", [0, 1, 2]) in member.events[lost_at + 1 :]
    assert member.consumer.memberid() == member_id  # rejoins with the same id


def test_group_coordinator_receives_the_heartbeats(
    embedded_kafka: EmbeddedKafka, members: Callable[[str, str], Member]
) -> None:
    topic, group = _name("coord"), _name("g-coord")
    embedded_kafka.create_topic(topic, partitions=2)
    embedded_kafka.set_group_coordinator(group, broker_id=2)
    embedded_kafka.clear_requests()
    member = members(group, topic)
    member.poll_until(lambda: member.partitions() == {0, 1}, 15.0, "assignment")
    member.poll_until(
        lambda: len(embedded_kafka.requests(CONSUMER_GROUP_HEARTBEAT)) >= 6, 10.0, "heartbeats"
    )

    heartbeats = embedded_kafka.requests(CONSUMER_GROUP_HEARTBEAT)
    assert {r.broker_id for r in heartbeats} == {2}
    assert embedded_kafka.requests(FIND_COORDINATOR)
    # Steady-state spacing follows the cluster's 500 ms heartbeat interval.
    gaps = [(b.timestamp_us - a.timestamp_us) / 1e6 for a, b in itertools.pairwise(heartbeats)]
    assert 0.3 <= statistics.median(gaps[-4:]) <= 1.0


def test_manual_target_assignment(
    embedded_kafka: EmbeddedKafka, members: Callable[[str, str], Member]
) -> None:
    topic, group = _name("manual"), _name("g-manual")
    embedded_kafka.create_topic(topic, partitions=4)
    member = members(group, topic)
    member.poll_until(lambda: member.partitions() == {0, 1, 2, 3}, 15.0, "automatic assignment")
    member_id = member.consumer.memberid()
    assert member_id

    embedded_kafka.set_target_assignment(group, {member_id: [(topic, 1), (topic, 3)]})
    member.poll_until(lambda: member.partitions() == {1, 3}, 10.0, "manual target {1, 3}")

    embedded_kafka.set_target_assignment(group, None)
    member.poll_until(lambda: member.partitions() == {0, 1, 2, 3}, 10.0, "automatic again")


def test_heartbeat_interval_can_change_at_runtime(
    embedded_kafka: EmbeddedKafka, members: Callable[[str, str], Member]
) -> None:
    topic, group = _name("interval"), _name("g-interval")
    embedded_kafka.create_topic(topic, partitions=1)
    member = members(group, topic)
    member.poll_until(lambda: member.partitions() == {0}, 15.0, "assignment")
    embedded_kafka.set_heartbeat_interval(100)
    try:
        member.consumer.poll(0.7)  # let the new interval reach the member
        embedded_kafka.clear_requests()
        member.poll_until(
            lambda: len(embedded_kafka.requests(CONSUMER_GROUP_HEARTBEAT)) >= 8,
            1.5,  # at 500 ms there would be at most 4
            "fast heartbeats",
        )
    finally:
        embedded_kafka.set_heartbeat_interval(500)
