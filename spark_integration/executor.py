"""Executor side: read one offset range with a pooled assign-only consumer, as Arrow batches.

The consumers live in this module's globals, so they survive across tasks in a reused
Python worker (Spark reuses workers; an idle one is killed after a minute, closing them).
They use the group id ``<group.id>-spark-executor``, never subscribe and never commit, so
they never join a group. Spark hands a task to any idle Python worker, so a range rarely
lands where its partition was read before: a range takes any idle connected consumer of
the worker, assigned at the range's start (its connection and metadata stay), and only
then a new one. A consumer whose range is done is unassigned when it goes back to the
pool: it stops fetching at once (an idle consumer sends no fetch and costs no CPU), and
no fetch of its old partition is left in flight for the next range's first fetch to wait
behind (librdkafka sends one fetch request at a time per broker connection).
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import is_, is_not, itemgetter
from typing import Any, cast

import pyarrow as pa
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from spark_integration.offsets import DataLossError, OffsetRange

__all__ = [
    "KAFKA_SCHEMA_DDL",
    "DataLossError",
    "ReadTask",
    "arrow_schema",
    "cached_consumers",
    "close_cached_consumers",
    "idle_assignments",
    "position_counts",
    "read_range",
    "records_to_batch",
]

log = logging.getLogger("spark_integration")
#: librdkafka's own log lines (e.g. reconnect attempts of an idle cached consumer).
_KAFKA_LOG = logging.getLogger("spark_integration.librdkafka")

#: Spark's Kafka source schema (``headers`` only with ``includeHeaders``).
KAFKA_SCHEMA_DDL = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
HEADERS_DDL = "headers array<struct<key:string,value:binary>>"

_CACHE_CAPACITY = 64
_IDLE_CLOSE_S = 300.0
_CONSUME_SLICE_S = 0.5
_STALL_CHECK_S = 3.0
_UNKNOWN = frozenset(
    {KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC, KafkaError._UNKNOWN_PARTITION}
)
# confluent-kafka's TIMESTAMP_* -> Kafka's TimestampType id, as Spark's source reports it.
_TIMESTAMP_TYPE = {0: -1, 1: 0, 2: 1}
# Unbound C methods, mapped over a consume() batch without a Python frame per record.
_KEY, _VALUE, _OFFSET, _ERROR = Message.key, Message.value, Message.offset, Message.error
_TIMESTAMP, _TOPIC, _PARTITION = Message.timestamp, Message.topic, Message.partition
_FIRST, _SECOND = itemgetter(0), itemgetter(1)
_TS_MS, _TS_US = pa.timestamp("ms", tz="UTC"), pa.timestamp("us", tz="UTC")
_HEADERS_TYPE = pa.list_(
    pa.field("element", pa.struct([pa.field("key", pa.string()), pa.field("value", pa.binary())]))
)


def arrow_schema(include_headers: bool) -> pa.Schema:
    """Exactly ``to_arrow_schema(kafka_schema, timezone="UTC")`` of pyspark 4.2+."""
    fields = [
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("topic", pa.string()),
        pa.field("partition", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("timestamp", _TS_US),
        pa.field("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(pa.field("headers", _HEADERS_TYPE))
    return pa.schema(fields)


@dataclass(frozen=True)
class ReadTask:
    """What one Spark task reads: offset ranges plus the settings to read them (picklable)."""

    ranges: tuple[OffsetRange, ...]
    config: tuple[tuple[str, str], ...]
    include_headers: bool
    fail_on_data_loss: bool
    poll_timeout_ms: int
    arrow_batch_size: int

    @property
    def range(self) -> OffsetRange:
        """The first range (a task built from one range has only that one)."""
        return self.ranges[0]

    @classmethod
    def make(
        cls,
        ranges: OffsetRange | Sequence[OffsetRange],
        config: Mapping[str, Any],
        *,
        include_headers: bool,
        fail_on_data_loss: bool,
        poll_timeout_ms: int,
        arrow_batch_size: int,
    ) -> ReadTask:
        return cls(
            (ranges,) if isinstance(ranges, OffsetRange) else tuple(ranges),
            tuple(sorted((str(k), str(v)) for k, v in config.items())),
            include_headers,
            fail_on_data_loss,
            poll_timeout_ms,
            arrow_batch_size,
        )


class _Cached:
    def __init__(self, pool: str, config: Mapping[str, str]) -> None:
        self.pool = pool
        self.consumer = Consumer({**config, "logger": _KAFKA_LOG})
        # It had a partition before: its first records are checked to be this range's.
        self.reused = False
        self.last_used = time.monotonic()


_lock = threading.Lock()
#: Idle consumers, least recently used first.
_idle: list[_Cached] = []
#: How the ranges of this process got their consumer: ``reused`` or ``created``.
_positions: Counter[str] = Counter()


def _close(entry: _Cached) -> None:
    try:
        entry.consumer.close()
    except Exception as exc:  # closing is best-effort
        log.debug("closing a cached consumer failed: %s", exc)


def _pool_key(config: tuple[tuple[str, str], ...]) -> str:
    """Consumers are shared by every query of the worker with the same connection settings:
    they only read assigned ranges (no group membership, no commits), so the group and
    client ids, which differ per query, do not matter."""
    return json.dumps([kv for kv in config if kv[0] not in ("group.id", "client.id")])


def _checkout(config: tuple[tuple[str, str], ...]) -> _Cached:
    """The most recently used idle consumer with these connection settings, else a new one."""
    pool = _pool_key(config)
    with _lock:
        now = time.monotonic()
        stale = [e for e in _idle if now - e.last_used > _IDLE_CLOSE_S]
        _idle[:] = [e for e in _idle if now - e.last_used <= _IDLE_CLOSE_S]
        entry = next((e for e in reversed(_idle) if e.pool == pool), None)
        if entry is not None:
            _idle.remove(entry)
    for e in stale:
        _close(e)
    return entry if entry is not None else _Cached(pool, dict(config))


def _checkin(e: _Cached) -> None:
    """Back to the pool, unassigned: it stops fetching and drops what it prefetched."""
    try:
        e.consumer.unassign()
    except KafkaException as exc:
        log.debug("unassigning a cached consumer failed, closing it: %s", exc)
        _close(e)
        return
    e.reused = True
    e.last_used = time.monotonic()
    with _lock:
        _idle.append(e)
        old = _idle[: max(len(_idle) - _CACHE_CAPACITY, 0)]
        del _idle[: len(old)]
    for o in old:
        _close(o)


def cached_consumers() -> int:
    """How many consumers this worker process keeps (for tests and diagnostics)."""
    with _lock:
        return len(_idle)


def idle_assignments() -> list[list[tuple[str, int]]]:
    """The partitions each idle consumer of this process has assigned (none: an idle
    consumer fetches nothing). For tests and diagnostics."""
    with _lock:
        entries = list(_idle)
    return [[(tp.topic, tp.partition) for tp in e.consumer.assignment()] for e in entries]


def position_counts() -> dict[str, int]:
    """How the ranges this process read got their consumer: ``reused`` (an idle one of the
    pool, assigned at the range's start) or ``created``. For benchmarks and diagnostics."""
    with _lock:
        return dict(_positions)


def close_cached_consumers() -> None:
    """Close every cached consumer of this process."""
    with _lock:
        entries = list(_idle)
        _idle.clear()
    for e in entries:
        _close(e)


atexit.register(close_cached_consumers)


class _Columns:
    """Columns of one partition's records, collected a ``consume()`` batch at a time: each
    column is gathered with a C-level ``map`` over the batch (no per-record Python frame),
    and the Arrow arrays are built once per Arrow batch."""

    def __init__(self, include_headers: bool) -> None:
        self.include_headers = include_headers
        self.clear()

    def clear(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int | None] = []
        self.timestamps: list[tuple[int, int]] = []  # (confluent-kafka type, ms)
        self.headers: list[list[dict[str, Any]] | None] = []

    def __len__(self) -> int:
        return len(self.offsets)

    def extend(self, msgs: Sequence[Message], offsets: Sequence[int | None]) -> None:
        """Add data records (no error events); ``offsets`` are theirs, in the same order."""
        self.keys.extend(map(_KEY, msgs))
        self.values.extend(map(_VALUE, msgs))
        self.offsets.extend(offsets)
        self.timestamps.extend(map(_TIMESTAMP, msgs))
        if self.include_headers:
            self.headers.extend(map(_header_rows, msgs))

    def arrays(self) -> list[pa.Array]:
        """The key, value, offset, timestamp, timestampType (and headers) arrays; clears."""
        arrays = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.array(self.offsets, pa.int64()),
            # A safe cast: out-of-range milliseconds raise, as converting ms * 1000 does.
            pa.array(list(map(_SECOND, self.timestamps)), _TS_MS).cast(_TS_US),
            _timestamp_types(self.timestamps),
        ]
        if self.include_headers:
            arrays.append(pa.array(self.headers, _HEADERS_TYPE))
        self.clear()
        return arrays

    def batch(self, schema: pa.Schema, topic: str, partition: int) -> pa.RecordBatch:
        n = len(self.offsets)
        key, value, offset, ts, ts_type, *headers = self.arrays()
        topics = pa.repeat(pa.scalar(topic, pa.string()), n)
        partitions = pa.repeat(pa.scalar(partition, pa.int32()), n)
        return pa.RecordBatch.from_arrays(
            [key, value, topics, partitions, offset, ts, ts_type, *headers], schema=schema
        )


def _header_rows(msg: Any) -> list[dict[str, Any]] | None:
    headers = msg.headers()
    return [{"key": k, "value": v} for k, v in headers] if headers else None


def _timestamp_types(timestamps: list[tuple[int, int]]) -> pa.Array:
    """Spark's timestampType per record; one ``pa.repeat`` when the batch has one kind."""
    distinct = set(map(_FIRST, timestamps))
    if len(distinct) == 1:
        (kind,) = distinct
        return pa.repeat(pa.scalar(_TIMESTAMP_TYPE.get(kind, -1), pa.int32()), len(timestamps))
    return pa.array([_TIMESTAMP_TYPE.get(k, -1) for k, _ in timestamps], pa.int32())


def records_to_batch(messages: list[Message], include_headers: bool = False) -> pa.RecordBatch:
    """confluent-kafka messages (any partitions) as one batch in the Kafka source schema."""
    cols = _Columns(include_headers)
    cols.extend(messages, list(map(_OFFSET, messages)))
    key, value, offset, ts, ts_type, *headers = cols.arrays()
    topics = pa.array(list(map(_TOPIC, messages)), pa.string())
    partitions = pa.array(list(map(_PARTITION, messages)), pa.int32())
    return pa.RecordBatch.from_arrays(
        [key, value, topics, partitions, offset, ts, ts_type, *headers],
        schema=arrow_schema(include_headers),
    )


def _data_loss(task: ReadTask, r: OffsetRange, message: str) -> None:
    text = (
        f"kip848: {r.topic}[{r.partition}] offsets [{r.from_offset}, {r.until_offset}): "
        f"{message}. Records may have been lost (deleted topic, retention or truncation)"
    )
    if task.fail_on_data_loss:
        raise DataLossError(text + "; set failOnDataLoss=false to skip them with a warning")
    log.warning("%s; skipped (failOnDataLoss=false)", text)


def read_range(task: ReadTask) -> Iterator[pa.RecordBatch]:
    """Yield the task's ranges as Arrow record batches in the Kafka source schema.

    Every partition's consumer is assigned at its first range's start before the first
    range is read, so their fetches run at once instead of
    one round trip after another (a task of a small batch reads many short ranges, often
    with consumers last used by another task). Small ranges of one task are combined into
    batches of up to ``arrow_batch_size`` rows: each batch costs Spark a round of Arrow IPC
    and JVM conversion.
    """
    schema = arrow_schema(task.include_headers)
    ranges = [r for r in task.ranges if r.size > 0]
    # Each partition's consumer, assigned at the partition's first range (popped by it).
    primed: dict[tuple[str, int], _Cached] = {}
    pending: list[pa.RecordBatch] = []
    rows = 0
    try:
        for r in ranges:
            if r.tp not in primed:
                primed[r.tp] = _position(task, r)
        for r in ranges:
            for batch in _read_one(task, r, schema, primed.pop(r.tp, None)):
                if rows + batch.num_rows > task.arrow_batch_size and pending:
                    yield _concat(pending)
                    pending, rows = [], 0
                pending.append(batch)
                rows += batch.num_rows
    finally:
        for entry in primed.values():  # not read (error, early stop)
            _checkin(entry)
    if pending:
        yield _concat(pending)


def _concat(batches: list[pa.RecordBatch]) -> pa.RecordBatch:
    return batches[0] if len(batches) == 1 else pa.concat_batches(batches)


def _position(task: ReadTask, r: OffsetRange) -> _Cached:
    """A consumer assigned ``r``'s partition at ``r.from_offset`` (fetching from there)."""
    entry = _checkout(task.config)
    try:
        entry.consumer.assign([TopicPartition(r.topic, r.partition, r.from_offset)])
    except BaseException:
        _close(entry)
        raise
    with _lock:
        _positions["reused" if entry.reused else "created"] += 1
    return entry


def _read_one(
    task: ReadTask, r: OffsetRange, schema: pa.Schema, entry: _Cached | None = None
) -> Iterator[pa.RecordBatch]:
    if entry is None:
        entry = _position(task, r)
    clean = False
    try:
        yield from _consume(entry, task, r, schema)
        clean = True
    finally:
        if clean:
            _checkin(entry)
        else:
            _close(entry)


def _consume(
    entry: _Cached, task: ReadTask, r: OffsetRange, schema: pa.Schema
) -> Iterator[pa.RecordBatch]:
    cols = _Columns(task.include_headers)
    position = r.from_offset  # next offset this range still needs
    deadline = time.monotonic() + task.poll_timeout_ms / 1000
    stall_check = time.monotonic() + _STALL_CHECK_S
    size = task.arrow_batch_size
    while position < r.until_offset:
        # Never more than the range still needs nor than fits the Arrow batch being filled.
        wanted = min(r.until_offset - position, size - len(cols))
        msgs = entry.consumer.consume(wanted, _CONSUME_SLICE_S)
        if entry.reused and msgs:
            msgs = _only_this_partition(entry, r, msgs)
        offsets = cast(list[int], list(map(_OFFSET, msgs)))  # ints unless an error event
        # (`is not`, not ==: KafkaError's == with None leaves a TypeError set.)
        errors = any(map(is_not, map(_ERROR, msgs), repeat(None)))
        if msgs and not errors and offsets[0] >= position:
            # Only records, none left over from before a seek: the whole batch at once.
            # One partition's records come in offset order, so a cut at the range's end
            # is a bisection and the rest are below it.
            if offsets[-1] >= r.until_offset:
                cut = bisect_left(offsets, r.until_offset)
                msgs, offsets = msgs[:cut], offsets[:cut]
                position = r.until_offset
            if offsets:
                cols.extend(msgs, offsets)
                position = max(position, offsets[-1] + 1)
            progressed = bool(offsets)
        else:
            progressed, position, lost = _consume_slowly(task, entry, r, msgs, cols, position)
            if lost:
                return
        if len(cols) >= size:
            yield cols.batch(schema, r.topic, r.partition)
        if position >= r.until_offset:
            break
        if not progressed:
            # Control records (transactions) and compaction leave gaps: ask the position.
            pos = entry.consumer.position([TopicPartition(r.topic, r.partition)])[0].offset
            if pos >= r.until_offset:
                break
            if time.monotonic() > stall_check and _topic_gone(entry, r.topic, r.partition):
                _data_loss(task, r, "the topic or partition no longer exists")
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"reading {r.topic}[{r.partition}] stalled at offset {position} for "
                    f"{task.poll_timeout_ms} ms (kafkaConsumer.pollTimeoutMs) before reaching "
                    f"{r.until_offset}"
                )
        else:
            deadline = time.monotonic() + task.poll_timeout_ms / 1000
            stall_check = time.monotonic() + _STALL_CHECK_S
    if len(cols):
        yield cols.batch(schema, r.topic, r.partition)


def _only_this_partition(entry: _Cached, r: OffsetRange, msgs: list[Message]) -> list[Message]:
    """Records of ``r``'s partition (and error events) from a consumer that had a partition
    assigned before. librdkafka drops what an unassigned partition prefetched; this checks
    it until a batch holds only this partition's records."""
    if set(map(_PARTITION, msgs)) == {r.partition} and set(map(_TOPIC, msgs)) == {r.topic}:
        if any(map(is_, map(_ERROR, msgs), repeat(None))):  # a record, not only events
            entry.reused = False
        return msgs
    kept = [
        m
        for m in msgs
        if m.error() is not None or (m.partition() == r.partition and m.topic() == r.topic)
    ]
    if len(kept) < len(msgs):
        log.debug("kip848: dropped %d records of a previous assignment", len(msgs) - len(kept))
    elif any(m.error() is None for m in kept):
        entry.reused = False
    return kept


def _consume_slowly(
    task: ReadTask, entry: _Cached, r: OffsetRange, msgs: list[Message], cols: _Columns, at: int
) -> tuple[bool, int, bool]:
    """A ``consume()`` batch with error events or stale records, one message at a time.

    Returns (progressed, the new position, whether the partition is gone: stop reading)."""
    position, progressed = at, False
    data: list[Message] = []
    data_offsets: list[int | None] = []
    for msg in msgs:
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                eof = msg.offset()
                if eof is not None and eof >= r.until_offset:
                    position = r.until_offset  # the rest were control records or gaps
                elif eof is not None:
                    # Not there yet (e.g. read_committed behind an open transaction).
                    position = max(position, eof)
                continue
            if err.code() == KafkaError._AUTO_OFFSET_RESET or (
                err.code() == KafkaError.OFFSET_OUT_OF_RANGE
            ):
                _data_loss(task, r, f"offset {position} is out of range ({err.str()})")
                return_to = _earliest_after(entry, r.topic, r.partition, position)
                if return_to is None or return_to >= r.until_offset:
                    position = r.until_offset
                else:
                    position = return_to
                    entry.consumer.assign([TopicPartition(r.topic, r.partition, position)])
                progressed = True
                break
            if err.code() in _UNKNOWN:
                if _topic_gone(entry, r.topic, r.partition):
                    _data_loss(task, r, f"the topic or partition no longer exists ({err.str()})")
                    return progressed, position, True
                continue
            if err.fatal() or not err.retriable():
                raise KafkaException(err)
            log.warning("reading %s[%d]: %s", r.topic, r.partition, err.str())
            continue
        offset = msg.offset()
        if offset is None or offset < position:
            continue  # left over from before a seek
        if offset >= r.until_offset:
            position = r.until_offset
            break
        data.append(msg)
        data_offsets.append(offset)
        position = offset + 1
        progressed = True
    if data:
        cols.extend(data, data_offsets)
    return progressed, position, False


def _earliest_after(entry: _Cached, topic: str, partition: int, position: int) -> int | None:
    try:
        low, _ = entry.consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=10.0, cached=False
        )
    except KafkaException:
        return None
    return max(int(low), position)


def _topic_gone(entry: _Cached, topic: str, partition: int) -> bool:
    """Whether the broker no longer knows ``topic[partition]`` (a deleted topic)."""
    try:
        md = entry.consumer.list_topics(topic, timeout=10.0)
    except KafkaException:
        return False
    meta = md.topics.get(topic)
    if meta is None:
        return True
    if meta.error is not None and meta.error.code() in _UNKNOWN:
        return True
    return partition not in meta.partitions
