"""A confluent-kafka ``group.protocol=consumer`` member for differential tests on the real broker.

Same shape as :class:`tests.runtime.harness.Member` (``owned``, ``records``, ``errors``, callbacks
on the shared ``Timeline``) so both kinds of member can share one group and one ownership check.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

import confluent_kafka

from consumer_sdk.testing import close_client
from tests.runtime.harness import Partition, Timeline


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


class CkMember:
    """A confluent-kafka KIP-848 consumer polled by its own thread."""

    def __init__(
        self,
        name: str,
        config: dict[str, Any],
        topics: list[str],
        timeline: Timeline,
        *,
        commit_on_revoke: bool = False,
    ) -> None:
        self.name = name
        self.timeline = timeline
        self.consumer = confluent_kafka.Consumer({**config, "group.protocol": "consumer"})
        self.records: list[tuple[str, int, int, bytes | None]] = []
        self.errors: list[confluent_kafka.KafkaError] = []
        self.owned: set[Partition] = set()
        self._commit_on_revoke = commit_on_revoke
        self._stop = threading.Event()
        self.consumer.subscribe(
            topics, on_assign=self._assign, on_revoke=self._revoke, on_lost=self._lost
        )
        self._thread = threading.Thread(target=self._loop, name=f"ck-{name}", daemon=True)
        self._thread.start()

    def _assign(self, consumer: Any, parts: list[confluent_kafka.TopicPartition]) -> None:
        self.owned.update((p.topic, p.partition) for p in parts)
        self.timeline.record(self.name, "assign", parts)

    def _revoke(self, consumer: Any, parts: list[confluent_kafka.TopicPartition]) -> None:
        if self._commit_on_revoke and parts:
            try:
                consumer.commit(asynchronous=False)
            except confluent_kafka.KafkaException as exc:
                if exc.args[0].code() != confluent_kafka.KafkaError._NO_OFFSET:
                    self.errors.append(exc.args[0])
        self.owned.difference_update((p.topic, p.partition) for p in parts)
        self.timeline.record(self.name, "revoke", parts)

    def _lost(self, consumer: Any, parts: list[confluent_kafka.TopicPartition]) -> None:
        self.owned.difference_update((p.topic, p.partition) for p in parts)
        self.timeline.record(self.name, "lost", parts)

    def _loop(self) -> None:
        while not self._stop.is_set():
            msg = self.consumer.poll(0.1)
            if msg is None:
                continue
            if msg.error() is not None:
                self.errors.append(msg.error())
                if msg.error().fatal():
                    return
                continue
            self.records.append((msg.topic(), msg.partition(), msg.offset(), msg.value()))

    def stop(self) -> None:
        """Stop polling and close (bounded: librdkafka's close can block)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(5)
        close_client(self.consumer, timeout=15)
