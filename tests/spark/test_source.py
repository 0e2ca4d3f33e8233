"""The kip848 source in real local-mode Spark queries against EmbeddedKafka."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from consumer_sdk.testing import EmbeddedKafka
from tests.spark.helpers import (
    PlainMember,
    Record,
    all_records,
    committed,
    produce,
    sink_positions,
    wait_for,
)

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")
pytestmark = pytest.mark.spark

PARTS = 4


def reader(spark: Any, kafka: EmbeddedKafka, group: str, topic: str, **options: Any) -> Any:
    stream = (
        spark.readStream.format("kip848")
        .option("kafka.bootstrap.servers", kafka.bootstrap_servers)
        .option("group.id", group)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    for key, value in options.items():
        stream = stream.option(key, value)
    return stream.load()


def events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def memory_rows(spark: Any, name: str) -> list[Record]:
    return [
        (r.topic, r.partition, r.offset)
        for r in spark.sql(f"select topic, partition, offset from {name}").collect()
    ]


def parquet_rows(spark: Any, path: Path) -> list[Record]:
    from pyspark.errors import AnalysisException

    if not (path / "_spark_metadata").exists():
        return []
    try:
        df = spark.read.parquet(str(path)).select("topic", "partition", "offset")
    except AnalysisException:  # no batch committed to the sink yet
        return []
    return [(r.topic, r.partition, r.offset) for r in df.collect()]


def input_rows(query: Any) -> int:
    """Rows the query's batches read so far (from its progress: no Spark job)."""
    return sum(int(p["numInputRows"]) for p in query.recentProgress)


def stop(query: Any) -> None:
    if query.isActive:
        query.stop()


def test_schema_is_the_kafka_source_schema(spark: Any, embedded_kafka: EmbeddedKafka) -> None:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    from spark_integration import kafka_schema
    from spark_integration.executor import arrow_schema

    embedded_kafka.create_topic("src-schema", partitions=1)
    plain = reader(spark, embedded_kafka, "src-schema-g", "src-schema")
    with_headers = reader(
        spark, embedded_kafka, "src-schema-g", "src-schema", includeHeaders="true"
    )
    assert plain.schema == StructType.fromDDL(kafka_schema())
    assert [f.name for f in plain.schema] == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
    ]
    assert with_headers.schema.simpleString().endswith(
        "headers:array<struct<key:string,value:binary>>>"
    )
    for include, df in ((False, plain), (True, with_headers)):
        assert arrow_schema(include).equals(to_arrow_schema(df.schema, timezone="UTC"))
    with pytest.raises(Exception, match="exactly one of subscribe, subscribePattern or assign"):
        (
            spark.readStream.format("kip848")
            .option("kafka.bootstrap.servers", "127.0.0.1:1")
            .option("group.id", "g")
            .load()
        )


def test_available_now_with_rate_limit_headers_and_min_partitions(
    spark: Any, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    topic, group = "src-avail", "src-avail-g"
    embedded_kafka.create_topic(topic, partitions=PARTS)
    for p in range(PARTS):
        embedded_kafka.produce(
            topic,
            [(f"k{i}", f"v{p}-{i}") for i in range(250)],
            partition=p,
            headers=[("origin", b"test")],
        )
    log = tmp_path / "events.jsonl"
    df = reader(
        spark,
        embedded_kafka,
        group,
        topic,
        maxOffsetsPerTrigger=300,
        includeHeaders="true",
        minPartitions=8,
        eventLog=str(log),
    )
    query = (
        df.writeStream.format("memory")
        .queryName("src_avail")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(120), "the availableNow query did not finish"
        assert query.exception() is None
        rows = spark.sql("select * from src_avail").collect()
        coords = [(r.topic, r.partition, r.offset) for r in rows]
        assert len(coords) == len(set(coords)) == 1000
        assert set(coords) == all_records(embedded_kafka, topic, PARTS)
        sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
        assert len(sizes) >= 4 and max(sizes) <= 300 + PARTS, sizes
        first = min(rows, key=lambda r: (r.partition, r.offset))
        assert first.key == b"k0" and first.value == b"v0-0" and first.timestampType == 0
        assert [(h.key, h.value) for h in first.headers] == [("origin", b"test")]
        # The last batch never gets commit(): its end is committed by the next latestOffset.
        assert committed(embedded_kafka, group, topic, PARTS) == sink_positions(coords)
        # The member reconciled its whole assignment before the first batch was planned.
        kinds = [e["kind"] for e in events(log)]
        assert kinds.index("assign") < kinds.index("stable") < kinds.index("commit"), kinds
        stable = next(e for e in events(log) if e["kind"] == "stable")
        assert sorted(stable["partitions"]) == [f"{topic}:{p}" for p in range(PARTS)]
        assert stable["epoch"] > 0 and stable["ms"] >= 0
    finally:
        stop(query)


def test_query_shares_the_group_with_a_plain_consumer(
    spark: Any, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """Sink + the other member's records == produced; no duplicate in the sink."""
    topic, group = "src-share", "src-share-g"
    embedded_kafka.create_topic(topic, partitions=PARTS)
    produce(embedded_kafka, topic, PARTS, 50, "a")
    log = tmp_path / "events.jsonl"
    df = reader(spark, embedded_kafka, group, topic, eventLog=str(log))
    query = (
        df.select("topic", "partition", "offset")
        .writeStream.format("memory")
        .queryName("src_share")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    other: PlainMember | None = None
    try:
        wait_for(lambda: len(memory_rows(spark, "src_share")) == 200, 90, "the first records")
        other = PlainMember(embedded_kafka, group, topic)
        wait_for(lambda: other is not None and len(other.owned) == 2, 30, "a 2/2 split")
        produce(embedded_kafka, topic, PARTS, 50, "b")
        wait_for(
            lambda: len(set(memory_rows(spark, "src_share")) | set(other.records)) == 400,
            60,
            "the second round read by both",
        )
        assert {p for _, p, o in other.records} == other.owned
        other.close()
        wait_for(
            lambda: len([e for e in events(log) if e["kind"] == "assign"]) >= 2,
            30,
            "the partitions coming back",
        )
        produce(embedded_kafka, topic, PARTS, 50, "c")
        wait_for(
            lambda: len(set(memory_rows(spark, "src_share")) | set(other.records)) == 600,
            60,
            "the third round",
        )
        sink = memory_rows(spark, "src_share")
        produced = all_records(embedded_kafka, topic, PARTS)
        # After the other member left, the query read every partition again.
        assert {(topic, p, o) for p in range(PARTS) for o in range(100, 150)} <= set(sink)
        assert len(sink) == len(set(sink)), "a record reached the sink twice"
        assert set(sink) | set(other.records) == produced
        overlap = set(sink) & set(other.records)
        revokes = [e for e in events(log) if e["kind"] == "revoke"]
        assert revokes and all(e["committed"] for e in revokes), revokes
        # Overlap is only possible for a revocation while a batch was in flight.
        assert len(overlap) <= 50 * 2, sorted(overlap)[:10]
        assert not other.errors
    finally:
        if other is not None:
            other.close()
        stop(query)


def test_committed_offsets_match_the_sink_after_each_batch(
    spark: Any, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    topic, group = "src-commits", "src-commits-g"
    embedded_kafka.create_topic(topic, partitions=PARTS)
    produce(embedded_kafka, topic, PARTS, 40, "a")
    seen: list[tuple[int, dict[int, int], dict[int, int]]] = []
    sink: list[Record] = []

    def write(batch: Any, batch_id: int) -> None:
        # Inside the query: Kafka must hold exactly what the sink held before this batch.
        seen.append(
            (batch_id, committed(embedded_kafka, group, topic, PARTS), sink_positions(sink))
        )
        sink.extend(
            (r.topic, r.partition, r.offset)
            for r in batch.select("topic", "partition", "offset").collect()
        )

    df = reader(spark, embedded_kafka, group, topic, maxOffsetsPerTrigger=50)
    query = (
        df.writeStream.foreachBatch(write)
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: len(sink) == 160, 90, "the first round")
        produce(embedded_kafka, topic, PARTS, 40, "b")
        wait_for(lambda: len(sink) == 320, 60, "the second round")
        wait_for(
            lambda: committed(embedded_kafka, group, topic, PARTS) == sink_positions(sink),
            20,
            "the last batch's commit",
        )
    finally:
        stop(query)
    assert len(sink) == len(set(sink)) == 320
    checked = [(bid, kafka, held) for bid, kafka, held in seen if held]
    assert len(checked) >= 5, seen
    for batch_id, kafka, held in checked:
        assert kafka == {p: held.get(p, 0) for p in kafka} and set(held) <= set(kafka), (
            f"batch {batch_id}: Kafka {kafka} != sink {held}"
        )
    assert committed(embedded_kafka, group, topic, PARTS) == sink_positions(sink)


def _restart_case(spark: Any, kafka: EmbeddedKafka, tmp_path: Path, name: str, kill: bool) -> None:
    topic, group = f"src-{name}", f"src-{name}-g"
    kafka.create_topic(topic, partitions=PARTS)
    produce(kafka, topic, PARTS, 100, "a")
    out, ck, log = tmp_path / "out", str(tmp_path / "ck"), tmp_path / "events.jsonl"

    def start() -> Any:
        df = reader(spark, kafka, group, topic, maxOffsetsPerTrigger=60, eventLog=str(log))
        return (
            df.select("topic", "partition", "offset", "value")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", ck)
            .trigger(processingTime="200 milliseconds")
            .start()
        )

    query = start()
    try:
        wait_for(lambda: input_rows(query) >= 120, 90, "some batches in the sink")
        if kill:
            pid = [e["pid"] for e in events(log) if e["kind"] == "start"][-1]
            os.kill(pid, signal.SIGKILL)  # the stream-reader process dies without leaving
            with pytest.raises(Exception):  # noqa: B017 - whatever Spark reports
                query.awaitTermination(60)
        else:
            query.stop()
        assert len(parquet_rows(spark, out)) < 400, "stopped too late to be mid-stream"
        produce(kafka, topic, PARTS, 50, "b")
        query = start()
        # Kafka commits only what the sink durably holds: all committed means all written.
        wait_for(
            lambda: committed(kafka, group, topic, PARTS) == dict.fromkeys(range(PARTS), 150),
            120,
            "every record after the restart",
        )
    finally:
        stop(query)
    rows = parquet_rows(spark, out)
    assert len(rows) == len(set(rows)) == 600, "loss or duplicate across the restart"
    assert set(rows) == all_records(kafka, topic, PARTS)


def test_stop_and_restart_from_checkpoint(
    spark: Any, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    _restart_case(spark, embedded_kafka, tmp_path, "restart", kill=False)


def test_killed_reader_process_and_restart(
    spark: Any, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """SIGKILL of the process hosting the member: the group keeps the zombie until its
    session expires (6 s here); the restarted query waits for the partitions, then resumes."""
    _restart_case(spark, embedded_kafka, tmp_path, "killed", kill=True)


def test_stopped_query_leaves_the_group(
    spark: Any, embedded_kafka_factory: Any, tmp_path: Path
) -> None:
    kafka = embedded_kafka_factory(brokers=1, heartbeat_interval_ms=500, session_timeout_ms=60000)
    topic, group = "src-leave", "src-leave-g"
    kafka.create_topic(topic, partitions=PARTS)
    produce(kafka, topic, PARTS, 10, "a")
    log = tmp_path / "events.jsonl"
    df = reader(spark, kafka, group, topic, eventLog=str(log))
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: input_rows(query) == 40, 90, "the first batch")
    finally:
        query.stop()
    stopped = time.monotonic()
    other = PlainMember(kafka, group, topic)
    try:
        # The session timeout is 60 s: getting every partition quickly means the query left.
        wait_for(lambda: len(other.owned) == PARTS, 15, "the partitions after the query left")
        assert time.monotonic() - stopped < 15
        wait_for(lambda: "left" in [e["kind"] for e in events(log)], 10, "the 'left' event")
    finally:
        other.close()


def test_the_pickled_reader_carries_no_member(embedded_kafka: EmbeddedKafka) -> None:
    """Spark pickles a second reader to executors: it must hold options and an id only."""
    import pickle

    from spark_integration import lifecycle
    from spark_integration.source import Kip848DataSource

    topic = "src-pickle"
    embedded_kafka.create_topic(topic, partitions=2)
    source = Kip848DataSource(
        {
            "kafka.bootstrap.servers": embedded_kafka.bootstrap_servers,
            "group.id": "src-pickle-g",
            "subscribe": topic,
        }
    )
    reader = source.streamReader(source.schema())
    assert reader.reader_id not in lifecycle._registry  # nothing happens in __init__
    initial = reader.initialOffset()  # creates and joins the member, in this process
    assert set(initial) == {topic, "@meta"}
    try:
        clone = pickle.loads(pickle.dumps(reader))
        assert vars(clone) == {"options": reader.options, "reader_id": reader.reader_id}
        member = lifecycle._registry[reader.reader_id].member
        assert member is not None and member.member_epoch > 0
    finally:
        reader.stop()
    assert reader.reader_id not in lifecycle._registry
