"""The runtime adapter of one group member: its `MemberDriver` on the shared `NetworkLoop`.

`MemberNetwork` hosts the member's sans-IO driver (`consumer_sdk.runtime.driver`: the
membership core and the coordinator, metadata and commit request managers) on the
process-wide network loop, over a `LoopTransport`: each run hands the driver the application's
queued events and the time, the driver sends what is due, and the next run is scheduled at
the time it names. Outcomes are fed to the driver on the loop thread as they arrive, mapped
to values once by the error boundary (`consumer_sdk.runtime.boundary`). There is no thread
per member, and the driver and its core are touched on the loop thread only.

Thread rules. The application side (`GroupMember`, the data plane, ``consumer_sdk.aio``)
calls only the thread-safe methods of the "application side" section: it queues events and
requests (`submit`, `commit`, ...) for the loop, waits on a `Completion` with a deadline
for every blocking call (`commit_sync`, `fetch_offsets`, `call`), drains the application-bound
events (`drain_background_events`, `drain_results`) and reads the frozen `MemberSnapshot`
(`snapshot`) that the loop publishes after each run by swapping one reference. Everything
below the "loop side" marker runs on the loop thread (asserted under pytest, see
`check_threads`); every loop-side entry point is guarded: an exception fails this member
(`failure`, raised to its application) and never the loop or the other members. The hooks
given to the constructor run on the loop thread and must not block.
"""

from __future__ import annotations

import itertools
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from heapq import heappush
from typing import Any, Protocol, TypeVar

from confluent_kafka import KafkaError

from consumer_sdk.backoff import Backoff
from consumer_sdk.config import ConsumerConfig
from consumer_sdk.domain import HeartbeatRequest, OffsetFetchRequest, OffsetFetchResponse
from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.errors import KafkaException
from consumer_sdk.membership import (
    ApplicationEvent,
    BackgroundEvent,
    GroupMembership,
    MemberState,
    Poll,
    StateChanged,
)
from consumer_sdk.membership.requests import (
    CommitKind,
    CommitRequestManager,
    CommitResult,
    CoordinatorManager,
    OffsetLike,
)
from consumer_sdk.observability.log_routing import enable_routing, routed_logs
from consumer_sdk.protocol.multiplex import MuxConnection
from consumer_sdk.protocol.security import ConnectionSettings, parse_bootstrap_servers
from consumer_sdk.runtime.boundary import exception_of, failure_of, unreachable_error
from consumer_sdk.runtime.completion import Completion, CompletionReaper
from consumer_sdk.runtime.driver import (
    CommitDone,
    CoordinatorUnreachable,
    DriverConfig,
    Fence,
    FetchDone,
    MemberDriver,
    MemberSnapshot,
    Outbound,
    SharedLookups,
)
from consumer_sdk.runtime.netloop import NetworkLoop, Timer
from consumer_sdk.runtime.transport import HeartbeatTrace, LoopTransport

__all__ = ["MemberNetwork", "PollGate", "check_threads", "failure_of"]

log = logging.getLogger("consumer_sdk.runtime")

Partition = tuple[str, int]

# A stable member's poll events only reset the poll timer; see MemberNetwork.note_poll.
_REBALANCE_POLL_GAP_S = 0.002

_T = TypeVar("_T")
CommitHook = Callable[[CommitResult, Mapping[Partition, OffsetLike]], None]
Committable = Callable[[], tuple[Mapping[Partition, OffsetLike], frozenset[Partition] | None]]
LogTarget = logging.Logger | logging.LoggerAdapter[logging.Logger]
#: An item of a member's inbox: an application event for the core, or work for the driver.
_Item = ApplicationEvent | Callable[[MemberDriver, int], None]

#: Whether loop-thread-only code asserts that it runs on the loop thread (on in the test
#: suite, where ``CONSUMER_SDK_CHECK_THREADS=1``; it costs a thread id read per entry).
check_threads = os.environ.get("CONSUMER_SDK_CHECK_THREADS", "") == "1"


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def commit_result(completion: Completion[CommitResult], kind: CommitKind) -> CommitResult:
    """The result of a `MemberNetwork.commit_completion` waited for: a timeout or the
    member's failure (which its caller raises) read as a timed-out commit. Expires it if it
    is not done."""
    if not completion.done():
        completion.expire()
    if completion.error() is not None:
        code = int(ErrorCode.REQUEST_TIMED_OUT)
        return CommitResult(0, kind, {}, code, "commit timed out", detail="commit timed out")
    return completion.outcome()


class PollGate(Protocol):
    """Where a stable member's ``poll(0)`` looks first (the facade, or the `MemberNetwork`
    itself): ``_poll_note_due``, until when (``time.monotonic()``) such a poll has nothing to
    do, which the loop clears (sets to 0.0) after it queues an event for the application or
    fails the member; and ``_poll_busy()``, whether the application side itself has work for
    a poll (which clears ``_poll_note_due`` whenever it gets some). On the facade, the poll reads
    one attribute of one object: with many members each poll finds it out of the CPU's
    caches, and every further object read costs about as much as the rest of the poll."""

    _poll_note_due: float

    def _poll_busy(self) -> bool: ...


class MemberNetwork:
    """One member's driver on the shared loop; see the module docstring.

    Hooks, all called on the loop thread: ``on_state_change`` for every transition of the
    core; ``committable`` returns what an auto-commit may commit (the data plane's positions,
    and the partitions of a manual assignment or None), and must not block; ``on_fence`` gets
    the partitions pending revocation after a heartbeat outcome (the data plane stops handing
    out their records at once); ``on_commit_done`` gets each finished commit not waited for
    by `commit_sync` (else `drain_results` returns them); ``on_group_error`` gets errors meant
    for ``error_cb`` only. ``logger`` receives the member's log records (the ``logger``
    configuration key).
    """

    __slots__ = (
        "_commit_waiters",
        "_commits_submitted",
        "_commits_taken",
        "_cond",
        "_core_events",
        "_driver",
        "_events",
        "_fetch_waiters",
        "_gate",
        "_ids",
        "_inbox",
        "_last_poll_event",
        "_logger",
        "_loop",
        "_on_commit_done",
        "_on_fence",
        "_on_group_error",
        "_owns_loop",
        "_poll_note_due",
        "_polled_taken",
        "_post_lock",
        "_reaper",
        "_results",
        "_rng",
        "_routing",
        "_snapshot",
        "_stable_poll_gap",
        "_stopped",
        "_submitted",
        "_taken",
        "_timer",
        "_timer_due",
        "_transport",
        "_wake_queued",
        "app_waker",
        "background_events",
        "config",
        "failure",
        "polled_ms",
    )

    def __init__(
        self,
        config: ConsumerConfig,
        *,
        loop: NetworkLoop | None = None,
        rng: random.Random | None = None,
        on_state_change: Callable[[StateChanged], None] | None = None,
        committable: Committable | None = None,
        on_fence: Callable[[set[Partition]], None] | None = None,
        on_commit_done: CommitHook | None = None,
        on_group_error: Callable[[KafkaError], None] | None = None,
        logger: LogTarget | None = None,
        poll_gate: PollGate | None = None,
    ) -> None:
        c = self.config = config
        self._rng = rng or random.Random()
        self.failure: KafkaException | None = None
        self._logger = logger
        if logger is not None:
            enable_routing()
        self._loop = loop or NetworkLoop.acquire()
        self._owns_loop = loop is None
        bootstrap = parse_bootstrap_servers(c.bootstrap_servers)
        self._transport = LoopTransport(
            self._loop,
            c.connection,
            bootstrap,
            self._on_outcome,
            logger,
            allow_auto_create_topics=c.allow_auto_create_topics,
        )
        core = GroupMembership(
            c.membership_config(), rng=self._rng, on_state_change=on_state_change
        )
        shared_key = ("lookups", self._loop.connection_key(c.connection), tuple(bootstrap))

        def backoff() -> Backoff:
            return Backoff(c.retry_backoff_ms, c.retry_backoff_max_ms, 0.2, self._rng)

        # Commit and fetch ids, taken on the application thread (itertools.count is atomic).
        self._ids = itertools.count(1).__next__
        self._driver = MemberDriver(
            DriverConfig(
                group_id=c.group_id,
                group_instance_id=c.group_instance_id,
                retry_backoff_ms=c.retry_backoff_ms,
                retry_backoff_max_ms=c.retry_backoff_max_ms,
                auto_commit_interval_ms=c.auto_commit_interval_ms if c.enable_auto_commit else 0,
                request_timeout_ms=c.connection.socket_timeout_ms,
            ),
            core,
            self._transport,
            self._loop.shared(shared_key, SharedLookups),
            self.wake,
            backoff,
            self._ids,
        )
        self._driver.committable = committable
        self._on_fence = on_fence
        self._on_commit_done = on_commit_done
        self._on_group_error = on_group_error
        #: Set by a data plane whose application thread waits inside librdkafka: ends that
        #: wait when work for the application is queued (any thread calls it).
        self.app_waker: Callable[[], None] | None = None
        # Application -> loop: events and requests, taken in by the next run, in order.
        self._inbox: deque[_Item] = deque()
        self._submitted = 0  # items put in the inbox (application side)
        self._commits_submitted = 0  # commits among them
        self._commits_taken = 0  # commits taken in (loop side)
        self._post_lock = threading.Lock()
        self._taken = 0  # items taken in by the driver (loop side)
        # Loop -> application: background events, finished commits, and their condition.
        self._events: deque[BackgroundEvent] = deque()
        #: The same queue, for the application to check for emptiness (drain it with
        #: `drain_background_events`).
        self.background_events = self._events
        self._results: list[CommitResult] = []
        self._cond = threading.Condition(threading.Lock())
        # Completions the application waits on, by commit or fetch id (loop side).
        self._commit_waiters: dict[int, Completion[CommitResult]] = {}
        self._fetch_waiters: dict[int, Completion[OffsetFetchResponse]] = {}
        self._reaper = CompletionReaper()
        self._timer: Timer | None = None
        self._timer_due = 0.0
        self._wake_queued = False
        self._last_poll_event = 0.0
        #: When (``time.monotonic()`` ms) a stable member's application last polled, as noted
        #: by `note_poll` (written by the application side, read by the loop's runs).
        self.polled_ms = 0
        self._polled_taken = 0  # the latest poll time the driver has (loop side)
        #: Until when (``time.monotonic()``) a stable member's ``poll(0)`` has nothing to do:
        #: `note_poll` would do nothing, and no background event or failure has been handed
        #: to the application since it was set (0.0 while not STABLE, once an event is queued
        #: for the application, and once the member failed). The application may skip
        #: `note_poll` and the queues' checks before then. Kept on ``poll_gate`` (see
        #: `PollGate`) when the facade gives one, else here.
        self._poll_note_due = 0.0
        self._gate: PollGate = poll_gate if poll_gate is not None else self
        self._stable_poll_gap = min(1.0, c.max_poll_interval_ms / 4000)
        self._stopped = False
        self._routing = False  # inside `_routed` (loop side)
        # The core's application-bound events (the same deque for the member's life).
        self._core_events = core.background_events
        self._snapshot: MemberSnapshot = self._driver.snapshot(0)
        self.wake()

    def __repr__(self) -> str:
        s = self._snapshot
        return (
            f"MemberNetwork(group_id={self.config.group_id!r}, "
            f"member_id={s.member_id!r}, state={s.state.name})"
        )

    # -- application side (thread-safe) -------------------------------------------------------

    @property
    def snapshot(self) -> MemberSnapshot:
        """The member as of the loop's last run (a frozen value; read it once)."""
        return self._snapshot

    @property
    def state(self) -> MemberState:
        return self._snapshot.state

    @property
    def member_id(self) -> str:
        return self._snapshot.member_id

    @property
    def member_epoch(self) -> int:
        return self._snapshot.member_epoch

    @property
    def last_poll(self) -> float:
        """When (``time.monotonic()``) the application last posted a poll event (0: never)."""
        return self._last_poll_event

    @property
    def events_pending(self) -> bool:
        """Application events submitted that the loop has not taken in yet."""
        return self._submitted > self._snapshot.events_taken

    def _post(self, item: _Item, wake: bool = True, commit: bool = False) -> None:
        with self._post_lock:  # application threads: the count matches the inbox
            self._inbox.append(item)
            self._submitted += 1
            if commit:
                self._commits_submitted += 1
        if wake:
            self.wake()

    def submit(self, event: ApplicationEvent) -> None:
        """Queue an application event for the core and wake the member's run."""
        self._post(event)

    def note_poll(self) -> None:
        """The application polled: tell the loop. A stable member only needs its poll timer
        reset, so it notes the time rarely, in `polled_ms` (no event, no wake-up: the loop's
        next run of the member takes it in); during a rebalance every poll counts (it lets
        revocations run) and posts a `Poll` event."""
        now = time.monotonic()
        gap = now - self._last_poll_event
        if gap < _REBALANCE_POLL_GAP_S:
            return
        if self._snapshot.state is MemberState.STABLE:
            if gap >= self._stable_poll_gap:
                self._last_poll_event = now
                self.polled_ms = int(now * 1000)
            gate = self._gate
            gate._poll_note_due = self._last_poll_event + self._stable_poll_gap
            # The loop clears it when it publishes another state, queues an event or fails
            # the member, and the facade when it queues a callback or ends (each after the
            # change): if either did so before the line above, clear it here (else polls
            # would skip a rebalance's counting, the event, the callback or the error).
            if (
                self._snapshot.state is not MemberState.STABLE
                or self._events
                or self.failure is not None
                or gate._poll_busy()
            ):
                gate._poll_note_due = 0.0
            return
        self._gate._poll_note_due = 0.0
        self._last_poll_event = now
        self._post(Poll(_now_ms()))

    def _poll_busy(self) -> bool:
        """(`PollGate`, without a facade's) Nothing besides the loop's own queues."""
        return False

    def prefetch_metadata(self, topics: Sequence[str]) -> None:
        """Learn these topics' ids ahead of the first assignment."""
        if topics:
            names = tuple(topics)
            self._post(lambda d, _now: d.request_metadata(names))

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
        commit_id = self._ids()
        made = _now_ms()
        timeout_ms = None if timeout_s is None else int(timeout_s * 1000)

        def queue(d: MemberDriver, _now: int) -> None:
            self._commits_taken += 1
            d.commit(made, offsets, kind, timeout_ms, epoch, commit_id)

        self._post(queue, commit=True)
        return commit_id

    @property
    def pending_commits(self) -> int:
        """Commits queued or in flight, those still on their way to the loop included."""
        s = self._snapshot
        return s.pending_commits + self._commits_submitted - s.commits_taken

    def forget_committed(self, partitions: set[Partition]) -> None:
        """Drop the no-regression floor of these partitions (released, or sought)."""
        parts = set(partitions)
        self._post(lambda d, _now: d.forget_committed(parts), wake=False)

    def fetch_offsets(self, request: OffsetFetchRequest, timeout_s: float) -> OffsetFetchResponse:
        """OffsetFetch from the group coordinator (found first if needed), waiting at most
        ``timeout_s``. Raises ``KafkaTimeoutError`` when no answer came in time, or the
        transport error that failed the request. The answer's offsets become the commit
        path's no-regression floor, as committed offsets."""
        if self.failure is not None:
            raise self.failure
        return self.fetch_offsets_completion(request, timeout_s).result(timeout_s)

    def fetch_offsets_completion(
        self, request: OffsetFetchRequest, timeout_s: float
    ) -> Completion[OffsetFetchResponse]:
        """`fetch_offsets` without the wait: its `Completion` (completed on the loop thread;
        failed past ``timeout_s`` or with the member's failure)."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        what = (
            f"OffsetFetch for group {request.group_id!r} (no answer within "
            f"{timeout_s * 1000:.0f} ms)"
        )
        done: Completion[OffsetFetchResponse] = Completion(deadline, what)
        fetch_id = self._ids()
        deadline_ms = int(deadline * 1000)

        def queue(d: MemberDriver, _now: int) -> None:
            self._fetch_waiters[fetch_id] = self._reaper.track(done)
            d.fetch_offsets(fetch_id, request, deadline_ms)

        if self.failure is not None:
            done.fail(self.failure)
            return done
        self._post(queue)
        return done

    def commit_sync(
        self,
        offsets: Mapping[Partition, OffsetLike],
        timeout_s: float,
        kind: CommitKind,
        releasing: Iterable[Partition] = (),
    ) -> CommitResult:
        """Commit and wait for the outcome (at most ``timeout_s`` plus a little);
        ``releasing`` as in `CommitRequestManager.commit`."""
        done = self.commit_completion(offsets, timeout_s, kind, releasing)
        done.wait(timeout_s + 1.0)
        return commit_result(done, kind)

    def commit_completion(
        self,
        offsets: Mapping[Partition, OffsetLike],
        timeout_s: float,
        kind: CommitKind,
        releasing: Iterable[Partition] = (),
    ) -> Completion[CommitResult]:
        """`commit_sync` without the wait: its `Completion` (completed on the loop thread;
        failed past ``timeout_s`` plus a little, or with the member's failure)."""
        releasing = frozenset(releasing)
        commit_id = self._ids()
        made = _now_ms()
        done: Completion[CommitResult] = Completion(
            time.monotonic() + timeout_s + 1.0, f"commit {commit_id}"
        )

        def queue(d: MemberDriver, _now: int) -> None:
            self._commits_taken += 1
            self._commit_waiters[commit_id] = self._reaper.track(done)
            d.commit(
                made, offsets, kind, int(timeout_s * 1000), commit_id=commit_id, releasing=releasing
            )

        if self.failure is not None:
            done.fail(self.failure)
            return done
        self._post(queue, commit=True)
        return done

    def call(self, fn: Callable[[MemberDriver], _T], timeout_s: float = 30.0) -> _T:
        """Run ``fn(driver)`` on the loop thread and return its value (diagnostics and
        metrics: the core's counters live there). After `stop`, when the loop no longer
        runs this member, ``fn`` runs on the calling thread."""
        if self._stopped or not self._loop.running or self._loop.in_loop_thread:
            return fn(self._driver)
        done: Completion[_T] = Completion(time.monotonic() + timeout_s, "a member query")

        def run() -> None:
            try:
                done.complete(fn(self._driver))
            except BaseException as exc:
                done.fail(exc)

        self._loop.call_soon(run)
        return done.result(timeout_s)

    def set_sasl_credentials(self, username: str, password: str) -> None:
        """New SASL PLAIN/SCRAM credentials from the next authentication on: this member's
        next requests go over connections authenticated with them (open ones stay up)."""
        self._transport.settings.credentials.set(username, password)
        self._loop.call_soon(self._transport.drop_connections)

    def drain_background_events(self) -> list[BackgroundEvent]:
        out: list[BackgroundEvent] = []
        events = self._events
        while events:
            try:
                out.append(events.popleft())
            except IndexError:
                break
        return out

    def drain_results(self) -> list[CommitResult]:
        """Finished commits not waited for by `commit_sync`."""
        with self._cond:
            out, self._results = self._results, []
        return out

    def wait_for_events(self, timeout_s: float, ready: Callable[[], bool] | None = None) -> None:
        """Block until background events or commit results are ready, the member failed,
        ``ready()`` holds (work the application side queued itself; see `notify`), or
        ``timeout_s``."""
        with self._cond:
            if self._events or self._results or self.failure is not None:
                return
            if ready is not None and ready():
                return
            self._cond.wait(timeout_s)

    def notify(self) -> None:
        """Wake `wait_for_events` and the data plane's wait (from any thread)."""
        with self._cond:
            self._cond.notify_all()
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
            self._driver.stopped = True
            if self._timer is not None:
                self._timer.cancel()
            done.set()

        if self._loop.running:
            self._loop.call_soon(cancel)
            if not self._loop.in_loop_thread:
                done.wait(5.0)
        else:
            self._driver.stopped = True
        if self._owns_loop:
            self._loop.release()

    # -- diagnostics (tests, benchmarks, chaos tooling) ----------------------------------------

    @property
    def core(self) -> GroupMembership:
        """The membership core: loop thread only (tests read counters of a quiet member)."""
        return self._driver.core

    @property
    def coordinator(self) -> CoordinatorManager:
        """The coordinator manager (loop thread only)."""
        return self._driver.coordinator

    @property
    def commits(self) -> CommitRequestManager:
        """The commit manager (loop thread only)."""
        return self._driver.commits

    @property
    def heartbeat_trace(self) -> HeartbeatTrace | None:
        """Called on the loop thread with each heartbeat's outcome: ``(request, sent
        wall-clock time, response or None, error or None)``."""
        return self._transport.heartbeat_trace

    @heartbeat_trace.setter
    def heartbeat_trace(self, trace: HeartbeatTrace | None) -> None:
        self._transport.heartbeat_trace = trace

    @property
    def heartbeat_sent(self) -> Callable[[HeartbeatRequest], None] | None:
        """Called on the loop thread with each heartbeat request as it is sent."""
        return self._transport.heartbeat_sent

    @heartbeat_sent.setter
    def heartbeat_sent(self, hook: Callable[[HeartbeatRequest], None] | None) -> None:
        self._transport.heartbeat_sent = hook

    def _conn(self, host: str, port: int) -> MuxConnection:
        """The member's connection to ``host:port`` (loop thread only)."""
        return self._transport._conn(host, port)

    @property
    def _conns(self) -> dict[tuple[str, int], MuxConnection]:
        return self._transport.conns

    @property
    def _settings(self) -> ConnectionSettings:
        return self._transport.settings

    # -- loop side (everything below runs on the loop thread) ---------------------------------

    def _fail(self, exc: BaseException) -> None:
        """This member's loop-side work raised: it stops (no more requests), waiters wake up
        and its application gets the error; the loop and the other members go on."""
        core = self._driver.core
        log.error(
            "group %s: member %s failed on the network loop",
            self.config.group_id,
            core.member_id,
            exc_info=exc,
        )
        self.failure = KafkaException(
            KafkaError(
                KafkaError._FATAL,
                f"the member failed on the network loop: {type(exc).__name__}: {exc}",
                fatal=True,
            )
        )
        self._gate._poll_note_due = 0.0  # after the failure: poll(0) raises it
        self._driver.fail()
        if self._timer is not None:
            self._timer.cancel()
        if self._on_fence is not None:  # the data plane stops: the member no longer heartbeats
            try:
                self._on_fence(set(core.assigned_partitions))
            except Exception:
                log.exception("group %s: fencing the data plane failed", self.config.group_id)
        self._commit_waiters.clear()
        self._fetch_waiters.clear()
        self._reaper.fail_all(self.failure)
        self.notify()

    # The member's loop-thread entry points, `_run` and `_on_outcome`, are its error
    # boundary: an exception fails this member only (`_fail`; the loop goes on serving the
    # others), and its log records go to its logger. Written out in each (one call less per
    # heartbeat than a decorator); `_routed` runs an entry again inside the log routing.

    def _routed(self, entry: Callable[..., None], *args: Any) -> None:
        self._routing = True
        try:
            with routed_logs(self._logger):
                entry(*args)
        finally:
            self._routing = False

    def _wrong_thread(self, entry: str) -> bool:
        if self._loop.in_loop_thread:
            return False
        raise AssertionError(f"{entry} runs on the network loop thread only")

    def _run(self) -> None:
        """A run of the member's driver: its queued events in, due requests out, the snapshot
        published and the next run scheduled (loop thread)."""
        if check_threads and self._wrong_thread("_run"):
            return
        if self.failure is not None:
            return
        if self._logger is not None and not self._routing:
            self._routed(self._run)
            return
        try:
            self._wake_queued = False
            if self._stopped:
                return
            started = time.monotonic()
            now = int(started * 1000)  # `_now_ms()`
            driver = self._driver
            inbox = self._inbox
            prev: MemberSnapshot | None = self._snapshot  # (None once something is taken in)
            if inbox:
                prev = None
                while inbox:  # `_take_inbox`, inline
                    item = inbox.popleft()
                    self._taken += 1
                    if callable(item):
                        item(driver, now)
                    else:
                        if type(item) is Poll and item.now_ms > self._polled_taken:
                            self._polled_taken = item.now_ms
                        driver.submit(item)
            polled = self.polled_ms  # a stable member's poll (about once a second): after
            if polled > self._polled_taken:  # the events queued before it, never older
                self._polled_taken = polled
            else:
                polled = 0
            wait_ms = driver.run(now, polled, prev)  # (`driver.note_poll(polled)` first)
            if self._commit_waiters or self._fetch_waiters:
                reaper = self._reaper
                reaper.reap(now / 1000)
                deadline = reaper.next_deadline()
                if deadline is not None:
                    wait_ms = min(wait_ms, max(int((deadline - now / 1000) * 1000) + 1, 0))
            # `_publish()`, inline (once per heartbeat); the heartbeat's lane built it, and
            # leaves nothing to hand over (a STABLE member; it adds no event, and the last
            # publish handed over what there was)
            snap = driver.lane_snapshot
            if snap is not None:
                driver.lane_snapshot = None
                self._snapshot = snap
            else:
                self._snapshot = snap = driver.snapshot(
                    self._taken, self._commits_taken, self._snapshot
                )
                if snap.state is not MemberState.STABLE or driver.outbox or self._core_events:
                    self._hand_over(snap)
            # `_schedule_at(started + wait)`, inline (once per heartbeat). The wait counts
            # from ``now``, which is not after ``started``: the run is never early.
            due = started + (wait_ms if wait_ms > 0 else 0) / 1000
            timer = self._timer
            if timer is not None:
                if not timer.armed:  # it fired (nearly always: this is its run): again
                    # `self._loop.rearm(timer, due)`, inline (once per heartbeat)
                    self._timer_due = timer.when = due
                    timer.cancelled = False
                    timer.armed = True
                    loop = self._loop
                    heappush(loop._lax_timers, (due, next(loop._seq), timer))
                    return
                if not timer.cancelled:
                    if -0.001 < self._timer_due - due < 0.001:
                        return
                    timer.cancelled = True
            self._timer_due = due
            self._timer = self._loop.call_at(due, self._run, lax=True)
        except Exception as exc:
            self._fail(exc)

    def _schedule_at(self, due: float) -> None:
        """The member's next run at ``due`` (its timer armed again, or moved)."""
        timer = self._timer
        if timer is not None:
            if not timer.armed:
                self._timer_due = due
                self._loop.rearm(timer, due)
                return
            if not timer.cancelled:
                if -0.001 < self._timer_due - due < 0.001:
                    return
                timer.cancelled = True
        self._timer_due = due
        self._timer = self._loop.call_at(due, self._run, lax=True)

    def _publish(self) -> None:
        """Publish the snapshot, then hand the application what the driver has for it, if
        anything (`_run` and `_on_outcome` write this out inline)."""
        driver = self._driver
        self._snapshot = snap = driver.snapshot(self._taken, self._commits_taken, self._snapshot)
        if snap.state is not MemberState.STABLE or driver.outbox or self._core_events:
            self._hand_over(snap)

    def _hand_over(self, snap: MemberSnapshot) -> None:
        """After publishing ``snap``: what the driver and the core have for the application
        (called by `_publish` and its inline copies only when there is something: a state
        other than STABLE, the driver's outbox or the core's background events)."""
        driver = self._driver
        if snap.state is not MemberState.STABLE:
            self._gate._poll_note_due = 0.0  # every poll of a rebalance counts (see note_poll)
        notify = False
        if driver.outbox:
            notify = self._deliver(driver.outbox)
        events = driver.core.background_events
        if events:
            out = self._events
            while events:
                out.append(events.popleft())
            self._gate._poll_note_due = 0.0  # after the events: poll(0) looks at the queue again
            notify = True
        if notify:
            self.notify()

    def _deliver(self, outbox: list[Any]) -> bool:
        """Application-bound events of the driver; True if the application must wake."""
        items = outbox[:]
        outbox.clear()
        notify = False
        for item in items:
            if isinstance(item, CommitDone):
                waiter = self._commit_waiters.pop(item.result.commit_id, None)
                if waiter is not None:
                    waiter.complete(item.result)
                elif self._on_commit_done is not None:
                    self._on_commit_done(item.result, item.offsets)
                else:
                    with self._cond:
                        self._results.append(item.result)
                    notify = True
            elif isinstance(item, FetchDone):
                fetch = self._fetch_waiters.pop(item.fetch_id, None)
                if fetch is None:
                    continue
                if item.failure is not None:
                    fetch.fail(exception_of(item.failure))
                else:
                    assert item.response is not None
                    fetch.complete(item.response)
            elif isinstance(item, Fence):
                if self._on_fence is not None:
                    self._on_fence(set(item.partitions))
            elif isinstance(item, CoordinatorUnreachable) and self._on_group_error is not None:
                self._on_group_error(unreachable_error(item.code, item.message, item.transport))
        return notify

    def _on_outcome(self, request: Outbound, response: Any, error: KafkaException | None) -> None:
        """A request's response or failure (the transport's ``deliver``; loop thread)."""
        if check_threads and self._wrong_thread("_on_outcome"):
            return
        if self.failure is not None:
            return
        if self._logger is not None and not self._routing:
            self._routed(self._on_outcome, request, response, error)
            return
        try:
            started = time.monotonic()
            now = int(started * 1000)  # `_now_ms()`
            driver = self._driver
            snap: MemberSnapshot | None = None
            if error is None:
                wait_ms = driver.on_response(now, request, response, self._snapshot)
                snap = driver.lane_snapshot  # a quiet answer's: published at once
                if snap is not None:
                    driver.lane_snapshot = None
                    self._snapshot = snap
            else:
                wait_ms = driver.on_failure(now, request, failure_of(error))
            if self._stopped:
                self._publish()
                return
            timer = self._timer
            if (
                wait_ms > 0
                and not self._inbox
                and not self._wake_queued
                and timer is not None
                and not timer.cancelled
            ):
                # A quiet heartbeat answer (once per heartbeat): run again when the heartbeat
                # is next due, if that is earlier than the scheduled run. A full run would
                # send nothing now (``wait_ms > 0``) and would wait ``min(wait_ms, the other
                # managers' waits)``; those are deadlines the scheduled run already honours,
                # as it was computed from them, so keeping it when it is earlier never runs
                # later than a full run would. It is nearly always the heartbeat's own, set
                # when it was sent: kept unless over a millisecond late (the two differ by
                # the clock's ms rounding).
                due = started + wait_ms / 1000  # (not early: see `_run`)
                if due < self._timer_due - 0.001 or not timer.armed:
                    self._schedule_at(due)
                # `_publish()`, inline (once per heartbeat), unless published above (a quiet
                # answer's, with nothing to hand over: see `_run`)
                if snap is None:
                    self._snapshot = snap = driver.snapshot(
                        self._taken, self._commits_taken, self._snapshot
                    )
                    if snap.state is not MemberState.STABLE or driver.outbox or self._core_events:
                        self._hand_over(snap)
                return
        except Exception as exc:
            self._fail(exc)
            return
        self._run()
