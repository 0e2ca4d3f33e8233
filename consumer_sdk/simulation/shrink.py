"""Replay a trace, and shrink a failing one to a smaller trace that still fails."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace

from consumer_sdk.simulation._base import CoreFactory
from consumer_sdk.simulation.engine import Simulation
from consumer_sdk.simulation.report import SimReport
from consumer_sdk.simulation.trace import Trace, TraceEvent

LOG = logging.getLogger("consumer_sdk.simulation")


def replay(trace: Trace, *, core_factory: CoreFactory | None = None) -> SimReport:
    """Run exactly the trace's events with its configuration (and so its seed)."""
    return Simulation(trace.config, events=trace.events, core_factory=core_factory).run()


def shrink(
    trace: Trace,
    *,
    core_factory: CoreFactory | None = None,
    fails: Callable[[SimReport], bool] | None = None,
    budget: int = 40,
) -> tuple[Trace, SimReport]:
    """A smaller trace that still fails (``fails``, default: any violation).

    First the run is cut just after the first violation, then the events are thinned:
    chunks of them are dropped (halves, quarters, ...) while the run still fails, within
    ``budget`` replays. Returns the smallest failing trace found and its report.
    """
    check = fails or (lambda report: not report.ok)
    best_report = replay(trace, core_factory=core_factory)
    if not check(best_report):
        raise ValueError("the trace does not fail; nothing to shrink")
    runs = 1
    best = trace
    # 1. Stop shortly after the first violation and drop the events after it.
    first = best_report.violations[0].time_ms
    minutes = min(trace.config.minutes, (first + 1_000) / 60_000)
    cut = Trace(
        replace(trace.config, minutes=minutes, stop_on_violation=True),
        tuple(e for e in trace.events if e.time_ms <= first),
    )
    report = replay(cut, core_factory=core_factory)
    runs += 1
    if check(report):
        best, best_report = cut, report
    # 2. Drop chunks of events while it still fails (a simple ddmin).
    events = list(best.events)
    chunk = max(1, len(events) // 2)
    while chunk >= 1 and runs < budget:
        i = 0
        removed_any = False
        while i < len(events) and runs < budget:
            candidate = events[:i] + events[i + chunk :]
            if not candidate:
                i += chunk
                continue
            trial = Trace(best.config, tuple(candidate))
            report = replay(trial, core_factory=core_factory)
            runs += 1
            if check(report):
                events = candidate
                best, best_report = trial, report
                removed_any = True
            else:
                i += chunk
        if not removed_any:
            chunk //= 2
    LOG.info("shrunk %d events to %d in %d runs", len(trace.events), len(best.events), runs)
    return best, best_report


def format_failure(report: SimReport, trace: Trace | None = None) -> str:
    """The seed, the violations and the (minimal) trace that replays them."""
    t = trace or report.trace
    lines = [
        f"seed {t.config.seed}: {len(report.violations)} violation(s)",
        *(f"  {v}" for v in report.violations[:5]),
        f"trace ({len(t.events)} events):",
        t.format(),
        "replay with: consumer_sdk.simulation.replay(Trace.from_json(<json below>))",
        t.to_json(),
    ]
    return "\n".join(lines)


__all__ = ["TraceEvent", "format_failure", "replay", "shrink"]
