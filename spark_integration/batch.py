"""Batch reads (``spark.read.format("kip848")``): resolve offset ranges once, no group.

Partitions come from ``subscribe`` (every listed topic must exist), ``subscribePattern``
(topics matching now) or ``assign``. Each partition is read from its starting position
(``startingTimestamp`` > ``startingOffsetsByTimestamp`` > ``startingOffsets``, default
earliest) up to its ending position (``endingTimestamp`` > ``endingOffsetsByTimestamp`` >
``endingOffsets``, default latest), both resolved when Spark plans the query.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaException, TopicPartition

from spark_integration.offsets import (
    EARLIEST,
    LATEST,
    DataLossError,
    OffsetRange,
    Partition,
    SourceStartupError,
    split_by_size,
    split_ranges,
)
from spark_integration.options import SourceOptions

__all__ = ["plan_batch"]

log = logging.getLogger("spark_integration")
_KAFKA_LOG = logging.getLogger("spark_integration.librdkafka")


def _retry(options: SourceOptions, what: str, call):  # type: ignore[no-untyped-def]
    for attempt in range(options.fetch_retries + 1):
        try:
            return call()
        except KafkaException as exc:
            if exc.args[0].fatal() or attempt == options.fetch_retries:
                raise KafkaException(exc.args[0]) from None
            log.info("kip848: %s failed (%s); retrying", what, exc.args[0].str())
            time.sleep(options.fetch_retry_interval_ms / 1000)
    raise AssertionError("unreachable")


def _partitions(client: Consumer, o: SourceOptions) -> list[Partition]:
    deadline = time.monotonic() + o.join_timeout_ms / 1000
    while True:
        try:
            md = client.list_topics(timeout=max(min(deadline - time.monotonic(), 5.0), 0.5))
        except KafkaException as exc:
            if time.monotonic() >= deadline:
                raise SourceStartupError(
                    f"kip848: no Kafka broker answered at kafka.bootstrap.servers="
                    f"{o.bootstrap_servers} within {o.join_timeout_ms} ms (joinTimeoutMs): "
                    f"{exc.args[0].str()}"
                ) from None
            time.sleep(0.5)
            continue
        topics = {n: sorted(t.partitions) for n, t in md.topics.items() if t.error is None}
        if o.assign:
            missing = [f"{t}[{p}]" for t, p in o.assign if p not in topics.get(t, ())]
        else:
            missing = [t for t in o.topics if t not in topics]
        if not missing:
            if o.assign:
                return list(o.assign)
            return sorted((t, p) for t, ps in topics.items() if o.matches(t) for p in ps)
        if time.monotonic() >= deadline:
            raise SourceStartupError(
                f"kip848: {'partition(s)' if o.assign else 'topic(s)'} {missing} do not exist "
                f"on {o.bootstrap_servers} (waited {o.join_timeout_ms} ms, joinTimeoutMs)"
            )
        time.sleep(0.5)


def _by_time(
    client: Consumer, o: SourceOptions, stamps: Mapping[Partition, int]
) -> dict[Partition, int]:
    """First offset at or after each timestamp; -1 where no record is that recent."""
    if not stamps:
        return {}
    query = [TopicPartition(t, p, ts) for (t, p), ts in sorted(stamps.items())]
    found = _retry(
        o, "offsets for timestamps", lambda: client.offsets_for_times(query, timeout=10.0)
    )
    out = {}
    for tp in found:
        if tp.error is not None:
            raise KafkaException(tp.error)
        out[(tp.topic, tp.partition)] = tp.offset
    return out


def plan_batch(o: SourceOptions) -> list[OffsetRange]:
    """The offset ranges of a batch query (split by maxRecordsPerPartition / minPartitions)."""
    client = Consumer({**o.fetch_config("driver"), "logger": _KAFKA_LOG})
    try:
        parts = _partitions(client, o)
        low: dict[Partition, int] = {}
        high: dict[Partition, int] = {}
        for tp in parts:
            lo, hi = _retry(
                o,
                f"the watermarks of {tp[0]}[{tp[1]}]",
                lambda tp=tp: client.get_watermark_offsets(
                    TopicPartition(*tp), timeout=10.0, cached=False
                ),
            )
            low[tp], high[tp] = int(lo), int(hi)
        start_ts = (
            {p: o.starting_timestamp for p in parts}
            if o.starting_timestamp is not None
            else {p: ts for p, ts in (o.starting_by_timestamp or {}).items() if p in low}
        )
        end_ts = (
            {p: o.ending_timestamp for p in parts}
            if o.ending_timestamp is not None
            else {p: ts for p, ts in (o.ending_by_timestamp or {}).items() if p in low}
        )
        starts_found, ends_found = _by_time(client, o, start_ts), _by_time(client, o, end_ts)
    finally:
        client.close()
    ranges: list[OffsetRange] = []
    no_match = []
    for p in parts:
        if p in starts_found:
            frm = starts_found[p]
            if frm < 0:
                if o.timestamp_strategy != "latest":
                    no_match.append(f"{p[0]}[{p[1]}] (timestamp {start_ts[p]})")
                frm = high[p]
        else:
            spec = o.starting_offsets
            wanted = spec.get(p, EARLIEST) if isinstance(spec, dict) else EARLIEST
            frm = low[p] if wanted == EARLIEST else wanted
        if p in ends_found:
            until = ends_found[p] if ends_found[p] >= 0 else high[p]
        else:
            spec = o.ending_offsets
            wanted = spec.get(p, LATEST) if isinstance(spec, dict) else LATEST
            until = high[p] if wanted == LATEST else wanted
        if frm > until:
            raise ValueError(
                f"kip848: {p[0]}[{p[1]}]: the starting offset {frm} is after the ending offset "
                f"{until}; check startingOffsets / endingOffsets (or their timestamps)"
            )
        if frm < low[p] or until > high[p]:
            text = (
                f"{p[0]}[{p[1]}]: offsets [{frm}, {until}) are not all available (the log "
                f"holds [{low[p]}, {high[p]}))"
            )
            if o.fail_on_data_loss:
                raise DataLossError(
                    f"kip848: {text}; set failOnDataLoss=false to read what is "
                    "available with a warning"
                )
            log.warning("kip848: %s; reading what is available (failOnDataLoss=false)", text)
            frm, until = max(frm, low[p]), min(until, high[p])
        if frm < until:
            ranges.append(OffsetRange(p[0], p[1], frm, until))
    if no_match:
        raise ValueError(
            f"kip848: startingTimestamp/startingOffsetsByTimestamp: no record at or after the "
            f"timestamp in {', '.join(no_match)}; set startingOffsetsByTimestampStrategy=latest "
            "to start those partitions at the latest offset instead"
        )
    return split_ranges(split_by_size(ranges, o.max_records_per_partition), o.min_partitions)
