"""Simulation settings and the fault mixes (``none``, ``default``, ``heavy``)."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from consumer_sdk.error_codes import ErrorCode as E

Range = tuple[int, int]


@dataclass(frozen=True, slots=True)
class FaultMix:
    """What goes wrong, and how often.

    Member events (joins, leaves, crashes, pauses, freezes, network partitions, subscription
    changes, injected errors) arrive at ``events_per_min + events_per_min_per_100 * members /
    100`` per virtual minute during churn windows, picked by ``weights``. Durations are
    ``(min, max)`` milliseconds, drawn uniformly.
    """

    name: str
    loss: float = 0.0
    latency_ms: Range = (1, 5)
    spike_probability: float = 0.0
    spike_ms: Range = (0, 0)
    events_per_min: float = 0.0
    events_per_min_per_100: float = 0.0
    weights: tuple[tuple[str, float], ...] = ()
    crash_restart_ms: Range = (2_000, 30_000)
    leave_restart_probability: float = 0.5
    leave_restart_ms: Range = (1_000, 20_000)
    pause_ms: Range = (2_000, 20_000)
    long_pause_probability: float = 0.0
    long_pause_ms: Range = (65_000, 90_000)
    freeze_ms: Range = (5_000, 30_000)
    partition_ms: Range = (5_000, 30_000)
    failovers_per_hour: float = 0.0
    failover_down_ms: Range = (1_000, 5_000)
    failover_load_ms: Range = (0, 2_000)
    partition_additions_per_hour: float = 0.0
    topic_creations_per_hour: float = 0.0
    retriable_codes: tuple[int, ...] = (
        E.COORDINATOR_LOAD_IN_PROGRESS,
        E.NOT_COORDINATOR,
        E.COORDINATOR_NOT_AVAILABLE,
    )
    fencing_codes: tuple[int, ...] = (E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID)
    fatal_codes: tuple[int, ...] = (E.GROUP_AUTHORIZATION_FAILED,)
    callback_latency_ms: Range = (0, 20)
    callback_failure: float = 0.0
    static_fraction: float = 0.0
    regex_fraction: float = 0.0

    def events_rate_per_min(self, members: int) -> float:
        return self.events_per_min + self.events_per_min_per_100 * members / 100.0


FAULT_MIXES: dict[str, FaultMix] = {
    "none": FaultMix(
        name="none", static_fraction=0.2, regex_fraction=0.2, callback_latency_ms=(0, 20)
    ),
    "default": FaultMix(
        name="default",
        loss=0.002,
        latency_ms=(1, 20),
        spike_probability=0.01,
        spike_ms=(50, 500),
        events_per_min=0.6,
        events_per_min_per_100=0.3,
        weights=(
            ("join", 2.0),
            ("leave", 2.0),
            ("crash", 1.5),
            ("pause", 1.0),
            ("partition", 0.8),
            ("freeze", 0.3),
            ("subscribe", 0.5),
            ("inject_retriable", 0.8),
            ("inject_fencing", 0.4),
        ),
        long_pause_probability=0.2,
        freeze_ms=(5_000, 40_000),
        failovers_per_hour=3.0,
        partition_additions_per_hour=4.0,
        topic_creations_per_hour=2.0,
        callback_latency_ms=(0, 200),
        callback_failure=0.01,
        static_fraction=0.2,
        regex_fraction=0.2,
    ),
    "heavy": FaultMix(
        name="heavy",
        loss=0.02,
        latency_ms=(1, 100),
        spike_probability=0.05,
        spike_ms=(100, 3_000),
        events_per_min=2.0,
        events_per_min_per_100=1.0,
        weights=(
            ("join", 2.0),
            ("leave", 2.0),
            ("crash", 2.0),
            ("pause", 1.5),
            ("partition", 1.5),
            ("freeze", 1.0),
            ("subscribe", 1.0),
            ("inject_retriable", 1.5),
            ("inject_fencing", 1.0),
            ("inject_fatal", 0.2),
        ),
        crash_restart_ms=(1_000, 60_000),
        long_pause_probability=0.4,
        freeze_ms=(5_000, 70_000),
        partition_ms=(5_000, 60_000),
        failovers_per_hour=12.0,
        failover_down_ms=(1_000, 10_000),
        failover_load_ms=(0, 5_000),
        partition_additions_per_hour=8.0,
        topic_creations_per_hour=4.0,
        callback_latency_ms=(0, 2_000),
        callback_failure=0.05,
        static_fraction=0.3,
        regex_fraction=0.3,
    ),
}


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulation run. Everything random derives from ``seed``.

    The run alternates churn windows (``churn_ms``: faults happen) and quiet windows
    (``quiet_ms``: nothing new goes wrong); at the end of each quiet window the group must have
    converged (a checkpoint). ``faults`` names a `FAULT_MIXES` entry; ``static_fraction``
    and ``regex_fraction`` override the mix's. ``poll_interval_ms`` is how often the simulated
    application calls ``poll()``; ``rebalance_timeout_ms`` is its ``max.poll.interval.ms``.
    """

    members: int = 10
    partitions: int = 60
    topics: int = 0
    minutes: float = 10.0
    seed: int = 0
    faults: str = "default"
    static_fraction: float | None = None
    regex_fraction: float | None = None
    assignor: str = "uniform"
    group_id: str = "sim-group"
    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    assignment_interval_ms: int = 1_000
    rebalance_timeout_ms: int = 60_000
    poll_interval_ms: int = 1_000
    request_timeout_ms: int = 30_000
    auto_commit: bool = True
    churn_ms: int = 450_000
    quiet_ms: int = 150_000
    join_spread_ms: int = 10_000
    fatal_restart_ms: Range = (5_000, 20_000)
    close_timeout_ms: int = 30_000
    static_rejoin_in_place: bool = False
    coalesce_polls: bool = True
    stop_on_violation: bool = True
    progress_every_min: float = 0.0

    def __post_init__(self) -> None:
        if self.faults not in FAULT_MIXES:
            raise ValueError(f"unknown fault mix {self.faults!r}; known: {', '.join(FAULT_MIXES)}")
        if self.members < 0 or self.partitions < 1:
            raise ValueError("need members >= 0 and partitions >= 1")
        if self.minutes <= 0:
            raise ValueError("minutes must be positive")
        if self.poll_interval_ms <= 0 or self.churn_ms < 0 or self.quiet_ms <= 0:
            raise ValueError("poll_interval_ms and quiet_ms must be positive")

    @property
    def mix(self) -> FaultMix:
        mix = FAULT_MIXES[self.faults]
        changes: dict[str, Any] = {}
        if self.static_fraction is not None:
            changes["static_fraction"] = self.static_fraction
        if self.regex_fraction is not None:
            changes["regex_fraction"] = self.regex_fraction
        return replace(mix, **changes) if changes else mix

    @property
    def duration_ms(self) -> int:
        return int(self.minutes * 60_000)

    @property
    def topic_count(self) -> int:
        return self.topics if self.topics > 0 else max(1, min(10, self.partitions))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SimConfig:
        known = {f.name for f in fields(cls)}
        kwargs: dict[str, Any] = {
            k: (tuple(v) if isinstance(v, list) else v) for k, v in data.items() if k in known
        }
        return cls(**kwargs)
