"""Single-threaded drivers for the membership core, with virtual time."""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from consumer_sdk.domain import HeartbeatRequest, HeartbeatResponse, TopicIdPartitions
from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.membership import (
    BackgroundEvent,
    CallbackCompleted,
    CallbackKind,
    CallbacksNeeded,
    Close,
    CloseOption,
    CommitCompleted,
    CommitNeeded,
    ErrorEvent,
    Failure,
    FailureKind,
    GroupMembership,
    MembershipConfig,
    MemberState,
    Poll,
    StateChanged,
    Subscribe,
    Unsubscribe,
)

T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)
T3 = uuid.UUID(int=3)
NAMES = {T1: "t1", T2: "t2", T3: "t3"}
INTERVAL = 5000


def cfg(**overrides: object) -> MembershipConfig:
    base: dict[str, object] = {"group_id": "group", "auto_commit": False}
    base.update(overrides)
    return MembershipConfig(**base)  # type: ignore[arg-type]


def assignment(spec: Mapping[uuid.UUID, Iterable[int]]) -> tuple[TopicIdPartitions, ...]:
    return tuple(TopicIdPartitions(t, tuple(sorted(ps))) for t, ps in sorted(spec.items()))


def ok(
    epoch: int,
    spec: Mapping[uuid.UUID, Iterable[int]] | None = None,
    interval: int = INTERVAL,
) -> HeartbeatResponse:
    return HeartbeatResponse(
        error_code=0,
        member_epoch=epoch,
        heartbeat_interval_ms=interval,
        assignment=None if spec is None else assignment(spec),
    )


def err(code: ErrorCode, message: str | None = None) -> HeartbeatResponse:
    return HeartbeatResponse(
        error_code=int(code), member_epoch=-1, heartbeat_interval_ms=0, error_message=message
    )


def owned_of(req: HeartbeatRequest) -> dict[uuid.UUID, tuple[int, ...]] | None:
    if req.topic_partitions is None:
        return None
    return {t.topic_id: t.partitions for t in req.topic_partitions}


@dataclass
class Driver:
    """One member under test: its core, virtual time, and every background event seen."""

    config: MembershipConfig = field(default_factory=cfg)
    now: int = 0
    seed: int = 0
    member_id: str | None = "member-1"
    seen: list[BackgroundEvent] = field(default_factory=list)
    transitions: list[StateChanged] = field(default_factory=list)
    completed: set[int] = field(default_factory=set)
    completed_commits: set[int] = field(default_factory=set)

    def __post_init__(self) -> None:
        factory = (lambda: self.member_id) if self.member_id is not None else None
        self.core = GroupMembership(
            self.config,
            rng=random.Random(self.seed),
            member_id_factory=factory,  # type: ignore[arg-type]
            on_state_change=self.transitions.append,
        )
        self.core.on_coordinator_known(self.now)

    # -- time and state ----------------------------------------------------------------------

    @property
    def state(self) -> MemberState:
        return self.core.state

    def advance(self, ms: int) -> None:
        self.now += ms

    # -- application side --------------------------------------------------------------------

    def subscribe(self, *topics: str, pattern: str | None = None, listener: bool = True) -> None:
        self.core.handle(Subscribe(tuple(topics), pattern, listener), self.now)

    def app_poll(self) -> None:
        self.core.handle(Poll(self.now), self.now)

    def unsubscribe(self) -> None:
        self.core.handle(Unsubscribe(), self.now)

    def close(self, option: CloseOption = CloseOption.DEFAULT) -> None:
        self.core.handle(Close(option), self.now)

    def drain(self) -> list[BackgroundEvent]:
        events = self.core.drain_background_events()
        self.seen.extend(events)
        return events

    def pending_callbacks(self) -> list[CallbacksNeeded]:
        """Callbacks asked for and not completed yet, oldest first."""
        self.drain()
        return [
            e
            for e in self.seen
            if isinstance(e, CallbacksNeeded) and e.callback_id not in self.completed
        ]

    def callbacks(self, kind: CallbackKind | None = None) -> list[CallbacksNeeded]:
        self.drain()
        return [
            e
            for e in self.seen
            if isinstance(e, CallbacksNeeded) and (kind is None or e.kind is kind)
        ]

    def complete(self, callback: CallbacksNeeded, error: str | None = None) -> None:
        self.completed.add(callback.callback_id)
        self.core.handle(CallbackCompleted(callback.callback_id, error), self.now)

    def run_callbacks(self, error: str | None = None) -> list[CallbacksNeeded]:
        """Complete every outstanding callback, including ones emitted while doing so."""
        ran: list[CallbacksNeeded] = []
        while True:
            pending = self.pending_callbacks()
            if not pending:
                return ran
            for cb in pending:
                self.complete(cb, error)
                ran.append(cb)

    def run_all(self, error: str | None = None) -> None:
        """Complete every outstanding commit and callback until none is left."""
        while True:
            commits = self.pending_commits()
            ran = self.run_callbacks(error)
            for commit in commits:
                self.complete_commit(commit)
            if not commits and not ran:
                return

    def commits(self) -> list[CommitNeeded]:
        self.drain()
        return [e for e in self.seen if isinstance(e, CommitNeeded)]

    def pending_commits(self) -> list[CommitNeeded]:
        return [c for c in self.commits() if c.commit_id not in self.completed_commits]

    def complete_commit(self, commit: CommitNeeded, error: str | None = None) -> None:
        self.completed_commits.add(commit.commit_id)
        self.core.handle(CommitCompleted(commit.commit_id, error), self.now)

    def errors(self) -> list[ErrorEvent]:
        self.drain()
        return [e for e in self.seen if isinstance(e, ErrorEvent)]

    def states(self) -> list[MemberState]:
        return [t.new for t in self.transitions]

    # -- network side ------------------------------------------------------------------------

    def hb(self) -> HeartbeatRequest | None:
        return self.core.poll(self.now).request

    def must_hb(self) -> HeartbeatRequest:
        req = self.hb()
        assert req is not None, f"expected a heartbeat in state {self.state}"
        return req

    def respond(self, response: HeartbeatResponse, request: HeartbeatRequest | None = None) -> None:
        self.core.on_heartbeat_response(self.now, response, request)

    def fail(self, kind: FailureKind = FailureKind.TIMEOUT, message: str = "") -> None:
        self.core.on_heartbeat_failure(self.now, Failure(kind, message))

    def metadata(self, names: Mapping[uuid.UUID, str] = NAMES) -> None:
        self.core.on_metadata(self.now, names)

    # -- common scripts ----------------------------------------------------------------------

    def join(self, *topics: str) -> HeartbeatRequest:
        """Subscribe, poll and return the join heartbeat."""
        self.subscribe(*(topics or ("t1",)))
        self.app_poll()
        return self.must_hb()

    def join_stable(
        self, spec: Mapping[uuid.UUID, Iterable[int]] | None = None, epoch: int = 1
    ) -> None:
        """Join, get ``spec`` assigned, run the callbacks, send the ack and become STABLE."""
        self.metadata()
        self.join(*sorted({NAMES[t] for t in (spec or {T1: ()})}))
        self.respond(ok(epoch, spec if spec is not None else {}))
        self.app_poll()
        self.run_all()
        ack = self.must_hb()
        assert ack.topic_partitions is not None
        self.respond(ok(epoch))
        assert self.state is MemberState.STABLE, self.state
        self.drain()


def stable(spec: Mapping[uuid.UUID, Iterable[int]] | None = None, **config: object) -> Driver:
    """A member STABLE with ``spec`` (default t1-0 and t1-1) at epoch 1."""
    d = Driver(cfg(**config))
    d.join_stable(spec if spec is not None else {T1: [0, 1]})
    return d


def drive_to(state: MemberState, **config: object) -> Driver:
    """A member in ``state``, holding t1-0/t1-1 where the state allows it.

    In-group states have a regular heartbeat in flight, so that an answer can be delivered.
    """
    S = MemberState
    if state is S.UNSUBSCRIBED:
        d = stable(**config)
        d.unsubscribe()
        d.run_callbacks()
        d.must_hb()  # leave heartbeat in flight
    elif state is S.JOINING:
        d = Driver(cfg(**config))
        d.metadata()
        d.join("t1")
    elif state in (S.RECONCILING, S.ACKNOWLEDGING):
        d = stable({T1: [0]}, **config)
        d.advance(INTERVAL)
        d.must_hb()
        d.respond(ok(2, {T1: [0, 1]}))
        d.app_poll()
        d.drain()
        d.advance(INTERVAL)
        d.must_hb()  # in flight; the ack has to wait for it
        if state is S.ACKNOWLEDGING:
            d.run_callbacks()
    elif state is S.STABLE:
        d = stable(**config)
        d.advance(INTERVAL)
        d.must_hb()
    elif state in (S.PREPARE_LEAVING, S.LEAVING):
        d = stable(**config)
        d.advance(INTERVAL)
        d.must_hb()
        d.unsubscribe()
        if state is S.LEAVING:
            d.run_callbacks()
    elif state is S.FENCED:
        d = stable(**config)
        d.advance(INTERVAL)
        d.must_hb()
        d.respond(err(ErrorCode.FENCED_MEMBER_EPOCH))
    elif state is S.STALE:
        d = stable(**config)
        d.advance(d.config.rebalance_timeout_ms)
        d.must_hb()
    else:
        d = stable(**config)
        d.advance(INTERVAL)
        d.must_hb()
        d.respond(err(ErrorCode.GROUP_AUTHORIZATION_FAILED))
    assert d.state is state, (d.state, state)
    d.drain()
    return d
