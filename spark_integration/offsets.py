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
    "parse_starting_offsets",
    "rate_limit",
    "split_ranges",
]

Partition = tuple[str, int]

META_KEY = "@meta"
#: Spark's sentinels in a startingOffsets JSON.
EARLIEST = -2
LATEST = -1


class DataLossError(RuntimeError):
    """Records the source should read are gone (deleted topic, retention, truncation)."""


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


def parse_starting_offsets(value: str | None) -> str | dict[Partition, int]:
    """``earliest``/``latest`` or JSON ``{topic: {partition: offset}}`` (-2 earliest/-1 latest)."""
    if value is None:
        return "latest"
    text = value.strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        data = json.loads(text)
    except ValueError:
        raise ValueError(
            f"startingOffsets: expected 'earliest', 'latest' or JSON, got {value!r}"
        ) from None
    if not isinstance(data, Mapping):
        raise ValueError("startingOffsets: the JSON must be an object {topic: {partition: offset}}")
    offsets = _flat(data, "startingOffsets")
    bad = [f"{t}[{p}]={o}" for (t, p), o in offsets.items() if o < EARLIEST]
    if bad:
        raise ValueError(f"startingOffsets: offsets must be >= -2, got {', '.join(bad)}")
    return offsets


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
