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
import re
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
    kafka_error,
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
    MembershipConfig,
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
_POLL_EVENT_INTERVAL_S = 0.05
_REBALANCE_POLL_GAP_S = 0.002


def _now_ms() -> int:
    return int(time.monotonic() * 1000)


def _tps(partitions: Iterable[Partition]) -> list[TopicPartition]:
    return [TopicPartition(t, p) for t, p in sorted(partitions)]


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
            MembershipConfig(
                group_id=c.group_id,
                group_instance_id=c.group_instance_id,
                client_rack=c.client_rack,
                remote_assignor=c.group_remote_assignor,
                rebalance_timeout_ms=c.max_poll_interval_ms,
                auto_commit=c.enable_auto_commit,
                retry_backoff_ms=c.retry_backoff_ms,
                retry_backoff_max_ms=c.retry_backoff_max_ms,
                client_id=c.client_id,
            ),
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
        self._async_commits: deque[dict[Partition, OffsetAndMetadata]] = deque()
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
        if event.old is not event.new:
            self._state_since_ms = _now_ms()
        self._last_transition_reason = event.reason

    def subscribe(
        self,
        topics: Sequence[str] | str,
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """Subscribe to topic names, or to a regex given as a string starting with ``^``
        (or a one-element list holding one). The group is joined on the next ``poll()``."""
        self._ensure_usable()
        names: tuple[str, ...]
        pattern: str | None = None
        if isinstance(topics, str):
            topics = [topics]
        if not isinstance(topics, Sequence) or not all(isinstance(t, str) for t in topics):
            raise TypeError("subscribe() takes a list of topic names or a regex string")
        if len(topics) == 1 and topics[0].startswith("^"):
            pattern = topics[0]
            try:
                re.compile(pattern)
            except re.error as exc:
                raise KafkaException(
                    kafka_error(ErrorCode.INVALID_REGULAR_EXPRESSION, f"{pattern!r}: {exc}")
                ) from None
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
        """Release the assignment (revoke callback) and leave the group."""
        self._ensure_usable()
        self._leave_done.clear()
        self._core.submit(Unsubscribe())
        self._wake()
        self._run_until(self._leave_done.is_set, timeout)

    # -- poll -------------------------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> Message | None:
        """Run pending rebalance callbacks and return within ``timeout`` seconds.

        Raises the errors the membership reports (fatal ones end the member) and exceptions
        raised by callbacks. A ``GroupMember`` has no data plane and always returns None.
        """
        self._ensure_usable()
        self._post_poll()
        self._run_until(lambda: False, 0.0 if timeout is None or timeout < 0 else timeout)
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

    def _run_until(self, done: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not done():
            self._dispatch_background_events()
            if done():
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._post_poll()
            self._await_background(min(remaining, _POLL_EVENT_INTERVAL_S))
        return True

    # -- background events (application thread) -------------------------------------------

    def _dispatch_background_events(self) -> None:
        raised: BaseException | None = None
        for event in self._core.drain_background_events():
            try:
                self._dispatch(event)
            except BaseException as exc:  # finish the batch, then raise the first error
                if raised is None:
                    raised = exc
        if raised is not None:
            raise raised

    def _dispatch(self, event: BackgroundEvent) -> None:
        if isinstance(event, CallbacksNeeded):
            self._run_callback(event)
        elif isinstance(event, CommitNeeded):
            self._commit_needed(event)
        elif isinstance(event, ErrorEvent):
            error = KafkaException(
                KafkaError(event.code, event.message, fatal=event.fatal, retriable=not event.fatal)
            )
            if event.fatal:
                self._fatal = error
            raise error
        elif isinstance(event, LeaveCompleted):
            self._leave_done.set()
        elif isinstance(event, StateChanged):
            log.debug("group %s: %s -> %s (%s)", self.group_id, event.old.name,
                      event.new.name, event.reason)  # fmt: skip

    def _run_callback(self, event: CallbacksNeeded) -> None:
        parts = list(event.partitions)
        error: str | None = None
        user_exc: BaseException | None = None
        try:
            if event.kind is CallbackKind.REVOKED:
                self._before_revoke(parts)
                self._call(self._on_revoke, parts)
            elif event.kind is CallbackKind.LOST:
                self._before_revoke(parts, lost=True)
                self._call(self._on_lost or self._on_revoke, parts)
            else:
                starts = self._before_assign(parts)
                self._call(self._on_assign, parts)
                self._after_assign(starts)
        except BaseException as exc:
            user_exc = exc
            error = f"{type(exc).__name__}: {exc}"
        finally:
            if event.kind is not CallbackKind.ASSIGNED:
                self._after_revoke(parts)
            self._core.submit(CallbackCompleted(event.callback_id, error))
            self._wake()
        if user_exc is not None:
            if isinstance(user_exc, KafkaException):
                raise user_exc
            if isinstance(user_exc, Exception):
                raise KafkaException(
                    KafkaError(
                        KafkaError._APPLICATION,
                        f"on_{event.kind.name.lower()} callback raised {error}",
                    )
                ) from user_exc
            raise user_exc

    def _call(self, callback: RebalanceCallback | None, parts: list[Partition]) -> None:
        if callback is not None:
            callback(self, _tps(parts))

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
            deadline = min(deadline, self._close_deadline)  # close() keeps its own timeout
        try:
            self._commit_with_retries(offsets, deadline, retry_stale=True)
        except KafkaException as exc:
            error = exc.args[0].str()
            log.warning("group %s: commit before rebalance failed (%s); continuing",
                        self.group_id, error)  # fmt: skip
        finally:
            self._core.submit(CommitCompleted(event.commit_id, error))
            self._wake()

    def _commit_with_retries(
        self, offsets: Mapping[Partition, OffsetAndMetadata], deadline: float, retry_stale: bool
    ) -> dict[Partition, int]:
        backoff = self._config.retry_backoff_ms / 1000
        while True:
            try:
                return self._offsets.commit(
                    offsets, self.member_id, self._commit_epoch(),
                    max(deadline - time.monotonic(), 0.05),
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
                    raise
                time.sleep(backoff)
                backoff = min(backoff * 2, self._config.retry_backoff_max_ms / 1000)

    def commit(
        self,
        message: Message | None = None,
        offsets: Sequence[TopicPartition] | None = None,
        asynchronous: bool = True,
        timeout: float | None = None,
    ) -> list[TopicPartition] | None:
        """Commit ``message`` (its offset + 1), explicit ``offsets``, or everything consumed.

        Offsets carry this member's id and epoch (OffsetCommit v9). A synchronous commit
        raises ``KafkaException`` on failure (e.g. STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID);
        an asynchronous one logs failures. A synchronous commit retries retriable errors for
        up to ``timeout`` seconds (default ``socket.timeout.ms``).
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
            self._async_commits.append(todo)
            self._wake()
            return None
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
        """Commit (auto-commit), release the assignment, leave the group and stop.

        Always returns within ``timeout`` seconds, even with the coordinator down, and leaves
        no thread behind. Closing twice is a no-op.
        """
        if self._closed:
            return
        deadline = time.monotonic() + max(timeout, 0.0)
        # The pre-leave auto-commit retries until the rebalance timeout otherwise.
        self._close_deadline = time.monotonic() + max(timeout, 0.0) * 0.5
        if self._fatal is None and self._thread.is_alive():
            self._leave_done.clear()
            self._core.submit(Close(option))
            self._wake()
            with contextlib.suppress(Exception):
                self._run_until(self._leave_done.is_set, max(deadline - time.monotonic(), 0) * 0.8)
        self._closed = True
        self._stop.set()
        self._wake()
        self._thread.join(max(deadline - time.monotonic(), 0) * 0.5)
        if self._thread.is_alive():
            self._client.close()  # unblocks a socket wait so the thread exits
            self._thread.join(max(deadline - time.monotonic(), 0.05))
        self._client.close()
        self._close_data_plane(max(deadline - time.monotonic(), 0.05))
        unroute_thread_logs(self._thread)

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
        if result.request is not None:
            self._send_heartbeat(result.request)
        self._run_async_commits()
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
            delay = min(
                self._config.retry_backoff_ms * 2 ** (self._coordinator_failures - 1),
                self._config.retry_backoff_max_ms,
            )
            self._coordinator_retry_at = time.monotonic() + delay / 1000
            log.warning("group %s: FindCoordinator failed (%s); retrying in %d ms",
                        self.group_id, exc, delay)  # fmt: skip
            if isinstance(exc, SaslError | TlsHandshakeError):
                self._report_connect_error(exc)
            return
        self._coordinator_failures = 0
        self._core.on_coordinator_known(now)

    def _report_connect_error(self, exc: KafkaException) -> None:
        """Authentication and TLS failures are configuration errors: besides the log, the
        next ``poll()`` raises them (once per failed attempt; the lookup goes on retrying)."""
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
        self, offsets: dict[Partition, OffsetAndMetadata], what: str
    ) -> None:
        """Background-thread commit (async or auto): failures are logged, never raised."""
        try:
            self._offsets.commit(offsets, self.member_id, self._commit_epoch(),
                                 self._request_timeout())  # fmt: skip
        except Exception as exc:
            log.warning("group %s: %s failed: %s", self.group_id, what, exc)

    def _run_async_commits(self) -> None:
        while self._async_commits:
            self._commit_logging_failures(self._async_commits.popleft(), "async commit")

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
