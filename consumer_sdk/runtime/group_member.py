"""``GroupMember``: the application-side facade of a KIP-848 group member.

The split of the Java AsyncKafkaConsumer. This class is the application side: its API
(subscribe, poll, commit, committed, close, ...), the user callbacks (rebalance, ``on_commit``,
``error_cb``), all run on the application thread inside ``poll()`` / ``unsubscribe()`` /
``close()``. The network side is a `MemberNetwork` on the process-wide `NetworkLoop` (one
thread for every member of the process): the member's driver (membership core, heartbeat,
coordinator, metadata and commit request managers), touched by that loop only. This side
sends it events and requests, waits on completions with deadlines for blocking calls, drains
the events it produces, and reads its published `MemberSnapshot`; it never reads or locks
the core. The few methods here that the loop thread calls are named ``_on_loop_*`` or say
so in their docstring (they never block); everything else runs on the application thread.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Self

from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, Message, TopicPartition

from consumer_sdk.backoff import Backoff
from consumer_sdk.config import ConsumerConfig
from consumer_sdk.domain import OffsetFetchRequest
from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.errors import (
    BrokerResponseError,
    KafkaTimeoutError,
    KafkaTransportError,
    ProtocolError,
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
    LeaveCompleted,
    MemberState,
    StateChanged,
    Subscribe,
    Unsubscribe,
)
from consumer_sdk.membership.requests import (
    COMMIT_RETRIABLE,
    CommitKind,
    CommitResult,
    OffsetLike,
)
from consumer_sdk.observability.client_metrics import ClientMetrics
from consumer_sdk.observability.health import IN_GROUP_STATES, Health
from consumer_sdk.observability.health import evaluate as evaluate_health
from consumer_sdk.runtime.boundary import commit_error, commit_failed
from consumer_sdk.runtime.error_channel import (
    client_error,
    error_event,
    fatal_event,
    for_error_cb,
)
from consumer_sdk.runtime.member_network import MemberNetwork
from consumer_sdk.runtime.offsets import OffsetAndMetadata, committed_offsets

__all__ = ["GroupMember", "RebalanceCallback"]

log = logging.getLogger("consumer_sdk.runtime")

Partition = tuple[str, int]
RebalanceCallback = Callable[[Any, list[TopicPartition]], None]

_IN_GROUP = frozenset({MemberState.STABLE, MemberState.RECONCILING, MemberState.ACKNOWLEDGING})
_LEAVING = frozenset({MemberState.PREPARE_LEAVING, MemberState.LEAVING})
_POLL_EVENT_INTERVAL_S = 0.05
# close(timeout) still gives the pre-leave commit and the leave heartbeat one attempt each of
# up to this long once the timeout has passed (Java sends the leave at least once).
_CLOSE_ATTEMPT_FLOOR_S = 0.5

CommitCallback = Callable[[KafkaError | None, list[TopicPartition]], None]
ErrorCallback = Callable[[KafkaError], None]


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _tps(partitions: Iterable[Partition]) -> list[TopicPartition]:
    return [TopicPartition(t, p) for t, p in sorted(partitions)]


def _wait_seconds(timeout: float | None) -> float:
    """confluent-kafka's timeout convention: None or negative waits forever."""
    return float("inf") if timeout is None or timeout < 0 else float(timeout)


def _never() -> bool:
    return False


def _committed_tps(committed: Mapping[Partition, int]) -> list[TopicPartition]:
    return [TopicPartition(t, p, o) for (t, p), o in sorted(committed.items())]


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

    # Consumer returns consumer errors from poll() as error events; a GroupMember, which
    # returns no messages, raises them (or gives them to error_cb).
    _ERRORS_AS_EVENTS = False

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._config = ConsumerConfig.from_mapping(config)
        c = self._config
        self._state_since_ms = _now_ms()
        self._last_transition_reason = ""
        # For health(): whether the member is in the group, and since when (wall clock).
        self._in_group = False
        self._in_group_since = time.time()
        self._on_assign: RebalanceCallback | None = None
        self._on_revoke: RebalanceCallback | None = None
        self._on_lost: RebalanceCallback | None = None
        self._closed = False
        self._fatal: KafkaException | None = None
        self._leave_done = threading.Event()
        self._close_deadline: float | None = None
        # Results for on_commit and errors for error_cb, queued by either thread and delivered
        # on the application thread inside poll()/consume()/close().
        self._app_callbacks: deque[tuple[str, Any]] = deque()
        # Consumer errors for poll()/consume() to return as error events (Consumer only).
        self._error_events: deque[Message] = deque()
        self._on_commit: CommitCallback | None = c.callbacks.get("on_commit")
        self._error_cb: ErrorCallback | None = c.callbacks.get("error_cb")
        self._leave_sent_at: float | None = None
        self._callbacks_ended_at = 0.0
        # Offsets of the partitions being revoked, committable from inside on_revoke. Replaced
        # whole, never changed in place: the loop thread reads it.
        self._revoking: Mapping[Partition, OffsetAndMetadata] = {}
        # Commit failures, partitions moved, fetch counters, the last error (any thread).
        self._client_metrics = ClientMetrics()
        # The poll gate (`PollGate`): until when a stable member's poll(0) has nothing to
        # do. The loop clears it when it queues an event or fails the member; this side
        # whenever it queues a callback, closes or gets a fatal error (`_poll_busy`).
        self._poll_note_due = 0.0
        # The network side, on the process-wide loop (started by the first member).
        self._net = MemberNetwork(
            c,
            on_state_change=self._on_loop_state_change,
            committable=self._on_loop_committable,
            on_fence=self._fence,
            on_commit_done=self._on_loop_commit_done,
            on_group_error=self._queue_error,
            logger=c.callbacks.get("logger"),
            poll_gate=self,
        )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(group_id={self._config.group_id!r}, "
            f"member_id={self.member_id!r}, state={self.state.name})"
        )

    # -- views ------------------------------------------------------------------------------

    @property
    def member_id(self) -> str:
        return self._net.snapshot.member_id

    @property
    def member_epoch(self) -> int:
        return self._net.snapshot.member_epoch

    @property
    def state(self) -> MemberState:
        return self._net.snapshot.state

    @property
    def group_id(self) -> str:
        return self._config.group_id

    @property
    def client_id(self) -> str:
        """The ``client.id`` setting (default ``consumer-sdk``)."""
        return self._config.connection.client_id

    def assignment(self) -> list[TopicPartition]:
        """Partitions this member owns (acknowledged or being reconciled)."""
        return _tps(self._net.snapshot.assigned)

    def group_stats(self) -> dict[str, Any]:
        """The ``cgrp`` block of librdkafka's statistics JSON for this member."""
        now = _now_ms()
        m = self.metrics()
        snap = self._net.snapshot
        state, assigned = snap.state, len(snap.assigned)
        since_state = now - self._state_since_ms
        last = m["last-rebalance-seconds-ago"]
        return {
            "state": "up" if snap.coordinator_known else "wait-coord",
            "stateage": since_state,
            "join_state": state.name.lower(),
            "rebalance_age": int(last * 1000) if last >= 0 else 0,
            "rebalance_cnt": int(m["rebalance-total"]),
            "rebalance_reason": self._last_transition_reason,
            "assignment_size": assigned,
            "member_id": snap.member_id,
            "member_epoch": snap.member_epoch,
        }

    def health(self) -> Health:
        """This consumer's health: in the group or not and since when, coordinator, last
        heartbeat answer, assignment, total lag, last error, and the ``live`` / ``ready``
        verdicts (rules in `consumer_sdk.observability.health`). Any thread; sends nothing."""
        c = self._config
        snap = self._net.snapshot
        state, epoch = snap.state, snap.member_epoch
        known = snap.coordinator_known
        assigned = tuple(sorted(snap.assigned))
        answered = snap.last_heartbeat_response_ms
        interval = snap.heartbeat_interval_ms
        now_ms = _now_ms()
        manual: Mapping[Partition, int] = getattr(self, "_manual", {})
        if manual:
            assigned = tuple(sorted(manual))
        last_poll = self._net.last_poll
        poll_age = time.monotonic() - last_poll if last_poll > 0 else None
        heartbeat_age = None if answered is None else (now_ms - answered) / 1000
        lag_of: Callable[[], dict[Partition, int]] | None = getattr(self, "lag", None)
        lags = lag_of() if lag_of is not None else {}
        fatal = self._fatal.args[0].str() if self._fatal is not None else None
        failure = self._net.failure.args[0].str() if self._net.failure is not None else None
        live, ready, reasons = evaluate_health(
            closed=self._closed,
            fatal=fatal,
            network_failure=failure,
            state=state,
            member_epoch=epoch,
            coordinator_known=known,
            subscribed=state is not MemberState.UNSUBSCRIBED,
            manual=bool(manual),
            heartbeat_age_s=heartbeat_age,
            heartbeat_interval_ms=interval,
            request_timeout_ms=int(self._request_timeout() * 1000),
            poll_age_s=poll_age,
            max_poll_interval_ms=c.max_poll_interval_ms,
        )
        return Health(
            live=live,
            ready=ready,
            reasons=reasons,
            state=state.name,
            in_group=self._in_group,
            since=self._in_group_since,
            member_id=self.member_id,
            member_epoch=epoch,
            coordinator_known=known,
            last_heartbeat_age_s=heartbeat_age,
            last_poll_age_s=poll_age,
            assignment=assigned,
            lag_total=sum(lags.values()) if lags else None,
            lag_unknown=(None if lag_of is None else sum(1 for p in assigned if p not in lags)),
            last_error=self._client_metrics.last_error,
        )

    def metrics(self) -> dict[str, float]:
        """The Java consumer's ``consumer-coordinator-metrics`` by name."""
        now = _now_ms()
        return self._net.call(lambda d: d.core.metrics.snapshot(now))

    def set_sasl_credentials(self, username: str, password: str) -> None:
        """New SASL PLAIN/SCRAM credentials, used from the next authentication on (open
        connections stay as they are), as ``confluent_kafka.Consumer.set_sasl_credentials``."""
        self._ensure_usable()
        if not isinstance(username, str) or not isinstance(password, str):
            raise TypeError("set_sasl_credentials() takes a username and a password (str)")
        self._net.set_sasl_credentials(username, password)

    # -- subscription -----------------------------------------------------------------------

    def _on_loop_state_change(self, event: StateChanged) -> None:
        """Called by the core (under the core lock, on the loop thread) for every transition."""
        if event.old is not event.new:
            self._state_since_ms = _now_ms()
            if (event.new in IN_GROUP_STATES) != self._in_group:
                self._in_group = not self._in_group
                self._in_group_since = time.time()
        self._last_transition_reason = event.reason
        if event.old is MemberState.LEAVING and event.new is MemberState.UNSUBSCRIBED:
            self._leave_sent_at = time.monotonic()
        elif event.new is MemberState.PREPARE_LEAVING and event.reason.startswith("poll timer"):
            ms = self._config.max_poll_interval_ms
            error = KafkaError(
                KafkaError._MAX_POLL_EXCEEDED,
                f"Application maximum poll interval ({ms}ms) exceeded: leaving the group; "
                "the member rejoins on the next poll()",
            )
            if self._ERRORS_AS_EVENTS:  # librdkafka returns it from poll() as an event
                self._note_error(error)
                self._queue_app_callback("event", error)
            else:
                self._queue_error(error)

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
        self._net.prefetch_metadata(names)
        self._net.submit(Subscribe(topics=names, pattern=pattern, has_listener=True))

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
        self._net.submit(Unsubscribe())
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
                if self._net.failure is not None:
                    break  # the network side failed: nothing more will be sent
                continue
            if self._leave_done.is_set() or self._net.failure is not None:
                break
            if self._leave_wait_over(deadline):
                break
            self._await_background(_POLL_EVENT_INTERVAL_S)
        return first

    def _leave_wait_over(self, deadline: float) -> bool:
        """Whether a leave still under way is waited for no longer (see `_drive_leave`)."""
        now = time.monotonic()
        if now < deadline:
            return False
        sent_at = self._leave_sent_at
        if sent_at is not None:
            return now >= sent_at + _CLOSE_ATTEMPT_FLOOR_S
        if self._net.events_pending or self._net.state in _LEAVING:
            cap = max(deadline, self._callbacks_ended_at) + 2 * self._request_timeout()
            if now >= cap:
                log.info(
                    "group %s: leave heartbeat not sent within the close timeout", self.group_id
                )
                return True
            return False
        return True

    # -- poll -------------------------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> Message | None:
        """Run pending callbacks (rebalance, ``on_commit``, ``error_cb``) within ``timeout``
        seconds; ``None`` or a negative timeout blocks until a callback has run.

        Raises the errors the membership reports (fatal ones end the member) and exceptions
        raised by callbacks. A ``GroupMember`` has no data plane and always returns None.
        """
        if timeout == 0 and time.monotonic() < self._poll_note_due:
            # The usual poll(0) of a stable member: nothing queued, no failure, the poll
            # noted lately (see `PollGate`). One attribute of this object read: with many
            # members each poll finds it out of the CPU's caches, and each further object
            # read cost about as much again (3.3 against 1.5 µs a poll at 100 members).
            return None
        net = self._net
        if self._closed or self._fatal is not None or net.failure is not None:
            self._ensure_usable()
        if time.monotonic() >= self._poll_note_due:  # (else note_poll would do nothing)
            net.note_poll()
        if timeout == 0 and not net.background_events and not self._app_callbacks:
            return None  # the usual poll(0): nothing happened (no lock, no loop round trip)
        self._run_until(_never, _wait_seconds(timeout), stop_after_callback=True)
        return None

    def _await_background(self, timeout: float) -> None:
        """Block (no busy wait) until the loop queued events or results, a callback was queued
        for this thread, or ``timeout``."""
        self._net.wait_for_events(timeout, self._has_app_callbacks)

    def _has_app_callbacks(self) -> bool:
        return bool(self._app_callbacks)

    def _poll_busy(self) -> bool:
        """(`PollGate`) Whether a poll has work of this side's: a callback queued, or the
        member closed or failed."""
        return bool(self._app_callbacks) or self._closed or self._fatal is not None

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
            self._net.note_poll()
            self._await_background(min(remaining, _POLL_EVENT_INTERVAL_S))
        return True

    # -- background events (application thread) -------------------------------------------

    def _dispatch_background_events(self) -> bool:
        """Handle the core's events and run queued user callbacks on this thread; True if
        user code ran (a rebalance callback, ``on_commit`` or ``error_cb``)."""
        self._check_network()
        raised: BaseException | None = None
        ran = False
        for event in self._net.drain_background_events():
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
                elif kind == "event":
                    ran = True
                    self._error_events.append(error_event(payload))
            except BaseException as exc:
                if raised is None:
                    raised = exc
        if raised is not None:
            raise _as_kafka_exception(raised, "on_commit" if kind == "commit" else "error_cb")
        return ran

    def _queue_app_callback(self, kind: str, payload: Any) -> None:
        """Queue a callback for the application thread (either thread) and wake it; its next
        poll(0) takes the full path."""
        self._app_callbacks.append((kind, payload))
        self._poll_note_due = 0.0  # (after the append: see `PollGate`)
        self._net.notify()

    def _queue_error(self, error: KafkaError) -> None:
        """Report a group-level error to ``error_cb`` (run on the application thread; this
        may be called on either thread)."""
        self._note_error(error)
        if self._error_cb is not None:
            self._queue_app_callback("error", error)

    def _note_error(self, error: KafkaError) -> None:
        """Remember ``error`` as the last one, for `health` (either thread)."""
        self._client_metrics.record_error(error.code(), error.name(), error.str(), time.time())

    def _dispatch(self, event: BackgroundEvent) -> bool:
        if isinstance(event, CallbacksNeeded):
            return self._run_callback(event)
        if isinstance(event, CommitNeeded):
            self._commit_needed(event)
        elif isinstance(event, ErrorEvent):
            return self._deliver_error(event)
        elif isinstance(event, LeaveCompleted):
            self._leave_done.set()
        elif isinstance(event, StateChanged):
            log.debug(
                "group %s: %s -> %s (%s)",
                self.group_id,
                event.old.name,
                event.new.name,
                event.reason,
            )
        return False

    def _deliver_error(self, event: ErrorEvent) -> bool:
        """Hand a group error to the application the way confluent-kafka does (see
        `error_channel`); True if it was delivered (an event queued or error_cb run)."""
        if event.fatal and self._fatal is not None:
            # The core repeats its fatal error for every event it refuses after it (each poll):
            # the application got it once; from now on its calls raise it.
            return False
        error = KafkaError(event.code, event.message, fatal=event.fatal, retriable=not event.fatal)
        self._note_error(error)
        if event.fatal:
            self._fatal = KafkaException(error)
            self._poll_note_due = 0.0  # poll(0) raises it
            if self._ERRORS_AS_EVENTS:
                # poll() returns the _FATAL event first; later calls raise the error.
                self._error_events.append(error_event(fatal_event(error)))
                return True
            if self._error_cb is not None:
                self._error_cb(error)
            raise self._fatal
        if client_error(event.code):
            if self._error_cb is not None:
                self._error_cb(for_error_cb(error))
                return True
            if not self._ERRORS_AS_EVENTS:
                raise KafkaException(error)
            # Logged, as confluent-kafka does without error_cb (to the `logger` if set).
            target = self._config.callbacks.get("logger") or log
            target.error("group %s: %s (no error_cb configured)", self.group_id, error.str())
            return False
        if self._ERRORS_AS_EVENTS:
            self._error_events.append(error_event(error))
            return True
        if self._error_cb is not None:
            self._error_cb(error)
            return True
        raise KafkaException(error)

    def _run_callback(self, event: CallbacksNeeded) -> bool:
        parts = list(event.partitions)
        user_exc: BaseException | None = None
        called = False
        try:
            called = self._call(self._callback_begin(event), parts)
            if event.kind is CallbackKind.ASSIGNED:
                self._after_assign()
        except BaseException as exc:
            user_exc = exc
        self._callback_end(event, user_exc)
        return called

    def _callback_begin(self, event: CallbacksNeeded) -> RebalanceCallback | None:
        """Prepare the data plane for a rebalance callback; the user callback to run."""
        parts = list(event.partitions)
        if event.kind is CallbackKind.REVOKED:
            self._before_revoke(parts)
            return self._on_revoke
        if event.kind is CallbackKind.LOST:
            self._before_revoke(parts, lost=True)
            return self._on_lost or self._on_revoke
        self._before_assign(parts)
        return self._on_assign

    def _callback_end(self, event: CallbacksNeeded, user_exc: BaseException | None) -> None:
        """Finish a rebalance callback (release revoked partitions, acknowledge it to the
        core), then raise the callback's error, if any, as the application sees it."""
        try:
            self._client_metrics.record_partitions(event.kind.name.lower(), len(event.partitions))
            if event.kind is not CallbackKind.ASSIGNED:
                self._after_revoke(list(event.partitions))
            elif user_exc is not None:
                self._assign_failed()
        finally:
            self._callbacks_ended_at = time.monotonic()
            error = None if user_exc is None else f"{type(user_exc).__name__}: {user_exc}"
            self._net.submit(CallbackCompleted(event.callback_id, error))
        if user_exc is not None:
            raise _as_kafka_exception(user_exc, f"on_{event.kind.name.lower()}")

    def _call(self, callback: RebalanceCallback | None, parts: list[Partition]) -> bool:
        if callback is None:
            return False
        callback(self, _tps(parts))
        return True

    # Hooks for the data plane (Consumer overrides them).
    def _fence(self, parts: set[Partition]) -> None:
        """Stop handing out records of ``parts`` (either thread: the loop thread calls it
        after a heartbeat outcome that left partitions pending revocation)."""
        return None

    def _before_revoke(self, parts: list[Partition], lost: bool = False) -> None:
        return None

    def _after_revoke(self, parts: list[Partition]) -> None:
        self._revoking = {}
        if parts:
            self._net.forget_committed(set(parts))

    def _before_assign(self, parts: list[Partition]) -> None:
        return None

    def _after_assign(self) -> None:
        return None

    def _assign_failed(self) -> None:
        """on_assign (or the assignment after it) raised: the core retries it later."""
        return None

    # -- commits ----------------------------------------------------------------------------

    def _consumed_offsets(self) -> dict[Partition, OffsetAndMetadata]:
        """Offsets to commit when none are given (the data plane's positions)."""
        return dict(self._revoking)

    def _commit_needed(self, event: CommitNeeded) -> None:
        offsets, deadline, pending = self._commit_needed_offsets(event)
        error: KafkaException | None = None
        try:
            self._commit_with_retries(offsets, deadline, retry_stale=True, releasing=pending)
        except KafkaException as exc:
            error = exc
        finally:
            self._commit_needed_done(event, error)

    def _commit_needed_offsets(
        self, event: CommitNeeded
    ) -> tuple[dict[Partition, OffsetAndMetadata], float, set[Partition]]:
        """What the commit before a revocation or leave commits, its deadline, and the
        partitions pending revocation."""
        # Reference step order: fence partitions pending revocation, then commit, so no record
        # of them is handed out after the offsets that the next owner starts from.
        pending = set(self._net.snapshot.pending_revocation)
        self._fence(pending)
        offsets = self._consumed_offsets()
        deadline = time.monotonic() + max(event.deadline_ms - _now_ms(), 0) / 1000
        if self._close_deadline is not None:
            # close()/unsubscribe() keep their own timeout (one attempt at least).
            deadline = min(
                deadline, max(self._close_deadline, time.monotonic() + _CLOSE_ATTEMPT_FLOOR_S)
            )
        return offsets, deadline, pending

    def _commit_needed_done(self, event: CommitNeeded, failure: KafkaException | None) -> None:
        error: str | None = None
        if failure is not None:
            error = failure.args[0].str()
            # The core logs the failure once it hears of it (CommitCompleted).
            log.debug(
                "group %s: commit before %s failed (%s); continuing",
                self.group_id,
                event.reason,
                error,
            )
        self._net.submit(CommitCompleted(event.commit_id, error))

    def _report_commit(
        self, error: KafkaError | None, offsets: Mapping[Partition, OffsetLike]
    ) -> None:
        """Queue the ``on_commit`` call of one commit (either thread; it runs on the
        application thread)."""
        if self._on_commit is not None:
            parts = []
            for (t, p), o in sorted(offsets.items()):
                extra: dict[str, Any] = {}
                if o.metadata is not None:
                    extra["metadata"] = o.metadata
                if o.leader_epoch >= 0:
                    extra["leader_epoch"] = o.leader_epoch
                parts.append(TopicPartition(t, p, o.offset, **extra))
            self._queue_app_callback("commit", (error, parts))

    def _report_no_offset(self) -> None:
        if self._on_commit is not None:
            self._queue_app_callback(
                "commit", (KafkaError(KafkaError._NO_OFFSET, "Local: No offset stored"), [])
            )

    def _on_loop_commit_done(
        self, result: CommitResult, offsets: Mapping[Partition, OffsetLike]
    ) -> None:
        """(loop thread) An asynchronous or auto commit finished: queue its ``on_commit``
        call; nothing new to commit is reported as _NO_OFFSET for ``commit()``."""
        if result.ok:
            if result.committed:
                self._report_commit(None, {p: offsets[p] for p in result.committed})
            elif result.kind is CommitKind.ASYNC:
                self._report_no_offset()
            return
        error = commit_error(result)
        self._client_metrics.record_commit_failed()
        self._note_error(error)
        self._report_commit(error, offsets)

    def _commit_with_retries(
        self,
        offsets: Mapping[Partition, OffsetAndMetadata],
        deadline: float,
        retry_stale: bool,
        releasing: Iterable[Partition] = (),
    ) -> dict[Partition, int]:
        """Commit and wait (this thread) for the loop to finish it: retriable errors are
        retried with backoff until ``deadline`` (``retry_stale``: STALE_MEMBER_EPOCH too, for
        the commit before a revocation or leave), except a deleted topic's partitions among
        ``releasing``, which fail at once. The outcome goes to ``on_commit``; a failure is
        raised (``CommitFailedError`` naming the error)."""
        kind = CommitKind.REBALANCE if retry_stale else CommitKind.SYNC
        result = self._net.commit_sync(
            offsets, max(deadline - time.monotonic(), 0.05), kind, releasing=releasing
        )
        return self._commit_outcome(offsets, result)

    def _commit_outcome(
        self, offsets: Mapping[Partition, OffsetAndMetadata], result: CommitResult
    ) -> dict[Partition, int]:
        """Report a waited-for commit's result to ``on_commit``; raise its failure."""
        self._check_network()
        committed = dict(result.committed)
        if result.ok:
            if committed:
                self._report_commit(None, {p: offsets[p] for p in committed})
            return committed
        error = commit_failed(result)
        self._client_metrics.record_commit_failed()
        self._note_error(error.args[0])
        if committed and result.dropped:
            # Only the deleted topics' offsets failed: report the others as committed.
            self._report_commit(None, {p: offsets[p] for p in committed})
            failed = {p: o for p, o in offsets.items() if p not in committed}
        else:
            failed = dict(offsets)
        self._report_commit(error.args[0], failed)
        raise error

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
        network loop (before any later leave heartbeat) and never retried.
        """
        self._ensure_usable()
        todo = self._commit_todo(message, offsets, asynchronous)
        if todo is None:
            return None
        if timeout is None:
            timeout = self._config.connection.socket_timeout_ms / 1000
        committed = self._commit_with_retries(
            todo,
            time.monotonic() + max(timeout, 0.0),
            retry_stale=False,
            releasing=self._commit_releasing(),
        )
        return _committed_tps(committed)

    def _commit_releasing(self) -> set[Partition]:
        """Partitions being released: an application commit of a deleted topic's partition
        among them fails at once instead of being retried."""
        return set(self._net.snapshot.pending_revocation) | set(self._revoking)

    def _commit_todo(
        self,
        message: Message | None,
        offsets: Sequence[TopicPartition] | None,
        asynchronous: bool,
    ) -> dict[Partition, OffsetAndMetadata] | None:
        """The offsets ``commit()`` commits; an asynchronous commit is queued here (None)."""
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
                    tp.offset,
                    tp.leader_epoch if tp.leader_epoch is not None else -1,
                    tp.metadata,
                )
        else:
            todo = self._consumed_offsets()
        if asynchronous:
            if not todo:
                self._report_no_offset()
                return None
            self._net.commit(todo, CommitKind.ASYNC, epoch=self.member_epoch)
            return None
        if not todo and message is None and offsets is None:
            # Nothing consumed (or stored) to commit: confluent-kafka raises too.
            raise KafkaException(
                KafkaError(KafkaError._NO_OFFSET, "Commit failed: Local: No offset stored")
            )
        return todo

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
        """OffsetFetch with the Java client's retry policy: coordinator and other retriable errors,
        and STALE_MEMBER_EPOCH (the next attempt carries the epoch of the next heartbeat), are
        retried with backoff until ``timeout``; other errors are raised."""
        deadline = time.monotonic() + timeout
        c = self._config
        backoff = Backoff(c.retry_backoff_ms, c.retry_backoff_max_ms, 0.2, random.Random())
        attempts = 0
        while True:
            epoch = self.member_epoch
            try:
                return self._fetch_once(
                    partitions,
                    self.member_id if epoch > 0 else None,
                    epoch if epoch > 0 else -1,
                    max(deadline - time.monotonic(), 0.05),
                )
            except (
                BrokerResponseError,
                KafkaTransportError,
                KafkaTimeoutError,
                ProtocolError,
            ) as exc:
                time.sleep(self._fetch_retry(exc, epoch, deadline, backoff.backoff_s(attempts)))
                attempts += 1

    def _fetch_retry(self, exc: KafkaException, epoch: int, deadline: float, delay: float) -> float:
        """After a failed OffsetFetch (made under ``epoch``): ``delay``, the backoff before
        the next attempt, or raise ``exc`` when it is not retried."""
        code = exc.args[0].code()
        retriable = not isinstance(exc, BrokerResponseError) or code in COMMIT_RETRIABLE
        if code == ErrorCode.STALE_MEMBER_EPOCH and epoch > 0:
            retriable = True
        if not retriable or time.monotonic() + delay >= deadline:
            raise exc
        log.info(
            "group %s: OffsetFetch failed (%s); retrying in %.0f ms",
            self.group_id,
            exc.args[0].str(),
            delay * 1000,
        )
        return delay

    def _fetch_once(
        self, partitions: list[Partition], member_id: str | None, epoch: int, timeout: float
    ) -> dict[Partition, OffsetAndMetadata | None]:
        """One OffsetFetch (v9 with member id/epoch where offered) over the loop; raises
        ``BrokerResponseError`` for an error in the answer."""
        if not partitions:
            return {}
        request = self._offset_fetch_request(partitions, member_id, epoch)
        return committed_offsets(self._net.fetch_offsets(request, timeout))

    def _offset_fetch_request(
        self, partitions: list[Partition], member_id: str | None, epoch: int
    ) -> OffsetFetchRequest:
        return OffsetFetchRequest(
            self.group_id, tuple(sorted(partitions)), member_id, epoch, require_stable=True
        )

    # -- close ------------------------------------------------------------------------------

    def close(self, timeout: float = 10.0, option: CloseOption = CloseOption.DEFAULT) -> None:
        """Commit, release the assignment, leave the group and stop.

        In order: pending asynchronous commits and the auto-commit (with
        ``enable.auto.commit``) go out with the member's epoch; ``on_revoke`` runs (``on_lost``
        if the member was fenced); the leave heartbeat is sent (per ``option``, KIP-1092) even
        if a callback raised; the member leaves the network loop. Callbacks are not cut short; the
        network part waits at most ``timeout`` seconds, except that the commit and the leave
        heartbeat each get one attempt (up to 0.5 s) even with ``timeout=0``. ``on_commit``
        runs for the close commits. Then the first callback error is raised as
        ``KafkaException`` (the original exception is its ``__cause__``). The member detaches
        from the shared network loop, which stops with its last member: no thread is left
        behind; closing twice is a no-op.
        """
        if self._closed:
            return
        deadline = time.monotonic() + max(timeout, 0.0)
        self._close_deadline = deadline
        first: BaseException | None = None
        if self._fatal is None and self._net.failure is None:
            self._leave_done.clear()
            self._leave_sent_at = None
            self._net.submit(Close(option))
            first = self._drive_leave(deadline)
            # Async commits made by callbacks after the leave (or with no leave to send).
            self._flush_async_commits(max(deadline, time.monotonic() + _CLOSE_ATTEMPT_FLOOR_S))
        self._closed = True
        self._poll_note_due = 0.0
        self._net.stop()
        self._close_data_plane(max(deadline - time.monotonic(), 0.05))
        try:
            self._serve_app_callbacks()  # on_commit of the close commits
        except BaseException as exc:
            if first is None:
                first = exc
        if first is not None:
            raise _as_kafka_exception(first)

    def _flush_async_commits(self, deadline: float) -> None:
        """Wait (until ``deadline``) for queued asynchronous commits to be answered."""
        while (pending := self._net.pending_commits) and self._net.failure is None:
            if time.monotonic() >= deadline:
                log.info(
                    "group %s: %d asynchronous commit(s) not answered before close",
                    self.group_id,
                    pending,
                )
                return
            time.sleep(0.005)

    def _close_data_plane(self, timeout: float) -> None:
        return None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _ensure_usable(self) -> None:
        if self._closed:
            raise KafkaException(KafkaError(KafkaError._STATE, "the consumer is closed"))
        self._check_network()
        if self._fatal is not None:
            raise self._fatal

    def _check_network(self) -> None:
        """Raise (from now on) the error that failed this member's network side."""
        if self._fatal is None and self._net.failure is not None:
            self._fatal = self._net.failure
        if self._fatal is not None and self._fatal is self._net.failure:
            raise self._fatal

    def _request_timeout(self) -> float:
        interval = self._net.snapshot.heartbeat_interval_ms or 3000
        return min(max(interval / 1000, 1.0), self._config.connection.socket_timeout_ms / 1000)

    def _on_loop_committable(
        self,
    ) -> tuple[Mapping[Partition, OffsetLike], frozenset[Partition] | None]:
        """(loop thread; never waits, takes no lock) What an auto-commit may commit: the
        offsets of partitions being revoked (the driver keeps those of the assigned
        partitions while in the group), and no manual assignment."""
        return dict(self._revoking), None
