"""The deterministic virtual-time simulator.

Real membership cores (`consumer_sdk.membership.GroupMembership`, the code the Consumer
runs) talk to the coordinator model (`consumer_sdk.coordinator.GroupCoordinator`) over
simulated links. Each member has a host that does what the runtime does: an application thread
that subscribes and polls every ``poll_interval_ms`` and runs rebalance callbacks, and a
background side that sends the heartbeats the core asks for, reports responses and failures,
finds the coordinator and fetches metadata.

Everything runs on one priority queue of virtual-millisecond events; every random choice comes
from ``random.Random`` instances seeded from the configuration's seed, so a seed (plus the trace
of scheduled events) replays a run exactly. Invariants are checked as things change (see
`consumer_sdk.simulation` and ``docs/simulation.md``).
"""

from __future__ import annotations

import heapq
import logging
import random
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from consumer_sdk.coordinator import (
    CoordinatorConfig,
    CoordinatorEvent,
    EventKind,
    GroupCoordinator,
    GroupState,
)
from consumer_sdk.domain import HeartbeatRequest, HeartbeatResponse
from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.membership import (
    AssignmentChanged,
    CallbackCompleted,
    CallbacksNeeded,
    Close,
    CommitCompleted,
    CommitNeeded,
    ErrorEvent,
    Failure,
    FailureKind,
    GroupMembership,
    LeaveCompleted,
    MembershipConfig,
    MemberState,
    Poll,
    StateChanged,
    Subscribe,
)
from consumer_sdk.simulation.config import SimConfig
from consumer_sdk.simulation.report import SimReport, Violation
from consumer_sdk.simulation.schedule import REGEX, generate, topic_names, windows
from consumer_sdk.simulation.trace import Trace, TraceEvent

LOG = logging.getLogger("consumer_sdk.simulation")

S = MemberState
E = ErrorCode

#: Builds the core of one member incarnation: ``(config, rng) -> GroupMembership``.
CoreFactory = Callable[[MembershipConfig, random.Random], GroupMembership]

#: Heartbeat error codes the client does not treat as fatal (it retries or rejoins).
NON_FATAL_CODES = frozenset(
    {
        E.NONE,
        E.NOT_COORDINATOR,
        E.COORDINATOR_NOT_AVAILABLE,
        E.COORDINATOR_LOAD_IN_PROGRESS,
        E.TOPIC_AUTHORIZATION_FAILED,
        E.FENCED_MEMBER_EPOCH,
        E.UNKNOWN_MEMBER_ID,
    }
)
IN_GROUP = frozenset({S.JOINING, S.RECONCILING, S.ACKNOWLEDGING, S.STABLE})
IDLE_STATES = frozenset({S.STABLE, S.JOINING, S.ACKNOWLEDGING})

# Queue event kinds.
_WAKE = 0
_TICK = 1
_HB_ARRIVE = 2
_HB_RESPONSE = 3
_HB_TIMEOUT = 4
_CALLBACK_DONE = 5
_COMMIT_DONE = 6
_FIND_DONE = 7
_METADATA_DONE = 8
_FAULT = 9
_RECOVER = 10
_COORD_TICK = 11
_CHECKPOINT = 12
_PROGRESS = 13
_RESTART = 14
_CLOSE_TIMEOUT = 15
_DISCONNECT = 16

_MEMBER_EVENTS = frozenset(
    {
        _WAKE,
        _TICK,
        _HB_RESPONSE,
        _HB_TIMEOUT,
        _CALLBACK_DONE,
        _COMMIT_DONE,
        _FIND_DONE,
        _METADATA_DONE,
        _CLOSE_TIMEOUT,
    }
)


def default_core_factory(config: MembershipConfig, rng: random.Random) -> GroupMembership:
    """The real core, unmodified."""
    return GroupMembership(config, rng=rng)


class _StopRun(Exception):
    pass


@dataclass(eq=False, slots=True)
class _Member:
    """One incarnation of a member slot and its simulated host."""

    slot: int
    inc: int
    core: GroupMembership
    rng: random.Random
    static: bool
    member_id: str
    alive: bool = True
    closing: bool = False
    app_active: bool = True
    frozen: bool = False
    partitioned_until: int = -1
    unhealthy_until: int = 0
    poll_origin: int = 0
    last_app_poll: int = -1
    delivered_poll: int = -1
    tick_at: int = -1
    wake_at: int = -1
    wake_token: int = 0
    inflight: dict[int, tuple[HeartbeatRequest, int]] = field(default_factory=dict)
    find_inflight: bool = False
    find_attempts: int = 0
    metadata_inflight: bool = False
    pending_callbacks: list[CallbacksNeeded] = field(default_factory=list)
    busy_until: int = 0
    deferred: list[tuple[int, int, Any, Any]] = field(default_factory=list)
    owned: frozenset[tuple[str, int]] = frozenset()
    last_epoch: int = 0
    reconciling_since: int = -1
    last_error: int = 0
    fatal: bool = False
    restart_after_close: int = 0


class Simulation:
    """A deterministic simulated deployment: ``Simulation(SimConfig(...)).run() -> SimReport``.

    ``events`` replays a given trace instead of generating one from the seed;
    ``core_factory`` builds each member's core (tests use it to run a deliberately broken
    copy of the core).
    """

    def __init__(
        self,
        config: SimConfig,
        *,
        events: Iterable[TraceEvent] | None = None,
        core_factory: CoreFactory | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.mix = config.mix
        self.events = tuple(events) if events is not None else generate(config)
        self.trace = Trace(config, self.events)
        self._core_factory = core_factory or default_core_factory
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
        self._queue: list[tuple[int, int, int, int, Any, Any]] = []
        self._seq = 0
        self._slots: dict[int, _Member] = {}
        self._incarnations: dict[int, int] = {}
        self._owners: dict[tuple[str, int], set[_Member]] = {}
        self._links: dict[int, random.Random] = {}
        self._next_msg = 0
        self._coord_down_until = -1
        self._coord_unhealthy_until = 0
        self._episode_start: int | None = None
        self._stable_since = 0
        self._windows = windows(config)
        self._poll_refresh_ms = max(config.poll_interval_ms, config.rebalance_timeout_ms // 4)
        self._window = 0
        self._departed_slots: set[int] = set()

    # ------------------------------------------------------------------------------------------
    # Running
    # ------------------------------------------------------------------------------------------

    def run(self) -> SimReport:
        """Run to the configured duration (or the first violation, if configured so)."""
        cfg = self.config
        core_logger = logging.getLogger("consumer_sdk.membership")
        coordinator_logger = logging.getLogger("consumer_sdk.coordinator")
        saved = core_logger.level, coordinator_logger.level
        # Thousands of members log every failed heartbeat; the report counts what matters.
        core_logger.setLevel(logging.CRITICAL + 1)
        coordinator_logger.setLevel(logging.CRITICAL + 1)
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
        queue = self._queue
        pop = heapq.heappop
        report = self.report
        handlers: dict[int, Callable[[int, Any, Any], None]] = {
            _FAULT: lambda _s, i, _y: self._apply_fault(self.events[i]),
            _RECOVER: self._recover,
            _COORD_TICK: lambda _s, _x, _y: self._coord_tick(),
            _CHECKPOINT: lambda _s, churn_end, _y: self._checkpoint(churn_end),
            _PROGRESS: lambda _s, t0, _y: self._progress_line(t0),
            _RESTART: lambda slot, _x, _y: self._start(slot),
            _HB_ARRIVE: self._hb_arrive,
        }
        member_handlers: dict[int, Callable[[_Member, Any, Any], None]] = {
            _WAKE: self._on_wake,
            _TICK: self._on_tick,
            _HB_RESPONSE: self._on_hb_response,
            _HB_TIMEOUT: self._on_hb_timeout,
            _CALLBACK_DONE: self._on_callback_done,
            _COMMIT_DONE: self._on_commit_done,
            _FIND_DONE: self._on_find_done,
            _METADATA_DONE: self._on_metadata_done,
            _CLOSE_TIMEOUT: self._on_close_timeout,
        }
        slots = self._slots
        try:
            while queue:
                t, _, kind, slot, x, y = pop(queue)
                if t > end:
                    break
                self.now = t
                report.steps += 1
                if kind in _MEMBER_EVENTS:
                    m = slots.get(slot)
                    # x carries the incarnation for member events.
                    if m is None or not m.alive or m.inc != x[0]:
                        continue
                    if m.frozen:
                        m.deferred.append((kind, 0, x, y))
                        continue
                    try:
                        member_handlers[kind](m, x, y)
                    except _StopRun:
                        raise
                    except Exception as exc:  # a bug in the core (or the host)
                        self._core_exception(m, exc)
                else:
                    handlers[kind](slot, x, y)
            self.now = end
        except _StopRun:
            return

    def _push(self, t: int, kind: int, slot: int, x: Any, y: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (t, self._seq, kind, slot, x, y))

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

    # ------------------------------------------------------------------------------------------
    # Member lifecycle
    # ------------------------------------------------------------------------------------------

    def _slot_profile(self, slot: int) -> tuple[bool, bool]:
        """Whether the slot's member is static and whether it subscribes with a regex."""
        rng = random.Random(f"{self.config.seed}/slot/{slot}")
        return rng.random() < self.mix.static_fraction, rng.random() < self.mix.regex_fraction

    def _start(self, slot: int) -> None:
        old = self._slots.get(slot)
        if old is not None and old.alive:
            return
        if slot in self._departed_slots:
            return
        cfg = self.config
        static, regex = self._slot_profile(slot)
        inc = self._incarnations.get(slot, 0) + 1
        self._incarnations[slot] = inc
        rng = random.Random(f"{cfg.seed}/member/{slot}/{inc}")
        mconfig = MembershipConfig(
            group_id=cfg.group_id,
            group_instance_id=f"instance-{slot}" if static else None,
            remote_assignor=cfg.assignor,
            rebalance_timeout_ms=cfg.rebalance_timeout_ms,
            auto_commit=cfg.auto_commit,
            client_id=f"sim-{slot}",
        )
        core = self._core_factory(mconfig, rng)
        now = self.now
        m = _Member(slot, inc, core, rng, static, core.member_id, poll_origin=now)
        if slot not in self._links:
            self._links[slot] = random.Random(f"{cfg.seed}/link/{slot}")
        self._slots[slot] = m
        self.report.core_calls += 3
        core.on_metadata(now, self.coordinator.topics.names_by_id())
        if regex:
            core.submit(Subscribe(pattern=REGEX))
        else:
            core.submit(Subscribe(topics=tuple(self.coordinator.topics.names()[:1000])))
        self._schedule_tick(m, now)
        self._drive(m)

    def _kill(self, m: _Member) -> None:
        """The process is gone: it owns nothing any more and its messages go nowhere."""
        if not m.alive:
            return
        m.alive = False
        self._set_owned(m, frozenset())
        m.inflight.clear()
        m.deferred.clear()
        m.pending_callbacks.clear()

    # ------------------------------------------------------------------------------------------
    # Driving one core
    # ------------------------------------------------------------------------------------------

    def _deliver_poll(self, m: _Member) -> None:
        """With coalesced polls, tell the core about the application's latest ``poll()``.

        In the idle states a poll only restarts the poll timer, so it is enough to hand the
        latest one over once a quarter of ``max.poll.interval.ms`` has passed since the last
        one the core saw (the core then never sees its poll timer near expiry).
        """
        if not m.app_active:
            return
        interval = self.config.poll_interval_ms
        now = self.now
        if m.core.state in IDLE_STATES and now - m.delivered_poll < self._poll_refresh_ms:
            return
        last = m.poll_origin + (now - m.poll_origin) // interval * interval
        if last > m.delivered_poll:
            m.delivered_poll = last
            m.last_app_poll = last
            self.report.core_calls += 1
            m.core.handle(Poll(last), now)

    def _drive(self, m: _Member) -> None:
        """Drain the core's events, then poll it and send what it asks for, until it is idle;
        schedule the next wake-up."""
        now = self.now
        core = m.core
        report = self.report
        self._drain(m)
        if not m.alive:
            return
        wait = 0
        for _ in range(16):
            if self.config.coalesce_polls:
                self._deliver_poll(m)
            report.core_calls += 1
            result = core.poll(now)
            self._drain(m)
            if not m.alive:
                return
            wait = result.next_poll_ms
            request = result.request
            if request is None:
                break
            self._send(m, request)
            if request.member_epoch >= 0:
                # With a regular heartbeat in flight the core sends nothing else (only a leave
                # may overtake it, and entering LEAVING drives the core again), so the wait it
                # returned already accounts for it: no need to poll it once more.
                break
        if core.coordinator_needed and not m.find_inflight:
            self._find_coordinator(m)
        if core.metadata_needed and not m.metadata_inflight:
            self._fetch_metadata(m)
        self._schedule_wake(m, now + max(1, wait))
        if (
            m.pending_callbacks or core.app_events or core.state not in IDLE_STATES
        ) and m.tick_at < 0:
            self._schedule_tick(m, now)

    def _schedule_wake(self, m: _Member, at: int) -> None:
        if 0 <= m.wake_at <= at and m.wake_at >= self.now:
            return
        m.wake_at = at
        m.wake_token += 1
        self._push(at, _WAKE, m.slot, (m.inc, m.wake_token), None)

    def _on_wake(self, m: _Member, x: Any, _y: Any) -> None:
        if x[1] != m.wake_token:
            return
        m.wake_at = -1
        self._drive(m)

    def _schedule_tick(self, m: _Member, not_before: int) -> None:
        """Schedule the application's next real ``poll()`` (on its poll grid)."""
        if not m.app_active or m.tick_at >= 0:
            return
        interval = self.config.poll_interval_ms
        k = -(-(not_before - m.poll_origin) // interval)
        at = m.poll_origin + max(0, k) * interval
        if at <= m.delivered_poll:
            at = m.delivered_poll + interval
        m.tick_at = at
        self._push(at, _TICK, m.slot, (m.inc,), None)

    def _on_tick(self, m: _Member, _x: Any, _y: Any) -> None:
        """The application calls ``poll()``: the core reconciles (commit-safe pass) and the
        application runs the callbacks the core asked for."""
        m.tick_at = -1
        if not m.app_active:
            return
        now = self.now
        m.delivered_poll = now
        m.last_app_poll = now
        self.report.core_calls += 1
        m.core.handle(Poll(now), now)
        self._drain(m)
        self._run_callbacks(m)
        self._drive(m)
        core = m.core
        if not m.alive:
            return
        if (
            not self.config.coalesce_polls
            or m.pending_callbacks
            or core.app_events
            or core.state not in IDLE_STATES
        ):
            self._schedule_tick(m, now + 1)

    def _run_callbacks(self, m: _Member) -> None:
        """Run the queued rebalance callbacks on the (simulated) application thread."""
        if not m.pending_callbacks:
            return
        mix = self.mix
        start = max(self.now, m.busy_until)
        for cb in m.pending_callbacks:
            lo, hi = mix.callback_latency_ms
            start += m.rng.randint(lo, hi) if hi > lo else lo
            error = None
            if mix.callback_failure and m.rng.random() < mix.callback_failure:
                error = f"simulated failure in on_partitions_{cb.kind.value.lower()}"
            self._push(start, _CALLBACK_DONE, m.slot, (m.inc, cb.callback_id), error)
        m.busy_until = start
        m.pending_callbacks.clear()

    def _on_callback_done(self, m: _Member, x: Any, error: Any) -> None:
        self.report.core_calls += 1
        m.core.handle(CallbackCompleted(x[1], error), self.now)
        self._drive(m)

    def _drain(self, m: _Member) -> None:
        """Handle the core's background events (the application thread's side)."""
        events = m.core.background_events
        if not events:
            return
        while events:
            event = events.popleft()
            if isinstance(event, AssignmentChanged):
                self._set_owned(m, frozenset(event.partitions))
            elif isinstance(event, StateChanged):
                self._on_state_changed(m, event)
            elif isinstance(event, CallbacksNeeded):
                m.pending_callbacks.append(event)
                if m.closing:
                    self._run_callbacks(m)  # close() runs them right away
            elif isinstance(event, CommitNeeded):
                self._commit(m, event)
            elif isinstance(event, ErrorEvent):
                if event.fatal and not m.fatal:
                    m.fatal = True
                    self._on_fatal(m, event)
            elif isinstance(event, LeaveCompleted) and m.closing:
                self._finish_close(m)
                return
        self._check_epoch(m)

    def _check_epoch(self, m: _Member) -> None:
        """Member epochs only move forward, except through a rejoin (0) or a leave (< 0)."""
        epoch = m.core.member_epoch
        if epoch != m.last_epoch:
            self.report.checks += 1
            if epoch > 0 and epoch < m.last_epoch:
                self._violate(
                    "epoch-regressed",
                    f"member epoch went from {m.last_epoch} to {epoch} without a rejoin",
                    m,
                )
            m.last_epoch = epoch

    def _on_state_changed(self, m: _Member, event: StateChanged) -> None:
        now = self.now
        report = self.report
        if event.new is S.RECONCILING and event.old is not S.RECONCILING:
            m.reconciling_since = now
        elif event.old is S.RECONCILING and event.new is not S.RECONCILING:
            self._check_reconciling(m)
            m.reconciling_since = -1
        if event.new is S.FATAL:
            report.checks += 1
            if m.last_error in NON_FATAL_CODES:
                self._violate(
                    "unexpected-fatal",
                    f"member went FATAL ({event.reason}) but its last heartbeat error was "
                    f"{E.name_of(m.last_error)}, which is not fatal",
                    m,
                )

    def _check_reconciling(self, m: _Member) -> None:
        since = m.reconciling_since
        if since < 0:
            return
        self.report.checks += 1
        healthy_from = max(m.unhealthy_until, self._coord_unhealthy_until)
        if since < healthy_from or m.frozen or not m.app_active or m.partitioned_until > self.now:
            return
        stuck = self.now - since
        if stuck > self.config.rebalance_timeout_ms:
            self._violate(
                "stuck-reconciling",
                f"RECONCILING for {stuck} ms (> rebalance timeout "
                f"{self.config.rebalance_timeout_ms} ms) while polling",
                m,
            )

    def _on_fatal(self, m: _Member, event: ErrorEvent) -> None:
        """The application's poll() raised a fatal error: the app dies; a supervisor restarts
        it a bit later (a new member, same instance id if static)."""
        name = E.name_of(event.code)
        self.report.fatal_by_code[name] = self.report.fatal_by_code.get(name, 0) + 1
        slot = m.slot
        self._kill(m)
        lo, hi = self.config.fatal_restart_ms
        self._push(self.now + m.rng.randint(lo, hi), _RESTART, slot, None, None)

    # ------------------------------------------------------------------------------------------
    # Ownership invariants
    # ------------------------------------------------------------------------------------------

    def _set_owned(self, m: _Member, owned: frozenset[tuple[str, int]]) -> None:
        old = m.owned
        if owned == old:
            return
        owners = self._owners
        for tp in old - owned:
            holders = owners.get(tp)
            if holders is not None:
                holders.discard(m)
                if not holders:
                    del owners[tp]
        m.owned = owned
        added = owned - old
        if not added or not m.alive:
            return
        report = self.report
        coordinator = self.coordinator
        group = self.config.group_id
        live = self._live_in_group(m)
        server_holds = coordinator.member_holds(group, m.member_id) if live else None
        topics = coordinator.topics
        for tp in added:
            report.checks += 1
            holders = owners.setdefault(tp, set())
            for other in holders:
                if live and self._live_in_group(other):
                    self._violate(
                        "double-ownership",
                        f"{tp[0]}-{tp[1]} owned by slot {other.slot} ({other.member_id}, "
                        f"{other.core.state}) and slot {m.slot} ({m.member_id}, "
                        f"{m.core.state}) at once",
                        m,
                    )
                else:
                    report.zombie_overlaps += 1
            holders.add(m)
            if server_holds is not None:
                tid = topics.topic_id(tp[0])
                if tid is not None and (tid, tp[1]) not in server_holds:
                    self._violate(
                        "owned-not-held",
                        f"{tp[0]}-{tp[1]} owned by the member but not assigned to it (nor pending "
                        f"revocation) at the coordinator",
                        m,
                    )

    def _live_in_group(self, m: _Member) -> bool:
        """In the group as both sides see it: the core is in a group state and the coordinator
        knows its member id with a non-negative epoch (else it is a zombie whose commits fail)."""
        if not m.alive or m.core.state not in IN_GROUP:
            return False
        epoch = self.coordinator.member_epoch(self.config.group_id, m.member_id)
        return epoch is not None and epoch >= 0

    # ------------------------------------------------------------------------------------------
    # Network
    # ------------------------------------------------------------------------------------------

    def _faulty(self) -> bool:
        """Whether we are in a churn window (message loss and latency spikes stop outside)."""
        wins = self._windows
        now = self.now
        i = self._window
        while i < len(wins) and now >= wins[i][1]:
            i += 1
        self._window = i
        return i < len(wins) and now >= wins[i][0]

    def _latency(self, slot: int) -> int:
        mix = self.mix
        rng = self._links[slot]
        lo, hi = mix.latency_ms
        latency = rng.randint(lo, hi) if hi > lo else lo
        if mix.spike_probability and rng.random() < mix.spike_probability and self._faulty():
            latency += rng.randint(*mix.spike_ms)
        return latency

    def _lost(self, slot: int) -> bool:
        loss = self.mix.loss
        return loss > 0 and self._links[slot].random() < loss and self._faulty()

    def _reachable(self, m: _Member) -> bool:
        return m.partitioned_until <= self.now

    def _send(self, m: _Member, request: HeartbeatRequest) -> None:
        self._next_msg += 1
        msg = self._next_msg
        now = self.now
        m.inflight[msg] = (request, now)
        if not self._reachable(m) or self._lost(m.slot):
            self.report.messages_lost += 1
            self._push(
                now + self.config.request_timeout_ms, _HB_TIMEOUT, m.slot, (m.inc, msg), None
            )
            return
        self._push(now + self._latency(m.slot), _HB_ARRIVE, m.slot, (m.inc, msg), m)

    def _hb_arrive(self, slot: int, x: Any, m: _Member) -> None:
        """A heartbeat reaches the coordinator (even if its sender died meanwhile)."""
        entry = m.inflight.get(x[1])
        if entry is None:  # the connection dropped before it got there
            return
        request, sent = entry
        now = self.now
        timeout = sent + self.config.request_timeout_ms
        if self._coord_down_until > now or not self._reachable(m):
            self.report.messages_lost += 1
            self._push(max(now, timeout), _HB_TIMEOUT, slot, x, None)
            return
        response = self.coordinator.heartbeat(now, request)
        if not m.alive:
            return
        if self._lost(slot):
            self.report.messages_lost += 1
            self._push(max(now, timeout), _HB_TIMEOUT, slot, x, None)
            return
        self._push(now + self._latency(slot), _HB_RESPONSE, slot, x, response)

    def _on_hb_response(self, m: _Member, x: Any, response: HeartbeatResponse) -> None:
        entry = m.inflight.pop(x[1], None)
        if entry is None:
            return
        if not self._reachable(m):  # the partition started while it was on its way back
            self.report.messages_lost += 1
            m.inflight[x[1]] = entry
            self._push(
                max(self.now, entry[1] + self.config.request_timeout_ms),
                _HB_TIMEOUT,
                m.slot,
                x,
                None,
            )
            return
        m.last_error = response.error_code
        self.report.core_calls += 1
        m.core.on_heartbeat_response(self.now, response, entry[0])
        self._check_epoch(m)
        self._drive(m)

    def _on_hb_timeout(self, m: _Member, x: Any, _y: Any) -> None:
        entry = m.inflight.pop(x[1], None)
        if entry is None:
            return
        self._fail(m, entry[0], FailureKind.TIMEOUT)
        self._drive(m)

    def _fail(self, m: _Member, request: HeartbeatRequest, kind: FailureKind) -> None:
        m.last_error = 0
        self.report.core_calls += 1
        m.core.on_heartbeat_failure(self.now, Failure(kind, "simulated"), request)

    def _find_coordinator(self, m: _Member) -> None:
        m.find_inflight = True
        now = self.now
        if not self._reachable(m):
            self._push(now + self.config.request_timeout_ms, _FIND_DONE, m.slot, (m.inc,), False)
            return
        ok = self._coord_down_until <= now and not self._lost(m.slot)
        self._push(now + 2 * self._latency(m.slot), _FIND_DONE, m.slot, (m.inc,), ok)

    def _on_find_done(self, m: _Member, _x: Any, ok: bool | None) -> None:
        m.find_inflight = False
        if ok is None:  # the backoff after a failed attempt is over: try again
            if m.core.coordinator_needed:
                self._find_coordinator(m)
            return
        if ok and self._coord_down_until <= self.now and self._reachable(m):
            m.find_attempts = 0
            self.report.core_calls += 1
            m.core.on_coordinator_known(self.now)
            self._drive(m)
            return
        # FindCoordinator failed: retry with the heartbeat's backoff (100 ms .. 1 s).
        backoff = min(1_000, 100 * 2**m.find_attempts)
        m.find_attempts += 1
        m.find_inflight = True
        self._push(self.now + backoff, _FIND_DONE, m.slot, (m.inc,), None)
        self._drive(m)

    def _fetch_metadata(self, m: _Member) -> None:
        m.metadata_inflight = True
        delay = 2 * self._latency(m.slot) if self._reachable(m) else self.config.request_timeout_ms
        self._push(self.now + delay, _METADATA_DONE, m.slot, (m.inc,), None)

    def _on_metadata_done(self, m: _Member, _x: Any, _y: Any) -> None:
        m.metadata_inflight = False
        if self._reachable(m):
            self.report.core_calls += 1
            m.core.on_metadata(self.now, self.coordinator.topics.names_by_id())
        self._drive(m)

    def _commit(self, m: _Member, event: CommitNeeded) -> None:
        """The pre-revocation (or close) commit, through the coordinator's epoch checks."""
        now = self.now
        offsets = {tp: now for tp in sorted(m.owned)}
        error: str | None = None
        if not self._reachable(m) or self._coord_down_until > now:
            done = now + min(self.config.request_timeout_ms, max(1, event.deadline_ms - now))
            error = "commit failed: coordinator unreachable"
        else:
            done = now + 2 * self._latency(m.slot)
            result = self.coordinator.offset_commit(
                now,
                self.config.group_id,
                m.member_id,
                event.member_epoch,
                offsets,
                instance_id=m.core.config.group_instance_id,
            )
            group = self.config.group_id
            topics = self.coordinator.topics
            for tp, code in result.items():
                self.report.checks += 1
                if code:
                    self.report.commits_rejected += 1
                    error = f"commit failed: {E.name_of(code)}"
                    continue
                tid = topics.topic_id(tp[0])
                holder = self.coordinator.holder(group, (tid, tp[1])) if tid else None
                if holder is not None and holder != m.member_id:
                    self._violate(
                        "zombie-commit",
                        f"commit of {tp[0]}-{tp[1]} at epoch {event.member_epoch} accepted "
                        f"while {holder} holds it",
                        m,
                    )
        self._push(done, _COMMIT_DONE, m.slot, (m.inc, event.commit_id), error)

    def _on_commit_done(self, m: _Member, x: Any, error: Any) -> None:
        self.report.core_calls += 1
        m.core.handle(CommitCompleted(x[1], error), self.now)
        self._drive(m)

    # ------------------------------------------------------------------------------------------
    # Faults
    # ------------------------------------------------------------------------------------------

    def _apply_fault(self, event: TraceEvent) -> None:
        counts = self.report.events_by_kind
        counts[event.kind] = counts.get(event.kind, 0) + 1
        now = self.now
        kind = event.kind
        if kind == "join":
            self._start(event.slot)
            return
        if kind == "failover":
            self._failover(int(event.args[0]), int(event.args[1]))
            return
        if kind == "add_partitions":
            name, count = event.args
            if name in self.coordinator.topics:
                self.coordinator.add_partitions(now, str(name), int(count))
            return
        if kind == "create_topic":
            name, count = event.args
            if name not in self.coordinator.topics:
                self.coordinator.create_topic(now, str(name), int(count))
            return
        m = self._slots.get(event.slot)
        if m is None or not m.alive or m.closing:
            return
        if kind == "leave":
            restart = int(event.args[0]) if event.args else 0
            if not restart:
                self._departed_slots.add(m.slot)
            m.restart_after_close = restart
            m.closing = True
            self.report.core_calls += 1
            m.core.handle(Close(), now)
            self._push(now + self.config.close_timeout_ms, _CLOSE_TIMEOUT, m.slot, (m.inc,), None)
            self._drive(m)
        elif kind == "crash":
            self._kill(m)
            restart = int(event.args[0]) if event.args else 0
            if restart:
                self._push(now + restart, _RESTART, m.slot, None, None)
        elif kind == "pause":
            until = now + int(event.args[0])
            m.app_active = False
            m.unhealthy_until = max(m.unhealthy_until, until)
            self._push(until, _RECOVER, m.slot, ("resume", m.inc), None)
        elif kind == "freeze":
            until = now + int(event.args[0])
            m.frozen = True
            m.app_active = False
            m.unhealthy_until = max(m.unhealthy_until, until)
            self._push(until, _RECOVER, m.slot, ("unfreeze", m.inc), None)
        elif kind == "partition":
            until = now + int(event.args[0])
            m.partitioned_until = max(m.partitioned_until, until)
            m.unhealthy_until = max(m.unhealthy_until, until)
            self._push(until, _RECOVER, m.slot, ("heal", m.inc), None)
        elif kind == "subscribe":
            topics, pattern = event.args
            sub = Subscribe(pattern=pattern) if pattern else Subscribe(topics=tuple(topics))
            m.core.submit(sub)
            self._schedule_tick(m, now)
        elif kind == "inject":
            code, count = event.args
            self.coordinator.inject_error(m.member_id, int(code), int(count))

    def _recover(self, slot: int, x: Any, _y: Any) -> None:
        what, inc = x
        if what == "load":
            self.coordinator.load(self.now, int(inc))
            self._coord_down_until = self.now
            return
        m = self._slots.get(slot)
        if m is None or m.inc != inc or not m.alive:
            return
        now = self.now
        if what == "resume" and not m.frozen:
            m.app_active = True
            m.poll_origin = now
            self._schedule_tick(m, now)
            self._drive(m)
        elif what == "unfreeze":
            m.frozen = False
            m.app_active = True
            m.poll_origin = now
            deferred, m.deferred = m.deferred, []
            handlers: dict[int, Callable[[_Member, Any, Any], None]] = {
                _WAKE: lambda mm, _x, _y: self._drive(mm),
                _TICK: self._on_tick,
                _HB_RESPONSE: self._on_hb_response,
                _HB_TIMEOUT: self._on_hb_timeout,
                _CALLBACK_DONE: self._on_callback_done,
                _COMMIT_DONE: self._on_commit_done,
                _FIND_DONE: self._on_find_done,
                _METADATA_DONE: self._on_metadata_done,
                _CLOSE_TIMEOUT: self._on_close_timeout,
                _DISCONNECT: self._on_disconnect,
            }
            m.tick_at = -1
            m.wake_at = -1
            for kind, _, dx, dy in deferred:
                if not m.alive or m.frozen:
                    break
                try:
                    handlers[kind](m, dx, dy)
                except _StopRun:
                    raise
                except Exception as exc:
                    self._core_exception(m, exc)
            if m.alive:
                self._schedule_tick(m, now)
                self._drive(m)
        elif what == "heal" and m.partitioned_until <= now:
            self._drive(m)

    def _failover(self, down_ms: int, load_ms: int) -> None:
        """The coordinator moves: connections drop (in-flight requests fail with DISCONNECTED),
        it is unavailable for ``down_ms``, then loads the groups (kept) for ``load_ms``."""
        now = self.now
        self.coordinator.unload(now)
        self._coord_down_until = now + down_ms
        self._coord_unhealthy_until = now + down_ms + load_ms
        self._push(now + down_ms, _RECOVER, -1, ("load", load_ms), None)
        for m in list(self._slots.values()):
            if not m.alive:
                continue
            requests = [request for request, _ in m.inflight.values()]
            m.inflight.clear()
            if m.frozen:
                # A stalled process notices the dropped connection when it runs again.
                m.deferred.append((_DISCONNECT, 0, (m.inc,), requests))
                continue
            try:
                self._on_disconnect(m, (m.inc,), requests)
            except _StopRun:
                raise
            except Exception as exc:
                self._core_exception(m, exc)

    def _on_disconnect(self, m: _Member, _x: Any, requests: list[HeartbeatRequest]) -> None:
        for request in requests:
            self._fail(m, request, FailureKind.DISCONNECTED)
        self.report.core_calls += 1
        m.core.on_coordinator_unknown(self.now)
        m.find_inflight = False
        m.find_attempts = 0
        self._drive(m)

    def _coord_tick(self) -> None:
        now = self.now
        for _, _, kind in self.coordinator.tick(now):
            name = kind.value.lower()
            self.report.server_removals[name] = self.report.server_removals.get(name, 0) + 1
        self._push(now + 250, _COORD_TICK, -1, None, None)

    def _on_close_timeout(self, m: _Member, _x: Any, _y: Any) -> None:
        if m.closing:
            self._finish_close(m)

    def _finish_close(self, m: _Member) -> None:
        slot = m.slot
        restart = m.restart_after_close
        self._kill(m)
        if restart:
            self._push(self.now + restart, _RESTART, slot, None, None)

    # ------------------------------------------------------------------------------------------
    # Statistics and checkpoints
    # ------------------------------------------------------------------------------------------

    def _on_coordinator_event(self, event: CoordinatorEvent) -> None:
        if event.kind is EventKind.TARGET_COMPUTED:
            self.report.rebalances += 1
        elif event.kind is EventKind.GROUP_STATE_CHANGED:
            interval = self.config.heartbeat_interval_ms
            if event.detail.endswith(str(GroupState.STABLE)):
                self._stable_since = event.time_ms
                if self._episode_start is not None:
                    self.report.convergence_hb.append(
                        (event.time_ms - self._episode_start) / interval
                    )
                    self._episode_start = None
            elif self._episode_start is None and not event.detail.endswith(str(GroupState.EMPTY)):
                self._episode_start = event.time_ms

    def _checkpoint(self, churn_end: int) -> None:
        """The end of a quiet window: the group must have converged."""
        report = self.report
        report.checkpoints += 1
        group = self.config.group_id
        coordinator = self.coordinator
        live = [m for m in self._slots.values() if m.alive and not m.closing]
        problems: list[str] = []
        problems += [f"server: {p}" for p in coordinator.check_exclusive(group)]
        report.checks += 1
        if live:
            state = coordinator.group_state(group)
            if state is not GroupState.STABLE:
                problems.append(f"group is {state} (epoch {coordinator.group_epoch(group)})")
        assignment_epoch = coordinator.assignment_epoch(group)
        topics = coordinator.topics
        subscribed: set[str] = set()
        owned: dict[tuple[str, int], list[int]] = {}
        for m in live:
            report.checks += 1
            core = m.core
            described = coordinator.member(group, m.member_id)
            if core.state is not S.STABLE:
                problems.append(f"slot {m.slot} is {core.state}")
                continue
            if described is None:
                problems.append(f"slot {m.slot} ({m.member_id}) is unknown to the coordinator")
                continue
            if core.member_epoch != described.member_epoch or core.member_epoch != assignment_epoch:
                problems.append(
                    f"slot {m.slot} epoch {core.member_epoch}, coordinator says "
                    f"{described.member_epoch}, assignment epoch {assignment_epoch}"
                )
            server = frozenset((topics.name(tid) or str(tid), p) for tid, p in described.assigned)
            if server != m.owned:
                problems.append(
                    f"slot {m.slot} owns {len(m.owned)} partitions, the coordinator assigned "
                    f"{len(server)} ({sorted(server ^ m.owned)[:4]} differ)"
                )
            names = described.subscribed_topic_names
            regex = described.subscribed_topic_regex
            subscribed |= {t for t in topics.names() if t in names} | (
                {t for t in topics.names() if regex and re.fullmatch(regex, t)}
            )
            for tp in m.owned:
                owned.setdefault(tp, []).append(m.slot)
        for name in sorted(subscribed):
            topic = topics.get(name)
            assert topic is not None
            for p in range(topic.partitions):
                report.checks += 1
                holders = owned.get((name, p), [])
                if len(holders) != 1:
                    problems.append(f"{name}-{p} owned by {len(holders)} members {holders[:4]}")
        if problems:
            self._violate(
                "not-converged",
                f"{len(problems)} problems after the quiet window: " + "; ".join(problems[:6]),
            )
        stable_at = max(self._stable_since, churn_end)
        report.checkpoint_convergence_hb.append(
            (stable_at - churn_end) / self.config.heartbeat_interval_ms
        )

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
