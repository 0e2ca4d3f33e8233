"""`MemberDriver`: one group member's request managers and the order between them, sans I/O.

The driver owns the membership core (with its heartbeat manager) and the coordinator,
metadata and commit request managers of one member, and decides what goes out when: the
coordinator lookup (shared by the members of one process, see `SharedLookups`), metadata,
commits before the heartbeat of the same run on the same connection (so a commit made before
a leave is applied before it), OffsetFetches, the auto-commit, then the heartbeat. It reads no
clock, opens no socket and starts no thread:

- in: application events (`MemberDriver.submit`, `commit`, `fetch_offsets`, ...), responses
  and failures (`on_response` / `on_failure`, fed back as values: a `Failure` mapped once by
  the host's error boundary), and time (``now_ms`` on every call);
- out: requests, handed to a `Transport` as `Outbound` values, the time of the next run
  (`run` returns it), and application-bound events (`MemberDriver.outbox`: finished commits
  and OffsetFetches, partitions to fence, group errors) plus the core's background events.

Hosts: the runtime's `MemberNetwork` drives it on the shared network loop over real
connections; the tests drive it over a scripted transport. Like the core, a driver is not
thread-safe: its host calls it from one thread only (the network loop's, in the runtime).
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from consumer_sdk.backoff import Backoff
from consumer_sdk.domain import (
    ClusterMetadata,
    Coordinator,
    HeartbeatRequest,
    HeartbeatResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionResult,
)
from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.membership import (
    ApplicationEvent,
    ErrorEvent,
    Failure,
    FailureKind,
    GroupMembership,
    MemberState,
    Poll,
)
from consumer_sdk.membership.requests import (
    Api,
    CommitKind,
    CommitRequestManager,
    CommitResult,
    CoordinatorManager,
    MetadataManager,
    OffsetLike,
    Outbound,
    RequestManager,
    RequestPoll,
)

__all__ = [
    "Api",
    "AppBound",
    "CommitDone",
    "CoordinatorUnreachable",
    "DriverConfig",
    "Fence",
    "FetchDone",
    "MemberDriver",
    "MemberSnapshot",
    "Outbound",
    "SharedLookups",
    "Transport",
]

log = logging.getLogger("consumer_sdk.runtime")

Partition = tuple[str, int]

_COORDINATOR_ERRORS = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
_IDLE_MS = 5_000
# FindCoordinator failures in a row after which the application hears of an unreachable
# coordinator (error_cb).
_UNREACHABLE_AFTER = 3
_IN_GROUP = frozenset({MemberState.STABLE, MemberState.RECONCILING, MemberState.ACKNOWLEDGING})


# -- what goes out ------------------------------------------------------------------------------


class Transport(Protocol):
    """Where a driver's requests go (httpcore's backend: one real implementation over the
    network loop's connections, a scripted one in unit tests). Each `Outbound` gets exactly
    one outcome later, fed to the driver's `MemberDriver.on_response` or `on_failure`;
    requests to one address are sent in the order given."""

    def send(self, request: Outbound) -> None: ...

    def connection_id(self, coordinator: Coordinator) -> Hashable | None:
        """Which established connection reaches ``coordinator`` (None: none is up). A
        different value than before means the connection was replaced."""
        ...


# -- what comes back to the application ------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CommitDone:
    """A commit finished (``offsets``: what it was asked to commit)."""

    result: CommitResult
    offsets: Mapping[Partition, OffsetLike]


@dataclass(frozen=True, slots=True)
class FetchDone:
    """An OffsetFetch finished: the answer, or the failure that ended it."""

    fetch_id: int
    response: OffsetFetchResponse | None
    failure: Failure | None


@dataclass(frozen=True, slots=True)
class Fence:
    """Stop handing out records of these partitions now (lost or pending revocation)."""

    partitions: frozenset[Partition]


@dataclass(frozen=True, slots=True)
class CoordinatorUnreachable:
    """For ``error_cb``: the coordinator lookup failed several times in a row. ``transport``:
    the lookups got no answer (``code`` is then the failure's)."""

    code: int
    message: str
    transport: bool


AppBound = CommitDone | FetchDone | Fence | CoordinatorUnreachable


class MemberSnapshot(NamedTuple):
    """What the application side may know of a member, frozen after a run of its driver and
    published by reference swap (read it once, use its fields together).

    ``heartbeat_due_ms`` is on the host's clock (the runtime's: ``time.monotonic()`` in ms);
    ``events_taken`` counts the application events and requests the host has taken in, and
    ``commits_taken`` the commits among them (compare with what was submitted to know whether
    some are still queued)."""

    state: MemberState
    member_id: str
    member_epoch: int
    assigned: frozenset[Partition]
    pending_revocation: frozenset[Partition]
    coordinator_known: bool
    heartbeat_interval_ms: int
    heartbeat_in_flight: bool
    heartbeat_due_ms: int
    pending_commits: int
    last_heartbeat_response_ms: int | None = None
    events_taken: int = 0
    commits_taken: int = 0
    #: records may be handed out until then (host clock, ms; None: no bound), see
    #: `consumer_sdk.membership.stall`
    handout_deadline_ms: int | None = None


@dataclass(frozen=True, slots=True)
class DriverConfig:
    """What the driver needs of the consumer configuration."""

    group_id: str
    group_instance_id: str | None
    retry_backoff_ms: int
    retry_backoff_max_ms: int
    auto_commit_interval_ms: int  # 0: no auto-commit
    request_timeout_ms: int  # socket.timeout.ms


# -- per-process lookups shared by the members -------------------------------------------------


class _TopicNames:
    """Topic id -> name of one cluster: a member whose assignment names known ids resolves
    them without a Metadata request, and members needing more wait for one full request
    instead of each sending their own."""

    def __init__(self) -> None:
        self.names: dict[uuid.UUID, str] = {}
        self.in_flight = False
        self.waiters: list[Callable[[], None]] = []

    def update(self, names: Mapping[uuid.UUID, str]) -> None:
        self.names.update(names)
        self.in_flight = False
        waiters, self.waiters = self.waiters, []
        for wake in waiters:
            wake()


class _Coordinators:
    """Group coordinators of one cluster: after a coordinator change or a dropped
    connection, one FindCoordinator per group goes out and the other members of that group
    take its answer, instead of each asking."""

    def __init__(self) -> None:
        self.known: dict[str, Coordinator] = {}
        self.in_flight: set[str] = set()
        self.waiters: dict[str, list[Callable[[], None]]] = {}

    def done(self, group_id: str, found: Coordinator | None) -> None:
        if found is not None and found.error_code == 0:
            self.known[group_id] = found
        self.in_flight.discard(group_id)
        for wake in self.waiters.pop(group_id, []):
            wake()

    def forget(self, group_id: str, coordinator: Coordinator) -> None:
        if self.known.get(group_id) == coordinator:
            del self.known[group_id]


class SharedLookups:
    """The coordinator and topic-name lookups shared by the members of one process that talk
    to the same cluster (same thread as the drivers that use it)."""

    def __init__(self) -> None:
        self.coordinators = _Coordinators()
        self.topics = _TopicNames()


@dataclass(slots=True)
class _Fetch:
    fetch_id: int
    request: OffsetFetchRequest
    deadline_ms: int


# -- the driver ---------------------------------------------------------------------------------


class MemberDriver:
    """One member's request managers and their ordering; see the module docstring.

    ``wake`` asks the host for a run soon (another member's shared lookup answered for this
    one). ``on_heartbeat_sent`` is told of every heartbeat handed to the transport.
    """

    __slots__ = (
        "_answered",
        "_by_api",
        "_commit_offsets",
        "_commit_sent_ms",
        "_conn_changes",
        "_conn_memo",
        "_due",
        "_fetches",
        "_hb_conn",
        "_hb_out",
        "_hb_period",
        "_hb_target",
        "_host_wake",
        "_ids",
        "_lane_open",
        "_managers",
        "_others_due",
        "_poll_all",
        "_quiet_run",
        "_session_asked",
        "_session_wanted",
        "_sm",
        "commits",
        "committable",
        "config",
        "coordinator",
        "core",
        "heartbeat_due_ms",
        "heartbeat_in_flight",
        "lane_snapshot",
        "metadata",
        "outbox",
        "shared",
        "stopped",
        "transport",
    )

    def __init__(
        self,
        config: DriverConfig,
        core: GroupMembership,
        transport: Transport,
        shared: SharedLookups,
        wake: Callable[[], None],
        backoff: Callable[[], Backoff],
        ids: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        self.core = core
        self._sm = core.state_machine  # ``self._sm.state``: the member's state
        self.transport = transport
        # The transport's connection change counter, if it has one (`LoopTransport`): while
        # it holds, `_conn_memo` (counter, coordinator, its `connection_id`) is the answer
        # the transport would give for that coordinator (see the lane in `run`).
        self._conn_changes: list[int] | None = getattr(transport, "conn_changes", None)
        self._conn_memo: tuple[int, Coordinator | None, Hashable | None] = (-1, None, None)
        self.shared = shared
        self._host_wake = wake
        #: Commit ids (the host may hand them out ahead, from any thread: `commit` takes one).
        self._ids = ids if ids is not None else itertools.count(1).__next__
        self.coordinator = CoordinatorManager(config.group_id, backoff())
        self.metadata = MetadataManager(backoff())
        self.commits = CommitRequestManager(
            config.group_id,
            config.group_instance_id,
            backoff(),
            auto_commit_interval_ms=config.auto_commit_interval_ms,
            default_timeout_ms=config.request_timeout_ms,
        )
        #: Application-bound events, oldest first; the host drains it after each call.
        self.outbox: list[AppBound] = []
        #: What an auto-commit may commit, asked for when one is due: the data plane's
        #: committable positions, and the partitions of a manual assignment (None: none,
        #: only the group's assigned partitions are committed). Must not block.
        self.committable: (
            Callable[[], tuple[Mapping[Partition, OffsetLike], frozenset[Partition] | None]] | None
        ) = None
        self.heartbeat_in_flight = False
        #: When (host ms) the heartbeat manager next wants to run.
        self.heartbeat_due_ms = 0
        self._commit_offsets: dict[int, Mapping[Partition, OffsetLike]] = {}
        self._commit_sent_ms: dict[int, int] = {}
        self._fetches: list[_Fetch] = []
        # The coordinator connection the last heartbeat was answered on (see `run`).
        self._hb_conn: Hashable | None = None
        # The coordinator the last heartbeat went to (see `_coordinator_found`).
        self._hb_target: tuple[int, str, int] | None = None
        # The group's session timeout is asked once (DescribeConfigs), again after a failure.
        self._session_asked = False
        self._session_wanted = False
        self.stopped = False
        # When (host ms) each manager is next due, in `_managers` order, and whether the next
        # run polls them all (something was fed in since the last run; see `run`).
        self._due = [0, 0, 0, 0, 0]
        # The earliest of the other managers' (all but the heartbeat's), set with them.
        self._others_due = 0
        # The heartbeat manager's wait after its last send (ms): about the interval.
        self._hb_period = 0
        self._poll_all = True
        # The last call was such a timer run that left the member STABLE, or a quiet
        # heartbeat answer after one (see `snapshot`).
        self._quiet_run = False
        # The driver's lane is open (read with ``_quiet_run``, which every other entry
        # clears): the last heartbeat went out through the lane in `run`, with what its
        # checks and `on_response`'s quiet-answer checks read holding then, and only the
        # lane's runs and quiet answers entered since. While open, both skip those checks
        # (the coordinator, the connection answered on, the events queued, the commits
        # waiting for an epoch): only another entry can change what they read.
        self._lane_open = False
        # A quiet answer's (answered at, handout deadline) for the next snapshot.
        self._answered: tuple[int, int] | None = None
        #: The snapshot after the last call, built by the heartbeat's lane itself when the
        #: host passed its previous one (``prev`` of `run` and `on_response`): what
        #: `snapshot` would return then. The host takes it (and sets it back to None)
        #: instead of calling `snapshot`; None otherwise.
        self.lane_snapshot: MemberSnapshot | None = None
        # The last heartbeat's `Outbound` (reused while its request is: see `run`).
        self._hb_out: Outbound | None = None
        # The request managers, in the order a run polls them (see `run`).
        heartbeat = _HeartbeatRequests(self)
        coordinator = _CoordinatorRequests(self)
        self._managers: tuple[RequestManager, ...] = (
            coordinator,
            _MetadataRequests(self),
            _CommitRequests(self),
            _OffsetFetchRequests(self),
            heartbeat,
        )
        self._by_api: dict[Api, RequestManager] = {
            Api.FIND_COORDINATOR: coordinator,
            Api.GROUP_SESSION_TIMEOUT: coordinator,
            Api.METADATA: self._managers[1],
            Api.OFFSET_COMMIT: self._managers[2],
            Api.OFFSET_FETCH: self._managers[3],
            Api.HEARTBEAT: heartbeat,
        }

    def snapshot(
        self, events_taken: int = 0, commits_taken: int = 0, prev: MemberSnapshot | None = None
    ) -> MemberSnapshot:
        """The member as of now. ``prev``: the snapshot taken after the driver's previous
        call; after a stable member's timer run (see `run`) only the heartbeat's and the
        commits' fields can differ from it, and the core is not read again."""
        quiet = self._answered
        if quiet is not None:
            self._answered = None
        if prev is not None and self._quiet_run:
            # tuple.__new__: the NamedTuple's own constructor adds a call (twice per beat)
            return tuple.__new__(
                MemberSnapshot,
                prev[:7]  # noqa: RUF005 (measured: faster than unpacking the slice)
                + (
                    self.heartbeat_in_flight,
                    self.heartbeat_due_ms,
                    len(self.commits.queue),  # `commits.pending`
                    prev[10] if quiet is None else quiet[0],
                    events_taken,
                    commits_taken,
                    prev[13] if quiet is None else quiet[1],
                ),
            )
        state, member_id, epoch, assigned, pending, known, interval, answered, handout = (
            self.core.published()
        )
        return tuple.__new__(
            MemberSnapshot,
            (
                state,
                member_id,
                epoch,
                assigned,
                pending,
                known,
                interval,
                self.heartbeat_in_flight,
                self.heartbeat_due_ms,
                self.commits.pending,
                answered,
                events_taken,
                commits_taken,
                handout,
            ),
        )

    # -- application events (the host calls these on the driver's thread) ---------------------

    def submit(self, event: ApplicationEvent) -> None:
        # A stable member's Poll only resets the poll timer: the heartbeat manager, polled
        # on every run, takes it in (see `run`).
        if type(event) is not Poll:
            self._poll_all = True
        self._quiet_run = False
        self.core.app_events.append(event)  # `core.submit`

    def note_poll(self, now_ms: int) -> None:
        """The application polled at ``now_ms``: as ``submit(Poll(now_ms))``, but a STABLE
        member with no other event queued restarts its poll timer at once, without the event
        (`GroupMembership.stable_poll`)."""
        core = self.core
        if core.app_events or not core.stable_poll(now_ms):
            self.submit(Poll(now_ms))

    def commit(
        self,
        now_ms: int,
        offsets: Mapping[Partition, OffsetLike],
        kind: CommitKind,
        timeout_ms: int | None = None,
        epoch: int = -1,
        commit_id: int | None = None,
        releasing: Iterable[Partition] = (),
    ) -> int:
        """Queue a commit; its `CommitDone` carries the returned id (``commit_id`` if given,
        one the host took from the driver's ``ids`` ahead). ``releasing``: see
        `CommitRequestManager.commit`."""
        if commit_id is None:
            commit_id = self._ids()
        self._poll_all = True
        self._quiet_run = False
        self.commits.commit(
            now_ms, offsets, kind, timeout_ms, epoch, releasing=releasing, commit_id=commit_id
        )
        self._commit_offsets[commit_id] = offsets
        return commit_id

    def fetch_offsets(self, fetch_id: int, request: OffsetFetchRequest, deadline_ms: int) -> None:
        """Queue an OffsetFetch to the coordinator (found first if needed); it ends with a
        `FetchDone`, at the latest at ``deadline_ms``."""
        self._poll_all = True
        self._quiet_run = False
        self._fetches.append(_Fetch(fetch_id, request, deadline_ms))

    def observe_committed(self, response: OffsetFetchResponse) -> None:
        """An OffsetFetch answer's offsets become the commits' no-regression floor."""
        self._poll_all = True
        self._quiet_run = False
        self.commits.observe_committed(
            {
                (r.topic, r.partition): r.offset
                for r in response.partitions
                if r.error_code == 0 and r.offset >= 0
            }
        )

    def forget_committed(self, partitions: set[Partition]) -> None:
        self._poll_all = True
        self._quiet_run = False
        self.commits.forget(partitions)

    def request_metadata(self, topics: Sequence[str]) -> None:
        self._poll_all = True
        self._quiet_run = False
        self.metadata.request(topics)

    def fail(self) -> None:
        """The member failed: pending OffsetFetches end with the caller's own error."""
        self._poll_all = True
        self._quiet_run = False
        self.stopped = True
        self._fetches.clear()

    # -- a run ---------------------------------------------------------------------------------

    def run(self, now: int, polled_ms: int = 0, prev: MemberSnapshot | None = None) -> int:
        """Poll the request managers in order (coordinator, metadata, commits, offset
        fetches, heartbeat), hand what each asks for to the transport, and return how long
        (ms) the host may wait before the next run: the smallest of their waits, at most
        ``_IDLE_MS``. Commits go out before the heartbeat of the same run, over the same
        connection (the broker answers one connection's requests in order): an asynchronous
        commit made before a leave (say, in on_revoke of close()) is applied before the
        leave, with the epoch it was made under.

        Every manager is polled after anything was fed in (an application event other than a
        stable member's `Poll`, a commit, a request, an outcome not a quiet heartbeat answer, a
        wake-up) and whenever the member is not STABLE. Otherwise (a stable member's timer)
        only the managers whose wait has run out are (the heartbeat's, nearly always), in the
        same order: the others' waits were computed with nothing changed since (Java's
        ``ConsumerNetworkThread`` keeps the managers' ``maximumTimeToWait`` the same way).

        ``polled_ms`` (0: none): a stable member's latest poll, handed over first, as
        `note_poll` (the heartbeat's lane takes it in with its heartbeat: one core call).
        ``prev``: the snapshot published after the driver's previous call (by `snapshot` or
        as `lane_snapshot`), if the host took nothing in since: the lane then builds the
        next one (`lane_snapshot`)."""
        due = self._due
        sm = self._sm
        if not self._poll_all and not self._fetches and sm.state is MemberState.STABLE:
            others = self._others_due
            if others > now + self._hb_period:
                # A stable member's timer with only the heartbeat's manager due (nearly every
                # run). The lane: its plain heartbeat goes out again on the connection the
                # last one was answered on, with nothing queued: `_HeartbeatRequests.poll`'s
                # fast path, inline (one call per heartbeat less).
                core = self.core
                out = self._hb_out
                changes = self._conn_changes
                if (
                    self._lane_open
                    and self._quiet_run
                    and changes is not None
                    and self._conn_memo[0] == changes[0]
                ):
                    # The lane is open and no connection changed state: its checks below
                    # hold as when it opened (see ``_lane_open``)
                    beat = core.stable_beat(now, polled_ms)
                else:
                    self._lane_open = False
                    hb_conn = self._hb_conn
                    target = self.coordinator.coordinator
                    beat = None
                    if (
                        out is not None
                        and hb_conn is not None
                        and target is not None
                        and out.coordinator is target
                        and not core.app_events
                    ):
                        # `self.transport.connection_id(target)`, asked again only once a
                        # connection changed state (or the coordinator is another)
                        memo = self._conn_memo
                        if changes is not None and memo[1] is target and memo[0] == changes[0]:
                            conn_id = memo[2]
                        else:
                            conn_id = self.transport.connection_id(target)
                            if changes is not None:
                                self._conn_memo = (changes[0], target, conn_id)
                        if conn_id == hb_conn:
                            beat = core.stable_beat(now, polled_ms)
                if beat is not None:
                    assert out is not None  # (checked when the lane opened, or just now)
                    plain, next_ms = beat
                    self.heartbeat_due_ms = now + next_ms
                    self.heartbeat_in_flight = True
                    self._hb_period = next_ms
                    if out.payload is not plain:  # (to ``out.coordinator``: ``target``)
                        out = self._hb_out = Outbound(
                            Api.HEARTBEAT, plain, out.coordinator, self._timeout_ms(True)
                        )
                    self.transport.send(out)
                    due[4] = when = now + (next_ms if next_ms < _IDLE_MS else _IDLE_MS)
                    self._quiet_run = True  # (`stable_beat` leaves the member STABLE)
                    queue = self.commits.queue
                    if not self._lane_open:  # (`on_response`'s quiet-answer checks)
                        self._lane_open = not core.background_events and not (
                            queue and self.commits.awaiting_epoch
                        )
                    if prev is not None:
                        # `snapshot(prev[11], prev[12], prev)`, inline
                        self.lane_snapshot = tuple.__new__(
                            MemberSnapshot,
                            prev[:7]  # noqa: RUF005 (as in `snapshot`)
                            + (True, self.heartbeat_due_ms, len(queue))
                            + prev[10:],
                        )
                    first = others if others < when else when  # `min(due)`
                    return first - now if first < now + _IDLE_MS else _IDLE_MS
                # Else the same for that manager alone, through its poll.
                self._lane_open = False
                if polled_ms:
                    self.note_poll(polled_ms)
                requests, next_ms = self._managers[4].poll(now)
                for request in requests:
                    self.transport.send(request)
                due[4] = when = now + (next_ms if next_ms < _IDLE_MS else _IDLE_MS)
                if sm.state is not MemberState.STABLE:
                    self._poll_all = True
                    return 0
                self._quiet_run = True
                first = others if others < when else when  # `min(due)`
                return first - now if first < now + _IDLE_MS else _IDLE_MS
        if polled_ms:
            self.note_poll(polled_ms)
        if self._fetches:
            self._expire_fetches(now)
        send = self.transport.send
        stable = sm.state is MemberState.STABLE
        everything = self._poll_all or not stable
        self._poll_all = self._quiet_run = self._lane_open = False
        first = _IDLE_MS + now
        # A manager due before the heartbeat's next run (about one period on) is polled in
        # this one (early is always allowed): the idle managers' waits add no wake-ups.
        horizon = now + self._hb_period
        commits_polled = everything or due[2] <= horizon
        for i, manager in enumerate(self._managers):
            if everything or due[i] <= horizon:
                requests, next_ms = manager.poll(now)
                for request in requests:
                    send(request)
                due[i] = when = now + (next_ms if next_ms < _IDLE_MS else _IDLE_MS)
            else:
                when = due[i]
            if when < first:
                first = when
        if stable and sm.state is not MemberState.STABLE:
            # The heartbeat manager's poll changed the state (the others read it): a full run.
            self._poll_all = True
            first = now
        elif not everything:
            self._quiet_run = True
        self._others_due = min(due[0], due[1], due[2], due[3])
        if commits_polled:  # (else none can have completed since the last outcome)
            self._collect_commits()
        return first - now

    def _wake(self) -> None:
        """Another member's shared lookup answered for this one: run it (all managers)."""
        self._poll_all = True
        self._quiet_run = False
        self._host_wake()

    def _owned(self) -> frozenset[Partition]:
        """The partitions the member holds and is not giving up."""
        return self.core.assigned_partitions - self.core.pending_revocation

    def _outbound(
        self, api: Api, payload: Any, coordinator: Coordinator | None, tag: int = 0
    ) -> Outbound:
        return Outbound(api, payload, coordinator, self._timeout_ms(False), tag)

    def _timeout_ms(self, heartbeat: bool) -> int:
        """Request timeout. A timed-out request closes the shared connection and fails every
        request on it, so it is generous: Java's request.timeout.ms (30 s) at most, and for
        heartbeats three intervals (at least 5 s), which still notices a hung coordinator
        well before a session timeout of the usual 45 s."""
        limit = min(self.config.request_timeout_ms, 30_000)
        if not heartbeat:
            return limit
        interval = self.core.heartbeat_interval_ms or 3000
        return min(max(3 * interval, 5_000), limit)

    def _lookup_ahead(self) -> bool:
        """A member not in a group yet (not subscribed, or unsubscribed) looks its
        coordinator up ahead, as librdkafka and the Java client do from the start: its join
        heartbeat then goes out as it subscribes, not one FindCoordinator round trip later.
        Not once closed or failed."""
        core = self.core
        return (
            self._sm.state is MemberState.UNSUBSCRIBED
            and not core.closed
            and core.fatal_error is None
            and not self.stopped
        )

    def _coordinator_found(self, now: int) -> None:
        """Tell the core; a coordinator other than the one the last heartbeat went to gets
        the next heartbeat at once (see `HeartbeatRequestManager.on_coordinator_known`)."""
        found = self.coordinator.coordinator
        assert found is not None
        target = (found.node_id, found.host, found.port)
        self.core.on_coordinator_known(now, self._hb_target not in (None, target))
        if not self._session_asked:  # asked by the coordinator manager's next poll
            self._session_asked = self._session_wanted = True

    def _coordinator_conn(self) -> Hashable | None:
        coordinator = self.coordinator.coordinator
        return None if coordinator is None else self.transport.connection_id(coordinator)

    def _coordinator_lost(self, reason: str) -> None:
        known = self.coordinator.coordinator
        if known is not None:
            self.shared.coordinators.forget(self.config.group_id, known)
        self.coordinator.mark_unknown(reason)

    def coordinator_detail(self) -> str:
        last = self.coordinator.last_error
        return "no lookup answered yet" if last is None else f"last error: {last[1]}"

    def _expire_fetches(self, now: int) -> None:
        """OffsetFetches still waiting for a coordinator past their deadline fail."""
        if not self._fetches:
            return
        keep = []
        for f in self._fetches:
            if now >= f.deadline_ms:
                message = (
                    f"OffsetFetch for group {self.config.group_id!r}: the group coordinator "
                    f"was not found in time ({self.coordinator_detail()})"
                )
                failure = Failure(FailureKind.TIMEOUT, message, int(ErrorCode.REQUEST_TIMED_OUT))
                self.outbox.append(FetchDone(f.fetch_id, None, failure))
            else:
                keep.append(f)
        self._fetches = keep

    def _resolve_topics(self, now: int) -> None:
        view = self.shared.topics
        unresolved = self.core.unresolved_topic_ids
        if unresolved and unresolved <= view.names.keys():
            self.core.on_metadata(now, {**self.metadata.topic_names, **view.names})
        elif view.in_flight:
            view.waiters.append(self._wake)
        else:
            self.metadata.request(None)

    def _auto_commit(self, now: int) -> None:
        """An auto-commit of the data plane's positions: those of the manual assignment, or of
        the assigned partitions while in the group; else none this interval."""
        core = self.core
        positions, manual = self.committable() if self.committable is not None else ({}, None)
        if manual:
            chosen = {p: o for p, o in positions.items() if p in manual}
        elif core.state in _IN_GROUP and core.member_epoch > 0:
            assigned = core.assigned_partitions
            chosen = {p: o for p, o in positions.items() if p in assigned}
        else:
            chosen = {}
        if chosen:
            self.commit(now, chosen, CommitKind.AUTO)
        else:
            self.commits.skip_auto_commit(now)

    def _collect_commits(self) -> None:
        done = self.commits.drain_completed()
        if not done:
            return
        for r in done:
            self.outbox.append(CommitDone(r, self._commit_offsets.pop(r.commit_id, {})))

    # -- outcomes ------------------------------------------------------------------------------

    def on_response(
        self, now: int, request: Outbound, response: Any, prev: MemberSnapshot | None = None
    ) -> int:
        """Apply the answer to ``request`` (its manager's). Returns 0 (run now) or, after a
        quiet heartbeat answer of a stable member (nothing changed but the heartbeat's own
        timer), the ms until the heartbeat is next due: the host may keep its scheduled run
        if earlier. ``prev``: as for `run` (a quiet answer then builds `lane_snapshot`)."""
        if request.api is Api.HEARTBEAT:  # the hot path
            core = self.core
            if not self.stopped and (
                (self._lane_open and self._quiet_run)  # (these hold: see ``_lane_open``)
                or (
                    self._hb_conn is not None
                    and self.coordinator.coordinator is not None
                    and not core.app_events
                    and not core.background_events
                    and not (self.commits.queue and self.commits.awaiting_epoch)
                )
            ):
                # A STABLE member's answer that changes nothing: what `_on_heartbeat` does
                # for it (None, and nothing done, for any other answer).
                answered = core.quiet_answer(now, response, request.payload)
                if answered is not None:
                    wait_ms, handout = answered
                    self.heartbeat_in_flight = False
                    self.heartbeat_due_ms = self._due[4] = due = now + wait_ms
                    if self._quiet_run:  # else the next snapshot reads the core anyway
                        if prev is not None:
                            # `snapshot(prev[11], prev[12], prev)` then, inline
                            self.lane_snapshot = tuple.__new__(
                                MemberSnapshot,
                                prev[:7]  # noqa: RUF005 (as in `snapshot`)
                                + (
                                    False,
                                    due,
                                    len(self.commits.queue),
                                    now,
                                    prev[11],
                                    prev[12],
                                    handout,
                                ),
                            )
                        else:
                            self._answered = (now, handout)
                    return wait_ms
            return self._on_heartbeat(now, request.payload, response, None)
        self._poll_all = True
        self._quiet_run = False
        self._by_api[request.api].on_response(now, request, response)
        return 0

    def on_failure(self, now: int, request: Outbound, failure: Failure) -> int:
        """``request`` got no answer (see `on_response` for the value returned)."""
        if request.api is Api.HEARTBEAT:
            return self._on_heartbeat(now, request.payload, None, failure)
        self._poll_all = True
        self._quiet_run = False
        self._by_api[request.api].on_failure(now, request, failure)
        return 0

    def _on_heartbeat(
        self,
        now: int,
        request: HeartbeatRequest,
        response: HeartbeatResponse | None,
        failure: Failure | None,
    ) -> int:
        if self.stopped:
            return 0
        core = self.core
        self._quiet_run = False
        self._hb_out = None  # (the interval, and so the request timeout, may change)
        sm = self._sm
        was_stable = sm.state is MemberState.STABLE
        if response is not None:
            core.on_heartbeat_response(now, response, request)
            if self._hb_conn is None:
                # Else it is the connection this answer came on: one that was replaced since
                # failed its requests, and the run that sent this one checked it (see the
                # heartbeat manager's poll).
                self._hb_conn = self._coordinator_conn()
            if response.error_code in _COORDINATOR_ERRORS:
                self._coordinator_lost(ErrorCode.name_of(response.error_code))
        else:
            assert failure is not None
            core.on_heartbeat_failure(now, failure, request)
            if failure.kind is FailureKind.DISCONNECTED:
                self._coordinator_lost(failure.message)
        if self.coordinator.coordinator is None and core.coordinator_known:
            core.on_coordinator_unknown(now)
        self.heartbeat_in_flight = False
        quiet = (
            was_stable
            and response is not None
            and response.error_code == 0
            and response.assignment is None
            and sm.state is MemberState.STABLE
            and not core.app_events
            and not core.background_events
            and not self.commits.awaiting_epoch
        )
        if quiet:
            wait_ms = core.time_until_next_poll(now)
            self.heartbeat_due_ms = self._due[4] = now + wait_ms
            return wait_ms
        self._poll_all = True
        self._quiet_run = False
        # Fenced, fatal or stale: the partitions are lost now, not when on_lost runs in the
        # next poll(); records of theirs still buffered must not reach the application.
        pending = core.pending_revocation
        if pending:
            self.outbox.append(Fence(frozenset(pending)))
        return 0

    def _on_coordinator(
        self, now: int, result: Coordinator | None, failure: Failure | None
    ) -> None:
        self.shared.coordinators.done(self.config.group_id, result)
        if self.stopped:
            return
        coord = self.coordinator
        unreachable: CoordinatorUnreachable | None = None
        if result is not None:
            report = coord.on_response(now, result)
            if result.error_code == 0:
                self._coordinator_found(now)
            elif coord.failures == _UNREACHABLE_AFTER:
                message = f"group coordinator unreachable: {self.coordinator_detail()}"
                unreachable = CoordinatorUnreachable(result.error_code, message, False)
        else:
            assert failure is not None
            report = coord.on_failure(now, failure)
            if failure.kind is FailureKind.AUTHENTICATION:
                # Configuration errors: reported with the code the boundary gave them.
                report = (failure.code, f"cannot connect to the cluster: {failure.message}")
            elif coord.failures == _UNREACHABLE_AFTER:
                message = f"group coordinator unreachable: {failure.message}"
                unreachable = CoordinatorUnreachable(failure.code, message, True)
        if report is not None:
            self._report(report)
        if unreachable is not None:
            self.outbox.append(unreachable)

    def _report(self, report: tuple[int, str]) -> None:
        code, message = report
        events = self.core.background_events
        if not any(isinstance(e, ErrorEvent) and e.message == message for e in list(events)):
            events.append(ErrorEvent(code, message, fatal=False))

    def _on_session_timeout(self, result: int | None, failure: Failure | None) -> None:
        """The group's session timeout (the bound of `consumer_sdk.membership.stall`)."""
        if result is not None:
            self.core.set_session_timeout(result)
        elif failure is not None and failure.kind.retriable:
            self._session_asked = False  # asked again when a coordinator is found
        log.debug(
            "group %s: session timeout %d ms (%s)",
            self.core.group_id,
            self.core.session_timeout_ms,
            "from the broker" if result is not None else f"default; {failure or 'not given'}",
        )

    def _on_metadata(
        self, now: int, result: ClusterMetadata | None, failure: Failure | None
    ) -> None:
        if self.stopped:
            return
        if result is not None:
            self.metadata.on_response(now, result)
            self.shared.topics.update(self.metadata.topic_names)
            self.core.on_metadata(now, self.metadata.topic_names)
        else:
            assert failure is not None
            self.metadata.on_failure(now, failure)
            self.shared.topics.update({})

    def _on_commit(
        self,
        now: int,
        commit_id: int,
        results: Sequence[PartitionResult] | None,
        failure: Failure | None,
    ) -> None:
        sent = self._commit_sent_ms.pop(commit_id, None)
        if results is not None:
            if sent is not None:  # commit-rate / commit-latency-*: answered requests
                self.core.metrics.record_commit(now, now - sent)
            rediscover = self.commits.on_response(now, commit_id, results)
        else:
            assert failure is not None
            rediscover = self.commits.on_failure(now, commit_id, failure)
        if rediscover:
            self._coordinator_lost("OffsetCommit coordinator error")
            if self.core.coordinator_known:
                self.core.on_coordinator_unknown(now)
        self._collect_commits()

    def _on_fetch(
        self, fetch_id: int, response: OffsetFetchResponse | None, failure: Failure | None
    ) -> None:
        if failure is not None:
            if failure.kind is FailureKind.DISCONNECTED:
                self._coordinator_lost(failure.message)
        elif response is not None:
            if response.error_code in _COORDINATOR_ERRORS:
                self._coordinator_lost(f"OffsetFetch: {ErrorCode.name_of(response.error_code)}")
            self.observe_committed(response)
        self.outbox.append(FetchDone(fetch_id, response, failure))


# -- the driver's request managers ---------------------------------------------------------------
#
# Each binds one sans-IO manager to this member's context (the core, the shared lookups, the
# coordinator found) and follows the `RequestManager` contract: ``poll(now)`` returns the
# requests to send now and the ms until it is next due; outcomes come back as values. They
# read and change their driver's state (the driver is their only user, on its one thread).

_NOTHING: tuple[Outbound, ...] = ()
_IDLE: RequestPoll = (_NOTHING, _IDLE_MS)


class _CoordinatorRequests:
    """FindCoordinator while the coordinator is unknown and wanted (one lookup per group and
    process: the other members take its answer), then the group's session timeout once."""

    __slots__ = ("_d",)

    def __init__(self, driver: MemberDriver) -> None:
        self._d = driver

    def poll(self, now: int) -> RequestPoll:
        d = self._d
        coord = d.coordinator
        requests = _NOTHING
        wait = _IDLE_MS
        if coord.coordinator is None:
            group = d.config.group_id
            needed = (
                d.core.coordinator_needed
                or d.commits.pending > 0
                or bool(d._fetches)
                or d._lookup_ahead()
            )
            waiting = False
            if needed and not coord.in_flight:
                shared = d.shared.coordinators
                found = shared.known.get(group)
                if found is not None:
                    coord.adopt(found)
                elif group in shared.in_flight:
                    shared.waiters.setdefault(group, []).append(d._wake)
                    waiting = True  # another member's lookup answers for this one too
            find = coord.poll(now, needed and not waiting)
            if find is not None:
                d.shared.coordinators.in_flight.add(find.group_id)
                requests = (d._outbound(Api.FIND_COORDINATOR, find.group_id, None),)
            if needed and not waiting:
                wait = coord.time_until_next_poll(now, True, _IDLE_MS)
        if coord.coordinator is not None and not d.core.coordinator_known:
            d._coordinator_found(now)
        if d._session_wanted:
            d._session_wanted = False
            requests += (d._outbound(Api.GROUP_SESSION_TIMEOUT, d.core.group_id, None),)
        return requests, wait

    def on_response(self, now: int, request: Outbound, response: Any) -> None:
        if request.api is Api.GROUP_SESSION_TIMEOUT:
            self._d._on_session_timeout(response, None)
        else:
            self._d._on_coordinator(now, response, None)

    def on_failure(self, now: int, request: Outbound, failure: Failure) -> None:
        if request.api is Api.GROUP_SESSION_TIMEOUT:
            self._d._on_session_timeout(None, failure)
        else:
            self._d._on_coordinator(now, None, failure)


class _MetadataRequests:
    """Metadata for topic ids the assignment names: known ones come from the process's
    shared view, and one request for the whole cluster serves every member waiting."""

    __slots__ = ("_d",)

    def __init__(self, driver: MemberDriver) -> None:
        self._d = driver

    def poll(self, now: int) -> RequestPoll:
        d = self._d
        metadata = d.metadata
        needed = d.core.metadata_needed
        if not (needed or metadata.pending):
            return _IDLE
        if needed and not metadata.pending:
            d._resolve_topics(now)
        send = metadata.poll(now)
        requests = _NOTHING
        if send is not None:
            if send.topics is None:
                d.shared.topics.in_flight = True
            requests = (d._outbound(Api.METADATA, send.topics, None),)
        return requests, metadata.time_until_next_poll(now, _IDLE_MS)

    def on_response(self, now: int, request: Outbound, response: Any) -> None:
        self._d._on_metadata(now, response, None)

    def on_failure(self, now: int, request: Outbound, failure: Failure) -> None:
        self._d._on_metadata(now, None, failure)


class _CommitRequests:
    """OffsetCommits: the auto-commit when due, then every commit ready to go (to the
    coordinator, with the member id and epoch at send time)."""

    __slots__ = ("_d",)

    def __init__(self, driver: MemberDriver) -> None:
        self._d = driver

    def poll(self, now: int) -> RequestPoll:
        d = self._d
        commits = d.commits
        auto = d.config.auto_commit_interval_ms > 0
        if auto and commits.auto_commit_due(now):
            d._auto_commit(now)
        if not auto and commits.pending == 0:
            return _IDLE
        core = d.core
        known = d.coordinator.coordinator
        sends = commits.poll(
            now,
            core.member_id,
            core.member_epoch,
            known is not None,
            owned=d._owned,
            # a commit refused as stale waits this long for the newer epoch's heartbeat
            epoch_wait_ms=2 * core.heartbeat_interval_ms,
        )
        requests = _NOTHING
        if sends:
            sent_ms = d._commit_sent_ms
            for c in sends:
                sent_ms[c.commit_id] = now
            requests = tuple(
                d._outbound(Api.OFFSET_COMMIT, c.request, known, c.commit_id) for c in sends
            )
        return requests, commits.time_until_next_poll(now, known is not None, _IDLE_MS)

    def on_response(self, now: int, request: Outbound, response: Any) -> None:
        self._d._on_commit(now, request.tag, response, None)

    def on_failure(self, now: int, request: Outbound, failure: Failure) -> None:
        self._d._on_commit(now, request.tag, None, failure)


class _OffsetFetchRequests:
    """OffsetFetches, sent once the coordinator is known; each fails at its deadline if it
    is not (see `MemberDriver._expire_fetches`)."""

    __slots__ = ("_d",)

    def __init__(self, driver: MemberDriver) -> None:
        self._d = driver

    def poll(self, now: int) -> RequestPoll:
        d = self._d
        if not d._fetches:
            return _IDLE
        known = d.coordinator.coordinator
        if known is not None:
            fetches, d._fetches = d._fetches, []
            requests = tuple(
                d._outbound(Api.OFFSET_FETCH, f.request, known, f.fetch_id) for f in fetches
            )
            return requests, _IDLE_MS
        return _NOTHING, min(max(f.deadline_ms - now, 0) for f in d._fetches)

    def on_response(self, now: int, request: Outbound, response: Any) -> None:
        self._d._on_fetch(request.tag, response, None)

    def on_failure(self, now: int, request: Outbound, failure: Failure) -> None:
        self._d._on_fetch(request.tag, None, failure)


class _HeartbeatRequests:
    """The membership core's heartbeat, to the coordinator found (a replaced connection
    makes it carry every field again)."""

    __slots__ = ("_d",)

    def __init__(self, driver: MemberDriver) -> None:
        self._d = driver

    def poll(self, now: int) -> RequestPoll:
        d = self._d
        core = d.core
        target = d.coordinator.coordinator
        hb_conn = d._hb_conn  # (`d._coordinator_conn()`, inline below)
        if hb_conn is not None and (target is None or d.transport.connection_id(target) != hb_conn):
            d._hb_conn = None
            core.on_coordinator_connection_lost()
        app = core.app_events
        if app and len(app) == 1 and type(app[0]) is Poll:
            core.handle(app.popleft(), now)  # a Poll, as `core.poll` takes it first
        if not app and target is not None:
            beat = core.stable_beat(now)  # `core.poll` for a STABLE member's plain heartbeat
            if beat is not None:
                plain, next_ms = beat
                d.heartbeat_due_ms = now + next_ms
                d.heartbeat_in_flight = True
                d._hb_period = next_ms
                out = d._hb_out  # reused while the request is (the transport reuses its call)
                if out is None or out.payload is not plain or out.coordinator is not target:
                    out = d._hb_out = Outbound(Api.HEARTBEAT, plain, target, d._timeout_ms(True))
                    d._hb_target = (target.node_id, target.host, target.port)
                return (out,), next_ms
        result = core.poll(now)
        request, next_ms = result.request, result.next_poll_ms
        d.heartbeat_due_ms = now + next_ms
        if core.app_events:
            next_ms = 0
        if request is None:
            return _NOTHING, next_ms
        target = d.coordinator.coordinator
        d.heartbeat_in_flight = True
        d._hb_period = next_ms
        if target is not None:
            d._hb_target = (target.node_id, target.host, target.port)
        return (Outbound(Api.HEARTBEAT, request, target, d._timeout_ms(True)),), next_ms

    def on_response(self, now: int, request: Outbound, response: Any) -> None:
        self._d._on_heartbeat(now, request.payload, response, None)

    def on_failure(self, now: int, request: Outbound, failure: Failure) -> None:
        self._d._on_heartbeat(now, request.payload, None, failure)
