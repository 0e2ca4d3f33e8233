"""The deterministic virtual-time simulator: `Simulation`, its event loop and its report.

Real members (`consumer_sdk.membership.GroupMembership`, driven by the runtime's own
`consumer_sdk.runtime.driver.MemberDriver`) talk to the coordinator model
(`consumer_sdk.coordinator.GroupCoordinator`) over simulated links. The parts, one concern
each, are mixed into `Simulation`: `host` (each member's application thread and its driver
over the simulated links), `faults` (what the trace schedules), `invariants` (the checks and
the convergence statistics); `_base` holds what they share.

Everything runs on one queue of virtual-millisecond events, taken in (time, scheduling order);
every random choice comes from ``random.Random`` instances seeded from the configuration's seed,
so a seed (plus the trace of scheduled events) replays a run exactly. Invariants are checked as
things change (see `consumer_sdk.simulation` and ``docs/simulation.md``).
"""

from __future__ import annotations

import gc
import heapq
import logging
import random
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from consumer_sdk.coordinator import (
    CoordinatorConfig,
    GroupCoordinator,
)
from consumer_sdk.runtime.driver import (
    DriverConfig,
)
from consumer_sdk.simulation._base import (
    _ARRIVE,
    _CALLBACK_DONE,
    _CHECKPOINT,
    _CLOSE_TIMEOUT,
    _COORD_TICK,
    _FAULT,
    _MAX_KIND,
    _PROGRESS,
    _RECOVER,
    _RESPONSE,
    _RESTART,
    _TICK,
    _TIMEOUT,
    _WAKE,
    LOG,
    CoreFactory,
    DriverFactory,
    _Member,
    _StopRun,
    default_core_factory,
    default_driver_factory,
)
from consumer_sdk.simulation.config import SimConfig
from consumer_sdk.simulation.faults import Faults
from consumer_sdk.simulation.host import MemberHost
from consumer_sdk.simulation.invariants import Invariants
from consumer_sdk.simulation.report import SimReport, Violation
from consumer_sdk.simulation.schedule import generate, topic_names, windows
from consumer_sdk.simulation.trace import Trace, TraceEvent

_heappush = heapq.heappush

#: The cyclic collector's thresholds during a run (see `Simulation.run`).
_GC_THRESHOLDS = (50_000, 20, 100)

#: The event queue's near horizon (ms; a power of two): a timing wheel of one list per
#: millisecond holds the events due within it, a heap the later ones (see `Simulation._loop`).
#: It spans a heartbeat interval (5 s by default) and its jitter, so the events of a quiet
#: heartbeat (its next run, the request's arrival, the answer) never touch the heap.
_WHEEL_MS = 1 << 13
_WHEEL_MASK = _WHEEL_MS - 1


class Simulation(MemberHost, Faults, Invariants):
    """A deterministic simulated deployment: ``Simulation(SimConfig(...)).run() -> SimReport``.

    ``events`` replays a given trace instead of generating one from the seed;
    ``core_factory`` builds each member's core and ``driver_factory`` its driver (tests use
    them to run deliberately broken copies).
    """

    def __init__(
        self,
        config: SimConfig,
        *,
        events: Iterable[TraceEvent] | None = None,
        core_factory: CoreFactory | None = None,
        driver_factory: DriverFactory | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.mix = config.mix
        self.events = tuple(events) if events is not None else generate(config)
        self.trace = Trace(config, self.events)
        self._core_factory = core_factory or default_core_factory
        self._driver_factory = driver_factory or default_driver_factory
        self._driver_config = DriverConfig(
            group_id=config.group_id,
            group_instance_id=None,
            retry_backoff_ms=100,
            retry_backoff_max_ms=1_000,
            auto_commit_interval_ms=0,
            request_timeout_ms=config.request_timeout_ms,
        )
        # The coordinator's node: a failover moves it (requests to the old one are refused).
        self._coord_node = 0
        self._progress = progress
        self.report = SimReport(config, self.trace)
        self.coordinator = GroupCoordinator(
            CoordinatorConfig(
                session_timeout_ms=config.session_timeout_ms,
                heartbeat_interval_ms=config.heartbeat_interval_ms,
                assignment_interval_ms=config.assignment_interval_ms,
                static_rejoin_in_place=config.static_rejoin_in_place,
            ),
            topic_names(config),
            listener=self._on_coordinator_event,
        )
        self.now = 0
        self._wheel: list[list[tuple[int, int, Any, Any]]] = [[] for _ in range(_WHEEL_MS)]
        self._occupied = bytearray(_WHEEL_MS)
        self._later: list[tuple[int, int, int, int, Any, Any]] = []
        self._seq = 0
        self._slots: dict[int, _Member] = {}
        self._incarnations: dict[int, int] = {}
        self._owners: dict[tuple[str, int], set[_Member]] = {}
        self._links: dict[int, random.Random] = {}
        # (loss, latency low, latency span, its bit length, spike probability): see `_link`.
        lo, hi = self.mix.latency_ms
        span = hi - lo + 1
        self._link_params = (
            self.mix.loss,
            lo,
            span,
            span.bit_length(),
            self.mix.spike_probability,
        )
        self._next_msg = 0
        self._coord_down_until = -1
        self._coord_unhealthy_until = 0
        self._episode_start: int | None = None
        self._stable_since = 0
        self._windows = windows(config)
        self._poll_refresh_ms = max(config.poll_interval_ms, config.rebalance_timeout_ms // 4)
        self._window = 0
        self._departed_slots: set[int] = set()

    def run(self) -> SimReport:
        """Run to the configured duration (or the first violation, if configured so)."""
        cfg = self.config
        core_logger = logging.getLogger("consumer_sdk.membership")
        coordinator_logger = logging.getLogger("consumer_sdk.coordinator")
        saved = core_logger.level, coordinator_logger.level
        # Thousands of members log every failed heartbeat; the report counts what matters.
        core_logger.setLevel(logging.CRITICAL + 1)
        coordinator_logger.setLevel(logging.CRITICAL + 1)
        # Each event allocates a few short-lived objects, nearly all freed by reference
        # counting: the cyclic collector's default young-generation threshold (700) would
        # run it every few events and rescan the members' state in its older generations
        # (about a tenth of the run). Collections are spaced out, not turned off.
        gc_thresholds = gc.get_threshold()
        gc.set_threshold(*_GC_THRESHOLDS)
        started = time.perf_counter()
        try:
            for i, event in enumerate(self.events):
                self._push(event.time_ms, _FAULT, -1, i, None)
            for _, churn_end, checkpoint in windows(cfg):
                self._push(checkpoint, _CHECKPOINT, -1, churn_end, None)
            self._push(250, _COORD_TICK, -1, None, None)
            if cfg.progress_every_min > 0:
                self._push(int(cfg.progress_every_min * 60_000), _PROGRESS, -1, started, None)
            self._loop(cfg.duration_ms, started)
        finally:
            gc.set_threshold(*gc_thresholds)
            core_logger.setLevel(saved[0])
            coordinator_logger.setLevel(saved[1])
        r = self.report
        r.wall_s = time.perf_counter() - started
        r.virtual_ms = self.now
        r.heartbeats = self.coordinator.heartbeats
        r.group_epoch = self.coordinator.group_epoch(cfg.group_id)
        r.members_alive = sum(1 for m in self._slots.values() if m.alive)
        return r

    def _loop(self, end: int, started: float) -> None:
        """Run the events due up to ``end``, each millisecond's in the order they were
        scheduled (what a heap of ``(time, sequence number)`` entries would pop).

        The queue is a timing wheel: ``_wheel[t % _WHEEL_MS]`` lists the events due at ``t``
        for ``now <= t < now + _WHEEL_MS`` (``_occupied`` marks the non-empty lists, so the
        next one is a C-speed search); events due later wait in the heap ``_later`` and move
        to their list when ``t`` comes within the horizon, before the first event of any
        millisecond from which they could be scheduled directly (so a millisecond's events
        stay in scheduling order). Most events are due within a heartbeat interval:
        scheduling one is an append, no heap comparisons.
        """
        wheel = self._wheel
        occupied = self._occupied
        find = occupied.find
        later = self._later
        mask = _WHEEL_MASK
        horizon_ms = _WHEEL_MS
        pop = heapq.heappop
        report = self.report
        handlers: dict[int, Callable[[int, Any, Any], None]] = {
            _FAULT: lambda _s, i, _y: self._apply_fault(self.events[i]),
            _RECOVER: self._recover,
            _COORD_TICK: lambda _s, _x, _y: self._coord_tick(),
            _CHECKPOINT: lambda _s, churn_end, _y: self._checkpoint(churn_end),
            _PROGRESS: lambda _s, t0, _y: self._progress_line(t0),
            _RESTART: lambda slot, _x, _y: self._start(slot),
            _ARRIVE: self._arrive,
        }
        member_handlers: dict[int, Callable[[_Member, Any, Any], None]] = {
            _WAKE: self._on_wake,
            _TICK: self._on_tick,
            _RESPONSE: self._on_response,
            _TIMEOUT: self._on_timeout,
            _CALLBACK_DONE: self._on_callback_done,
            _CLOSE_TIMEOUT: self._on_close_timeout,
        }
        # Indexed by event kind: a member event's handler, else None (and then `handlers`').
        by_kind: list[Callable[[_Member, Any, Any], None] | None] = [None] * (_MAX_KIND + 1)
        for kind, handler in member_handlers.items():
            by_kind[kind] = handler
        slots = self._slots
        steps = report.steps
        t = self.now
        i = 0
        bucket: list[tuple[int, int, Any, Any]] = []
        try:
            while t <= end:
                while later and later[0][0] - t < horizon_ms:
                    due, _, kind, slot, x, y = pop(later)
                    wheel[due & mask].append((kind, slot, x, y))
                    occupied[due & mask] = 1
                index = t & mask
                bucket = wheel[index]
                if bucket:
                    self.now = t
                    i = 0
                    # (handlers may schedule more events at this very millisecond)
                    while i < len(bucket):
                        kind, slot, x, y = bucket[i]
                        i += 1
                        member_handler = by_kind[kind]
                        if member_handler is not None:
                            # A member event: x carries the incarnation it is for.
                            m = slots[slot]
                            if not m.alive or m.inc != x[0]:
                                continue
                            if m.frozen:
                                m.deferred.append((kind, 0, x, y))
                                continue
                            try:
                                member_handler(m, x, y)
                            except _StopRun:
                                raise
                            except Exception as exc:  # a bug in the core (or the host)
                                self._core_exception(m, exc)
                        else:
                            handlers[kind](slot, x, y)
                    steps += i
                    i = 0
                    bucket.clear()
                    occupied[index] = 0
                # The next millisecond with events: the wheel's next list, else the heap's.
                j = find(1, index + 1)
                if j >= 0:
                    t += j - index
                    continue
                j = find(1, 0, index)
                if j >= 0:
                    t += horizon_ms - index + j
                elif later:
                    t = later[0][0]
                else:
                    break
            self.now = end
        except _StopRun:
            return
        finally:
            report.steps = steps + i  # (i: the events of an unfinished millisecond)

    def _push(self, t: int, kind: int, slot: int, x: Any, y: Any) -> None:
        ahead = t - self.now
        if 0 <= ahead < _WHEEL_MS:
            index = t & _WHEEL_MASK
            self._wheel[index].append((kind, slot, x, y))
            self._occupied[index] = 1
        elif ahead >= 0:
            self._seq = seq = self._seq + 1
            _heappush(self._later, (t, seq, kind, slot, x, y))
        else:
            raise ValueError(f"event {kind} scheduled at {t} ms, before now ({self.now} ms)")

    def _violate(self, kind: str, message: str, m: _Member | None = None) -> None:
        v = Violation(self.now, kind, message, m.slot if m else -1, m.member_id if m else "")
        self.report.violations.append(v)
        LOG.warning("violation: %s", v)
        if self.config.stop_on_violation:
            raise _StopRun

    def _core_exception(self, m: _Member, exc: Exception) -> None:
        tb = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        where = traceback.extract_tb(exc.__traceback__)[-1]
        self._violate(
            "core-exception",
            f"{tb} at {where.filename.rsplit('/', 1)[-1]}:{where.lineno} (state {m.core.state})",
            m,
        )
        self._kill(m)

    def _progress_line(self, started: float) -> None:
        r = self.report
        alive = sum(1 for m in self._slots.values() if m.alive)
        line = (
            f"[simulation] {self.now / 60_000:5.1f}/{self.config.minutes:g} virtual min, "
            f"{alive} members, {r.rebalances} rebalances, {r.checks} checks, "
            f"{len(r.violations)} violations, {time.perf_counter() - started:.1f} s wall"
        )
        (self._progress or _stderr)(line)
        self._push(
            self.now + int(self.config.progress_every_min * 60_000), _PROGRESS, -1, started, None
        )


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run(config: SimConfig, **kwargs: Any) -> SimReport:
    """``Simulation(config, **kwargs).run()``."""
    return Simulation(config, **kwargs).run()
