"""What a run found: statistics, invariant checks and violations."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from consumer_sdk.simulation.config import SimConfig
from consumer_sdk.simulation.trace import Trace

#: Violation kinds (see docs/simulation.md).
VIOLATION_KINDS = (
    "double-ownership",
    "owned-not-held",
    "server-double-holder",
    "epoch-regressed",
    "unexpected-fatal",
    "stuck-reconciling",
    "not-converged",
    "zombie-commit",
    "commit-after-leave",
    "core-exception",
)


@dataclass(frozen=True, slots=True)
class Violation:
    """An invariant that did not hold."""

    time_ms: int
    kind: str
    message: str
    slot: int = -1
    member_id: str = ""

    def __str__(self) -> str:
        who = f" slot={self.slot} member={self.member_id}" if self.slot >= 0 else ""
        return f"{self.time_ms / 1000:.3f}s {self.kind}{who}: {self.message}"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return float(ordered[k])


@dataclass(slots=True)
class SimReport:
    """The outcome of `Simulation.run`."""

    config: SimConfig
    trace: Trace
    virtual_ms: int = 0
    wall_s: float = 0.0
    steps: int = 0
    heartbeats: int = 0
    messages_lost: int = 0
    rebalances: int = 0
    group_epoch: int = 0
    convergence_hb: list[float] = field(default_factory=list)
    checkpoint_convergence_hb: list[float] = field(default_factory=list)
    checks: int = 0
    checkpoints: int = 0
    violations: list[Violation] = field(default_factory=list)
    fatal_by_code: dict[str, int] = field(default_factory=dict)
    events_by_kind: dict[str, int] = field(default_factory=dict)
    server_removals: dict[str, int] = field(default_factory=dict)
    zombie_overlaps: int = 0
    commits_rejected: int = 0
    members_alive: int = 0
    core_calls: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations

    def to_dict(self, timing: bool = True) -> dict[str, Any]:
        """Everything but the trace; ``timing=False`` drops the wall-clock time (which is the
        only thing that differs between two runs of the same seed)."""
        out: dict[str, Any] = {
            "seed": self.config.seed,
            "config": self.config.to_dict(),
            "virtual_ms": self.virtual_ms,
            "steps": self.steps,
            "heartbeats": self.heartbeats,
            "messages_lost": self.messages_lost,
            "rebalances": self.rebalances,
            "group_epoch": self.group_epoch,
            "convergence_hb": list(self.convergence_hb),
            "checkpoint_convergence_hb": list(self.checkpoint_convergence_hb),
            "checks": self.checks,
            "checkpoints": self.checkpoints,
            "violations": [str(v) for v in self.violations],
            "fatal_by_code": dict(sorted(self.fatal_by_code.items())),
            "events_by_kind": dict(sorted(self.events_by_kind.items())),
            "server_removals": dict(sorted(self.server_removals.items())),
            "zombie_overlaps": self.zombie_overlaps,
            "commits_rejected": self.commits_rejected,
            "members_alive": self.members_alive,
            "core_calls": self.core_calls,
        }
        if timing:
            out["wall_s"] = round(self.wall_s, 3)
        return out

    def summary(self) -> str:
        c = self.config
        conv = self.convergence_hb
        lines = [
            f"simulation seed={c.seed} faults={c.faults} members={c.members} "
            f"partitions={c.partitions} topics={c.topic_count} minutes={c.minutes:g}",
            f"  virtual time       {self.virtual_ms / 60_000:.1f} min in {self.wall_s:.1f} s wall "
            f"({self.steps} steps, {self.core_calls} core calls)",
            f"  heartbeats         {self.heartbeats} ({self.messages_lost} messages lost)",
            f"  rebalances         {self.rebalances} target assignments, group epoch "
            f"{self.group_epoch}, {len(conv)} rebalance episodes",
            f"  convergence        p50 {percentile(conv, 0.5):.1f}  p90 {percentile(conv, 0.9):.1f}"
            f"  p99 {percentile(conv, 0.99):.1f}  max {max(conv, default=0.0):.1f} heartbeat "
            "intervals",
            "  after faults stop  "
            + ", ".join(f"{x:.1f}" for x in self.checkpoint_convergence_hb)
            + " heartbeat intervals to converge, per checkpoint",
            f"  fault events       {_fmt(self.events_by_kind)}",
            f"  server removals    {_fmt(self.server_removals) or 'none'}",
            f"  fatal members      {_fmt(self.fatal_by_code) or 'none'}",
            f"  zombie overlaps    {self.zombie_overlaps} (a fenced member still held a "
            f"partition its successor got; commits rejected: {self.commits_rejected})",
            f"  invariant checks   {self.checks} ({self.checkpoints} convergence checkpoints)",
            f"  violations         {len(self.violations)}",
        ]
        lines += [f"    {v}" for v in self.violations[:20]]
        return "\n".join(lines)


def _fmt(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
