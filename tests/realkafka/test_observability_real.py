"""Lag, statistics and per-consumer metrics on the real broker, next to confluent-kafka."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
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
        self.stats_seen = 0
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
            self.stats_seen += 1

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

    def paused_lag(self) -> dict[int, int]:
        """Pause every partition, poll until two more statistics came in with both end
        offsets known, and return each partition's consumer_lag_stored (-1: unknown)."""
        self.consumer.pause(self.consumer.assignment())
        with self.lock:
            seen = self.stats_seen
        self.poll_until(
            lambda: (
                self.stats_seen >= seen + 2
                and all(
                    self.partitions().get(p, {}).get("hi_offset") == n for p, n in PRODUCED.items()
                )
            ),
            "statistics while paused",
        )
        return {p: v["consumer_lag_stored"] for p, v in self.partitions().items()}

    def positions(self) -> dict[int, int]:
        found = self.consumer.position(self.consumer.assignment())
        return {tp.partition: tp.offset for tp in found}

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
        # Part way: paused after 30 records, lag_stored = end offset - position, -1 where
        # no record was delivered yet; the SDK's lag() agrees and leaves those out.
        for run in runs:
            run.consume_all(30)
            stored_lag = run.paused_lag()
            positions = run.positions()
            expected_lag = {
                p: PRODUCED[p] - positions[p] if positions[p] >= 0 else -1 for p in PRODUCED
            }
            assert stored_lag == expected_lag, (run.consumer, positions)
            if isinstance(run.consumer, Consumer):
                assert run.consumer.lag() == {
                    (topic, p): v for p, v in expected_lag.items() if v >= 0
                }
            run.consumer.resume(run.consumer.assignment())
        for run in runs:
            run.consume_all(total)
            run.commit()
            run.poll_until(lambda run=run: _lag_fields(run.partitions()) == expected, "lag")  # type: ignore[misc]
        sdk, ck = (_lag_fields(run.partitions()) for run in runs)
        assert sdk == ck == expected

        # records-lag (high watermark minus position) is what confluent-kafka's statistics
        # call consumer_lag_stored (its stored offset is its position here).
        sdk_consumer: Consumer = runs[0].consumer
        assert sdk_consumer.lag() == {(topic, p): ck[p][3] for p in PRODUCED}
    finally:
        for run in runs:
            run.consumer.close()


def _scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def test_prometheus_endpoint_two_consumers_two_series(real_kafka: KafkaCluster) -> None:
    from prometheus_client import CollectorRegistry, start_http_server

    from consumer_sdk.observability.prometheus import ConsumerCollector

    topic, group = f"prom-{uuid.uuid4().hex[:8]}", f"prom-g-{uuid.uuid4().hex[:6]}"
    real_kafka.create_topic(topic, partitions=4)
    for p in range(4):
        real_kafka.produce(topic, [f"{p}-{i}" for i in range(20)], partition=p)
    registry = CollectorRegistry()
    collector = ConsumerCollector.register(registry)
    server, http_thread = start_http_server(0, "127.0.0.1", registry)
    consumers = [
        Consumer(
            {
                "bootstrap.servers": real_kafka.bootstrap_servers,
                "group.id": group,
                "client.id": f"svc-{i}",
                "auto.offset.reset": "earliest",
                "statistics.interval.ms": 300,
            }
        )
        for i in range(2)
    ]
    stop = threading.Event()

    def run(c: Consumer) -> None:
        while not stop.is_set():
            c.poll(0.1)

    threads = [threading.Thread(target=run, args=(c,), daemon=True) for c in consumers]
    try:
        for c in consumers:
            collector.add(c)
            c.subscribe([topic])
        for t in threads:
            t.start()
        wait_until(
            lambda: (
                all(len(c.assignment()) == 2 for c in consumers)
                and len(
                    _scrape(server.server_port).get("kafka_consumer_fetch_manager_records_lag", [])
                )
                == 4
                and all(
                    s[1] > 0
                    for s in _scrape(server.server_port)["kafka_consumer_fetch_manager_fetch_total"]
                )
            ),
            60,
            0.2,
            "both consumers assigned, fetching and lag known",
        )
        scraped = _scrape(server.server_port)
        assigned = scraped["kafka_consumer_coordinator_assigned_partitions"]
        assert sorted((s[0]["client_id"], s[1]) for s in assigned) == [
            ("svc-0", 2.0),
            ("svc-1", 2.0),
        ]
        members = {c.client_id: c.member_id for c in consumers}
        assert {s[0]["client_id"]: s[0]["member_id"] for s in assigned} == members
        assert all(s[0]["group"] == group for s in assigned)
        for name in (
            "kafka_consumer_coordinator_heartbeat_total",
            "kafka_consumer_coordinator_rebalance_total",
            "kafka_consumer_coordinator_partitions_assigned_total",
            "kafka_consumer_fetch_manager_records_consumed_total",
        ):
            series = scraped[name]
            assert len(series) == 2, (name, series)
            assert all(value > 0 for _, value in series), (name, series)
        lag = scraped["kafka_consumer_fetch_manager_records_lag"]
        owner = {(s[0]["topic"], int(s[0]["partition"])): s[0]["client_id"] for s in lag}
        expected = {
            (tp.topic, tp.partition): c.client_id for c in consumers for tp in c.assignment()
        }
        assert owner == expected
        wait_until(
            lambda: (
                sum(
                    s[1]
                    for s in _scrape(server.server_port)["kafka_consumer_fetch_manager_records_lag"]
                )
                == 0
            ),
            30,
            0.2,
            "all 80 records consumed: lag 0",
        )
    finally:
        stop.set()
        for t in threads:
            t.join(10)
        for c in consumers:
            c.close()
        server.shutdown()
        server.server_close()
        http_thread.join(5)
    assert "kafka_consumer_coordinator_assigned_partitions" not in _scrape_registry(registry)


def _scrape_registry(registry: Any) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry).decode()


def test_coordinator_found_before_subscribe_as_confluent_kafka(real_kafka: KafkaCluster) -> None:
    """Both clients look the group coordinator up as soon as they are created, before
    ``subscribe()`` (so the join heartbeat can go out with it, not one FindCoordinator round
    trip later): their statistics' ``cgrp.state`` says "up" while they are not subscribed.
    Then both subscribe in one group and split its partitions."""
    topic = f"ahead-{uuid.uuid4().hex[:8]}"
    real_kafka.create_topic(topic, partitions=4)
    cgrp: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()

    def stats_cb(name: str) -> Callable[[str], None]:
        def on_stats(raw: str) -> None:
            with lock:
                cgrp[name] = json.loads(raw).get("cgrp", {})

        return on_stats

    def state(name: str) -> str | None:
        with lock:
            return cgrp.get(name, {}).get("state")

    conf = {
        "bootstrap.servers": real_kafka.bootstrap_servers,
        "group.id": f"ahead-{uuid.uuid4().hex[:8]}",
        "group.protocol": "consumer",
        "statistics.interval.ms": 100,
    }
    sdk = Consumer({**conf, "stats_cb": stats_cb("sdk")})
    ck = confluent_kafka.Consumer({**conf, "stats_cb": stats_cb("ck")})
    try:
        deadline = time.monotonic() + 30
        while not (state("sdk") == state("ck") == "up"):
            assert time.monotonic() < deadline, f"coordinator not found ahead: {cgrp}"
            sdk.poll(0.05)
            ck.poll(0.05)
        assert sdk.health().coordinator_known
        assert sdk.group_stats()["state"] == "up"
        assert sdk.assignment() == [] and ck.assignment() == []  # not subscribed yet

        sdk.subscribe([topic])
        ck.subscribe([topic])

        def owned(consumer: Any) -> set[int]:
            return {tp.partition for tp in consumer.assignment()}

        deadline = time.monotonic() + 30
        while not (owned(sdk) and owned(ck) and owned(sdk) | owned(ck) == {0, 1, 2, 3}):
            assert time.monotonic() < deadline, (owned(sdk), owned(ck))
            sdk.poll(0.05)
            ck.poll(0.05)
        assert not owned(sdk) & owned(ck)
    finally:
        sdk.close()
        ck.close()
