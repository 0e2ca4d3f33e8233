"""The network side of one group member, driven by the shared `NetworkLoop`.

`MemberNetwork` owns the member's sans-IO parts (the membership core with its heartbeat
manager, and the coordinator, metadata and commit request managers) and runs them on the
process-wide network loop: each run polls the managers, sends what they ask for over the
shared connections, and schedules the next run at the earliest time any of them is due.
Responses are applied on the loop thread as they arrive. There is no thread per member.

The application side (`GroupMember`, running callbacks on the application thread) talks to
it only through thread-safe methods: `submit` application events, `commit` offsets,
`fetch_offsets`, `drain_background_events`, `wait_for_events`, and `stop`. The hooks given
to the constructor run on the loop thread. Methods below the "loop side" marker run on the
loop thread only; every loop-side entry point is guarded: an exception fails this member
(`failure`, raised to its application) and never the loop or the other members.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Concatenate, ParamSpec

from confluent_kafka import KafkaError

from consumer_sdk.config import ConsumerConfig
from consumer_sdk.domain import (
    ClusterMetadata,
    Coordinator,
    HeartbeatRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionResult,
)
from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.errors import (
    KafkaException,
    KafkaTimeoutError,
    KafkaTransportError,
    ProtocolError,
    UnsupportedBrokerError,
)
from consumer_sdk.membership import (
    ApplicationEvent,
    BackgroundEvent,
    ErrorEvent,
    Failure,
    FailureKind,
    GroupMembership,
    MemberState,
    Poll,
    StateChanged,
)
from consumer_sdk.membership.heartbeat import Backoff
from consumer_sdk.membership.requests import (
    CommitKind,
    CommitRequestManager,
    CommitResult,
    CoordinatorManager,
    MetadataManager,
    OffsetLike,
)
from consumer_sdk.observability.log_routing import enable_routing, routed_logs
from consumer_sdk.protocol import messages as m
from consumer_sdk.protocol.connection import TlsHandshakeError
from consumer_sdk.protocol.heartbeat_codec import HeartbeatEncoder
from consumer_sdk.protocol.multiplex import HeartbeatCall, KioCall, MuxConnection
from consumer_sdk.protocol.sasl import SaslError
from consumer_sdk.protocol.security import parse_bootstrap_servers
from consumer_sdk.runtime.netloop import NetworkLoop, Timer

__all__ = ["MemberNetwork"]

log = logging.getLogger("consumer_sdk.runtime")

Partition = tuple[str, int]

_COORDINATOR_ERRORS = frozenset({ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE})
_IDLE_MS = 5_000
# A stable member's poll events only reset the poll timer; see MemberNetwork.note_poll.
_REBALANCE_POLL_GAP_S = 0.002

_ENCODER = HeartbeatEncoder()  # used on the loop thread only
# FindCoordinator failures in a row after which error_cb hears of an unreachable coordinator.
_UNREACHABLE_AFTER = 3

_P = ParamSpec("_P")
CommitHook = Callable[[CommitResult, Mapping[Partition, OffsetLike]], None]
HeartbeatTrace = Callable[[HeartbeatRequest, float, Any, KafkaException | None], None]
LogTarget = logging.Logger | logging.LoggerAdapter[logging.Logger]


def _member_work(
    method: Callable[Concatenate[MemberNetwork, _P], None],
) -> Callable[Concatenate[MemberNetwork, _P], None]:
    """A loop-thread entry point of one member: routed to its logger, and an exception fails
    this member only (the loop goes on serving the others)."""

    def run(self: MemberNetwork, /, *args: _P.args, **kwargs: _P.kwargs) -> None:
        if self.failure is not None:
            return
        try:
            if self._logger is None:
                method(self, *args, **kwargs)
            else:
                with routed_logs(self._logger):
                    method(self, *args, **kwargs)
        except Exception as exc:
            self._fail(exc)

    run.__name__ = method.__name__
    run.__doc__ = method.__doc__
    return run


class _Fetch:
    """An OffsetFetch the application thread waits for."""

    __slots__ = ("cancelled", "deadline", "done", "error", "request", "result")

    def __init__(self, request: OffsetFetchRequest, deadline: float) -> None:
        self.request = request
        self.deadline = deadline
        self.done = threading.Event()
        self.result: OffsetFetchResponse | None = None
        self.error: KafkaException | None = None
        self.cancelled = False

    def finish(self, result: OffsetFetchResponse | None, error: KafkaException | None) -> None:
        self.result, self.error = result, error
        self.done.set()


class _TopicNames:
    """Topic id -> name of one cluster, shared by the process's members on the loop thread:
    a member whose assignment names known ids resolves them without a Metadata request, and
    members needing more wait for one full request instead of each sending their own."""

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
    """Group coordinators of one cluster, shared by the process's members on the loop thread:
    after a coordinator change or a dropped connection, one FindCoordinator per group goes out
    and the other members of that group take its answer, instead of each asking."""

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


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def failure_of(exc: KafkaException) -> Failure:
    """How the membership core sees a request that got no answer."""
    message = exc.args[0].str()
    if isinstance(exc, UnsupportedBrokerError):
        return Failure(FailureKind.UNSUPPORTED_VERSION_CLIENT, message)
    if isinstance(exc, KafkaTimeoutError):
        return Failure(FailureKind.TIMEOUT, message)
    if isinstance(exc, SaslError | TlsHandshakeError):
        return Failure(FailureKind.AUTHENTICATION, message)
    if isinstance(exc, KafkaTransportError | ProtocolError):
        return Failure(FailureKind.DISCONNECTED, message)
    retriable = exc.args[0].retriable()
    return Failure(FailureKind.RETRIABLE if retriable else FailureKind.FATAL, message)


class MemberNetwork:
    """One member's network side on the shared loop; see the module docstring.

    Hooks, all called on the loop thread: ``on_state_change`` for every transition of the
    core; ``auto_commit_offsets`` returns what an auto-commit commits now (None or empty:
    nothing; without it, ``consumed_offsets`` of the assigned partitions while in the group);
    ``on_fence`` gets the partitions pending revocation after a heartbeat outcome (the data
    plane stops handing out their records at once); ``on_commit_done`` gets each finished
    commit not waited for by `commit_sync` (else `drain_results` returns them);
    ``on_group_error`` gets errors meant for ``error_cb`` only. ``logger`` receives the
    member's log records (the ``logger`` configuration key).
    """

    def __init__(
        self,
        config: ConsumerConfig,
        *,
        loop: NetworkLoop | None = None,
        consumed_offsets: Callable[[], Mapping[Partition, OffsetLike]] | None = None,
        rng: random.Random | None = None,
        on_state_change: Callable[[StateChanged], None] | None = None,
        auto_commit_offsets: Callable[[], Mapping[Partition, OffsetLike] | None] | None = None,
        on_fence: Callable[[set[Partition]], None] | None = None,
        on_commit_done: CommitHook | None = None,
        on_group_error: Callable[[KafkaError], None] | None = None,
        logger: LogTarget | None = None,
    ) -> None:
        c = self.config = config
        self._settings = c.connection
        self._client_id = c.connection.client_id
        self._bootstrap = parse_bootstrap_servers(c.bootstrap_servers)
        self._bootstrap_index = 0
        self._rng = rng or random.Random()
        self.failure: KafkaException | None = None
        self._logger = logger
        if logger is not None:
            enable_routing()
        self.core = GroupMembership(
            c.membership_config(),
            rng=self._rng,
            on_state_change=on_state_change,
        )

        def backoff() -> Backoff:
            return Backoff(c.retry_backoff_ms, c.retry_backoff_max_ms, 0.2, self._rng)

        self.coordinator = CoordinatorManager(c.group_id, backoff())
        self.metadata = MetadataManager(backoff())
        auto_ms = c.auto_commit_interval_ms if c.enable_auto_commit else 0
        self.commits = CommitRequestManager(
            c.group_id,
            c.group_instance_id,
            backoff(),
            auto_commit_interval_ms=auto_ms,
            default_timeout_ms=c.connection.socket_timeout_ms,
        )
        self._consumed_offsets = consumed_offsets
        self._auto_commit_offsets = auto_commit_offsets
        self._on_fence = on_fence
        self._on_commit_done = on_commit_done
        self._on_group_error = on_group_error
        self._commit_offsets: dict[int, Mapping[Partition, OffsetLike]] = {}
        self._commit_sent_ms: dict[int, int] = {}
        self._fetches: list[_Fetch] = []
        #: Diagnostics: called on the loop thread with each heartbeat's outcome,
        #: ``(request, sent wall-clock time, response or None, error or None)``.
        self.heartbeat_trace: HeartbeatTrace | None = None
        # Read by the application thread to time its waits (`Consumer._slice`): a heartbeat
        # is on the wire, and when (monotonic s) the next one is due. Its answers are where
        # rebalance work for the application comes from.
        self.heartbeat_in_flight = False
        self.heartbeat_due = 0.0
        #: Set by a data plane whose application thread waits inside librdkafka: ends that
        #: wait when work for the application is queued (any thread calls it).
        self.app_waker: Callable[[], None] | None = None
        # The coordinator socket the last heartbeat was answered on (see _run_locked).
        self._hb_conn: tuple[int, int] | None = None
        # The coordinator the last heartbeat went to (see _coordinator_found).
        self._hb_target: tuple[int, str, int] | None = None
        self.lock = self._lock = threading.RLock()  # the core and the managers
        self._events = threading.Condition(threading.Lock())
        self._results: list[CommitResult] = []
        self._commit_waiters: dict[int, threading.Event] = {}
        self._timer: Timer | None = None
        self._timer_due = 0.0
        self._wake_queued = False
        self._metadata_version = -1
        self._last_poll_event = 0.0
        self._stable_poll_gap = min(1.0, c.max_poll_interval_ms / 4000)
        self._stopped = False
        self._conns: dict[tuple[str, int], MuxConnection] = {}
        self._loop = loop or NetworkLoop.acquire()
        self._owns_loop = loop is None
        self.wake()

    def __repr__(self) -> str:
        return (
            f"MemberNetwork(group_id={self.config.group_id!r}, "
            f"member_id={self.core.member_id!r}, state={self.core.state.name})"
        )

    # -- application side (thread-safe) -------------------------------------------------------

    @property
    def state(self) -> MemberState:
        return self.core.state

    @property
    def member_id(self) -> str:
        return self.core.member_id

    @property
    def member_epoch(self) -> int:
        return self.core.member_epoch

    def submit(self, event: ApplicationEvent) -> None:
        """Queue an application event for the core and wake the member's run."""
        self.core.submit(event)
        self.wake()

    def note_poll(self) -> None:
        """The application polled: post a `Poll` event. A stable member only needs its
        poll timer reset, so it posts rarely and does not wake the loop; during a rebalance
        every poll counts (it lets revocations run)."""
        now = time.monotonic()
        gap = now - self._last_poll_event
        if gap < _REBALANCE_POLL_GAP_S:
            return
        if self.core.state is MemberState.STABLE:
            if gap < self._stable_poll_gap:
                return
            self._last_poll_event = now
            self.core.submit(Poll(_now_ms()))
            return
        self._last_poll_event = now
        self.submit(Poll(_now_ms()))

    def prefetch_metadata(self, topics: Sequence[str]) -> None:
        """Learn these topics' ids ahead of the first assignment."""
        if topics:
            self._loop.call_soon(lambda: self._with_lock(lambda: self.metadata.request(topics)))
            self.wake()

    def commit(
        self,
        offsets: Mapping[Partition, OffsetLike],
        kind: CommitKind,
        timeout_s: float | None = None,
        epoch: int = -1,
    ) -> int:
        """Queue a commit; its `CommitResult` goes to ``on_commit_done`` (else to
        `drain_results`). ``epoch``: the member epoch it was made under (see
        `CommitRequestManager.commit`)."""
        with self._lock:
            commit_id = self.commits.commit(
                _now_ms(),
                offsets,
                kind,
                None if timeout_s is None else int(timeout_s * 1000),
                epoch,
            )
            self._commit_offsets[commit_id] = offsets
        self.wake()
        return commit_id

    @property
    def pending_commits(self) -> int:
        """Commits queued or in flight."""
        with self._lock:
            return self.commits.pending

    def forget_committed(self, partitions: set[Partition]) -> None:
        """Drop the no-regression floor of these partitions (released, or sought)."""
        with self._lock:
            self.commits.forget(partitions)

    def fetch_offsets(self, request: OffsetFetchRequest, timeout_s: float) -> OffsetFetchResponse:
        """OffsetFetch from the group coordinator (found first if needed), waiting at most
        ``timeout_s``. Raises ``KafkaTimeoutError`` when no answer came in time, or the
        transport error that failed the request. The answer's offsets become the commit
        path's no-regression floor, as committed offsets."""
        if self.failure is not None:
            raise self.failure
        fetch = _Fetch(request, time.monotonic() + timeout_s)
        self._loop.call_soon(lambda: self._queue_fetch(fetch))
        if not fetch.done.wait(max(timeout_s, 0.0)):
            fetch.cancelled = True
            raise KafkaTimeoutError(
                f"OffsetFetch for group {request.group_id!r} got no answer within "
                f"{timeout_s * 1000:.0f} ms"
            )
        if fetch.error is not None:
            raise fetch.error
        assert fetch.result is not None
        floor = {
            (r.topic, r.partition): r.offset
            for r in fetch.result.partitions
            if r.error_code == 0 and r.offset >= 0
        }
        with self._lock:
            self.commits.observe_committed(floor)
        return fetch.result

    def set_sasl_credentials(self, username: str, password: str) -> None:
        """New SASL PLAIN/SCRAM credentials from the next authentication on: this member's
        next requests go over connections authenticated with them (open ones stay up)."""
        self._settings.credentials.set(username, password)
        self._loop.call_soon(self._conns.clear)

    def commit_sync(
        self,
        offsets: Mapping[Partition, OffsetLike],
        timeout_s: float,
        kind: CommitKind,
        releasing: Iterable[Partition] = (),
    ) -> CommitResult:
        """Commit and wait for the outcome (at most ``timeout_s`` plus a little);
        ``releasing`` as in `CommitRequestManager.commit`."""
        done = threading.Event()
        with self._lock:
            commit_id = self.commits.commit(
                _now_ms(), offsets, kind, int(timeout_s * 1000), releasing=releasing
            )
            self._commit_waiters[commit_id] = done
        self.wake()
        done.wait(timeout_s + 1.0)
        with self._events:
            for i, r in enumerate(self._results):
                if r.commit_id == commit_id:
                    return self._results.pop(i)
        self._commit_waiters.pop(commit_id, None)
        return CommitResult(
            commit_id, kind, {}, int(ErrorCode.REQUEST_TIMED_OUT), "commit timed out"
        )

    def drain_background_events(self) -> list[BackgroundEvent]:
        if not self.core.background_events:
            return []
        return self.core.drain_background_events()

    def drain_results(self) -> list[CommitResult]:
        """Finished commits not waited for by `commit_sync`."""
        with self._events:
            out, self._results = self._results, []
        return out

    def wait_for_events(self, timeout_s: float, ready: Callable[[], bool] | None = None) -> None:
        """Block until background events or commit results are ready, the member failed,
        ``ready()`` holds (work the application side queued itself; see `notify`), or
        ``timeout_s``."""
        with self._events:
            if self.core.background_events or self._results or self.failure is not None:
                return
            if ready is not None and ready():
                return
            self._events.wait(timeout_s)

    def notify(self) -> None:
        """Wake `wait_for_events` and the data plane's wait (from any thread)."""
        with self._events:
            self._events.notify_all()
        waker = self.app_waker
        if waker is not None:
            waker()

    def wake(self) -> None:
        """Run the member on the loop thread soon (from any thread)."""
        if self._wake_queued or self._stopped:
            return
        self._wake_queued = True
        self._loop.call_soon(self._run)

    def stop(self) -> None:
        """Detach from the loop (after the application side has left the group)."""
        if self._stopped:
            return
        self._stopped = True
        done = threading.Event()

        def cancel() -> None:
            if self._timer is not None:
                self._timer.cancel()
            done.set()

        if self._loop.running:
            self._loop.call_soon(cancel)
            if not self._loop.in_loop_thread:
                done.wait(5.0)
        if self._owns_loop:
            self._loop.release()

    # -- loop side (everything below runs on the loop thread) ---------------------------------

    def _fail(self, exc: BaseException) -> None:
        """This member's loop-side work raised: it stops (no more requests), waiters wake up
        and its application gets the error; the loop and the other members go on."""
        log.error(
            "group %s: member %s failed on the network loop",
            self.config.group_id,
            self.core.member_id,
            exc_info=exc,
        )
        self.failure = KafkaException(
            KafkaError(
                KafkaError._FATAL,
                f"the member failed on the network loop: {type(exc).__name__}: {exc}",
                fatal=True,
            )
        )
        if self._timer is not None:
            self._timer.cancel()
        if self._on_fence is not None:  # the data plane stops: the member no longer heartbeats
            try:
                self._on_fence(set(self.core.assigned_partitions))
            except Exception:
                log.exception("group %s: fencing the data plane failed", self.config.group_id)
        fetches, self._fetches = self._fetches, []
        for f in fetches:
            f.finish(None, self.failure)
        with self._events:
            waiters, self._commit_waiters = self._commit_waiters, {}
            for w in waiters.values():
                w.set()
        self.notify()

    def _with_lock(self, fn: Callable[[], None]) -> None:
        with self._lock:
            fn()

    @_member_work
    def _queue_fetch(self, fetch: _Fetch) -> None:
        self._fetches.append(fetch)
        self._run()

    @_member_work
    def _run(self) -> None:
        self._wake_queued = False
        if self._stopped:
            return
        now = _now_ms()
        with self._lock:
            wait_ms = self._run_locked(now)
        self._notify()
        self._schedule(wait_ms)

    def _run_locked(self, now: int) -> int:
        core, coord = self.core, self.coordinator
        # Coordinator
        self._expire_fetches()
        needed = core.coordinator_needed or self.commits.coordinator_needed or bool(self._fetches)
        waiting = False
        if needed and coord.coordinator is None and not coord.in_flight:
            shared = self._shared_coordinators()
            found = shared.known.get(self.config.group_id)
            if found is not None:
                coord.adopt(found)
            elif self.config.group_id in shared.in_flight:
                shared.waiters.setdefault(self.config.group_id, []).append(self.wake)
                waiting = True  # another member's lookup answers for this one too
        if coord.coordinator is not None and not core.coordinator_known:
            self._coordinator_found(now)
        find = coord.poll(now, needed and not waiting)
        if find is not None:
            self._shared_coordinators().in_flight.add(find.group_id)
            self._send_any(
                KioCall(
                    m.API_FIND_COORDINATOR,
                    lambda v: m.find_coordinator_call(find.group_id, v),
                    lambda r: m.find_coordinator_from_kio(find.group_id, r),
                    self._client_id,
                ),
                self._on_coordinator,
            )
        # Metadata
        if core.metadata_needed and not self.metadata.pending:
            self._resolve_topics(now)
        send = self.metadata.poll(now)
        if send is not None:
            if send.topics is None:
                self._topic_view().in_flight = True
            topics = None if send.topics is None else list(send.topics)
            self._send_any(
                KioCall(
                    m.API_METADATA,
                    lambda v: m.metadata_call(topics, v, self.config.allow_auto_create_topics),
                    m.metadata_from_kio,
                    self._client_id,
                ),
                self._on_metadata,
            )
        # Commits go out before the heartbeat of the same run, over the same connection (the
        # broker answers one connection's requests in order): an asynchronous commit made
        # before a leave (say, in on_revoke of close()) is applied before the leave, with the
        # epoch it was made under.
        if self.commits.auto_commit_due(now):
            self._auto_commit(now)
        known = coord.coordinator is not None
        for c in self.commits.poll(now, core.member_id, core.member_epoch, known):
            req, commit_id = c.request, c.commit_id
            self._commit_sent_ms[commit_id] = now
            self._send_coordinator(
                KioCall(
                    m.API_OFFSET_COMMIT,
                    lambda v, r=req: m.offset_commit_call(r, v),  # type: ignore[misc]
                    m.offset_commit_from_kio,
                    self._client_id,
                ),
                lambda res, err, i=commit_id: self._on_commit(i, res, err),  # type: ignore[misc]
            )
        if known and self._fetches:
            fetches, self._fetches = self._fetches, []
            for f in fetches:
                self._send_fetch(f)
        # Heartbeat
        if self._hb_conn is not None and self._coordinator_conn_key() != self._hb_conn:
            self._hb_conn = None
            core.on_coordinator_connection_lost()
        result = core.poll(now)
        if result.request is not None:
            self._send_heartbeat(result.request)
        self.heartbeat_due = time.monotonic() + result.next_poll_ms / 1000
        wait = 0 if core.app_events else result.next_poll_ms
        if needed and not waiting:
            wait = min(wait, coord.time_until_next_poll(now, True, _IDLE_MS))
        wait = min(wait, self.metadata.time_until_next_poll(now, _IDLE_MS))
        for f in self._fetches:
            wait = min(wait, max(int((f.deadline - time.monotonic()) * 1000), 0))
        return min(wait, self.commits.time_until_next_poll(now, known, _IDLE_MS))

    def _coordinator_found(self, now: int) -> None:
        """Tell the core; a coordinator other than the one the last heartbeat went to gets
        the next heartbeat at once (see `HeartbeatRequestManager.on_coordinator_known`)."""
        found = self.coordinator.coordinator
        assert found is not None
        target = (found.node_id, found.host, found.port)
        self.core.on_coordinator_known(now, self._hb_target not in (None, target))

    def _coordinator_conn_key(self) -> tuple[int, int] | None:
        """Which socket the coordinator connection is on (None: none established)."""
        coordinator = self.coordinator.coordinator
        if coordinator is None:
            return None
        conn = self._conn(coordinator.host, coordinator.port)
        if conn.state != MuxConnection.READY:
            return None
        return (id(conn), conn.generation)

    def _expire_fetches(self) -> None:
        """OffsetFetches still waiting for a coordinator past their deadline fail."""
        if not self._fetches:
            return
        now = time.monotonic()
        keep = []
        for f in self._fetches:
            if f.cancelled:
                continue
            if now >= f.deadline:
                f.finish(
                    None,
                    KafkaTimeoutError(
                        f"OffsetFetch for group {self.config.group_id!r}: the group coordinator "
                        f"was not found in time ({self._coordinator_detail()})"
                    ),
                )
            else:
                keep.append(f)
        self._fetches = keep

    def _coordinator_detail(self) -> str:
        last = self.coordinator.last_error
        return "no lookup answered yet" if last is None else f"last error: {last[1]}"

    def _shared_coordinators(self) -> _Coordinators:
        key = ("coordinators", self._loop.connection_key(self._settings), tuple(self._bootstrap))
        shared: _Coordinators = self._loop.shared(key, _Coordinators)
        return shared

    def _coordinator_lost(self, reason: str) -> None:
        known = self.coordinator.coordinator
        if known is not None:
            self._shared_coordinators().forget(self.config.group_id, known)
        self.coordinator.mark_unknown(reason)

    def _topic_view(self) -> _TopicNames:
        key = ("topic-names", self._loop.connection_key(self._settings), tuple(self._bootstrap))
        view: _TopicNames = self._loop.shared(key, _TopicNames)
        return view

    def _resolve_topics(self, now: int) -> None:
        view = self._topic_view()
        unresolved = self.core.unresolved_topic_ids
        if unresolved and unresolved <= view.names.keys():
            self.core.on_metadata(now, {**self.metadata.topic_names, **view.names})
        elif view.in_flight:
            view.waiters.append(self.wake)
        else:
            self.metadata.request(None)

    def _schedule(self, wait_ms: int) -> None:
        due = time.monotonic() + max(wait_ms, 0) / 1000
        if self._timer is not None and not self._timer.cancelled:
            if abs(self._timer_due - due) < 0.001:
                return
            self._timer.cancel()
        self._timer_due = due
        self._timer = self._loop.call_at(due, self._run)

    def _notify(self) -> None:
        self._collect_results()
        if self.core.background_events or self._results:
            self.notify()

    def _collect_results(self) -> None:
        with self._lock:
            done = self.commits.drain_completed()
            if not done:
                return
            offsets = [self._commit_offsets.pop(r.commit_id, {}) for r in done]
        hooked = []
        with self._events:
            for r, o in zip(done, offsets, strict=True):
                waiter = self._commit_waiters.pop(r.commit_id, None)
                if waiter is None and self._on_commit_done is not None:
                    hooked.append((r, o))
                    continue
                self._results.append(r)
                if waiter is not None:
                    waiter.set()
        for r, o in hooked:
            assert self._on_commit_done is not None
            self._on_commit_done(r, o)

    def _auto_commit(self, now: int) -> None:
        if self._auto_commit_offsets is not None:
            chosen = self._auto_commit_offsets()
            if chosen:
                self._commit_offsets[self.commits.commit(now, chosen, CommitKind.AUTO)] = chosen
            else:
                self.commits.skip_auto_commit(now)
            return
        core = self.core
        in_group = core.state in (
            MemberState.STABLE,
            MemberState.RECONCILING,
            MemberState.ACKNOWLEDGING,
        )
        offsets = dict(self._consumed_offsets()) if self._consumed_offsets else {}
        assigned = core.assigned_partitions
        offsets = {p: o for p, o in offsets.items() if p in assigned}
        if not in_group or core.member_epoch <= 0 or not offsets:
            self.commits.skip_auto_commit(now)
            return
        self.commits.commit(now, offsets, CommitKind.AUTO)

    # -- sending ------------------------------------------------------------------------------

    def _timeout_s(self, heartbeat: bool = False) -> float:
        """Request timeout. A timed-out request closes the shared connection and fails every
        request on it, so it is generous: Java's request.timeout.ms (30 s) at most, and for
        heartbeats three intervals (at least 5 s), which still notices a hung coordinator
        well before a session timeout of the usual 45 s."""
        limit = min(self._settings.socket_timeout_ms / 1000, 30.0)
        if not heartbeat:
            return limit
        interval = self.core.heartbeat_interval_ms or 3000
        return min(max(3 * interval / 1000, 5.0), limit)

    def _conn(self, host: str, port: int) -> MuxConnection:
        conn = self._conns.get((host, port))
        if conn is None:
            conn = self._conns[(host, port)] = self._loop.connection(self._settings, host, port)
            if conn.log_target is None:
                conn.log_target = self._logger
        return conn

    def _send_any(self, call: Any, handler: Callable[[Any, KafkaException | None], None]) -> None:
        host, port = self._bootstrap[self._bootstrap_index % len(self._bootstrap)]
        self._loop.request(self._conn(host, port), call, handler, self._timeout_s())

    def _send_coordinator(
        self,
        call: Any,
        handler: Callable[[Any, KafkaException | None], None],
        heartbeat: bool = False,
    ) -> None:
        coordinator = self.coordinator.coordinator
        if coordinator is None:
            handler(None, KafkaTransportError("the group coordinator is unknown"))
            return
        conn = self._conn(coordinator.host, coordinator.port)
        self._loop.request(conn, call, handler, self._timeout_s(heartbeat))

    def _send_heartbeat(self, request: HeartbeatRequest) -> None:
        call = HeartbeatCall(request, _ENCODER, self._client_id)
        self.heartbeat_in_flight = True
        target = self.coordinator.coordinator
        if target is not None:
            self._hb_target = (target.node_id, target.host, target.port)
        trace = self.heartbeat_trace
        if trace is None:
            self._send_coordinator(
                call, lambda res, err: self._on_heartbeat(request, res, err), heartbeat=True
            )
            return
        sent = time.time()

        def traced(response: Any, error: KafkaException | None) -> None:
            try:
                trace(request, sent, response, error)
            except Exception:
                log.exception("group %s: heartbeat trace failed", self.config.group_id)
            self._on_heartbeat(request, response, error)

        self._send_coordinator(call, traced, heartbeat=True)

    def _send_fetch(self, fetch: _Fetch) -> None:
        req = fetch.request
        self._send_coordinator(
            KioCall(
                m.API_OFFSET_FETCH,
                lambda v: m.offset_fetch_call(req, v),
                m.offset_fetch_from_kio,
                self._client_id,
            ),
            lambda res, err: self._on_fetch(fetch, res, err),
        )

    # -- responses (loop thread) ---------------------------------------------------------------

    def _after(self) -> None:
        """Run again now: a response may have made something due."""
        self._run()

    @_member_work
    def _on_fetch(
        self, fetch: _Fetch, response: OffsetFetchResponse | None, error: KafkaException | None
    ) -> None:
        if error is not None:
            if failure_of(error).kind is FailureKind.DISCONNECTED:
                self._coordinator_lost(error.args[0].str())
        elif response is not None and response.error_code in _COORDINATOR_ERRORS:
            self._coordinator_lost(f"OffsetFetch: {ErrorCode.name_of(response.error_code)}")
        fetch.finish(response, error)
        if not self._stopped:
            self._after()

    @_member_work
    def _on_heartbeat(
        self, request: HeartbeatRequest, response: Any, error: KafkaException | None
    ) -> None:
        if self._stopped:
            return
        now = _now_ms()
        with self._lock:
            core = self.core
            was_stable = core.state is MemberState.STABLE
            if error is None:
                core.on_heartbeat_response(now, response, request)
                self._hb_conn = self._coordinator_conn_key()
                if response.error_code in _COORDINATOR_ERRORS:
                    self._coordinator_lost(ErrorCode.name_of(response.error_code))
            else:
                failure = failure_of(error)
                core.on_heartbeat_failure(now, failure, request)
                if failure.kind is FailureKind.DISCONNECTED:
                    self._coordinator_lost(failure.message)
            if self.coordinator.coordinator is None and core.coordinator_known:
                core.on_coordinator_unknown(now)
            # The steady state: a stable member's plain answer changed nothing but the
            # heartbeat's own timer, so only that is rescheduled (see `_reschedule_heartbeat`).
            quiet = (
                was_stable
                and error is None
                and response.error_code == 0
                and response.assignment is None
                and core.state is MemberState.STABLE
                and not core.app_events
                and not core.background_events
            )
            wait_ms = core.time_until_next_poll(now) if quiet else 0
            fence = self._on_fence is not None and not quiet
            pending = set(core.pending_revocation) if fence else set()
            if quiet:
                self.heartbeat_due = time.monotonic() + wait_ms / 1000
            self.heartbeat_in_flight = False
        # Fenced, fatal or stale: the partitions are lost now, not when on_lost runs in the
        # next poll(); records of theirs still buffered must not reach the application.
        if pending:
            assert self._on_fence is not None
            self._on_fence(pending)
        if wait_ms > 0 and self._reschedule_heartbeat(wait_ms):
            return
        self._after()

    def _reschedule_heartbeat(self, wait_ms: int) -> bool:
        """After a quiet heartbeat answer: run again when the heartbeat is next due, if that is
        earlier than the scheduled run; False if no run is scheduled (run now instead).

        A full run would send nothing now (``wait_ms > 0``) and would wait
        ``min(wait_ms, the other managers' waits)``; those are deadlines the scheduled run
        already honours, as it was computed from them, so keeping it when it is earlier never
        runs later than a full run would."""
        timer = self._timer
        if self._wake_queued or timer is None or timer.cancelled:
            return False
        if time.monotonic() + wait_ms / 1000 < self._timer_due:
            self._schedule(wait_ms)
        return True

    @_member_work
    def _on_coordinator(self, result: Coordinator | None, error: KafkaException | None) -> None:
        self._shared_coordinators().done(self.config.group_id, result if error is None else None)
        if self._stopped:
            return
        now = _now_ms()
        unreachable: KafkaError | None = None
        with self._lock:
            if error is None:
                assert result is not None
                report = self.coordinator.on_response(now, result)
                if result.error_code == 0:
                    self._coordinator_found(now)
                elif self.coordinator.failures == _UNREACHABLE_AFTER:
                    detail = self._coordinator_detail()
                    unreachable = KafkaError(
                        result.error_code,
                        f"group coordinator unreachable: {detail}",
                        retriable=True,
                    )
            else:
                self._bootstrap_index += 1  # try the next bootstrap server
                report = self.coordinator.on_failure(now, failure_of(error))
                if isinstance(error, SaslError | TlsHandshakeError):
                    # Configuration errors: _AUTHENTICATION / _SSL as confluent-kafka names them.
                    code = error.args[0].code() if isinstance(error, SaslError) else KafkaError._SSL
                    report = (code, f"cannot connect to the cluster: {error.args[0].str()}")
                elif self.coordinator.failures == _UNREACHABLE_AFTER:
                    code = error.args[0].code()
                    if code == KafkaError._TIMED_OUT:
                        code = KafkaError._TRANSPORT
                    unreachable = KafkaError(
                        code,
                        f"group coordinator unreachable: {error.args[0].str()}",
                        retriable=True,
                    )
            if report is not None:
                self._report(report)
        if unreachable is not None and self._on_group_error is not None:
            self._on_group_error(unreachable)
        self._after()

    def _report(self, report: tuple[int, str]) -> None:
        code, message = report
        events = self.core.background_events
        if not any(isinstance(e, ErrorEvent) and e.message == message for e in list(events)):
            events.append(ErrorEvent(code, message, fatal=False))

    @_member_work
    def _on_metadata(self, result: ClusterMetadata | None, error: KafkaException | None) -> None:
        if self._stopped:
            return
        now = _now_ms()
        with self._lock:
            if error is None:
                assert result is not None
                self.metadata.on_response(now, result)
                self._topic_view().update(self.metadata.topic_names)
                self.core.on_metadata(now, self.metadata.topic_names)
            else:
                self._bootstrap_index += 1
                self.metadata.on_failure(now, failure_of(error))
                self._topic_view().update({})
        self._after()

    @_member_work
    def _on_commit(
        self,
        commit_id: int,
        results: Sequence[PartitionResult] | None,
        error: KafkaException | None,
    ) -> None:
        now = _now_ms()
        with self._lock:
            sent = self._commit_sent_ms.pop(commit_id, None)
            if error is None:
                assert results is not None
                if sent is not None:  # commit-rate / commit-latency-*: answered requests
                    self.core.metrics.record_commit(now, now - sent)
                rediscover = self.commits.on_response(now, commit_id, results)
            else:
                rediscover = self.commits.on_failure(now, commit_id, failure_of(error))
            if rediscover:
                self._coordinator_lost("OffsetCommit coordinator error")
                if self.core.coordinator_known:
                    self.core.on_coordinator_unknown(now)
        if not self._stopped:
            self._after()
        else:
            self._collect_results()
