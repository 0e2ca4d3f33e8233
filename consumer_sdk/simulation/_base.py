"""What the parts of the simulator share: the queue's event kinds, a member incarnation
(`Member`), and `SimBase`, the state every part of `Simulation` reads (declared once here;
`engine` sets it up) with the methods the parts call on each other."""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from consumer_sdk.coordinator import (
    CoordinatorEvent,
    GroupCoordinator,
)
from consumer_sdk.domain import (
    Coordinator,
)
from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.membership import (
    CallbacksNeeded,
    CommitNeeded,
    ErrorEvent,
    FailureKind,
    GroupMembership,
    MembershipConfig,
    MemberState,
    StateChanged,
)
from consumer_sdk.runtime.driver import (
    DriverConfig,
    MemberDriver,
    Outbound,
)
from consumer_sdk.simulation.config import FaultMix, SimConfig
from consumer_sdk.simulation.report import SimReport
from consumer_sdk.simulation.trace import Trace, TraceEvent

LOG = logging.getLogger("consumer_sdk.simulation")

S = MemberState
E = ErrorCode

#: Builds the core of one member incarnation: ``(config, rng) -> GroupMembership``.
CoreFactory = Callable[[MembershipConfig, random.Random], GroupMembership]
#: Builds the driver of one member incarnation around its core (tests use it to run a
#: deliberately broken driver): ``(config, core, transport, shared, wake, backoff)``.
DriverFactory = Callable[..., MemberDriver]

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
_ARRIVE = 2  # a request reaches the coordinator (even if its sender died meanwhile)
_RESPONSE = 3
_TIMEOUT = 4
_CALLBACK_DONE = 5
_FAULT = 9
_RECOVER = 10
_COORD_TICK = 11
_CHECKPOINT = 12
_PROGRESS = 13
_RESTART = 14
_CLOSE_TIMEOUT = 15
_DISCONNECT = 16

#: The largest event kind (the loop indexes a list by kind).
_MAX_KIND = _DISCONNECT


@dataclass(frozen=True, slots=True)
class _Offset:
    offset: int
    leader_epoch: int = -1
    metadata: str | None = None


class _VirtualTransport:
    """A member's `Transport` over the simulated links: requests become queue events."""

    __slots__ = ("m", "send")

    def __init__(self, sim: SimBase, m: _Member) -> None:
        self.m = m
        # ``send(request)`` is ``sim._send(m, request)``, bound once (one call less per request).
        self.send: Callable[[Outbound], None] = partial(sim._send, m)

    def connection_id(self, coordinator: Coordinator) -> int | None:
        return self.m.conn_gen


def default_core_factory(config: MembershipConfig, rng: random.Random) -> GroupMembership:
    """The real core, unmodified."""
    return GroupMembership(config, rng=rng)


def default_driver_factory(*args: Any) -> MemberDriver:
    """The runtime's driver, unmodified."""
    return MemberDriver(*args)


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
    link: random.Random  # the slot's link draws (shared by its incarnations)
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
    driver: MemberDriver | None = None
    inflight: dict[int, tuple[Outbound, int]] = field(default_factory=dict)
    conn_gen: int = 0
    last_arrival: int = 0
    left_seen: bool = False
    commit_waits: dict[int, int] = field(default_factory=dict)
    pending_callbacks: list[CallbacksNeeded] = field(default_factory=list)
    busy_until: int = 0
    deferred: list[tuple[int, int, Any, Any]] = field(default_factory=list)
    owned: frozenset[tuple[str, int]] = frozenset()
    last_epoch: int = 0
    idle: bool = False  # the core's state is in IDLE_STATES, as of the last StateChanged
    reconciling_since: int = -1
    last_error: int = 0
    fatal: bool = False
    restart_after_close: int = 0


class SimBase:
    """The simulation's shared state (set up by `Simulation.__init__`) and the methods its
    parts (`engine`, `host`, `faults`, `invariants`) call across modules."""

    config: SimConfig
    mix: FaultMix
    events: tuple[TraceEvent, ...]
    trace: Trace
    report: SimReport
    coordinator: GroupCoordinator
    now: int
    _core_factory: CoreFactory
    _driver_factory: DriverFactory
    _driver_config: DriverConfig
    _coord_node: int
    _progress: Callable[[str], None] | None
    _wheel: list[list[tuple[int, int, Any, Any]]]
    _occupied: bytearray
    _later: list[tuple[int, int, int, int, Any, Any]]
    _seq: int
    _slots: dict[int, _Member]
    _incarnations: dict[int, int]
    _owners: dict[tuple[str, int], set[_Member]]
    _links: dict[int, random.Random]
    _link_params: tuple[float, int, int, int, float]
    _next_msg: int
    _coord_down_until: int
    _coord_unhealthy_until: int
    _episode_start: int | None
    _stable_since: int
    _windows: list[tuple[int, int, int]]
    _poll_refresh_ms: int
    _window: int
    _departed_slots: set[int]

    def _push(self, t: int, kind: int, slot: int, x: Any, y: Any) -> None:
        raise NotImplementedError

    def _violate(self, kind: str, message: str, m: _Member | None = None) -> None:
        raise NotImplementedError

    def _core_exception(self, m: _Member, exc: Exception) -> None:
        raise NotImplementedError

    def _drive(self, m: _Member) -> None:
        raise NotImplementedError

    def _kill(self, m: _Member) -> None:
        raise NotImplementedError

    def _start(self, slot: int) -> None:
        raise NotImplementedError

    def _schedule_tick(self, m: _Member, not_before: int) -> None:
        raise NotImplementedError

    def _fail(self, m: _Member, request: Outbound, kind: FailureKind) -> None:
        raise NotImplementedError

    def _check_epoch(self, m: _Member) -> None:
        raise NotImplementedError

    def _on_state_changed(self, m: _Member, event: StateChanged) -> None:
        raise NotImplementedError

    def _set_owned(self, m: _Member, owned: frozenset[tuple[str, int]]) -> None:
        raise NotImplementedError

    def _live_in_group(self, m: _Member) -> bool:
        raise NotImplementedError

    def _check_reconciling(self, m: _Member) -> None:
        raise NotImplementedError

    def _on_fatal(self, m: _Member, event: ErrorEvent) -> None:
        raise NotImplementedError

    def _finish_close(self, m: _Member) -> None:
        raise NotImplementedError

    def _on_disconnect(self, m: _Member, _x: Any, requests: list[Outbound]) -> None:
        raise NotImplementedError

    def _on_tick(self, m: _Member, _x: Any, _y: Any) -> None:
        raise NotImplementedError

    def _on_response(self, m: _Member, x: Any, response: Any) -> None:
        raise NotImplementedError

    def _on_timeout(self, m: _Member, x: Any, _y: Any) -> None:
        raise NotImplementedError

    def _on_callback_done(self, m: _Member, x: Any, error: Any) -> None:
        raise NotImplementedError

    def _on_close_timeout(self, m: _Member, _x: Any, _y: Any) -> None:
        raise NotImplementedError

    def _reachable(self, m: _Member) -> bool:
        raise NotImplementedError

    def _faulty(self) -> bool:
        raise NotImplementedError

    def _commit(self, m: _Member, event: CommitNeeded) -> None:
        raise NotImplementedError

    def _on_coordinator_event(self, event: CoordinatorEvent) -> None:
        raise NotImplementedError

    def _run_callbacks(self, m: _Member) -> None:
        raise NotImplementedError

    def _link(self, rng: random.Random, lossy: bool) -> int:
        raise NotImplementedError

    def _send(self, m: _Member, request: Outbound) -> None:
        raise NotImplementedError
