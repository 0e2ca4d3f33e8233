"""Shared helpers of the Spark tests: reading sinks, committed offsets, plain consumers."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka

from consumer_sdk import Consumer, TopicPartition
from consumer_sdk.testing import EmbeddedKafka, wait_until

Record = tuple[str, int, int]


def produce(
    kafka: EmbeddedKafka, topic: str, partitions: int, per_partition: int, tag: str
) -> None:
    """Produce ``per_partition`` records to each partition."""
    for p in range(partitions):
        kafka.produce(topic, [f"{tag}-{p}-{i}".encode() for i in range(per_partition)], partition=p)


def high_watermarks(kafka: EmbeddedKafka, topic: str, partitions: int) -> dict[int, int]:
    c = confluent_kafka.Consumer(
        {"bootstrap.servers": kafka.bootstrap_servers, "group.id": "hw-probe"}
    )
    try:
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10, cached=False)[1]
            for p in range(partitions)
        }
    finally:
        c.close()


def all_records(kafka: EmbeddedKafka, topic: str, partitions: int) -> set[Record]:
    """Every (topic, partition, offset) currently in the topic."""
    return {
        (topic, p, o)
        for p, hw in high_watermarks(kafka, topic, partitions).items()
        for o in range(hw)
    }


def committed(kafka: EmbeddedKafka, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offsets (OffsetFetch from a non-member: allowed by the mock)."""
    c = confluent_kafka.Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": group})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
        return {tp.partition: tp.offset for tp in tps if tp.offset >= 0}
    finally:
        c.close()


def sink_positions(records: list[Record]) -> dict[int, int]:
    out: dict[int, int] = {}
    for _, p, o in records:
        out[p] = max(out.get(p, 0), o + 1)
    return out


def read_json_dir(path: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for f in sorted(path.glob("*.jsonl")):
        rows.extend(json.loads(line) for line in f.read_text().splitlines() if line.strip())
    return rows


class PlainMember:
    """A consumer_sdk Consumer in its own thread that commits what it processed on revoke."""

    def __init__(self, kafka: EmbeddedKafka, group: str, topic: str) -> None:
        self.records: list[Record] = []
        self.owned: set[int] = set()
        self.events: list[tuple[float, str, list[int]]] = []
        self.errors: list[BaseException] = []
        self._processed: dict[tuple[str, int], int] = {}
        self._stop = threading.Event()
        self.consumer = Consumer(
            {
                "bootstrap.servers": kafka.bootstrap_servers,
                "group.id": group,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
        self.consumer.subscribe([topic], on_assign=self._assign, on_revoke=self._revoke)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _assign(self, c: Any, tps: list[TopicPartition]) -> None:
        self.owned.update(tp.partition for tp in tps)
        self.events.append((time.time(), "assign", [tp.partition for tp in tps]))

    def _revoke(self, c: Any, tps: list[TopicPartition]) -> None:
        done = [
            TopicPartition(tp.topic, tp.partition, self._processed[(tp.topic, tp.partition)])
            for tp in tps
            if (tp.topic, tp.partition) in self._processed
        ]
        if done:
            c.commit(offsets=done, asynchronous=False)
        for tp in tps:
            self._processed.pop((tp.topic, tp.partition), None)
        self.owned.difference_update(tp.partition for tp in tps)
        self.events.append((time.time(), "revoke", [tp.partition for tp in tps]))

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self.consumer.poll(0.1)
            except Exception as exc:  # surfaced through self.errors
                self.errors.append(exc)
                continue
            if msg is None or msg.error() is not None:
                continue
            topic, partition, offset = msg.topic(), msg.partition(), msg.offset()
            assert topic is not None and partition is not None and offset is not None
            self.records.append((topic, partition, offset))
            self._processed[(topic, partition)] = offset + 1

    def close(self) -> None:
        """Leave the group (the revoke callback commits first)."""
        self._stop.set()
        self._thread.join(10)
        self.consumer.close(timeout=10)


def wait_for(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """Poll ``condition`` until truthy (bounded by ``timeout``)."""
    return wait_until(condition, timeout=timeout, interval=interval, description=what)
