"""Parity with Spark's Kafka source at the edges, in real local Spark against EmbeddedKafka:
Trigger.Once commits, batch reads, assign, new topics of a pattern, start-up errors."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import pytest

from consumer_sdk.testing import EmbeddedKafka
from tests.spark.helpers import (
    Record,
    all_records,
    committed,
    high_watermarks,
    produce,
    wait_for,
)

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")
pytestmark = pytest.mark.spark


def rows(df: Any) -> list[Record]:
    return [
        (r.topic, r.partition, r.offset)
        for r in df.select("topic", "partition", "offset").collect()
    ]


def stream(spark: Any, kafka_servers: str, **options: Any) -> Any:
    reader = spark.readStream.format("kip848").option("kafka.bootstrap.servers", kafka_servers)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_trigger_once_commits_its_batch(
    spark: Any, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    topic, group = "par-once", "par-once-g"
    embedded_kafka.create_topic(topic, partitions=3)
    produce(embedded_kafka, topic, 3, 20, "a")
    df = stream(
        spark,
        embedded_kafka.bootstrap_servers,
        subscribe=topic,
        startingOffsets="earliest",
        checkpointLocation=str(tmp_path / "ck"),
        **{"group.id": group},
    )
    query = (
        df.writeStream.format("memory")
        .queryName("par_once")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(once=True)
        .start()
    )
    assert query.awaitTermination(120), "the Trigger.Once query did not finish"
    assert query.exception() is None
    assert len(rows(spark.sql("select * from par_once"))) == 60
    # No later Spark call reports the batch durable: the stream reader read the query's
    # commit log (checkpointLocation) before its member left, so this holds at once.
    assert committed(embedded_kafka, group, topic, 3) == dict.fromkeys(range(3), 20)


def test_batch_reads_between_starting_and_ending_offsets(
    spark: Any, embedded_kafka: EmbeddedKafka
) -> None:
    import time

    import confluent_kafka

    topic = "par-batch"
    embedded_kafka.create_topic(topic, partitions=3)
    producer = confluent_kafka.Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers})
    base = int(time.time() * 1000) - 100_000
    for p in range(3):
        for i in range(10):
            producer.produce(topic, f"v{i}".encode(), partition=p, timestamp=base + i * 1000)
    assert producer.flush(10) == 0
    del producer  # no librdkafka reconnect noise after the module's cluster stops

    def read(**options: str) -> list[Record]:
        reader = spark.read.format("kip848").option(
            "kafka.bootstrap.servers", embedded_kafka.bootstrap_servers
        )
        for key, value in options.items():
            reader = reader.option(key, value)
        return sorted(rows(reader.load()))

    # Defaults: earliest to latest, every partition; no group.id needed.
    assert set(read(subscribe=topic)) == all_records(embedded_kafka, topic, 3)
    got = read(
        subscribe=topic,
        startingOffsets=json.dumps({topic: {"0": 2, "1": -2}}),
        endingOffsets=json.dumps({topic: {"0": 5, "2": 3}}),
    )
    assert got == sorted(
        [(topic, 0, o) for o in range(2, 5)]
        + [(topic, 1, o) for o in range(10)]
        + [(topic, 2, o) for o in range(3)]
    )
    got = read(
        assign=json.dumps({topic: [1]}),
        startingOffsets=json.dumps({topic: {"1": 4}}),
        endingOffsets=json.dumps({topic: {"1": 7}}),
        minPartitions="3",
    )
    assert got == [(topic, 1, o) for o in range(4, 7)]
    # The mock finds no record for any timestamp: an ending timestamp then means latest (as
    # in Spark), a starting one follows startingOffsetsByTimestampStrategy.
    got = read(
        subscribePattern="par-b.*",
        endingTimestamp=str(base + 1000),
        startingOffsetsByTimestamp=json.dumps({topic: {"2": base}}),
        startingOffsetsByTimestampStrategy="latest",
    )
    assert got == sorted((topic, p, o) for p in (0, 1) for o in range(10))
    with pytest.raises(Exception, match=r"no record at or after the timestamp in par-batch\[2\]"):
        read(subscribe=topic, startingOffsetsByTimestamp=json.dumps({topic: {"2": base}}))
    with pytest.raises(Exception, match="maxOffsetsPerTrigger: only for streaming"):
        read(subscribe=topic, maxOffsetsPerTrigger="5")
    with pytest.raises(Exception, match="starting offset 8 is after the ending offset 3"):
        read(
            assign=json.dumps({topic: [0]}),
            startingOffsets=json.dumps({topic: {"0": 8}}),
            endingOffsets=json.dumps({topic: {"0": 3}}),
        )


def test_assign_and_a_new_topic_of_a_pattern_in_one_query(
    spark: Any, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """subscribePattern with startingOffsets=latest: a topic created mid-stream is read from
    its first record (Spark's rule); an assign query reads exactly its partitions."""
    embedded_kafka.create_topic("parpat-a", partitions=2)
    produce(embedded_kafka, "parpat-a", 2, 5, "old")  # before the start: skipped (latest)
    df = stream(
        spark,
        embedded_kafka.bootstrap_servers,
        subscribePattern="parpat-.*",
        startingOffsets="latest",
        **{"group.id": "parpat-g"},
    )
    query = (
        df.writeStream.format("memory")
        .queryName("par_pattern")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: query.recentProgress, 120, "the first batch")
        embedded_kafka.create_topic("parpat-b", partitions=2)
        produce(embedded_kafka, "parpat-b", 2, 6, "new")
        produce(embedded_kafka, "parpat-a", 2, 3, "late")
        expected = all_records(embedded_kafka, "parpat-b", 2) | {
            ("parpat-a", p, o) for p in range(2) for o in range(5, 8)
        }
        wait_for(
            lambda: set(rows(spark.sql("select * from par_pattern"))) == expected,
            90,
            "the new topic read from offset 0",
        )
    finally:
        query.stop()
    got = rows(spark.sql("select * from par_pattern"))
    assert len(got) == len(set(got))
    # assign: fixed partitions, no membership; offsets committed to the group when given.
    assigned = stream(
        spark,
        embedded_kafka.bootstrap_servers,
        assign=json.dumps({"parpat-b": [1]}),
        startingOffsets="earliest",
        **{"group.id": "parpat-assign"},
    )
    query = (
        assigned.writeStream.format("memory")
        .queryName("par_assign")
        .option("checkpointLocation", str(tmp_path / "ck2"))
        .trigger(availableNow=True)
        .start()
    )
    assert query.awaitTermination(120)
    assert sorted(rows(spark.sql("select * from par_assign"))) == [
        ("parpat-b", 1, o) for o in range(6)
    ]
    wait_for(
        lambda: committed(embedded_kafka, "parpat-assign", "parpat-b", 2) == {1: 6},
        30,
        "the assign query's offsets committed",
    )


def test_start_up_errors_name_the_problem(
    spark: Any, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"
    embedded_kafka.create_topic("par-there", partitions=1)
    cases = [
        (dead, "par-there", f"no Kafka broker answered at kafka.bootstrap.servers={dead}"),
        (
            embedded_kafka.bootstrap_servers,
            "par-there,par-absent",
            r"subscribed topic\(s\) \['par-absent'\] do not exist",
        ),
    ]
    for i, (servers, topics, message) in enumerate(cases):
        df = stream(
            spark, servers, subscribe=topics, joinTimeoutMs="2000", **{"group.id": f"par-err-{i}"}
        )
        query = (
            df.writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / f"ck{i}"))
            .start()
        )
        try:
            with pytest.raises(Exception, match=message):
                query.awaitTermination(120)
        finally:
            query.stop()
    assert high_watermarks(embedded_kafka, "par-there", 1) == {0: 0}
