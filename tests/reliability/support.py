"""Shared helpers of the reliability suite: a heartbeat spy, a single-threaded app driver,
and mock-timestamp helpers. Every wait is a bounded poll-until loop."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from consumer_sdk import GroupMember, KafkaException, MemberState, TopicPartition
from consumer_sdk.testing import EmbeddedKafka, wait_until

T = TypeVar("T")
Partition = tuple[str, int]

HB = 68
OFFSET_COMMIT = 8
OFFSET_FETCH = 9
FIND_COORDINATOR = 10


def wait_for(condition: Callable[[], T], timeout: float = 15.0, what: str = "") -> T:
    """Poll ``condition`` every 20 ms until truthy (returned) or ``timeout`` (AssertionError)."""
    return wait_until(condition, timeout, 0.02, what or str(condition))


def config(kafka: EmbeddedKafka | str, group: str, **extra: Any) -> dict[str, Any]:
    """A consumer config; ``extra`` keys use ``_`` for ``.`` (``enable_auto_commit=False``)."""
    servers = kafka if isinstance(kafka, str) else kafka.bootstrap_servers
    base: dict[str, Any] = {
        "bootstrap.servers": servers,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "retry.backoff.ms": 100,
        "retry.backoff.max.ms": 1000,
    }
    base.update({k.replace("_", "."): v for k, v in extra.items()})
    return base


@dataclass
class HbCall:
    """One ConsumerGroupHeartbeat as the member's client saw it."""

    sent: float  # time.monotonic() when sent
    state: MemberState  # member state when sent (LEAVING has already become UNSUBSCRIBED)
    epoch: int  # MemberEpoch in the request
    error_code: int | None = None  # None: no response (exception)
    failure: str | None = None
    done: float = 0.0


def trace_heartbeats(
    member: GroupMember,
    sent: Callable[[Any], None],
    done: Callable[[Any, Any, BaseException | None], None],
) -> None:
    """Call ``sent(request)`` when the member's network side sends a heartbeat and
    ``done(request, response, error)`` when its outcome arrives (both on the loop thread)."""
    net = member._net
    traced = net.heartbeat_trace

    def on_heartbeat(request: Any, at: float, response: Any, error: BaseException | None) -> None:
        done(request, response, error)
        if traced is not None:
            traced(request, at, response, error)  # type: ignore[arg-type]

    net.heartbeat_sent = sent
    net.heartbeat_trace = on_heartbeat


class HeartbeatSpy:
    """Records every heartbeat of ``member`` and its outcome in order."""

    def __init__(self, member: GroupMember) -> None:
        self.calls: list[HbCall] = []
        self._lock = threading.Lock()
        in_flight: dict[int, HbCall] = {}

        def sent(request: Any) -> None:
            # On the loop thread, as the request goes out: the core's state right now.
            call = HbCall(time.monotonic(), member._net.core.state, request.member_epoch)
            with self._lock:
                self.calls.append(call)
                in_flight[id(request)] = call

        def done(request: Any, response: Any, error: BaseException | None) -> None:
            with self._lock:
                call = in_flight.pop(id(request), None)
            if call is None:
                return
            if error is not None:
                call.failure = f"{type(error).__name__}: {error}"
            else:
                call.error_code = response.error_code
            call.done = time.monotonic()

        trace_heartbeats(member, sent, done)

    def snapshot(self) -> list[HbCall]:
        with self._lock:
            return list(self.calls)

    def count(self) -> int:
        with self._lock:
            return len(self.calls)

    def index_of_error(self, code: int) -> int | None:
        for i, call in enumerate(self.snapshot()):
            if call.error_code == code:
                return i
        return None

    def answered_after(self, index: int) -> int:
        """Heartbeats after ``index`` that got a successful response."""
        return sum(1 for c in self.snapshot()[index + 1 :] if c.error_code == 0)


@dataclass
class Callbacks:
    """Records rebalance callbacks; ``assign_hook`` runs inside ``on_assign`` (first call)."""

    events: list[tuple[float, str, tuple[Partition, ...]]] = field(default_factory=list)
    assign_hook: Callable[[list[TopicPartition]], None] | None = None
    revoke_hook: Callable[[list[TopicPartition]], None] | None = None
    _assign_calls: int = 0

    def kinds(self) -> list[str]:
        return [k for _, k, _ in self.events]

    def parts(self, kind: str) -> list[tuple[Partition, ...]]:
        return [p for _, k, p in self.events if k == kind]

    def _record(self, kind: str, parts: list[TopicPartition]) -> None:
        self.events.append((time.monotonic(), kind, tuple((p.topic, p.partition) for p in parts)))

    def on_assign(self, consumer: Any, parts: list[TopicPartition]) -> None:
        self._record("assign", parts)
        self._assign_calls += 1
        if self._assign_calls == 1 and self.assign_hook is not None:
            self.assign_hook(parts)

    def on_revoke(self, consumer: Any, parts: list[TopicPartition]) -> None:
        self._record("revoke", parts)
        if self.revoke_hook is not None:
            hook, self.revoke_hook = self.revoke_hook, None
            hook(parts)

    def on_lost(self, consumer: Any, parts: list[TopicPartition]) -> None:
        self._record("lost", parts)

    def subscribe(self, member: GroupMember, topics: list[str]) -> None:
        member.subscribe(
            topics, on_assign=self.on_assign, on_revoke=self.on_revoke, on_lost=self.on_lost
        )


class App:
    """The application thread of one member, driven by the test: ``poll_until`` polls the
    member and collects what ``poll()`` raises."""

    def __init__(self, member: GroupMember) -> None:
        self.member = member
        self.errors: list[KafkaException] = []

    def poll_once(self, timeout: float = 0.05) -> Any:
        try:
            return self.member.poll(timeout)
        except KafkaException as exc:
            self.errors.append(exc)
            return None

    def poll_until(self, condition: Callable[[], T], timeout: float = 15.0, what: str = "") -> T:
        deadline = time.monotonic() + timeout
        while True:
            value = condition()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"timed out after {timeout}s waiting for {what or condition}; "
                    f"state={self.member.state.name}, errors={self.error_codes()}"
                )
            self.poll_once(0.05)

    def next_record(self, timeout: float = 15.0, what: str = "a record") -> Any:
        """Poll until ``poll()`` returns a record without error (returned)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = self.poll_once(0.1)
            if msg is not None and msg.error() is None:
                return msg
        raise AssertionError(
            f"timed out after {timeout}s waiting for {what}; state={self.member.state.name}, "
            f"errors={self.error_codes()}"
        )

    def poll_for(self, seconds: float) -> None:
        """Keep polling for ``seconds`` (an observation window, not a wait for a condition)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            self.poll_once(min(0.05, max(deadline - time.monotonic(), 0)))

    def error_codes(self) -> list[int]:
        return [int(e.args[0].code()) for e in self.errors]

    def fatal_errors(self) -> list[KafkaException]:
        return [e for e in self.errors if e.args[0].fatal()]


def timed_close(member: GroupMember, timeout: float = 5.0) -> float:
    """``member.close(timeout)`` in a thread; returns how long it took (inf if it hung)."""
    started = time.monotonic()
    thread = threading.Thread(target=member.close, kwargs={"timeout": timeout}, daemon=True)
    thread.start()
    thread.join(timeout + 5.0)
    return float("inf") if thread.is_alive() else time.monotonic() - started


def hb_timestamps_ms(kafka: EmbeddedKafka, broker: int | None = None) -> list[float]:
    """ConsumerGroupHeartbeat arrival times at the mock, in ms (its monotonic clock)."""
    return [
        r.timestamp_us / 1000 for r in kafka.requests(HB) if broker is None or r.broker_id == broker
    ]


def gaps(timestamps: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(timestamps)]
