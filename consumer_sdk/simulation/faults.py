"""The faults the trace schedules: leaves, crashes, pauses, freezes, partitions, coordinator
failovers, topic changes, injected errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from consumer_sdk.membership import (
    Close,
    FailureKind,
    Subscribe,
)
from consumer_sdk.runtime.driver import (
    Outbound,
)
from consumer_sdk.simulation._base import (
    _CALLBACK_DONE,
    _CLOSE_TIMEOUT,
    _COORD_TICK,
    _DISCONNECT,
    _RECOVER,
    _RESPONSE,
    _RESTART,
    _TICK,
    _TIMEOUT,
    _WAKE,
    SimBase,
    _Member,
    _StopRun,
)
from consumer_sdk.simulation.trace import TraceEvent


class Faults(SimBase):
    """Applying and recovering from the scheduled faults."""

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
                _RESPONSE: self._on_response,
                _TIMEOUT: self._on_timeout,
                _CALLBACK_DONE: self._on_callback_done,
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
        self._coord_node += 1
        for m in list(self._slots.values()):
            if not m.alive:
                continue
            requests = [request for request, _ in m.inflight.values()]
            m.inflight.clear()
            m.conn_gen += 1
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

    def _on_disconnect(self, m: _Member, _x: Any, requests: list[Outbound]) -> None:
        """The coordinator connection dropped: what was in flight on it fails."""
        for request in requests:
            self._fail(m, request, FailureKind.DISCONNECTED)
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
