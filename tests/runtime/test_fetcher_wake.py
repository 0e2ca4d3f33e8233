"""The network loop ends the application thread's wait inside librdkafka when it queues work
for it (`Fetcher.wake`), so rebalance callbacks do not wait out a poll slice."""

from __future__ import annotations

import threading
import time

from confluent_kafka import TopicPartition

from consumer_sdk import Consumer
from consumer_sdk.runtime.fetcher import Fetcher
from consumer_sdk.testing import EmbeddedKafka
from tests.runtime.harness import config, fetcher_over, wait_for

WAIT_S = 0.19  # one librdkafka call: confluent-kafka splits waits from 200 ms into chunks
ROUNDS = 10


def _drain(fetcher: Fetcher, records: int) -> None:
    deadline = time.monotonic() + 30
    while records:
        assert time.monotonic() < deadline, f"{records} records not fetched"
        msg = fetcher.poll(1.0)
        if msg is not None and msg.error() is None:
            records -= 1


def test_wake_ends_a_wait_and_a_wake_before_the_wait_is_kept(
    embedded_kafka: EmbeddedKafka,
) -> None:
    topic = "wake-fetcher"
    fetcher = fetcher_over(embedded_kafka, topic, 2)
    try:
        assert fetcher.wakeable, "the librdkafka handle of confluent_kafka.Consumer not found"
        fetcher.assign({(topic, 0): 0, (topic, 1): 0})
        _drain(fetcher, 4)
        during = before = 0
        for _ in range(ROUNDS):
            timer = threading.Timer(0.02, fetcher.wake)
            started = time.monotonic()
            timer.start()
            assert fetcher.poll(WAIT_S) is None
            during += time.monotonic() - started < WAIT_S / 2
            timer.join()
            fetcher.wake()  # nobody waits: the next wait ends at once
            started = time.monotonic()
            assert fetcher.poll(WAIT_S) is None
            before += time.monotonic() - started < WAIT_S / 2
        # Each wait would otherwise last WAIT_S; most end early even on a loaded machine.
        assert during >= ROUNDS // 2, f"{during} of {ROUNDS} waits ended by a wake-up"
        assert before >= ROUNDS // 2, f"{before} of {ROUNDS} waits ended by an earlier wake-up"
    finally:
        fetcher.close()
    fetcher.wake()  # after close: nothing to wake, no error


def test_a_consumer_blocked_in_poll_runs_its_assignment_callback(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """poll() with no timeout runs on_assign while it blocks (the network loop wakes it) and
    goes on waiting, as confluent-kafka's, until a record comes."""
    topic = "wake-consumer"
    embedded_kafka.create_topic(topic, partitions=2)
    consumer = Consumer(config(embedded_kafka, "wake-consumer-g"))
    assigned: list[TopicPartition] = []

    def produce_once_assigned() -> None:
        wait_for(lambda: assigned, timeout=30, what="on_assign")
        embedded_kafka.produce(topic, [b"after-assign"], partition=1)

    producer = threading.Thread(target=produce_once_assigned, daemon=True)
    try:
        assert consumer._fetcher.wakeable
        assert consumer._net.app_waker is not None
        consumer.subscribe([topic], on_assign=lambda c, parts: assigned.extend(parts))
        producer.start()
        msg = consumer.poll()
        assert msg is not None and msg.error() is None and msg.value() == b"after-assign"
        assert sorted(tp.partition for tp in assigned) == [0, 1]
    finally:
        producer.join(30)
        consumer.close()


def test_positions_kept_by_the_fetcher_are_read_while_the_application_waits(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """The network loop's auto-commit reads positions while poll() waits inside librdkafka.

    It used to wait for that poll to end (up to 100 ms per auto-commit, heartbeats delayed
    as long); only librdkafka's own positions (native partitions) need the wait."""
    topic = "wake-positions"
    fetcher = fetcher_over(embedded_kafka, topic, 2)
    try:
        fetcher.assign({(topic, 0): 0, (topic, 1): 0})
        _drain(fetcher, 4)  # poll() keeps the positions itself from its first call
        returned = threading.Event()

        def wait() -> None:
            fetcher.poll(10.0)
            returned.set()

        waiter = threading.Thread(target=wait)
        waiter.start()

        def waiting() -> bool:
            """The waiter holds the lock a batch being returned is guarded by."""
            if fetcher._flight.acquire(blocking=False):
                fetcher._flight.release()
                return False
            return True

        wait_for(waiting, timeout=10, what="poll() waiting")
        positions = fetcher.committable()  # unbounded: before the fix it waited 10 s
        assert not returned.is_set(), "the positions were read only after poll() returned"
        assert {p: o for p, (o, _) in positions.items()} == {(topic, 0): 2, (topic, 1): 2}
        embedded_kafka.produce(topic, [b"0-2"], partition=0)  # ends the wait
        waiter.join(10)
        assert returned.is_set()
    finally:
        fetcher.close()
