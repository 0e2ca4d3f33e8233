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
        # The next range, then back; one consumer throughout, unassigned between ranges.
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
        # Partition 0 had no consumer left: partition 3's idle one was assigned to it.
        assert cached_consumers() == parts - 1
        assert rows(task([(3, 0, 3)])) == [(3, 0), (3, 1), (3, 2)]
    finally:
        close_cached_consumers()
    assert cached_consumers() == 0


def test_an_idle_consumer_is_unassigned_and_reused_for_any_partition(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """A consumer whose range is done goes back to the pool with no partition assigned (it
    fetches nothing while idle); the next range, of its old partition or another one, takes
    it (assigned at the range's start) instead of creating one; rows stay exact, also for
    a range that continues where the consumer's last one ended, and the reuse is counted."""
    from spark_integration.executor import (
        ReadTask,
        cached_consumers,
        close_cached_consumers,
        idle_assignments,
        position_counts,
        read_range,
    )

    topic = "ex-repoint"
    embedded_kafka.create_topic(topic, partitions=3)
    for p in range(3):
        embedded_kafka.produce(topic, [f"v{p}-{i}".encode() for i in range(40)], partition=p)
    opts = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": embedded_kafka.bootstrap_servers,
            "group.id": "ex-repoint-g",
            "subscribe": topic,
        }
    )

    def rows(ranges: list[tuple[int, int, int]]) -> list[tuple[int, int, bytes]]:
        task = ReadTask.make(
            [OffsetRange(topic, p, a, b) for p, a, b in ranges],
            opts.fetch_config("executor"),
            include_headers=False,
            fail_on_data_loss=True,
            poll_timeout_ms=10_000,
            arrow_batch_size=1000,
        )
        table = pa.Table.from_batches(list(read_range(task)))
        return list(
            zip(
                table.column("partition").to_pylist(),
                table.column("offset").to_pylist(),
                table.column("value").to_pylist(),
                strict=True,
            )
        )

    def expected(p: int, a: int, b: int) -> list[tuple[int, int, bytes]]:
        return [(p, o, f"v{p}-{o}".encode()) for o in range(a, b)]

    close_cached_consumers()
    before = position_counts()
    try:
        assert rows([(0, 0, 10)]) == expected(0, 0, 10)
        assert idle_assignments() == [[]]
        assert rows([(1, 5, 20)]) == expected(1, 5, 20)  # partition 0's consumer
        assert cached_consumers() == 1
        assert rows([(1, 20, 30)]) == expected(1, 20, 30)  # where the last range ended
        assert rows([(1, 0, 3)]) == expected(1, 0, 3)  # back
        assert rows([(2, 30, 40)]) == expected(2, 30, 40)  # to the log end
        assert rows([(0, 10, 12), (1, 3, 5)]) == expected(0, 10, 12) + expected(1, 3, 5)
        assert cached_consumers() == 2  # the two-partition task needed a second one
        assert idle_assignments() == [[], []]
    finally:
        close_cached_consumers()
    after = position_counts()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert delta == {"created": 2, "reused": 5}


def _reference_rows(messages: list[object], include_headers: bool) -> list[dict[str, object]]:
    """What Spark's Kafka source yields for each message, built one record at a time."""
    from datetime import UTC, datetime, timedelta

    kinds = {0: -1, 1: 0, 2: 1}
    rows = []
    for m in messages:
        kind, ms = m.timestamp()  # type: ignore[attr-defined]
        row = {
            "key": m.key(),  # type: ignore[attr-defined]
            "value": m.value(),  # type: ignore[attr-defined]
            "topic": m.topic(),  # type: ignore[attr-defined]
            "partition": m.partition(),  # type: ignore[attr-defined]
            "offset": m.offset(),  # type: ignore[attr-defined]
            "timestamp": datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms),
            "timestampType": kinds[kind],
        }
        if include_headers:
            hs = m.headers()  # type: ignore[attr-defined]
            row["headers"] = [{"key": k, "value": v} for k, v in hs] if hs else None
        rows.append(row)
    return rows


def test_arrow_columns_match_each_record_exactly(embedded_kafka: EmbeddedKafka) -> None:
    """Keys and values (null ones too), headers (none, empty value, several), producer
    timestamps and offsets come out of a range read in batches, and out of
    ``records_to_batch``, exactly as a plain consumer sees each record; a range that ends
    inside a fetched batch stops at its end, and the next range continues from there."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from spark_integration.executor import (
        ReadTask,
        arrow_schema,
        close_cached_consumers,
        read_range,
        records_to_batch,
    )

    topic = "ex-exact"
    embedded_kafka.create_topic(topic, partitions=1)
    producer = Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers})
    base_ms = 1_700_000_000_123
    for i in range(120):
        producer.produce(
            topic,
            None if i % 11 == 3 else f"value-{i}".encode(),
            key=None if i % 7 == 2 else f"k{i}".encode(),
            partition=0,
            timestamp=base_ms + 1000 * i,
            headers=None if i % 3 == 0 else [("a", f"{i}".encode()), ("b", None), ("a", b"")],
        )
    assert producer.flush(10) == 0

    plain = Consumer(
        {
            "bootstrap.servers": embedded_kafka.bootstrap_servers,
            "group.id": "ex-exact-plain",
            "enable.auto.commit": False,
        }
    )
    try:
        plain.assign([TopicPartition(topic, 0, 0)])
        messages: list[object] = []
        while len(messages) < 120:
            messages += [m for m in plain.consume(120 - len(messages), 5.0) if m.error() is None]
    finally:
        plain.close()
    opts = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": embedded_kafka.bootstrap_servers,
            "group.id": "ex-exact-g",
            "subscribe": topic,
        }
    )

    def read(frm: int, until: int, headers: bool) -> list[pa.RecordBatch]:
        task = ReadTask.make(
            OffsetRange(topic, 0, frm, until),
            opts.fetch_config("executor"),
            include_headers=headers,
            fail_on_data_loss=True,
            poll_timeout_ms=10_000,
            arrow_batch_size=7,
        )
        return list(read_range(task))

    close_cached_consumers()
    try:
        for headers in (True, False):
            ref = _reference_rows(messages, headers)
            assert records_to_batch(messages, headers).to_pylist() == ref  # type: ignore[arg-type]
            first = read(0, 45, headers)
            assert [b.num_rows for b in first] == [7] * 6 + [3]
            assert all(b.schema.equals(arrow_schema(headers)) for b in first)
            rest = read(45, 120, headers)
            assert pa.Table.from_batches(first + rest).to_pylist() == ref
            assert pa.Table.from_batches(read(3, 4, headers)).to_pylist() == ref[3:4]
    finally:
        close_cached_consumers()
    assert records_to_batch([]).num_rows == 0


def test_ranges_over_transaction_markers_end_exactly(embedded_kafka: EmbeddedKafka) -> None:
    """Committed transactions leave a control record (an offset with no record) after each
    transaction: a range ending just past one stops at its end although the consumer has
    the next records fetched, and the next range continues from there."""
    from confluent_kafka import Producer

    from spark_integration.executor import ReadTask, close_cached_consumers, read_range

    topic = "ex-txn"
    embedded_kafka.create_topic(topic, partitions=1)
    producer = Producer(
        {"bootstrap.servers": embedded_kafka.bootstrap_servers, "transactional.id": "ex-txn"}
    )
    producer.init_transactions(30)
    for _ in range(3):  # offsets 0-4, 6-10, 12-16; markers at 5, 11, 17
        producer.begin_transaction()
        for i in range(5):
            producer.produce(topic, f"v{i}".encode(), partition=0)
        producer.commit_transaction(30)
    opts = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": embedded_kafka.bootstrap_servers,
            "group.id": "ex-txn-g",
            "subscribe": topic,
        }
    )

    def offsets(frm: int, until: int) -> list[int]:
        task = ReadTask.make(
            OffsetRange(topic, 0, frm, until),
            opts.fetch_config("executor"),
            include_headers=False,
            fail_on_data_loss=True,
            poll_timeout_ms=10_000,
            arrow_batch_size=4,
        )
        batches = list(read_range(task))
        assert all(b.num_rows <= 4 for b in batches)
        return [o for b in batches for o in b.column("offset").to_pylist()]

    close_cached_consumers()
    try:
        assert offsets(0, 7) == [0, 1, 2, 3, 4, 6]
        assert offsets(7, 13) == [7, 8, 9, 10, 12]
        assert offsets(13, 18) == [13, 14, 15, 16]
        assert offsets(5, 6) == []
        assert offsets(0, 18) == [o for o in range(17) if o not in (5, 11)]
    finally:
        close_cached_consumers()
