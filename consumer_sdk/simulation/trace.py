"""The event trace of a run: what happened when, enough to replay it exactly."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from consumer_sdk.simulation.config import SimConfig

#: Trace event kinds and their ``args``.
EVENT_KINDS: dict[str, str] = {
    "join": "a member slot starts (slot)",
    "leave": "graceful close; restart after args[0] ms if > 0 (slot)",
    "crash": "the process dies; restart after args[0] ms if > 0 (slot)",
    "pause": "the application stops polling for args[0] ms (slot)",
    "freeze": "the whole process stalls for args[0] ms (slot)",
    "partition": "the member is cut off from the brokers for args[0] ms (slot)",
    "subscribe": "the application subscribes to args[0] (topic list) or args[1] (pattern)",
    "inject": "the coordinator answers the member's next args[1] heartbeats with error args[0]",
    "failover": "the coordinator moves: down args[0] ms, then loading args[1] ms",
    "add_partitions": "topic args[0] gets args[1] more partitions",
    "create_topic": "topic args[0] is created with args[1] partitions",
}


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One scheduled event. ``slot`` is the member slot (-1 for cluster events)."""

    time_ms: int
    kind: str
    slot: int = -1
    args: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in EVENT_KINDS:
            raise ValueError(f"unknown trace event kind {self.kind!r}")

    def to_json(self) -> list[Any]:
        return [self.time_ms, self.kind, self.slot, list(self.args)]

    @classmethod
    def from_json(cls, data: list[Any]) -> TraceEvent:
        time_ms, kind, slot, args = data
        return cls(int(time_ms), str(kind), int(slot), tuple(_tuple(a) for a in args))

    def __str__(self) -> str:
        who = f" slot={self.slot}" if self.slot >= 0 else ""
        args = f" {list(self.args)}" if self.args else ""
        return f"{self.time_ms / 1000:9.3f}s {self.kind}{who}{args}"


def _tuple(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@dataclass(frozen=True, slots=True)
class Trace:
    """A run to replay: its configuration (seed included) and its events."""

    config: SimConfig
    events: tuple[TraceEvent, ...]

    def to_json(self) -> str:
        return json.dumps(
            {"config": self.config.to_dict(), "events": [e.to_json() for e in self.events]},
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> Trace:
        data = json.loads(text)
        return cls(
            SimConfig.from_dict(data["config"]),
            tuple(TraceEvent.from_json(e) for e in data["events"]),
        )

    def format(self, limit: int = 60) -> str:
        lines = [str(e) for e in self.events[:limit]]
        if len(self.events) > limit:
            lines.append(f"... {len(self.events) - limit} more")
        return "\n".join(lines)
