"""The source's offset JSON, admission control and offset-range planning (no Spark needed).

An offset is what Spark writes to the checkpoint's offset log for each micro-batch:

    {"orders": {"0": 120, "1": 88},
     "@meta": {"epoch": 7, "member": "AbC...", "starts": {"orders": {"1": 40}}}}

The topic entries map each partition this query owns to the next offset to read (the
batch's exclusive end), like Spark's Kafka source. ``@meta`` (``@`` cannot occur in a
topic name) records the member epoch and id at which the offset was built and, under
``starts``, where partitions (re)assigned since the previous offset begin. A batch
``(start, end]`` therefore reads, for every partition in ``end``, from
``end.starts[p]`` if present, else ``start[p]``: partitions(start, end) depends on the two
logged offsets only, so a restart replays a batch exactly.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "EARLIEST",
    "LATEST",
    "META_KEY",
    "DataLossError",
    "OffsetRange",
    "Partition",
    "SourceOffset",
    "SourceStartupError",
    "pack_tasks",
    "parse_assign",
    "parse_offsets_json",
    "parse_starting_offsets",
    "parse_timestamps",
    "rate_limit",
    "split_by_size",
    "split_ranges",
]

Partition = tuple[str, int]

META_KEY = "@meta"
#: Spark's sentinels in a startingOffsets JSON.
EARLIEST = -2
LATEST = -1


class DataLossError(RuntimeError):
    """Records the source should read are gone (deleted topic, retention, truncation)."""


class SourceStartupError(RuntimeError):
    """The query cannot start: no broker answered, or a subscribed topic does not exist."""


def _nested(positions: Mapping[Partition, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(positions.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def _flat(nested: Mapping[str, Any], what: str) -> dict[Partition, int]:
    out: dict[Partition, int] = {}
    for topic, parts in nested.items():
        if not isinstance(parts, Mapping):
            raise ValueError(f"{what}: expected {{partition: offset}} for topic {topic!r}")
        for partition, offset in parts.items():
            try:
                out[(str(topic), int(partition))] = int(offset)
            except (TypeError, ValueError):
                raise ValueError(f"{what}: bad entry {topic!r}/{partition!r}: {offset!r}") from None
    return out


@dataclass(frozen=True)
class SourceOffset:
    """One offset-log entry: owned partitions' next offsets plus membership metadata."""

    positions: dict[Partition, int] = field(default_factory=dict)
    starts: dict[Partition, int] = field(default_factory=dict)
    epoch: int = -1
    member_id: str = ""

    def to_json(self) -> dict[str, Any]:
        """The JSON-ready dict handed to Spark (stable key order)."""
        out: dict[str, Any] = dict(_nested(self.positions))
        meta: dict[str, Any] = {"epoch": self.epoch, "member": self.member_id}
        if self.starts:
            meta["starts"] = _nested(self.starts)
        out[META_KEY] = meta
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str | None) -> SourceOffset:
        """Parse an offset dict (or its JSON text); ``None``/``{}`` is the empty offset."""
        if data is None:
            return cls()
        if isinstance(data, str):
            data = json.loads(data)
        if not isinstance(data, Mapping):
            raise ValueError(f"offset must be a JSON object, got {type(data).__name__}")
        meta = data.get(META_KEY) or {}
        topics = {k: v for k, v in data.items() if k != META_KEY}
        return cls(
            positions=_flat(topics, "offset"),
            starts=_flat(meta.get("starts") or {}, "offset starts"),
            epoch=int(meta.get("epoch", -1)),
            member_id=str(meta.get("member", "")),
        )

    def key(self) -> str:
        """Canonical text of the positions and starts (what identifies a batch boundary)."""
        return json.dumps([_nested(self.positions), _nested(self.starts)], sort_keys=True)


@dataclass(frozen=True, order=True)
class OffsetRange:
    """Records ``[from_offset, until_offset)`` of one partition, read by one Spark task."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    @property
    def size(self) -> int:
        return max(self.until_offset - self.from_offset, 0)

    @property
    def tp(self) -> Partition:
        return (self.topic, self.partition)


def parse_offsets_json(
    value: str | None, what: str = "startingOffsets", default: str = "latest"
) -> str | dict[Partition, int]:
    """``earliest``/``latest`` or JSON ``{topic: {partition: offset}}`` (-2 earliest/-1 latest)."""
    if value is None:
        return default
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError(f"{what}: expected 'earliest', 'latest' or JSON, got {value!r}") from None
    if not isinstance(data, Mapping):
        raise ValueError(f"{what}: the JSON must be an object {{topic: {{partition: offset}}}}")
    offsets = _flat(data, what)
    bad = [f"{t}[{p}]={o}" for (t, p), o in offsets.items() if o < EARLIEST]
    if bad:
        raise ValueError(f"{what}: offsets must be >= -2, got {', '.join(bad)}")
    return offsets


def parse_starting_offsets(value: str | None) -> str | dict[Partition, int]:
    """``startingOffsets`` of a streaming query (default ``latest``)."""
    return parse_offsets_json(value, "startingOffsets", "latest")


def parse_timestamps(value: str, what: str) -> dict[Partition, int]:
    """JSON ``{topic: {partition: epoch_millis}}`` (``startingOffsetsByTimestamp`` & co.)."""
    try:
        data = json.loads(value)
    except ValueError:
        raise ValueError(
            f"{what}: expected JSON {{topic: {{partition: timestamp}}}}, got {value!r}"
        ) from None
    if not isinstance(data, Mapping) or not data:
        raise ValueError(
            f"{what}: the JSON must be a non-empty object {{topic: {{partition: ms}}}}"
        )
    out = _flat(data, what)
    bad = [f"{t}[{p}]={ts}" for (t, p), ts in out.items() if ts < 0]
    if bad:
        raise ValueError(f"{what}: timestamps must be >= 0 (epoch milliseconds), got {bad}")
    return out


def parse_assign(value: str) -> tuple[Partition, ...]:
    """``assign``: JSON ``{"topicA": [0, 1], "topicB": [2]}`` as in Spark's Kafka source."""
    try:
        data = json.loads(value)
    except ValueError:
        raise ValueError(
            f'assign: expected JSON like {{"topicA": [0, 1]}}, got {value!r}'
        ) from None
    if not isinstance(data, Mapping) or not data:
        raise ValueError('assign: expected a non-empty JSON object like {"topicA": [0, 1]}')
    out: set[Partition] = set()
    for topic, parts in data.items():
        if not isinstance(parts, list) or not parts:
            raise ValueError(f"assign: topic {topic!r} needs a non-empty list of partitions")
        for p in parts:
            if not isinstance(p, int) or isinstance(p, bool) or p < 0:
                raise ValueError(f"assign: bad partition {p!r} for topic {topic!r}")
            out.add((str(topic), p))
    return tuple(sorted(out))


def rate_limit(
    limit: int, start: Mapping[Partition, int], latest: Mapping[Partition, int]
) -> dict[Partition, int]:
    """Cap ``latest`` so at most about ``limit`` records are read from ``start``.

    Split proportionally to each partition's backlog, like Spark's Kafka source: a share
    below one record is rounded up so small partitions are never starved.
    """
    sizes = {p: end - start[p] for p, end in latest.items() if p in start and end > start[p]}
    total = float(sum(sizes.values()))
    if total < 1 or total <= limit:
        return dict(latest)
    out = dict(latest)
    for p, size in sizes.items():
        share = limit * (size / total)
        count = math.ceil(share) if share < 1 else math.floor(share)
        out[p] = min(latest[p], start[p] + count)
    return out


def split_ranges(ranges: Iterable[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """Split large ranges so there are about ``min_partitions`` tasks (Spark's minPartitions)."""
    ranges = [r for r in ranges if r.size > 0]
    if not min_partitions or len(ranges) >= min_partitions:
        return sorted(ranges)
    total = sum(r.size for r in ranges)
    out: list[OffsetRange] = []
    for r in ranges:
        parts = max(round(r.size / total * min_partitions), 1)
        remaining, begin = r.size, r.from_offset
        for i in range(parts):
            size = remaining // (parts - i)
            remaining -= size
            end = min(begin + size, r.until_offset)
            if end > begin:
                out.append(OffsetRange(r.topic, r.partition, begin, end))
            begin = end
    return sorted(out)


def pack_tasks(ranges: Iterable[OffsetRange], rows_per_task: int) -> list[list[OffsetRange]]:
    """Group ranges into up to ``ceil(total / rows_per_task)`` Spark tasks of balanced size.

    Spark charges a Python source per input partition (task launch, worker round trip,
    Arrow stream), so a small batch over many Kafka partitions is read by one task, not one
    per partition; a large batch gets as many tasks as its size asks for, but never more
    than there are ranges: a range is never split here (a split range seeks its pooled
    consumer back and discards prefetched records; ``minPartitions`` and
    ``maxRecordsPerPartition`` split before this). Ranges go largest first to the least
    loaded task (LPT), so tasks end up within one range of each other.
    """
    ranges = [r for r in ranges if r.size > 0]
    total = sum(r.size for r in ranges)
    if not ranges:
        return []
    count = min(max(math.ceil(total / rows_per_task), 1), len(ranges))
    tasks: list[list[OffsetRange]] = [[] for _ in range(count)]
    loads = [0] * count
    for r in sorted(ranges, key=lambda r: (-r.size, r)):
        i = loads.index(min(loads))
        tasks[i].append(r)
        loads[i] += r.size
    return [sorted(t) for t in tasks]


def split_by_size(ranges: Iterable[OffsetRange], max_records: int | None) -> list[OffsetRange]:
    """Split ranges so none holds more than ``max_records`` (Spark's maxRecordsPerPartition)."""
    out: list[OffsetRange] = []
    for r in ranges:
        if not max_records or r.size <= max_records:
            out.append(r)
            continue
        for begin in range(r.from_offset, r.until_offset, max_records):
            out.append(
                OffsetRange(r.topic, r.partition, begin, min(begin + max_records, r.until_offset))
            )
    return sorted(out)
