"""Issue 12 item 9 on EmbeddedKafka: partitions lost while ``on_assign`` runs stay fenced.

The member is fenced (an injected FENCED_MEMBER_EPOCH; the mock removes it from the group)
while its ``on_assign`` runs. When the callback returns, the consumer starts fetching the
assigned partitions, then must keep every partition lost meanwhile fenced until ``on_lost``:
only the core's fetchable partitions are unfenced. Unfencing every owned partition (the bug)
hands the application records of partitions it no longer owns.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from consumer_sdk import Consumer, MemberState, TopicPartition
from consumer_sdk.testing import EmbeddedKafka
from tests.runtime.harness import wait_for

HB = 68
FENCED_MEMBER_EPOCH = 110
TOPIC = "fence-in-assign"
PROBE_S = 1.5


@pytest.fixture(scope="module")
def kafka() -> Iterator[EmbeddedKafka]:
    cluster = EmbeddedKafka(brokers=1, heartbeat_interval_ms=300, session_timeout_ms=12_000)
    try:
        cluster.create_topic(TOPIC, partitions=2)
        for p in (0, 1):
            cluster.produce(TOPIC, [f"r{i}" for i in range(50)], partition=p)
        yield cluster
    finally:
        cluster.close()


class ProbingConsumer(Consumer):
    """Right after the data plane's post-``on_assign`` step, reads the fetcher for a while: what
    the application's next poll() would get if ``on_lost`` ran one fetch later."""

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__(config)
        self.probe_armed = False
        self.probed: list[tuple[int, int]] = []

    def _after_assign(self) -> None:
        super()._after_assign()
        if not self.probe_armed:
            return
        self.probe_armed = False
        deadline = time.monotonic() + PROBE_S
        while time.monotonic() < deadline:
            for msg in self._fetcher.consume(100, 0.1):
                if msg.error() is None:
                    self.probed.append((int(msg.partition()), int(msg.offset())))  # type: ignore[arg-type]


def test_partitions_lost_during_on_assign_stay_fenced(kafka: EmbeddedKafka) -> None:
    consumer = ProbingConsumer(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": "fence-in-assign",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    log: list[tuple[Any, ...]] = []
    fenced = threading.Event()

    def on_assign(c: Any, parts: list[TopicPartition]) -> None:
        log.append(("assign", sorted(tp.partition for tp in parts)))
        if parts and not fenced.is_set():
            # the member's next heartbeat is answered FENCED_MEMBER_EPOCH: it loses both
            # partitions while this callback still runs
            kafka.push_request_errors(HB, [FENCED_MEMBER_EPOCH])
            wait_for(lambda: c.state is MemberState.FENCED, 30, "fenced inside on_assign")
            fenced.set()
            consumer.probe_armed = True

    def on_lost(c: Any, parts: list[TopicPartition]) -> None:
        log.append(("lost", sorted(tp.partition for tp in parts)))

    try:
        consumer.subscribe([TOPIC], on_assign=on_assign, on_lost=on_lost)
        deadline = time.monotonic() + 60
        # until the member has rejoined and consumed records of its new assignment
        while time.monotonic() < deadline:
            msg = consumer.poll(0.1)
            if msg is not None and msg.error() is None:
                log.append(("rec", msg.partition()))
                if ("lost", [0, 1]) in log:
                    break
        assert fenced.is_set() and ("lost", [0, 1]) in log, log
        first_lost = log.index(("lost", [0, 1]))
        assert log[0] == ("assign", [0, 1]), log
        # nothing of the lost partitions reached the application before on_lost ...
        assert [e for e in log[:first_lost] if e[0] == "rec"] == [], log[: first_lost + 1]
        # ... nor was fetchable right after on_assign returned
        assert consumer.probed == [], consumer.probed[:5]
        # after on_lost the member rejoined, got its partitions back and consumes them
        assert ("assign", [0, 1]) in log[first_lost:] and log[-1][0] == "rec", log
    finally:
        consumer.close(timeout=5)
