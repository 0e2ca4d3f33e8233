"""``GroupMember``: the KIP-848 membership core run by a background thread.

Two threads, as in the Java AsyncKafkaConsumer. The background thread owns the network: it
runs the core's ``poll(now)``, sends the heartbeats it returns, discovers the coordinator,
refreshes metadata and runs auto and async commits. The application thread runs user
callbacks inside ``poll()`` / ``unsubscribe()`` / ``close()``. They exchange only the core's
event queues (application events in, background events out); a lock serializes the core.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Self

from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, Message, TopicPartition

from consumer_sdk.config import ConsumerConfig
from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.errors import (
    BrokerResponseError,
    KafkaTimeoutError,
    KafkaTransportError,
    ProtocolError,
    UnsupportedBrokerError,
)
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
    LeaveCompleted,
    MemberState,
    Poll,
    StateChanged,
    Subscribe,
    Unsubscribe,
)
from consumer_sdk.observability.log_routing import route_thread_logs, unroute_thread_logs
from consumer_sdk.protocol.client import ClusterClient
from consumer_sdk.protocol.connection import TlsHandshakeError
from consumer_sdk.protocol.sasl import SaslError
from consumer_sdk.runtime.offsets import (
    COMMIT_RETRIABLE,
    CommitFailedError,
    OffsetAndMetadata,
    OffsetManager,
)

__all__ = ["GroupMember", "RebalanceCallback"]

log = logging.getLogger("consumer_sdk.runtime")

Partition = tuple[str, int]
RebalanceCallback = Callable[[Any, list[TopicPartition]], None]

_IN_GROUP = frozenset({MemberState.STABLE, MemberState.RECONCILING, MemberState.ACKNOWLEDGING})
_LEAVING = frozenset({MemberState.PREPARE_LEAVING, MemberState.LEAVING})
_POLL_EVENT_INTERVAL_S = 0.05
_REBALANCE_POLL_GAP_S = 0.002
# close(timeout) still gives the pre-leave commit and the leave heartbeat one attempt each of
# up to this long once the timeout has passed (Java sends the leave at least once).
_CLOSE_ATTEMPT_FLOOR_S = 0.5

CommitCallback = Callable[[KafkaError | None, list[TopicPartition]], None]
ErrorCallback = Callable[[KafkaError], None]


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _tps(partitions: Iterable[Partition]) -> list[TopicPartition]:
    return [TopicPartition(t, p) for t, p in sorted(partitions)]


def _jittered(seconds: float) -> float:
    """A retry backoff with +-20% jitter, so that members do not retry in lockstep."""
    return seconds * random.uniform(0.8, 1.2)


def _wait_seconds(timeout: float | None) -> float:
    """confluent-kafka's timeout convention: None or negative waits forever."""
    return float("inf") if timeout is None or timeout < 0 else float(timeout)


def _as_kafka_exception(exc: BaseException, what: str = "callback") -> BaseException:
    """A user callback's exception as raised to the application: a ``KafkaException`` as is,
    any other ``Exception`` wrapped in one (``_APPLICATION``) with the original as
    ``__cause__``; others (such as ``KeyboardInterrupt``) unchanged."""
    if isinstance(exc, KafkaException) or not isinstance(exc, Exception):
        return exc
    wrapped = KafkaException(
        KafkaError(KafkaError._APPLICATION, f"{what} callback raised {type(exc).__name__}: {exc}")
    )
    wrapped.__cause__ = exc
    wrapped.__suppress_context__ = True
    return wrapped


class GroupMember:
    """A consumer group member without a data plane.

    It subscribes, runs rebalance callbacks inside `poll`, commits explicit offsets and
    reports its assignment, for hosts that read data themselves (such as the Spark driver).
    `Consumer` adds record fetching on top.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config = ConsumerConfig.from_mapping(config)
        c = self._config
        self._client = ClusterClient({**c.raw_connection, "bootstrap.servers": c.bootstrap_servers})
        self._core_lock = threading.RLock()
        self._state_since_ms = _now_ms()
        self._last_transition_reason = ""
        self._core = GroupMembership(
            c.membership_config(),
            on_state_change=self._on_state_change,
        )
        self._offsets = OffsetManager(
            self._client, c.group_id, c.group_instance_id, on_commit=self._record_commit
        )
        self._on_assign: RebalanceCallback | None = None
        self._on_revoke: RebalanceCallback | None = None
        self._on_lost: RebalanceCallback | None = None
        self._wakeup = threading.Condition()
        self._woken = False
        self._stop = threading.Event()
        self._closed = False
        self._fatal: KafkaException | None = None
        self._leave_done = threading.Event()
        self._close_deadline: float | None = None
        # Async commits with the member epoch at the time of the call: one made in on_revoke
        # while leaving goes out before the leave heartbeat, with the epoch it was made under.
        self._async_commits: deque[tuple[dict[Partition, OffsetAndMetadata], int]] = deque()
        self._async_in_flight = 0
        # Results for on_commit and errors for error_cb, queued by either thread and delivered
        # on the application thread inside poll()/consume()/close().
        self._app_callbacks: deque[tuple[str, Any]] = deque()
        self._on_commit: CommitCallback | None = c.callbacks.get("on_commit")
        self._error_cb: ErrorCallback | None = c.callbacks.get("error_cb")
        self._leave_sent_at: float | None = None
        self._callbacks_ended_at = 0.0
        self._connect_episode = False
        self._last_poll_event = 0.0
        # Poll events of a stable member only reset the poll timer; posting one this often
        # keeps the timer far from expiry (it is processed within one heartbeat interval).
        self._stable_poll_gap = min(1.0, c.max_poll_interval_ms / 4000)
        self._coordinator_retry_at = 0.0
        self._coordinator_failures = 0
        self._last_auto_commit = time.monotonic()
        self._revoking: dict[Partition, OffsetAndMetadata] = {}
        self._prefetch_topics: list[str] = []
        self._thread = threading.Thread(
            target=self._run, name=f"consumer-sdk-heartbeat[{c.group_id}]", daemon=True
        )
        if "logger" in c.callbacks:
            route_thread_logs(self._thread, c.callbacks["logger"])
        self._thread.start()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(group_id={self._config.group_id!r}, "
            f"member_id={self.member_id!r}, state={self.state.name})"
        )

    # -- views ------------------------------------------------------------------------------

    @property
    def member_id(self) -> str:
        return self._core.member_id

    @property
    def member_epoch(self) -> int:
        return self._core.member_epoch

    @property
    def state(self) -> MemberState:
        return self._core.state

    @property
    def group_id(self) -> str:
        return self._config.group_id

    def assignment(self) -> list[TopicPartition]:
        """Partitions this member owns (acknowledged or being reconciled)."""
        with self._core_lock:
            return _tps(self._core.assigned_partitions)

    def group_stats(self) -> dict[str, Any]:
        """The ``cgrp`` block of librdkafka's statistics JSON for this member."""
        now = _now_ms()
        with self._core_lock:
            m = self._core.metrics.snapshot(now)
            state = self._core.state
            assigned = len(self._core.assigned_partitions)
        since_state = now - self._state_since_ms
        last = m["last-rebalance-seconds-ago"]
        return {
            "state": "up" if self._core.coordinator_known else "wait-coord",
            "stateage": since_state,
            "join_state": state.name.lower(),
            "rebalance_age": int(last * 1000) if last >= 0 else 0,
            "rebalance_cnt": int(m["rebalance-total"]),
            "rebalance_reason": self._last_transition_reason,
            "assignment_size": assigned,
            "member_id": self.member_id,
            "member_epoch": self.member_epoch,
        }

    def _record_commit(self, latency_ms: int) -> None:
        with self._core_lock:
            self._core.metrics.record_commit(_now_ms(), latency_ms)

    def metrics(self) -> dict[str, float]:
        """The Java consumer's ``consumer-coordinator-metrics`` by name."""
        with self._core_lock:
            return self._core.metrics.snapshot(_now_ms())

    def set_sasl_credentials(self, username: str, password: str) -> None:
        """New SASL PLAIN/SCRAM credentials, used from the next authentication on (open
        connections stay as they are), as ``confluent_kafka.Consumer.set_sasl_credentials``."""
        self._ensure_usable()
        if not isinstance(username, str) or not isinstance(password, str):
            raise TypeError("set_sasl_credentials() takes a username and a password (str)")
        self._client.set_sasl_credentials(username, password)

    # -- subscription -----------------------------------------------------------------------

    def _on_state_change(self, event: StateChanged) -> None:
        """Called by the core (under the core lock) for every transition."""
        if event.old is not event.new:
            self._state_since_ms = _now_ms()
        self._last_transition_reason = event.reason
        if event.old is MemberState.LEAVING and event.new is MemberState.UNSUBSCRIBED:
            self._leave_sent_at = time.monotonic()
        elif event.new is MemberState.PREPARE_LEAVING and event.reason.startswith("poll timer"):
            ms = self._config.max_poll_interval_ms
            self._queue_error(KafkaError(
                KafkaError._MAX_POLL_EXCEEDED,
                f"Application maximum poll interval ({ms}ms) exceeded: leaving the group; "
                "the member rejoins on the next poll()",
            ))  # fmt: skip

    def subscribe(
        self,
        topics: Sequence[str] | str,
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """Subscribe to topic names, or to a regex given as a string starting with ``^``
        (or a one-element list holding one). The group is joined on the next ``poll()``.

        A regex goes to the broker as is (SubscribedTopicRegex) and is evaluated there with
        RE2J; a pattern the broker rejects surfaces from ``poll()`` as
        INVALID_REGULAR_EXPRESSION naming the pattern."""
        self._ensure_usable()
        names: tuple[str, ...]
        pattern: str | None = None
        if isinstance(topics, str):
            topics = [topics]
        if not isinstance(topics, Sequence) or not all(isinstance(t, str) for t in topics):
            raise TypeError("subscribe() takes a list of topic names or a regex string")
        if len(topics) == 1 and topics[0].startswith("^"):
            pattern = topics[0]
            if pattern == "^":
                raise ValueError("subscribe(): the regex '^' has no pattern after the anchor")
            names = ()
        else:
            if any(t.startswith("^") for t in topics):
                raise ValueError("subscribe to topic names or to one regex, not both")
            if not topics or any(not t for t in topics):
                raise ValueError("subscribe() needs at least one non-empty topic name")
            names = tuple(dict.fromkeys(topics))
        self._on_assign, self._on_revoke, self._on_lost = on_assign, on_revoke, on_lost
        # Learn the topic ids up front, so the first assignment resolves at once.
        self._prefetch_topics = list(names)
        self._core.submit(Subscribe(topics=names, pattern=pattern, has_listener=True))
        self._wake()

    def unsubscribe(self, timeout: float = 30.0) -> None:
        """Commit (auto-commit and pending async commits), release the assignment (revoke
        callback, or lost when fenced) and leave the group.

        The callback always runs and the leave heartbeat is sent even if it raises; then the
        first callback error is raised as ``KafkaException`` (its ``__cause__`` is the
        original exception). The network part waits at most ``timeout`` seconds.
        """
        self._ensure_usable()
        self._leave_done.clear()
        self._leave_sent_at = None
        self._core.submit(Unsubscribe())
        self._wake()
        first = self._drive_leave(time.monotonic() + max(timeout, 0.0))
        self._serve_app_callbacks()
        if first is not None:
            raise _as_kafka_exception(first)

    def _drive_leave(self, deadline: float) -> BaseException | None:
        """Run the leave's commit and release callback on this thread until the leave is over.

        Callbacks are never cut short. Once ``deadline`` has passed, the wait goes on only for
        a leave heartbeat not attempted yet (bounded by one request timeout past the last
        callback), and for one already sent up to ``_CLOSE_ATTEMPT_FLOOR_S``. Returns the first
        error raised by a callback (the leave goes on regardless).
        """
        first: BaseException | None = None
        while not self._leave_done.is_set():
            try:
                self._dispatch_background_events()
            except BaseException as exc:  # keep leaving; raised by the caller afterwards
                if first is None:
                    first = exc
                continue
            if self._leave_done.is_set() or not self._thread.is_alive():
                break
            now = time.monotonic()
            if now >= deadline:
                sent_at = self._leave_sent_at
                if sent_at is not None:
                    if now >= sent_at + _CLOSE_ATTEMPT_FLOOR_S:
                        break
                elif self._core.app_events or self._core.state in _LEAVING:
                    cap = max(deadline, self._callbacks_ended_at) + 2 * self._request_timeout()
                    if now >= cap:
                        log.info("group %s: leave heartbeat not sent within the close "
                                 "timeout", self.group_id)  # fmt: skip
                        break
                else:
                    break
            self._await_background(_POLL_EVENT_INTERVAL_S)
        return first

    # -- poll -------------------------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> Message | None:
        """Run pending callbacks (rebalance, ``on_commit``, ``error_cb``) within ``timeout``
        seconds; ``None`` or a negative timeout blocks until a callback has run.

        Raises the errors the membership reports (fatal ones end the member) and exceptions
        raised by callbacks. A ``GroupMember`` has no data plane and always returns None.
        """
        self._ensure_usable()
        self._post_poll()
        self._run_until(lambda: False, _wait_seconds(timeout), stop_after_callback=True)
        return None

    def _post_poll(self) -> None:
        """Tell the core the application is polling (resets the poll timer, lets revocations
        run). A stable member only needs the poll timer reset, so it posts rarely and does not
        wake the background thread; during a rebalance every poll counts."""
        now = time.monotonic()
        gap = now - self._last_poll_event
        if gap < _REBALANCE_POLL_GAP_S:
            return
        if self._core.state is MemberState.STABLE:
            if gap < self._stable_poll_gap:
                return
            self._last_poll_event = now
            self._core.submit(Poll(_now_ms()))
            return
        self._last_poll_event = now
        self._core.submit(Poll(_now_ms()))
        self._wake()

    def _await_background(self, timeout: float) -> None:
        with self._wakeup:
            if not self._core.background_events:
                self._wakeup.wait(timeout)

    def _run_until(
        self, done: Callable[[], bool], timeout: float, stop_after_callback: bool = False
    ) -> bool:
        deadline = time.monotonic() + timeout
        while not done():
            if self._dispatch_background_events() and stop_after_callback:
                return True
            if done():
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._post_poll()
            self._await_background(min(remaining, _POLL_EVENT_INTERVAL_S))
        return True

    # -- background events (application thread) -------------------------------------------

    def _dispatch_background_events(self) -> bool:
        """Handle the core's events and run queued user callbacks on this thread; True if
        user code ran (a rebalance callback, ``on_commit`` or ``error_cb``)."""
        raised: BaseException | None = None
        ran = False
        for event in self._core.drain_background_events():
            try:
                ran = self._dispatch(event) or ran
            except BaseException as exc:  # finish the batch, then raise the first error
                ran = True
                if raised is None:
                    raised = exc
        try:
            ran = self._serve_app_callbacks() or ran
        except BaseException as exc:
            if raised is None:
                raised = exc
        if raised is not None:
            raise raised
        return ran

    def _serve_app_callbacks(self) -> bool:
        """Run queued ``on_commit`` / ``error_cb`` calls; True if any ran. An exception of one
        is raised after the others have run."""
        ran = False
        raised: BaseException | None = None
        while True:
            try:
                kind, payload = self._app_callbacks.popleft()
            except IndexError:
                break
            try:
                if kind == "commit" and self._on_commit is not None:
                    ran = True
                    self._on_commit(*payload)
                elif kind == "error" and self._error_cb is not None:
                    ran = True
                    self._error_cb(payload)
            except BaseException as exc:
                if raised is None:
                    raised = exc
        if raised is not None:
            raise _as_kafka_exception(raised, "on_commit" if kind == "commit" else "error_cb")
        return ran

    def _queue_error(self, error: KafkaError) -> None:
        """Report a group-level error to ``error_cb`` (on the application thread)."""
        if self._error_cb is not None:
            self._app_callbacks.append(("error", error))
            self._wake_app()

    def _dispatch(self, event: BackgroundEvent) -> bool:
        if isinstance(event, CallbacksNeeded):
            return self._run_callback(event)
        if isinstance(event, CommitNeeded):
            self._commit_needed(event)
        elif isinstance(event, ErrorEvent):
            error = KafkaError(
                event.code, event.message, fatal=event.fatal, retriable=not event.fatal
            )
            if event.fatal:
                self._fatal = KafkaException(error)
                if self._error_cb is not None:
                    self._error_cb(error)
                raise self._fatal
            if self._error_cb is not None:
                # Non-fatal group errors go to error_cb, as in confluent-kafka.
                self._error_cb(error)
                return True
            raise KafkaException(error)
        elif isinstance(event, LeaveCompleted):
            self._leave_done.set()
        elif isinstance(event, StateChanged):
            log.debug("group %s: %s -> %s (%s)", self.group_id, event.old.name,
                      event.new.name, event.reason)  # fmt: skip
        return False

    def _run_callback(self, event: CallbacksNeeded) -> bool:
        parts = list(event.partitions)
        error: str | None = None
        user_exc: BaseException | None = None
        called = False
        try:
            if event.kind is CallbackKind.REVOKED:
                self._before_revoke(parts)
                called = self._call(self._on_revoke, parts)
            elif event.kind is CallbackKind.LOST:
                self._before_revoke(parts, lost=True)
                called = self._call(self._on_lost or self._on_revoke, parts)
            else:
                starts = self._before_assign(parts)
                called = self._call(self._on_assign, parts)
                self._after_assign(starts)
        except BaseException as exc:
            user_exc = exc
            error = f"{type(exc).__name__}: {exc}"
        finally:
            if event.kind is not CallbackKind.ASSIGNED:
                self._after_revoke(parts)
            self._callbacks_ended_at = time.monotonic()
            self._core.submit(CallbackCompleted(event.callback_id, error))
            self._wake()
        if user_exc is not None:
            raise _as_kafka_exception(user_exc, f"on_{event.kind.name.lower()}")
        return called

    def _call(self, callback: RebalanceCallback | None, parts: list[Partition]) -> bool:
        if callback is None:
            return False
        callback(self, _tps(parts))
        return True

    # Hooks for the data plane (Consumer overrides them).
    def _fence(self, parts: set[Partition]) -> None:
        return None

    def _before_revoke(self, parts: list[Partition], lost: bool = False) -> None:
        return None

    def _after_revoke(self, parts: list[Partition]) -> None:
        self._revoking.clear()
        if parts:
            self._offsets.forget(set(parts))

    def _before_assign(self, parts: list[Partition]) -> dict[Partition, int | None]:
        return {}

    def _after_assign(self, starts: dict[Partition, int | None]) -> None:
        return None

    # -- commits ----------------------------------------------------------------------------

    def _consumed_offsets(self) -> dict[Partition, OffsetAndMetadata]:
        """Offsets to commit when none are given (the data plane's positions)."""
        return dict(self._revoking)

    def _commit_needed(self, event: CommitNeeded) -> None:
        error: str | None = None
        # Reference step order: fence partitions pending revocation, then commit, so no record
        # of them is handed out after the offsets that the next owner starts from.
        with self._core_lock:
            pending = set(self._core.pending_revocation)
        self._fence(pending)
        offsets = self._consumed_offsets()
        deadline = time.monotonic() + max(event.deadline_ms - _now_ms(), 0) / 1000
        if self._close_deadline is not None:
            # close()/unsubscribe() keep their own timeout (one attempt at least).
            deadline = min(deadline, max(self._close_deadline,
                                         time.monotonic() + _CLOSE_ATTEMPT_FLOOR_S))  # fmt: skip
        try:
            self._commit_with_retries(offsets, deadline, retry_stale=True, what=event.reason)
        except KafkaException as exc:
            error = exc.args[0].str()
            log.warning("group %s: commit before %s failed (%s); continuing",
                        self.group_id, event.reason, error)  # fmt: skip
        finally:
            self._core.submit(CommitCompleted(event.commit_id, error))
            self._wake()

    def _send_commit(
        self,
        offsets: Mapping[Partition, OffsetAndMetadata],
        epoch: int,
        timeout: float,
        report: bool = True,
    ) -> dict[Partition, int]:
        """One OffsetCommit; queues the ``on_commit`` call (``report=False``: the caller
        reports a failure, after its retries)."""
        try:
            committed = self._offsets.commit(offsets, self.member_id, epoch, timeout)
        except KafkaException as exc:
            if report:
                self._report_commit(exc.args[0], offsets)
            raise
        if committed:
            self._report_commit(None, {p: offsets[p] for p in committed})
        return committed

    def _report_commit(
        self, error: KafkaError | None, offsets: Mapping[Partition, OffsetAndMetadata]
    ) -> None:
        """Queue the ``on_commit`` call of one commit (the OffsetManager records the commit
        metrics of every OffsetCommit request)."""
        if self._on_commit is not None:
            parts = []
            for (t, p), o in sorted(offsets.items()):
                extra: dict[str, Any] = {}
                if o.metadata is not None:
                    extra["metadata"] = o.metadata
                if o.leader_epoch >= 0:
                    extra["leader_epoch"] = o.leader_epoch
                parts.append(TopicPartition(t, p, o.offset, **extra))
            self._app_callbacks.append(("commit", (error, parts)))
            self._wake_app()

    def _commit_with_retries(
        self,
        offsets: Mapping[Partition, OffsetAndMetadata],
        deadline: float,
        retry_stale: bool,
        what: str = "commit",
    ) -> dict[Partition, int]:
        backoff = self._config.retry_backoff_ms / 1000
        logged = False
        while True:
            try:
                return self._send_commit(
                    offsets, self._commit_epoch(), max(deadline - time.monotonic(), 0.05),
                    report=False,
                )  # fmt: skip
            except (
                CommitFailedError,
                KafkaTransportError,
                KafkaTimeoutError,
                ProtocolError,
            ) as exc:
                code = exc.args[0].code()
                retriable = exc.args[0].retriable() or (
                    retry_stale and code == ErrorCode.STALE_MEMBER_EPOCH
                )
                if not retriable or time.monotonic() + backoff >= deadline:
                    self._report_commit(exc.args[0], offsets)
                    raise
                if not logged:  # once per call, not per attempt
                    logged = True
                    log.info("group %s: %s failed (%s); retrying with backoff",
                             self.group_id, what, exc.args[0].str())  # fmt: skip
                time.sleep(_jittered(backoff))
                backoff = min(backoff * 2, self._config.retry_backoff_max_ms / 1000)

    def commit(
        self,
        message: Message | None = None,
        offsets: Sequence[TopicPartition] | None = None,
        asynchronous: bool = True,
        timeout: float | None = None,
    ) -> list[TopicPartition] | None:
        """Commit ``message`` (its offset + 1), explicit ``offsets``, or everything consumed
        (with ``enable.auto.offset.store=false``: everything stored with ``store_offsets``).

        Offsets carry this member's id and epoch (OffsetCommit v9). A synchronous commit
        raises ``KafkaException`` on failure (e.g. STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID) and
        retries retriable errors for up to ``timeout`` seconds (default ``socket.timeout.ms``).
        Every commit's outcome goes to the ``on_commit`` callback, if configured, inside the
        next ``poll()``/``consume()``/``close()``; an asynchronous one is sent by the
        background thread (before any later leave heartbeat) and never retried.
        """
        self._ensure_usable()
        if message is not None and offsets is not None:
            raise ValueError("commit() takes message or offsets, not both")
        if message is not None:
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            if message.error() is not None or topic is None or partition is None or offset is None:
                raise ValueError("cannot commit a message that carries an error")
            epoch = message.leader_epoch()
            todo: dict[Partition, OffsetAndMetadata] = {
                (topic, partition): OffsetAndMetadata(offset + 1, -1 if epoch is None else epoch)
            }
        elif offsets is not None:
            todo = {}
            for tp in offsets:
                if tp.offset < 0:
                    raise ValueError(f"cannot commit {tp.topic}[{tp.partition}] at {tp.offset}")
                todo[(tp.topic, tp.partition)] = OffsetAndMetadata(
                    tp.offset, tp.leader_epoch if tp.leader_epoch is not None else -1,
                    tp.metadata,
                )  # fmt: skip
        else:
            todo = self._consumed_offsets()
        if asynchronous:
            if not todo:
                self._report_no_offset()
                return None
            self._async_commits.append((todo, self.member_epoch))
            self._wake()
            return None
        if not todo and message is None and offsets is None:
            # Nothing consumed (or stored) to commit: confluent-kafka raises too.
            raise KafkaException(
                KafkaError(KafkaError._NO_OFFSET, "Commit failed: Local: No offset stored")
            )
        if timeout is None:
            timeout = self._config.connection.socket_timeout_ms / 1000
        committed = self._commit_with_retries(
            todo, time.monotonic() + max(timeout, 0.0), retry_stale=False
        )  # fmt: skip
        return [TopicPartition(t, p, o) for (t, p), o in sorted(committed.items())]

    def committed(
        self, partitions: Sequence[TopicPartition], timeout: float = 10.0
    ) -> list[TopicPartition]:
        """The group's committed offsets (OFFSET_INVALID where there is none)."""
        self._ensure_usable()
        keys = [(tp.topic, tp.partition) for tp in partitions]
        found = self._fetch_committed(keys, timeout)
        out = []
        for t, p in keys:
            o = found.get((t, p))
            out.append(TopicPartition(t, p, o.offset if o else OFFSET_INVALID))
        return out

    def _fetch_committed(
        self, partitions: list[Partition], timeout: float
    ) -> dict[Partition, OffsetAndMetadata | None]:
        """OffsetFetch with the reference policy (§8): coordinator and other retriable errors,
        and STALE_MEMBER_EPOCH (the next attempt carries the epoch of the next heartbeat), are
        retried with backoff until ``timeout``; other errors are raised."""
        deadline = time.monotonic() + timeout
        backoff = self._config.retry_backoff_ms / 1000
        while True:
            epoch = self.member_epoch
            try:
                return self._offsets.fetch(
                    partitions, self.member_id if epoch > 0 else None, epoch if epoch > 0 else -1,
                    max(deadline - time.monotonic(), 0.05),
                )  # fmt: skip
            except (
                BrokerResponseError, KafkaTransportError, KafkaTimeoutError, ProtocolError,
            ) as exc:  # fmt: skip
                code = exc.args[0].code()
                retriable = not isinstance(exc, BrokerResponseError) or code in COMMIT_RETRIABLE
                if code == ErrorCode.STALE_MEMBER_EPOCH and epoch > 0:
                    retriable = True
                if not retriable or time.monotonic() + backoff >= deadline:
                    raise
                log.info("group %s: OffsetFetch failed (%s); retrying in %.0f ms",
                         self.group_id, exc.args[0].str(), backoff * 1000)  # fmt: skip
                time.sleep(backoff)
                backoff = min(backoff * 2, self._config.retry_backoff_max_ms / 1000)

    # -- close ------------------------------------------------------------------------------

    def close(self, timeout: float = 10.0, option: CloseOption = CloseOption.DEFAULT) -> None:
        """Commit, release the assignment, leave the group and stop.

        In order: pending asynchronous commits and the auto-commit (with
        ``enable.auto.commit``) go out with the member's epoch; ``on_revoke`` runs (``on_lost``
        if the member was fenced); the leave heartbeat is sent (per ``option``, KIP-1092) even
        if a callback raised; the background thread stops. Callbacks are not cut short; the
        network part waits at most ``timeout`` seconds, except that the commit and the leave
        heartbeat each get one attempt (up to 0.5 s) even with ``timeout=0``. ``on_commit``
        runs for the close commits. Then the first callback error is raised as
        ``KafkaException`` (the original exception is its ``__cause__``). No thread is left
        behind; closing twice is a no-op.
        """
        if self._closed:
            return
        deadline = time.monotonic() + max(timeout, 0.0)
        self._close_deadline = deadline
        first: BaseException | None = None
        if self._fatal is None and self._thread.is_alive():
            self._leave_done.clear()
            self._leave_sent_at = None
            self._core.submit(Close(option))
            self._wake()
            first = self._drive_leave(deadline)
            # Async commits made by callbacks after the leave (or with no leave to send).
            self._flush_async_commits(max(deadline, time.monotonic() + _CLOSE_ATTEMPT_FLOOR_S))
        self._closed = True
        self._stop.set()
        self._wake()
        self._thread.join(max(deadline - time.monotonic(), 0.05))
        if self._thread.is_alive():
            self._client.close()  # unblocks a socket wait so the thread exits
            self._thread.join(max(deadline - time.monotonic(), 0.5))
        self._client.close()
        self._close_data_plane(max(deadline - time.monotonic(), 0.05))
        unroute_thread_logs(self._thread)
        try:
            self._serve_app_callbacks()  # on_commit of the close commits
        except BaseException as exc:
            if first is None:
                first = exc
        if first is not None:
            raise _as_kafka_exception(first)

    def _flush_async_commits(self, deadline: float) -> None:
        """Wait (until ``deadline``) for queued asynchronous commits to be sent."""
        while (self._async_commits or self._async_in_flight) and self._thread.is_alive():
            if time.monotonic() >= deadline:
                log.info("group %s: %d asynchronous commit(s) not sent before close",
                         self.group_id, len(self._async_commits))  # fmt: skip
                return
            self._wake()
            with self._wakeup:
                self._wakeup.wait(0.01)

    def _close_data_plane(self, timeout: float) -> None:
        return None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ensure_usable(self) -> None:
        if self._closed:
            raise KafkaException(KafkaError(KafkaError._STATE, "the consumer is closed"))
        if self._fatal is not None:
            raise self._fatal

    def _wake(self) -> None:
        with self._wakeup:
            self._woken = True
            self._wakeup.notify_all()

    # -- background thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                wait_s = self._loop_once()
                with self._wakeup:
                    if not self._woken and not self._stop.is_set():
                        self._wakeup.wait(wait_s)
                    self._woken = False
        except Exception:
            log.exception("group %s: background thread failed", self.group_id)
            self._fatal = KafkaException(
                KafkaError(KafkaError._FATAL, "the background thread failed", fatal=True)
            )
        finally:
            self._wake()

    def _loop_once(self) -> float:
        if self._prefetch_topics:
            topics, self._prefetch_topics = self._prefetch_topics, []
            with contextlib.suppress(Exception):
                self._client.metadata(topics, self._request_timeout())
                with self._core_lock:
                    self._core.on_metadata(_now_ms(), self._client.topic_names())
        now = _now_ms()
        with self._core_lock:
            if self._core.coordinator_needed and time.monotonic() >= self._coordinator_retry_at:
                self._discover_coordinator(now)
            if self._core.metadata_needed:
                self._refresh_metadata(now)
            result = self._core.poll(now)
        # Async commits queued before the event that made this heartbeat (say, a commit made
        # in on_revoke before the leave) go out first.
        self._run_async_commits()
        if result.request is not None:
            self._send_heartbeat(result.request)
        self._maybe_auto_commit()
        with self._core_lock:
            wait_ms = self._core.time_until_next_poll(_now_ms())
            if self._core.coordinator_needed:
                # The core idles while the coordinator is unknown; finding it is the host's
                # job, due now or when the FindCoordinator backoff ends (reference §4, §8).
                due_ms = (self._coordinator_retry_at - time.monotonic()) * 1000
                wait_ms = min(wait_ms, max(int(due_ms), 0))
        if self._core.background_events:
            self._wake_app()
        return max(min(wait_ms / 1000, self._auto_commit_wait()), 0.0)

    def _wake_app(self) -> None:
        with self._wakeup:
            self._wakeup.notify_all()

    def _discover_coordinator(self, now: int) -> None:
        try:
            self._client.find_coordinator(self.group_id, self._request_timeout())
        except Exception as exc:
            self._coordinator_failures += 1
            delay = _jittered(min(
                self._config.retry_backoff_ms * 2 ** (self._coordinator_failures - 1),
                self._config.retry_backoff_max_ms,
            ))  # fmt: skip
            self._coordinator_retry_at = time.monotonic() + delay / 1000
            # Once per episode (until the coordinator is found), not once per attempt.
            level = logging.INFO if self._coordinator_failures == 1 else logging.DEBUG
            log.log(level, "group %s: FindCoordinator failed (%s); retrying with backoff "
                    "(next in %d ms)", self.group_id, exc, delay)  # fmt: skip
            if isinstance(exc, SaslError | TlsHandshakeError):
                self._report_connect_error(exc)
            elif self._coordinator_failures == 3 and isinstance(exc, KafkaException):
                error = exc.args[0]
                self._queue_error(KafkaError(
                    KafkaError._TRANSPORT if error.code() in (KafkaError._TRANSPORT,
                                                              KafkaError._TIMED_OUT)
                    else error.code(),
                    f"group coordinator unreachable: {error.str()}", retriable=True,
                ))  # fmt: skip
            return
        if self._coordinator_failures >= 3:
            log.info("group %s: coordinator found after %d failed attempts", self.group_id,
                     self._coordinator_failures)  # fmt: skip
        self._coordinator_failures = 0
        self._core.on_coordinator_known(now)

    def _report_connect_error(self, exc: KafkaException) -> None:
        """Authentication and TLS failures are configuration errors: besides the log, they go
        to ``error_cb`` (``_AUTHENTICATION`` / ``_SSL``), or without one the next ``poll()``
        raises them (once per failed attempt; the lookup goes on retrying)."""
        error = exc.args[0]
        code = error.code() if isinstance(exc, SaslError) else KafkaError._SSL
        message = f"cannot connect to the cluster: {error.str()}"
        queued = list(self._core.background_events)
        if not any(isinstance(e, ErrorEvent) and e.message == message for e in queued):
            self._core.background_events.append(ErrorEvent(code, message, fatal=False))
            self._wake_app()

    def _refresh_metadata(self, now: int) -> None:
        try:
            self._client.metadata(None, self._request_timeout())
        except Exception as exc:
            log.warning("group %s: metadata refresh failed: %s", self.group_id, exc)
            return
        self._core.on_metadata(now, self._client.topic_names())

    def _request_timeout(self) -> float:
        interval = self._core.heartbeat_interval_ms or 3000
        return min(max(interval / 1000, 1.0), self._config.connection.socket_timeout_ms / 1000)

    def _send_heartbeat(self, request: Any) -> None:
        failure: Failure | None = None
        response = None
        try:
            response = self._client.heartbeat(request, self._request_timeout())
        except UnsupportedBrokerError as exc:
            failure = Failure(FailureKind.UNSUPPORTED_VERSION_CLIENT, exc.args[0].str())
        except KafkaTimeoutError as exc:
            failure = Failure(FailureKind.TIMEOUT, exc.args[0].str())
        except (KafkaTransportError, ProtocolError) as exc:
            failure = Failure(FailureKind.DISCONNECTED, exc.args[0].str())
        except SaslError as exc:
            failure = Failure(FailureKind.AUTHENTICATION, exc.args[0].str())
        except KafkaException as exc:
            kind = FailureKind.RETRIABLE if exc.args[0].retriable() else FailureKind.FATAL
            failure = Failure(kind, exc.args[0].str())
        except ValueError as exc:
            failure = Failure(FailureKind.FATAL, str(exc))
        now = _now_ms()
        with self._core_lock:
            if response is not None:
                self._core.on_heartbeat_response(now, response, request)
            else:
                assert failure is not None
                self._core.on_heartbeat_failure(now, failure, request)
            if self._client.coordinator(self.group_id) is None and self._core.coordinator_known:
                self._core.on_coordinator_unknown(now)
            pending = set(self._core.pending_revocation)
        # Fenced, fatal or stale: the partitions are lost now, not when on_lost runs in the
        # next poll(); records of theirs still buffered must not reach the application.
        self._fence(pending)
        self._wake_app()

    def _commit_epoch(self) -> int:
        """OffsetCommit's GenerationIdOrMemberEpoch: the member epoch while in the group, else
        -1 (reference §8). A fenced or rejoining member is at epoch 0; committing with 0 would
        present its old partitions' offsets as a member's (a broker may accept it), while -1
        is accepted only for an empty group."""
        epoch = self.member_epoch
        return epoch if epoch > 0 else -1

    def _commit_logging_failures(
        self, offsets: dict[Partition, OffsetAndMetadata], what: str, epoch: int | None = None
    ) -> bool:
        """Background-thread commit (async or auto), never retried: failures go to
        ``on_commit`` if configured (else they are logged), never raised. False if there was
        nothing new to commit."""
        current = self._commit_epoch()
        if epoch is None or current > 0 or epoch <= 0:
            epoch = current
        try:
            return bool(self._send_commit(offsets, epoch, self._request_timeout()))
        except Exception as exc:
            level = logging.DEBUG if self._on_commit is not None else logging.WARNING
            log.log(level, "group %s: %s failed: %s", self.group_id, what, exc)
            return True

    def _report_no_offset(self) -> None:
        if self._on_commit is not None:
            self._app_callbacks.append(
                ("commit", (KafkaError(KafkaError._NO_OFFSET, "Local: No offset stored"), []))
            )
            self._wake_app()

    def _run_async_commits(self) -> None:
        while self._async_commits:
            self._async_in_flight += 1
            try:
                offsets, epoch = self._async_commits.popleft()
                if not self._commit_logging_failures(offsets, "async commit", epoch):
                    self._report_no_offset()
            finally:
                self._async_in_flight -= 1

    def _auto_commit_wait(self) -> float:
        if not self._config.enable_auto_commit or self._config.auto_commit_interval_ms <= 0:
            return 5.0
        interval = self._config.auto_commit_interval_ms / 1000
        return max(self._last_auto_commit + interval - time.monotonic(), 0.01)

    def _maybe_auto_commit(self) -> None:
        c = self._config
        if not c.enable_auto_commit or c.auto_commit_interval_ms <= 0:
            return
        if time.monotonic() - self._last_auto_commit < c.auto_commit_interval_ms / 1000:
            return
        self._last_auto_commit = time.monotonic()
        if self.state not in _IN_GROUP or self.member_epoch <= 0:
            return
        assigned = self._core.assigned_partitions
        offsets = {p: o for p, o in self._consumed_offsets().items() if p in assigned}
        if offsets:
            self._commit_logging_failures(offsets, "auto-commit")
