"""Lag, statistics and per-consumer metrics on the real broker, next to confluent-kafka."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import confluent_kafka
import pytest

from consumer_sdk import Consumer, TopicPartition
from consumer_sdk.testing import KafkaCluster, wait_until

pytestmark = pytest.mark.realkafka

# Records per partition, and the offsets committed explicitly (auto-commit off).
PRODUCED = {0: 100, 1: 50}
COMMITTED = {0: 40, 1: 10}


def _partition_stats(stats: dict[str, Any], topic: str) -> dict[int, dict[str, Any]]:
    parts = stats.get("topics", {}).get(topic, {}).get("partitions", {})
    return {int(p): v for p, v in parts.items() if int(p) >= 0}


class _Run:
    """One client consuming ``topic`` in its own group: every record, then the explicit
    commit, then polling on so statistics keep coming."""

    def __init__(self, make: Callable[[dict[str, Any]], Any], servers: str, topic: str) -> None:
        self.stats: dict[str, Any] = {}
        self.lock = threading.Lock()
        self.consumer = make(
            {
                "bootstrap.servers": servers,
                "group.id": f"lag-{uuid.uuid4().hex[:8]}",
                "group.protocol": "consumer",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
                "statistics.interval.ms": 300,
                "stats_cb": self._on_stats,
            }
        )
        self.topic = topic
        self.consumer.subscribe([topic])
        self.records = 0

    def _on_stats(self, raw: str) -> None:
        with self.lock:
            self.stats = json.loads(raw)

    def partitions(self) -> dict[int, dict[str, Any]]:
        with self.lock:
            return _partition_stats(self.stats, self.topic)

    def consume_all(self, total: int) -> None:
        deadline = time.monotonic() + 60
        while self.records < total and time.monotonic() < deadline:
            msg = self.consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                self.records += 1
        assert self.records == total

    def commit(self) -> None:
        self.consumer.commit(
            offsets=[TopicPartition(self.topic, p, o) for p, o in COMMITTED.items()],
            asynchronous=False,
        )

    def poll_until(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 30
        while not done():
            assert time.monotonic() < deadline, f"timed out: {what}; stats {self.partitions()}"
            msg = self.consumer.poll(0.1)
            if msg is not None and msg.error() is None:
                self.records += 1


def _lag_fields(parts: dict[int, dict[str, Any]]) -> dict[int, tuple[int, ...]]:
    return {
        p: (
            v["hi_offset"],
            v["committed_offset"],
            v["consumer_lag"],
            v["consumer_lag_stored"],
        )
        for p, v in parts.items()
    }


def test_stats_consumer_lag_matches_confluent_kafka(real_kafka: KafkaCluster) -> None:
    topic = f"lag-{uuid.uuid4().hex[:8]}"
    real_kafka.create_topic(topic, partitions=2)
    for p, n in PRODUCED.items():
        real_kafka.produce(topic, [f"{p}-{i}" for i in range(n)], partition=p)
    total = sum(PRODUCED.values())
    expected = {p: (PRODUCED[p], COMMITTED[p], PRODUCED[p] - COMMITTED[p], 0) for p in PRODUCED}
    runs = [
        _Run(Consumer, real_kafka.bootstrap_servers, topic),
        _Run(confluent_kafka.Consumer, real_kafka.bootstrap_servers, topic),
    ]
    try:
        for run in runs:
            run.consume_all(total)
            run.commit()
            run.poll_until(lambda run=run: _lag_fields(run.partitions()) == expected, "lag")  # type: ignore[misc]
        sdk, ck = (_lag_fields(run.partitions()) for run in runs)
        assert sdk == ck == expected

        # records-lag: high watermark minus position, without the application polling.
        sdk_consumer: Consumer = runs[0].consumer
        assert sdk_consumer.lag() == {(topic, 0): 0, (topic, 1): 0}
        real_kafka.produce(topic, [f"late-{i}" for i in range(7)], partition=0)
        wait_until(lambda: sdk_consumer.lag().get((topic, 0)) == 7, 30, 0.05, "lag 7")
        assert sdk_consumer.lag()[(topic, 1)] == 0
    finally:
        for run in runs:
            run.consumer.close()
