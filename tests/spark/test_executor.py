"""The executor-side range reader, in this process (no Spark): rows, schema, cache."""

from __future__ import annotations

import pytest

from consumer_sdk.testing import EmbeddedKafka
from spark_integration.offsets import OffsetRange
from spark_integration.options import SourceOptions

pa = pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[spark]')")


def test_read_range_yields_kafka_rows_and_reuses_its_consumer(
    embedded_kafka: EmbeddedKafka,
) -> None:
    from spark_integration.executor import (
        ReadTask,
        arrow_schema,
        cached_consumers,
        close_cached_consumers,
        read_range,
    )

    topic = "ex-read"
    embedded_kafka.create_topic(topic, partitions=1)
    embedded_kafka.produce(
        topic, [(f"k{i}", f"v{i}") for i in range(300)], partition=0, headers=[("h", b"1")]
    )
    opts = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": embedded_kafka.bootstrap_servers,
            "group.id": "ex-read-g",
            "subscribe": topic,
        }
    )
    config = opts.fetch_config("executor")

    def read(frm: int, until: int, headers: bool = False, size: int = 1000) -> list[pa.RecordBatch]:
        task = ReadTask.make(
            OffsetRange(topic, 0, frm, until),
            config,
            include_headers=headers,
            fail_on_data_loss=True,
            poll_timeout_ms=10_000,
            arrow_batch_size=size,
        )
        return list(read_range(task))

    close_cached_consumers()
    try:
        first = read(0, 100, headers=True, size=40)
        assert [b.num_rows for b in first] == [40, 40, 20]
        assert all(b.schema.equals(arrow_schema(True)) for b in first)
        rows = pa.Table.from_batches(first).to_pylist()
        assert [r["offset"] for r in rows] == list(range(100))
        assert rows[5]["key"] == b"k5" and rows[5]["value"] == b"v5"
        assert rows[5]["topic"] == topic and rows[5]["partition"] == 0
        assert rows[5]["timestampType"] == 0 and rows[5]["timestamp"].year >= 2024
        assert rows[5]["headers"] == [{"key": "h", "value": b"1"}]
        assert cached_consumers() == 1
        # Continues at 100 without a seek, then seeks back; one consumer throughout.
        nxt = pa.Table.from_batches(read(100, 300)).column("offset").to_pylist()
        assert nxt == list(range(100, 300))
        back = pa.Table.from_batches(read(10, 20)).column("offset").to_pylist()
        assert back == list(range(10, 20))
        assert cached_consumers() == 1
        assert read(50, 50) == []
        assert pa.Table.from_batches(read(0, 5)).schema.equals(arrow_schema(False))
    finally:
        close_cached_consumers()
    assert cached_consumers() == 0


def test_one_task_reads_several_ranges(embedded_kafka: EmbeddedKafka) -> None:
    from spark_integration.executor import ReadTask, close_cached_consumers, read_range

    topic = "ex-multi"
    embedded_kafka.create_topic(topic, partitions=3)
    for p in range(3):
        embedded_kafka.produce(topic, [f"v{p}-{i}".encode() for i in range(20)], partition=p)
    opts = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": embedded_kafka.bootstrap_servers,
            "group.id": "ex-multi-g",
            "subscribe": topic,
        }
    )
    ranges = [
        OffsetRange(topic, 0, 0, 20),
        OffsetRange(topic, 1, 5, 10),
        OffsetRange(topic, 2, 19, 20),
    ]
    task = ReadTask.make(
        ranges,
        opts.fetch_config("executor"),
        include_headers=False,
        fail_on_data_loss=True,
        poll_timeout_ms=10_000,
        arrow_batch_size=1000,
    )
    try:
        table = pa.Table.from_batches(list(read_range(task)))
    finally:
        close_cached_consumers()
    got = list(
        zip(table.column("partition").to_pylist(), table.column("offset").to_pylist(), strict=True)
    )
    assert got == [(0, o) for o in range(20)] + [(1, o) for o in range(5, 10)] + [(2, 19)]


def test_a_task_positions_its_consumers_up_front_and_returns_unread_ones(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """Consumers are positioned for every partition before the first range is read: rows
    stay exact across seeks back and forth, a partition twice in one task, and a reader
    stopped early, which returns the consumers it positioned to the pool."""
    from spark_integration.executor import (
        ReadTask,
        cached_consumers,
        close_cached_consumers,
        read_range,
    )

    topic, parts = "ex-prime", 4
    embedded_kafka.create_topic(topic, partitions=parts)
    for p in range(parts):
        embedded_kafka.produce(topic, [f"v{p}-{i}".encode() for i in range(50)], partition=p)
    opts = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": embedded_kafka.bootstrap_servers,
            "group.id": "ex-prime-g",
            "subscribe": topic,
        }
    )

    def task(ranges: list[tuple[int, int, int]], size: int = 1000) -> ReadTask:
        return ReadTask.make(
            [OffsetRange(topic, p, a, b) for p, a, b in ranges],
            opts.fetch_config("executor"),
            include_headers=False,
            fail_on_data_loss=True,
            poll_timeout_ms=10_000,
            arrow_batch_size=size,
        )

    def rows(t: ReadTask) -> list[tuple[int, int]]:
        table = pa.Table.from_batches(list(read_range(t)))
        return list(
            zip(
                table.column("partition").to_pylist(),
                table.column("offset").to_pylist(),
                strict=True,
            )
        )

    close_cached_consumers()
    try:
        assert rows(task([(p, 0, 20) for p in range(parts)])) == [
            (p, o) for p in range(parts) for o in range(20)
        ]
        assert cached_consumers() == parts
        mixed = [(0, 30, 40), (0, 40, 45), (1, 5, 15), (2, 20, 25), (3, 45, 50)]
        assert rows(task(mixed)) == [(p, o) for p, a, b in mixed for o in range(a, b)]
        assert cached_consumers() == parts
        early = task([(0, 0, 10), (1, 0, 10), (2, 0, 10)], size=5)
        reader = read_range(early)
        first = next(reader)
        assert first.column("offset").to_pylist() == [0, 1, 2, 3, 4]
        # While partition 0 is read, partitions 1 and 2 already have their consumers out
        # (positioned, fetching); only partition 3's idles in the pool.
        assert cached_consumers() == 1
        # Spark stopped reading: the consumer cut off mid-range is closed, the ones positioned
        # for partitions 1 and 2 go back to the pool.
        reader.close()
        assert cached_consumers() == parts - 1
        assert rows(early) == [(p, o) for p in range(3) for o in range(10)]
        assert cached_consumers() == parts
        assert rows(task([(3, 0, 3)])) == [(3, 0), (3, 1), (3, 2)]
    finally:
        close_cached_consumers()
    assert cached_consumers() == 0
