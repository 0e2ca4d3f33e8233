"""Several membership cores talking to one :class:`ScriptedCoordinator`, in virtual time.

Every member is a :class:`~.harness.Driver`. The cluster plays the network (heartbeats queue
per member and are delivered in order, answered by the coordinator or failed) and the
application threads (Poll events, callbacks, commits), and checks the safety invariants after
every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from consumer_sdk.domain import HeartbeatRequest, HeartbeatResponse
from consumer_sdk.membership import (
    CallbackKind,
    CallbacksNeeded,
    Failure,
    FailureKind,
    MemberState,
    StateChanged,
)

from .coordinator import ScriptedCoordinator
from .harness import Driver, cfg


class InvariantViolation(AssertionError):
    pass


@dataclass
class Member:
    name: str
    driver: Driver = field(repr=False)
    in_flight: list[HeartbeatRequest] = field(default_factory=list, repr=False)
    # Partitions whose ASSIGNED callback completed successfully since the member last joined.
    assigned_ok: set[tuple[str, int]] = field(default_factory=set, repr=False)
    seen_transitions: int = field(default=0, repr=False)
    fatal_seen: bool = field(default=False, repr=False)

    @property
    def core(self):  # type: ignore[no-untyped-def]
        return self.driver.core


@dataclass
class Cluster:
    coordinator: ScriptedCoordinator = field(repr=False)
    now: int = 0
    members: dict[str, Member] = field(default_factory=dict, repr=False)
    sent: list[tuple[str, HeartbeatRequest]] = field(default_factory=list, repr=False)

    # -- setup -------------------------------------------------------------------------------

    def add(self, name: str, *topics: str, pattern: str | None = None, **config: object) -> Member:
        config.setdefault("group_id", self.coordinator.group_id)
        driver = Driver(cfg(**config), now=self.now, member_id=f"{name}-id", seed=len(self.members))
        member = Member(name, driver)
        self.members[name] = member
        driver.metadata(self.coordinator.metadata())
        driver.subscribe(*topics, pattern=pattern)
        return member

    def _sync(self, m: Member) -> Driver:
        m.driver.now = self.now
        return m.driver

    # -- actions -----------------------------------------------------------------------------

    def advance(self, ms: int) -> None:
        self.now += ms

    def app_poll(self, m: Member) -> None:
        self._sync(m).app_poll()
        self.check()

    def background_poll(self, m: Member) -> HeartbeatRequest | None:
        d = self._sync(m)
        was_fatal = d.state is MemberState.FATAL
        request = d.core.poll(self.now).request
        if request is not None:
            if was_fatal:
                raise InvariantViolation(f"{m.name} sent a heartbeat after FATAL: {request}")
            self._check_ack(m, request)
            m.in_flight.append(request)
            self.sent.append((m.name, request))
        self.check()
        return request

    def deliver(self, m: Member, outcome: str = "answer") -> HeartbeatResponse | None:
        """Deliver the oldest in-flight heartbeat of ``m``.

        ``answer``: the coordinator answers. ``lost``: it processes the request but the answer
        is lost (timeout). ``drop``: it never sees it (disconnect). Anything else is an error
        code name answered without the coordinator seeing the request.
        """
        d = self._sync(m)
        request = m.in_flight.pop(0)
        response = None
        if outcome == "answer":
            response = self.coordinator.heartbeat(self.now, request)
            d.respond(response, request)
        elif outcome == "lost":
            self.coordinator.heartbeat(self.now, request)
            d.core.on_heartbeat_failure(self.now, Failure(FailureKind.TIMEOUT), request)
        elif outcome == "drop":
            d.core.on_heartbeat_failure(self.now, Failure(FailureKind.DISCONNECTED), request)
        else:
            from consumer_sdk.error_codes import ErrorCode

            from .harness import err

            response = err(ErrorCode[outcome])
            d.respond(response, request)
        self.check()
        return response

    def run_callback(self, m: Member, error: str | None = None) -> bool:
        d = self._sync(m)
        pending = d.pending_callbacks()
        if not pending:
            return False
        cb = pending[0]
        self._track(m)
        d.complete(cb, error)
        self._track(m)
        if error is None and cb.kind is CallbackKind.ASSIGNED:
            m.assigned_ok.update(cb.partitions)
        self.check()
        return True

    def complete_commit(self, m: Member, error: str | None = None) -> bool:
        d = self._sync(m)
        pending = d.pending_commits()
        if not pending:
            return False
        d.complete_commit(pending[0], error)
        self.check()
        return True

    def metadata(self, m: Member) -> None:
        self._sync(m).metadata(self.coordinator.metadata())
        self.check()

    def coordinator_found(self, m: Member) -> None:
        self._sync(m).core.on_coordinator_known(self.now)

    def tick(self) -> None:
        self.coordinator.tick(self.now)
        self.check()

    # -- convenience -------------------------------------------------------------------------

    def settle(self, rounds: int = 50, step_ms: int = 250) -> None:
        """Run every member (app poll, callbacks, commits, heartbeats answered) for a while."""
        for _ in range(rounds):
            for m in self.members.values():
                self.app_poll(m)
                while self.complete_commit(m) or self.run_callback(m):
                    pass
                if m.core.coordinator_needed:
                    self.coordinator_found(m)
                if m.core.metadata_needed:
                    self.metadata(m)
                while self.background_poll(m) is not None or m.in_flight:
                    while m.in_flight:
                        self.deliver(m)
            self.advance(step_ms)
            self.tick()

    # -- invariants --------------------------------------------------------------------------

    def _track(self, m: Member) -> None:
        transitions = m.driver.transitions[m.seen_transitions :]
        m.seen_transitions = len(m.driver.transitions)
        for t in transitions:
            if t.new is MemberState.JOINING:
                m.assigned_ok.clear()

    def _check_ack(self, m: Member, request: HeartbeatRequest) -> None:
        self._track(m)
        if request.topic_partitions is None:
            return
        names = self.coordinator.metadata()
        acked = {(names[t.topic_id], p) for t in request.topic_partitions for p in t.partitions}
        if request.member_epoch == 0 and acked:
            raise InvariantViolation(f"{m.name} joined with owned partitions {acked}")
        if request.topic_partitions != m.core.current_assignment.to_wire():
            raise InvariantViolation(f"{m.name} acked something else than its current assignment")
        if not acked <= m.assigned_ok:
            raise InvariantViolation(
                f"{m.name} acked {sorted(acked - m.assigned_ok)} before their ASSIGNED callback"
            )

    def check(self) -> None:
        """Safety: a live member never holds (callback done) what another member holds."""
        coord = self.coordinator
        for m in self.members.values():
            self._track(m)
            if m.fatal_seen and m.core.state is not MemberState.FATAL:
                raise InvariantViolation(f"{m.name} left FATAL")
            if m.core.state is MemberState.FATAL:
                m.fatal_seen = True
            if m.core.member_id not in coord.members:
                continue  # not a member for the coordinator (a zombie until it hears so)
            held = m.core.assigned_partitions - m.core.awaiting_callback
            for topic, partition in held:
                if topic not in coord.topic_ids:
                    continue
                others = coord.holders(topic, partition) - {m.core.member_id}
                if others:
                    raise InvariantViolation(
                        f"{m.name} holds {topic}-{partition} while the coordinator gave it to "
                        f"{sorted(others)}"
                    )

    def transitions(self, m: Member) -> list[StateChanged]:
        return m.driver.transitions

    def callbacks(self, m: Member) -> list[CallbacksNeeded]:
        return m.driver.callbacks()
