"""A subscribed topic deleted on the real broker, with a confluent-kafka
``group.protocol=consumer`` member beside the SDK in the same run: its partitions are revoked
promptly, their commit fails once with UNKNOWN_TOPIC_OR_PARTITION (not retried until
``max.poll.interval.ms``), the other topic keeps flowing and ``close()`` leaves no thread."""

from __future__ import annotations

import logging
import threading
from typing import Any

import confluent_kafka
import pytest

from consumer_sdk import Consumer, KafkaError, KafkaException, TopicPartition
from consumer_sdk.testing import KafkaCluster, close_client
from tests.realkafka.support import unique
from tests.runtime.harness import wait_for

pytestmark = pytest.mark.realkafka

GONE = KafkaError.UNKNOWN_TOPIC_OR_PART
# Far above the test's waits: a revocation that waited for the commit's deadline (as it did,
# for max.poll.interval.ms) shows as a timeout of the wait for it.
MAX_POLL_MS = 300_000
WAIT_S = 40.0


class Client:
    """One consumer (sdk or ck) polled by its own thread: what it read, revoked, committed."""

    def __init__(self, impl: str, conf: dict[str, Any], topics: list[str], auto: bool) -> None:
        self.impl = impl
        self.auto = auto
        self.records: list[tuple[str, int, int]] = []
        self.revoked: list[tuple[str, int]] = []
        self.commit_errors: list[tuple[int, tuple[str, int]]] = []
        self.revoke_commit_errors: list[int] = []
        self.errors: list[BaseException | KafkaError] = []
        conf = {**conf, "on_commit": self._on_commit, "max.poll.interval.ms": MAX_POLL_MS}
        if impl == "ck":
            self.consumer: Any = confluent_kafka.Consumer({**conf, "group.protocol": "consumer"})
        else:
            self.consumer = Consumer(conf)
        self.consumer.subscribe(topics, on_revoke=self._on_revoke, on_lost=self._on_revoke)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, name=f"poll-{impl}", daemon=True)
        self.thread.start()

    def _on_commit(self, err: KafkaError | None, parts: list[TopicPartition]) -> None:
        if err is not None:
            for p in parts:
                # librdkafka marks a partition that committed in the same request with the
                # request's error but no error of its own, and leaves offsets unset as -1001.
                failed = p.error is not None or self.impl == "sdk"
                if failed and p.offset >= 0:
                    self.commit_errors.append((err.code(), (p.topic, p.partition)))

    def _on_revoke(self, consumer: Any, parts: list[TopicPartition]) -> None:
        self.revoked.extend((p.topic, p.partition) for p in parts)
        if not self.auto and parts:
            try:
                consumer.commit(asynchronous=False)
            except KafkaException as exc:
                self.revoke_commit_errors.append(exc.args[0].code())

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self.consumer.poll(0.2)
            except Exception as exc:
                self.errors.append(exc)
                continue
            if msg is None:
                continue
            if msg.error() is not None:
                self.errors.append(msg.error())
                continue
            self.records.append((msg.topic(), msg.partition(), msg.offset()))

    def read(self, topic: str) -> int:
        return sum(1 for t, _, _ in list(self.records) if t == topic)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), f"{self.impl}: poll() did not return"


def _sdk_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("consumer-sdk")]


@pytest.mark.parametrize("auto", [True, False], ids=["auto-commit", "manual-commit"])
def test_deleted_topic_is_revoked_and_the_rest_flows(
    real_kafka: KafkaCluster, auto: bool, caplog: pytest.LogCaptureFixture
) -> None:
    keep, gone = unique("dt-keep"), unique("dt-gone")
    real_kafka.create_topic(keep, partitions=2)
    real_kafka.create_topic(gone, partitions=2)
    for partition in (0, 1):  # records in every partition: each has an offset to commit
        real_kafka.produce(keep, [b"k"] * 5, partition=partition)
        real_kafka.produce(gone, [b"g"] * 5, partition=partition)
    before = set(_sdk_threads())
    clients = {}
    for impl in ("sdk", "ck"):
        conf = {
            "bootstrap.servers": real_kafka.bootstrap_servers,
            "group.id": unique(f"dt-{impl}"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": auto,
            # No auto-commit before the deletion: the commit before the revocation carries
            # the deleted topic's offsets.
            "auto.commit.interval.ms": 600_000,
        }
        clients[impl] = Client(impl, conf, [keep, gone], auto)
    try:
        for c in clients.values():
            wait_for(lambda c=c: len(c.records) == 20, WAIT_S, f"{c.impl}: the first records")
        caplog.set_level(logging.WARNING, logger="consumer_sdk")
        real_kafka.delete_topic(gone)
        for partition in (0, 1):
            real_kafka.produce(keep, [b"k2"] * 5, partition=partition)
        gone_parts = [(gone, 0), (gone, 1)]
        for c in clients.values():
            wait_for(
                lambda c=c: (
                    sorted(c.revoked) == gone_parts
                    and c.read(keep) == 20
                    and (len(c.commit_errors) >= 2 or len(c.revoke_commit_errors) >= 1)
                ),
                WAIT_S,
                f"{c.impl}: {gone} revoked, its commit failed and the new records of {keep} read",
            )
        for c in clients.values():
            c.stop()
        sdk, ck = clients["sdk"], clients["ck"]
        if auto:
            # The offsets of the deleted topic fail once (on_commit), not retried.
            assert sorted(ck.commit_errors) == [(GONE, p) for p in gone_parts]
            assert sorted(sdk.commit_errors) == sorted(ck.commit_errors)
            warnings = [r for r in caplog.records if gone in r.getMessage()]
            assert len(warnings) == 1, [r.getMessage() for r in warnings]
        else:
            # The application's commit in on_revoke raises at once, as confluent-kafka's does.
            assert ck.revoke_commit_errors == [GONE]
            assert sdk.revoke_commit_errors == ck.revoke_commit_errors
        assert sdk.errors == [] and ck.errors == []
    finally:
        for c in clients.values():
            c._stop.set()
            c.thread.join(WAIT_S)
        assert close_client(clients["ck"].consumer)
        clients["sdk"].consumer.close()
    wait_for(lambda: set(_sdk_threads()) <= before, WAIT_S, "the SDK's threads to end")
    assert not clients["sdk"].thread.is_alive()
