"""The kip848 source against a real Kafka broker (the `real_kafka` fixture): partition
increase, topic deletion, timestamp lookups and AvailableNow exactly-once, which the
librdkafka mock cannot show (no partition increase, no real deletion, no timestamp index)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.spark.helpers import Record, all_records, committed, high_watermarks, produce, wait_for

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")
pytestmark = pytest.mark.spark


def rows(df: Any) -> list[Record]:
    return [
        (r.topic, r.partition, r.offset)
        for r in df.select("topic", "partition", "offset").collect()
    ]


def stream(spark: Any, kafka: Any, **options: Any) -> Any:
    reader = spark.readStream.format("kip848").option(
        "kafka.bootstrap.servers", kafka.bootstrap_servers
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def events(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_partition_increase_is_read_from_the_start(
    spark: Any, real_kafka: Any, tmp_path: Path
) -> None:
    topic = "rk-grow"
    real_kafka.create_topic(topic, partitions=2)
    produce(real_kafka, topic, 2, 5, "old")  # before the query: skipped (startingOffsets=latest)
    df = stream(
        spark, real_kafka, subscribe=topic, startingOffsets="latest", **{"group.id": "rk-grow-g"}
    )
    query = (
        df.writeStream.format("memory")
        .queryName("rk_grow")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="300 milliseconds")
        .start()
    )
    try:
        wait_for(lambda: query.recentProgress, 120, "the first batch")
        produce(real_kafka, topic, 2, 3, "mid")
        real_kafka.add_partitions(topic, 4)
        import confluent_kafka

        # A new producer: the fixture's cached one knows only the old partition count.
        producer = confluent_kafka.Producer({"bootstrap.servers": real_kafka.bootstrap_servers})
        for p in (2, 3):
            for i in range(4):
                producer.produce(topic, f"new-{p}-{i}".encode(), partition=p)
        assert producer.flush(30) == 0
        del producer
        expected = {(topic, p, o) for p in (0, 1) for o in range(5, 8)} | {
            (topic, p, o) for p in (2, 3) for o in range(4)
        }
        wait_for(
            lambda: set(rows(spark.sql("select * from rk_grow"))) == expected,
            120,
            "the added partitions read from offset 0",
        )
        assert query.exception() is None
    finally:
        query.stop()
    got = rows(spark.sql("select * from rk_grow"))
    assert len(got) == len(set(got))


def test_deleted_topic_fails_the_query_naming_it(
    spark: Any, real_kafka: Any, tmp_path: Path
) -> None:
    topic = "rk-del-strict"
    real_kafka.create_topic(topic, partitions=2)
    produce(real_kafka, topic, 2, 300, "a")
    df = stream(
        spark,
        real_kafka,
        subscribe=topic,
        startingOffsets="earliest",
        maxOffsetsPerTrigger=20,
        **{"group.id": "rk-del-strict-g"},
    )
    query = (
        df.writeStream.format("noop")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        wait_for(lambda: any(p["numInputRows"] for p in query.recentProgress), 120, "a first batch")
        real_kafka.delete_topic(topic)
        with pytest.raises(Exception, match=r"(?s)rk-del-strict.*failOnDataLoss=false"):
            query.awaitTermination(120)
    finally:
        query.stop()


def test_deleted_topic_is_skipped_with_a_warning_when_allowed(
    spark: Any, real_kafka: Any, tmp_path: Path
) -> None:
    keep, gone = "rk-del2-keep", "rk-del2-gone"
    real_kafka.create_topic(keep, partitions=2)
    real_kafka.create_topic(gone, partitions=2)
    produce(real_kafka, keep, 2, 100, "a")
    produce(real_kafka, gone, 2, 100, "a")
    log = tmp_path / "events.jsonl"
    df = stream(
        spark,
        real_kafka,
        subscribePattern="rk-del2-.*",
        startingOffsets="earliest",
        maxOffsetsPerTrigger=20,
        failOnDataLoss="false",
        eventLog=str(log),
        **{"group.id": "rk-del2-g"},
    )
    query = (
        df.writeStream.format("memory")
        .queryName("rk_del2")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="500 milliseconds")
        .start()
    )
    try:
        wait_for(
            lambda: {t for t, _, _ in rows(spark.sql("select * from rk_del2"))} == {keep, gone},
            120,
            "both topics read",
        )
        real_kafka.delete_topic(gone)
        produce(real_kafka, keep, 2, 10, "b")
        expected = all_records(real_kafka, keep, 2)
        wait_for(
            lambda: (
                {r for r in rows(spark.sql("select * from rk_del2")) if r[0] == keep} == expected
            ),
            120,
            "the other topic read to its end",
        )
        assert query.isActive and query.exception() is None
        deleted = [e for e in events(log) if e["kind"] == "deleted"]
        assert deleted and set(deleted[0]["partitions"]) <= {f"{gone}:0", f"{gone}:1"}
    finally:
        query.stop()


def test_timestamps_on_a_real_broker(spark: Any, real_kafka: Any) -> None:
    """startingTimestamp / startingOffsetsByTimestamp (streaming) and a batch read between
    two timestamps, through ListOffsets by time (the mock has no timestamp index)."""
    import confluent_kafka

    from spark_integration.driver import GroupReader
    from spark_integration.offsets import SourceOffset
    from spark_integration.options import SourceOptions

    topic = "rk-time"
    real_kafka.create_topic(topic, partitions=2)
    producer = confluent_kafka.Producer({"bootstrap.servers": real_kafka.bootstrap_servers})
    base = int(time.time() * 1000) - 100_000
    for p in range(2):
        for i in range(10):
            producer.produce(topic, f"v{i}".encode(), partition=p, timestamp=base + i * 1000)
    assert producer.flush(30) == 0
    del producer

    def initial(group: str, **extra: str) -> dict[int, int]:
        reader = GroupReader(
            SourceOptions.parse(
                {
                    "kafka.bootstrap.servers": real_kafka.bootstrap_servers,
                    "group.id": group,
                    "subscribe": topic,
                    **extra,
                }
            )
        )
        try:
            start = SourceOffset.from_json(reader.initial_offset())
            return {p: o for (_, p), o in start.positions.items()}
        finally:
            reader.close()

    assert initial("rk-time-1", startingTimestamp=str(base + 3000)) == {0: 3, 1: 3}
    by_ts = json.dumps({topic: {"0": base + 6500, "1": base}})
    assert initial("rk-time-2", startingOffsetsByTimestamp=by_ts) == {0: 7, 1: 0}
    got = (
        spark.read.format("kip848")
        .option("kafka.bootstrap.servers", real_kafka.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingTimestamp", str(base + 4000))
        .option("endingTimestamp", str(base + 7000))
        .load()
    )
    assert sorted(rows(got)) == [(topic, p, o) for p in range(2) for o in range(4, 7)]


def test_available_now_is_exactly_once_across_runs(
    spark: Any, real_kafka: Any, tmp_path: Path
) -> None:
    from pyspark.errors import AnalysisException

    topic, group = "rk-avail", "rk-avail-g"
    real_kafka.create_topic(topic, partitions=3)
    produce(real_kafka, topic, 3, 200, "a")
    out, ck = tmp_path / "out", str(tmp_path / "ck")

    def run(stop_early: bool) -> None:
        df = stream(
            spark,
            real_kafka,
            subscribe=topic,
            startingOffsets="earliest",
            maxOffsetsPerTrigger=100,
            eventLog=str(tmp_path / "events.jsonl"),
            **{"group.id": group},
        )
        query = (
            df.select("topic", "partition", "offset")
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", ck)
            .trigger(availableNow=True)
            .start()
        )
        if stop_early:  # stopped after its first batches, mid-run
            wait_for(
                lambda: len(query.recentProgress) >= 2 or not query.isActive, 120, "two batches"
            )
            query.stop()
        else:
            assert query.awaitTermination(180)
        assert query.exception() is None
        progress.append(
            [
                (
                    p["batchId"],
                    p["numInputRows"],
                    p["sources"][0]["startOffset"],
                    p["sources"][0]["endOffset"],
                )
                for p in query.recentProgress
            ]
        )

    def sink() -> list[Record]:
        try:
            return rows(spark.read.parquet(str(out)))
        except AnalysisException:
            return []

    progress: list[Any] = []
    run(stop_early=True)  # on a fast machine the run may also have finished: both are fine
    produce(real_kafka, topic, 3, 50, "b")
    run(stop_early=False)
    got = sink()
    assert len(got) == len(set(got)) == 750, f"loss or duplicate across the runs: {progress}"
    kinds = [e["kind"] for e in events(tmp_path / "events.jsonl")]
    # The finished run left the group. The stopped one leaves too unless query.stop() lands
    # while Spark plans a batch: Spark then interrupts the planner (ClosedByInterruptException)
    # and ends the reader process before it can leave (docs/spark.md: its partitions wait one
    # session timeout); exactly-once above holds either way.
    assert 1 <= kinds.count("left") <= 2, kinds
    assert set(got) == all_records(real_kafka, topic, 3)
    ends = high_watermarks(real_kafka, topic, 3)
    wait_for(
        lambda: committed(real_kafka, group, topic, 3) == ends, 30, "the group's offsets at the end"
    )
