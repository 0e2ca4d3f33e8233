"""A simulated member host: the application thread (polls, rebalance callbacks, the
pre-revocation commit) and the runtime's `MemberDriver` over the simulated links."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any

from consumer_sdk.backoff import Backoff
from consumer_sdk.domain import (
    ClusterMetadata,
    Coordinator,
    HeartbeatResponse,
    OffsetFetchResponse,
    PartitionResult,
    TopicMetadata,
)
from consumer_sdk.membership import (
    AssignmentChanged,
    CallbackCompleted,
    CallbackKind,
    CallbacksNeeded,
    CommitCompleted,
    CommitNeeded,
    ErrorEvent,
    Failure,
    FailureKind,
    LeaveCompleted,
    MembershipConfig,
    Poll,
    StateChanged,
    Subscribe,
)
from consumer_sdk.membership.requests import CommitKind
from consumer_sdk.runtime.driver import (
    Api,
    CommitDone,
    Outbound,
    SharedLookups,
)
from consumer_sdk.simulation._base import (
    _ARRIVE,
    _CALLBACK_DONE,
    _RESPONSE,
    _RESTART,
    _TICK,
    _TIMEOUT,
    _WAKE,
    IDLE_STATES,
    E,
    SimBase,
    _Member,
    _Offset,
    _VirtualTransport,
)
from consumer_sdk.simulation.schedule import REGEX

_HEARTBEAT = Api.HEARTBEAT
_COMMIT = Api.OFFSET_COMMIT


def _randint(rng: random.Random, lo: int, hi: int) -> int:
    """``rng.randint(lo, hi)``, the very same draw (CPython's rejection sampling over
    ``getrandbits``) without its three layers of Python calls: links draw one per message."""
    n = hi - lo + 1
    k = n.bit_length()
    r = rng.getrandbits(k)
    while r >= n:
        r = rng.getrandbits(k)
    return lo + r


class MemberHost(SimBase):
    """Members' lifecycle, their driving and their network."""

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
        link = self._links.get(slot)
        if link is None:
            link = self._links[slot] = random.Random(f"{cfg.seed}/link/{slot}")
        m = _Member(slot, inc, core, rng, static, core.member_id, link, poll_origin=now)
        backoff_rng = random.Random(f"{cfg.seed}/backoff/{slot}/{inc}")
        dconfig = self._driver_config
        if static:
            dconfig = replace(dconfig, group_instance_id=mconfig.group_instance_id)
        m.driver = self._driver_factory(
            dconfig,
            core,
            _VirtualTransport(self, m),
            SharedLookups(),  # one process per member
            lambda: None,  # nothing waits on a shared lookup of its own process
            lambda: Backoff(100, 1_000, 0.2, backoff_rng),
        )
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
        m.commit_waits.clear()

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
        """Drain the core's events, then run the member's driver (it sends what is due over
        the simulated links); schedule the next wake-up. (After a drain, ``m.idle`` is
        whether the core's state is one of `IDLE_STATES`: every transition is an event.)"""
        now = self.now
        core = m.core
        driver = m.driver
        assert driver is not None
        if driver.outbox or core.background_events:
            self._drain(m)
        if not m.alive:
            return
        if (
            self.config.coalesce_polls
            and m.app_active
            and (now - m.delivered_poll >= self._poll_refresh_ms or not m.idle)
        ):
            self._deliver_poll(m)  # (its first checks, inline: a stable member skips it)
        self.report.core_calls += 1
        wait = driver.run(now)
        if driver.outbox or core.background_events:
            self._drain(m)
            if not m.alive:
                return
        at = now + wait if wait > 1 else now + 1
        if not now <= m.wake_at <= at:  # (see _on_wake)
            m.wake_at = at
            m.wake_token = token = m.wake_token + 1
            self._push(at, _WAKE, m.slot, (m.inc, token), None)
        if m.tick_at < 0 and (m.pending_callbacks or core.app_events or not m.idle):
            self._schedule_tick(m, now)

    def _on_wake(self, m: _Member, x: Any, _y: Any) -> None:
        """The member's driver runs again. A wake-up is scheduled (inline, where a run or a
        heartbeat answer asks for one) unless one comes no later; scheduling one makes the
        one before stale (its token is not the member's ``wake_token`` any more)."""
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
            self._push(start, _CALLBACK_DONE, m.slot, (m.inc, cb.callback_id, cb.kind), error)
        m.busy_until = start
        m.pending_callbacks.clear()

    def _on_callback_done(self, m: _Member, x: Any, error: Any) -> None:
        callback_id, kind = x[1], x[2]
        driver = m.driver
        if m.closing and kind is CallbackKind.REVOKED and driver is not None and m.owned:
            # The application commits what it consumed in on_revoke, asynchronously: the
            # driver sends it before the leave that follows, with the epoch it was made under.
            offsets = {tp: _Offset(self.now) for tp in sorted(m.owned)}
            driver.commit(self.now, offsets, CommitKind.ASYNC, epoch=m.core.member_epoch)
        self.report.core_calls += 1
        m.core.handle(CallbackCompleted(callback_id, error), self.now)
        self._drive(m)

    def _drain(self, m: _Member) -> None:
        """Handle the driver's and the core's events (the application thread's side)."""
        driver = m.driver
        if driver is not None and driver.outbox:
            done, driver.outbox[:] = list(driver.outbox), []
            for item in done:
                if isinstance(item, CommitDone):
                    self._commit_done(m, item)
        events = m.core.background_events
        if not events:
            return
        while events:
            event = events.popleft()
            if isinstance(event, AssignmentChanged):
                self._set_owned(m, frozenset(event.partitions))
            elif isinstance(event, StateChanged):
                m.idle = event.new in IDLE_STATES
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

    def _on_fatal(self, m: _Member, event: ErrorEvent) -> None:
        """The application's poll() raised a fatal error: the app dies; a supervisor restarts
        it a bit later (a new member, same instance id if static)."""
        name = E.name_of(event.code)
        self.report.fatal_by_code[name] = self.report.fatal_by_code.get(name, 0) + 1
        slot = m.slot
        self._kill(m)
        lo, hi = self.config.fatal_restart_ms
        self._push(self.now + m.rng.randint(lo, hi), _RESTART, slot, None, None)

    def _faulty(self) -> bool:
        """Whether we are in a churn window (message loss and latency spikes stop outside)."""
        wins = self._windows
        now = self.now
        i = self._window
        while i < len(wins) and now >= wins[i][1]:
            i += 1
        self._window = i
        return i < len(wins) and now >= wins[i][0]

    def _link(self, rng: random.Random, lossy: bool) -> int:
        """One message over a slot's link (``rng``: the link's draws): -1 if it is lost
        (``lossy`` ones only, in churn windows), else its latency (ms). The link's draws, in
        this order: ``random() < loss`` (``lossy`` ones), the latency as
        ``randint(*latency_ms)`` draws it, ``random() < spike_probability`` and the spike's
        ``randint``."""
        loss, lo, span, bits, spike = self._link_params
        if lossy and loss > 0 and rng.random() < loss and self._faulty():
            return -1
        if span > 1:  # (_randint inline: one per message)
            r = rng.getrandbits(bits)
            while r >= span:
                r = rng.getrandbits(bits)
            latency = lo + r
        else:
            latency = lo
        if spike and rng.random() < spike and self._faulty():
            latency += _randint(rng, *self.mix.spike_ms)
        return latency

    def _reachable(self, m: _Member) -> bool:
        return m.partitioned_until <= self.now

    def _send(self, m: _Member, request: Outbound) -> None:
        """A request of ``m``'s driver goes out. Requests to the coordinator travel in order
        (one connection); FindCoordinator and Metadata are answered by any broker."""
        self._next_msg = msg = self._next_msg + 1
        now = self.now
        m.inflight[msg] = (request, now)
        x = (m.inc, msg)
        api = request.api
        slot = m.slot
        # Commits are not lost at random (as before the driver ran here): a lost one would
        # only wait out its request timeout, which the invariants cannot tell from a bug.
        latency = -1 if m.partitioned_until > now else self._link(m.link, api is not _COMMIT)
        if latency < 0:
            self.report.messages_lost += 1
            self._push(now + request.timeout_ms, _TIMEOUT, slot, x, None)
            return
        if api is _HEARTBEAT or api is _COMMIT or api is Api.OFFSET_FETCH:
            arrive = now + latency
            if arrive < m.last_arrival:
                arrive = m.last_arrival
            m.last_arrival = arrive
            self._push(arrive, _ARRIVE, slot, x, m)
            return
        self._push(now + 2 * latency, _RESPONSE, slot, x, self._answer(request))

    def _answer(self, request: Outbound) -> Any:
        """What any broker answers to FindCoordinator, Metadata and the group's session
        timeout (DescribeConfigs)."""
        if request.api is Api.GROUP_SESSION_TIMEOUT:
            return self.config.session_timeout_ms
        if request.api is Api.FIND_COORDINATOR:
            node = self._coord_node
            if self._coord_down_until > self.now:
                code = int(E.COORDINATOR_NOT_AVAILABLE)
                return Coordinator(self.config.group_id, -1, "", -1, code)
            return Coordinator(self.config.group_id, node, f"coordinator-{node}", 9092)
        topics = self.coordinator.topics
        return ClusterMetadata(
            (),
            tuple(TopicMetadata(name, tid, ()) for tid, name in topics.names_by_id().items()),
        )

    def _arrive(self, slot: int, x: Any, m: _Member) -> None:
        """A request reaches the coordinator (even if its sender died meanwhile)."""
        entry = m.inflight.get(x[1])
        if entry is None:  # the connection dropped before it got there
            return
        request, sent = entry
        now = self.now
        timeout = sent + request.timeout_ms
        if self._coord_down_until > now or m.partitioned_until > now:
            self.report.messages_lost += 1
            self._push(max(now, timeout), _TIMEOUT, slot, x, None)
            return
        moved = request.coordinator is None or request.coordinator.node_id != self._coord_node
        response: Any
        if request.api is _HEARTBEAT:
            if moved:
                response = HeartbeatResponse(int(E.NOT_COORDINATOR), -1, 0)
            else:
                response = self.coordinator.heartbeat(now, request.payload)
                m.left_seen = request.payload.member_epoch < 0
        elif request.api is _COMMIT:
            response = self._offset_commit(m, request, moved)
        else:
            response = OffsetFetchResponse(int(E.NOT_COORDINATOR) if moved else 0, ())
        if not m.alive:
            return
        latency = self._link(m.link, request.api is not _COMMIT)
        if latency < 0:
            self.report.messages_lost += 1
            self._push(max(now, timeout), _TIMEOUT, slot, x, None)
            return
        self._push(now + latency, _RESPONSE, slot, x, response)

    def _offset_commit(self, m: _Member, request: Outbound, moved: bool) -> Any:
        """An OffsetCommit at the coordinator, through its epoch checks."""
        req = request.payload
        if moved:
            code = int(E.NOT_COORDINATOR)
            return tuple(PartitionResult(o.topic, o.partition, code) for o in req.offsets)
        now = self.now
        if m.closing and m.left_seen and req.member_epoch > 0:
            self._violate(
                "commit-after-leave",
                f"a commit made in the group at epoch {req.member_epoch} reached the "
                "coordinator after the member's leave heartbeat",
                m,
            )
        offsets = {(o.topic, o.partition): o.offset for o in req.offsets}
        result = self.coordinator.offset_commit(
            now,
            self.config.group_id,
            req.member_id,
            req.member_epoch,
            offsets,
            instance_id=req.instance_id,
        )
        group = self.config.group_id
        topics = self.coordinator.topics
        for tp, code in result.items():
            self.report.checks += 1
            if code:
                self.report.commits_rejected += 1
                continue
            tid = topics.topic_id(tp[0])
            holder = self.coordinator.holder(group, (tid, tp[1])) if tid else None
            if holder is not None and holder != req.member_id:
                self._violate(
                    "zombie-commit",
                    f"commit of {tp[0]}-{tp[1]} at epoch {req.member_epoch} accepted "
                    f"while {holder} holds it",
                    m,
                )
        return tuple(PartitionResult(t, p, code) for (t, p), code in result.items())

    def _on_response(self, m: _Member, x: Any, response: Any) -> None:
        entry = m.inflight.pop(x[1], None)
        if entry is None:
            return
        request, sent = entry
        if m.partitioned_until > self.now:  # the partition started while it was on its way back
            self.report.messages_lost += 1
            m.inflight[x[1]] = entry
            self._push(max(self.now, sent + request.timeout_ms), _TIMEOUT, m.slot, x, None)
            return
        if request.api is _HEARTBEAT:
            m.last_error = response.error_code
        self.report.core_calls += 1
        driver = m.driver
        assert driver is not None
        now = self.now
        wait = driver.on_response(now, request, response)
        if m.core.member_epoch != m.last_epoch:
            self._check_epoch(m)
        if wait > 0 and not m.pending_callbacks and not driver.outbox:
            # A quiet heartbeat answer: as the runtime does (MemberNetwork._on_outcome), no
            # run now, only one when the heartbeat is next due, unless one comes earlier.
            at = now + wait
            if not now <= m.wake_at <= at:  # (else the run already scheduled comes first)
                m.wake_at = at
                m.wake_token = token = m.wake_token + 1
                self._push(at, _WAKE, m.slot, (m.inc, token), None)
            return
        self._drive(m)

    def _on_timeout(self, m: _Member, x: Any, _y: Any) -> None:
        entry = m.inflight.pop(x[1], None)
        if entry is None:
            return
        self._fail(m, entry[0], FailureKind.TIMEOUT)
        self._drive(m)

    def _fail(self, m: _Member, request: Outbound, kind: FailureKind) -> None:
        if request.api is _HEARTBEAT:
            m.last_error = 0
        self.report.core_calls += 1
        driver = m.driver
        assert driver is not None
        driver.on_failure(self.now, request, Failure(kind, "simulated"))

    def _commit(self, m: _Member, event: CommitNeeded) -> None:
        """The pre-revocation (or close) commit: through the member's driver, which sends it
        to the coordinator (retrying as the runtime does) and reports its outcome."""
        driver = m.driver
        assert driver is not None
        now = self.now
        offsets = {tp: _Offset(now) for tp in sorted(m.owned)}
        commit_id = driver.commit(
            now,
            offsets,
            CommitKind.REBALANCE,
            max(1, event.deadline_ms - now),
            epoch=event.member_epoch,
        )
        m.commit_waits[commit_id] = event.commit_id

    def _commit_done(self, m: _Member, done: CommitDone) -> None:
        waited = m.commit_waits.pop(done.result.commit_id, None)
        if waited is None:
            return
        error = None if done.result.ok else done.result.error_message
        self.report.core_calls += 1
        m.core.handle(CommitCompleted(waited, error), self.now)
