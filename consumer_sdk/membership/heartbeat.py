"""Heartbeat timing, content and error policy (the Java client's heartbeat request manager).

`HeartbeatRequestManager` decides when a ConsumerGroupHeartbeat goes out and what it
carries, and turns responses and failures into membership transitions. It never does I/O: the
host calls `HeartbeatRequestManager.poll`, sends the returned request, and reports the
outcome with `on_response` or
`on_failure` (once per request, in the order sent, or passing the
request back to match it).
"""

from __future__ import annotations

import enum
import logging
import random
from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

from consumer_sdk.backoff import Backoff
from consumer_sdk.domain import HeartbeatRequest, HeartbeatResponse
from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.membership._log import LEVELS_CACHED, LOGGER
from consumer_sdk.membership.manager import MembershipManager
from consumer_sdk.membership.metrics import MembershipMetrics
from consumer_sdk.membership.reconciler import LocalAssignment
from consumer_sdk.membership.stall import DEFAULT_SESSION_TIMEOUT_MS, unreleased_retry_deadline_ms
from consumer_sdk.membership.state import HEARTBEAT_NOW, LEAVING_STATES, NOT_IN_GROUP, MemberState

S = MemberState
E = ErrorCode

UNSUPPORTED_VERSION_MESSAGE = (
    "The broker does not support the KIP-848 consumer group protocol "
    "(ConsumerGroupHeartbeat v1). The broker must be Apache Kafka 4.0 or newer with the "
    "consumer group protocol enabled (group.coordinator.rebalance.protocols includes "
    "'consumer'); otherwise use group.protocol=classic with another client."
)


class FailureKind(enum.Enum):
    """Why a heartbeat got no response."""

    TIMEOUT = "TIMEOUT"  # request timed out: retriable, back off
    DISCONNECTED = "DISCONNECTED"  # connection lost: retriable, coordinator unknown
    RETRIABLE = "RETRIABLE"  # any other retriable client-side failure
    UNSUPPORTED_VERSION_CLIENT = "UNSUPPORTED_VERSION_CLIENT"  # broker lacks the API: fatal
    AUTHENTICATION = "AUTHENTICATION"  # SASL/TLS failure: fatal
    FATAL = "FATAL"  # any other non-retriable failure

    @property
    def retriable(self) -> bool:
        return self in (FailureKind.TIMEOUT, FailureKind.DISCONNECTED, FailureKind.RETRIABLE)


@dataclass(frozen=True, slots=True)
class Failure:
    """A request that got no response, as the error boundary of the host maps it once:
    ``kind`` decides the policy, ``code`` is the error code the application would see for it
    (0: none in particular), ``message`` the detail, and ``cause`` the host's original error
    (kept only to hand back to the application as is; never inspected here)."""

    kind: FailureKind
    message: str = ""
    code: int = 0
    cause: BaseException | None = field(default=None, compare=False, repr=False)


class PollResult(NamedTuple):
    """What to send now (if anything) and when to call ``poll`` again at the latest (a
    tuple: one is built per poll, by `_poll_result` in C)."""

    request: HeartbeatRequest | None
    next_poll_ms: int


_poll_result = partial(tuple.__new__, PollResult)


_LANE_NOTES = MembershipMetrics.LANE_NOTES
_DEBUG = logging.DEBUG


class _Kind(enum.Enum):
    REGULAR = "REGULAR"
    LEAVE = "LEAVE"  # unsubscribe/close leave: the response completes the leave
    STALE_LEAVE = "STALE_LEAVE"  # poll-expiry leave: the response is ignored


class _InFlight(NamedTuple):
    """A heartbeat sent and not answered yet (a tuple: one is built per heartbeat)."""

    request: HeartbeatRequest
    kind: _Kind
    sent_ms: int
    generation: int


# ``_InFlight(...)`` goes through a generated Python function; this builds it in C.
_in_flight = partial(tuple.__new__, _InFlight)


class HeartbeatTiming:
    """When the next heartbeat may go: the broker's interval, backoff after failures."""

    __slots__ = (
        "_attempts",
        "_backoff",
        "_backoff_ms",
        "_exponent",
        "_last_failed",
        "_last_received_ms",
        "_timer_deadline_ms",
        "interval_ms",
    )

    def __init__(self, backoff: Backoff) -> None:
        self._backoff = backoff
        self.interval_ms = 0
        self._timer_deadline_ms: int | None = None  # None: expired
        self._last_received_ms: int | None = None
        self._attempts = 0
        # Failures since the episode began or a failure retried without backoff: the
        # exponent of the next backoff.
        self._exponent = 0
        self._backoff_ms = 0
        self._last_failed = False

    @property
    def failed_attempts(self) -> int:
        return self._attempts

    def on_send(self, now_ms: int) -> None:
        """A heartbeat on the regular schedule went out: the next is due one interval later."""
        self._timer_deadline_ms = now_ms + self.interval_ms

    def on_success(self, now_ms: int) -> None:
        self._last_received_ms = now_ms
        self._attempts = 0
        self._backoff_ms = self._backoff.backoff_ms(0)
        self._last_failed = False

    def on_failure(
        self, now_ms: int, *, immediate_first: bool = False, skip_backoff: bool = False
    ) -> None:
        """Back off; the interval no longer applies (retry as soon as the backoff allows).

        ``immediate_first``: the first failure of an episode is retried without backoff (a
        dropped connection: the retry goes to the coordinator found again); repeated failures
        back off exponentially from retry.backoff.ms. ``skip_backoff``: retried without
        backoff, and the exponent starts again (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE:
        the Java client resets its heartbeat's request state; the coordinator lookup that
        comes first is what paces the retries, see `CoordinatorManager`)."""
        self._last_received_ms = now_ms
        if self._attempts == 0:  # a new episode (every success resets the attempts)
            self._exponent = 0
        if skip_backoff or (immediate_first and self._attempts == 0):
            self._backoff_ms = 0
            self._exponent = 0
        else:
            self._backoff_ms = self._backoff.backoff_ms(self._exponent)
            self._exponent += 1
        self._attempts += 1
        self._last_failed = True
        self._timer_deadline_ms = None

    def expedite(self) -> None:
        """The next heartbeat may go right away (no interval, no backoff left); unlike
        `reset`, failures keep counting, so one more failure backs off further."""
        self._backoff_ms = 0
        self._timer_deadline_ms = None

    def reset(self) -> None:
        """Skip the backoff and the interval: the next heartbeat may go right away."""
        self._last_received_ms = None
        self._attempts = 0
        self._backoff_ms = 0
        self._last_failed = False
        self._timer_deadline_ms = None

    def update_interval(self, interval_ms: int, sent_ms: int) -> None:
        """The broker's interval, from the answer to a heartbeat sent at ``sent_ms``; a
        changed one counts from that send, as every interval does."""
        if interval_ms != self.interval_ms:
            self.interval_ms = interval_ms
            self._timer_deadline_ms = sent_ms + interval_ms

    def backoff_remaining(self, now_ms: int) -> int:
        if self._last_received_ms is None:
            return 0
        return max(0, self._backoff_ms - (now_ms - self._last_received_ms))

    def failure_backoff_remaining(self, now_ms: int) -> int:
        """Backoff still due after a failed attempt (immediate heartbeats respect only this)."""
        return self.backoff_remaining(now_ms) if self._last_failed else 0

    def regular_wait(self, now_ms: int) -> int:
        """Until a heartbeat on the regular schedule may go: the larger of
        `interval_remaining` and `backoff_remaining` (one call: read on every poll)."""
        deadline = self._timer_deadline_ms
        wait = 0 if deadline is None else deadline - now_ms
        last = self._last_received_ms
        if last is not None:
            backoff = self._backoff_ms - (now_ms - last)
            if backoff > wait:
                wait = backoff
        return wait if wait > 0 else 0

    def interval_remaining(self, now_ms: int) -> int:
        if self._timer_deadline_ms is None:
            return 0
        return max(0, self._timer_deadline_ms - now_ms)


@dataclass(slots=True)
class _SentFields:
    """What the last heartbeats carried, to send only changes (reset after errors)."""

    rebalance_timeout_ms: int | None = None
    subscription: tuple[tuple[str, ...], str] | None = None
    server_assignor: str | None = None
    assignment: LocalAssignment | None = None


class HeartbeatRequestManager:
    """Builds heartbeats when due and applies the error policy to their outcomes."""

    __slots__ = (
        "_cfg",
        "_confirmed_sent_ms",
        "_coordinator_known",
        "_in_flight",
        "_join_answered",
        "_lane",
        "_lane_answered",
        "_lane_sent",
        "_m",
        "_metrics",
        "_plain",
        "_poll_deadline_ms",
        "_regular_count",
        "_sent",
        "_sm",
        "_timing",
        "_unreleased_since_ms",
        "session_timeout_ms",
    )

    def __init__(
        self,
        membership: MembershipManager,
        metrics: MembershipMetrics,
        rng: random.Random,
    ) -> None:
        cfg = membership.config
        self._m = membership
        self._sm = membership.state_machine  # ``self._sm.state``: the member's state
        self._cfg = cfg
        self._metrics = metrics
        # The lane's notes (see `MembershipMetrics.settle`): the lists, not their bound
        # ``append`` (a deep copy of the core would keep that bound to the original's list).
        self._lane_sent = metrics.lane_sent
        self._lane_answered = metrics.lane_answered
        self._timing = HeartbeatTiming(
            Backoff(cfg.retry_backoff_ms, cfg.retry_backoff_max_ms, cfg.retry_backoff_jitter, rng)
        )
        self._sent = _SentFields()
        self._plain: HeartbeatRequest | None = None  # see `_build_plain`
        self._in_flight: list[_InFlight] = []
        self._regular_count = 0  # REGULAR heartbeats in ``_in_flight``
        self._coordinator_known = False
        self._poll_deadline_ms: int | None = None
        # The generation whose join heartbeat was answered without an assignment: its next
        # join heartbeat waits for the interval instead of going out at once.
        self._join_answered: int | None = None
        #: The group's session timeout as the broker reported it (None: not known yet).
        self.session_timeout_ms: int | None = None
        # When the last heartbeat answered without error was sent (see membership.stall).
        self._confirmed_sent_ms: int | None = None
        # When a join was first refused with UNRELEASED_INSTANCE_ID in this episode.
        self._unreleased_since_ms: int | None = None
        # The heartbeats' lane, open (the plain request) or closed (None). Open: the last
        # heartbeat went out through `stable_beat` after its full checks, and nothing but
        # `stable_beat`, `quiet_answer` and `stable_poll` entered the core since. What those
        # checks read (the coordinator, the plain request and what was last sent, closed or
        # failed, the in-flight record's kind and generation) only changes through another
        # entry, and every other entry closes the lane (`close_lane`): while it is open the
        # fast paths skip those checks. The state, the time-dependent checks (the poll
        # timer, the interval, the backoff) and the answer's own are made on every beat.
        self._lane: HeartbeatRequest | None = None

    # ------------------------------------------------------------------------------------------
    # Views
    # ------------------------------------------------------------------------------------------

    @property
    def timing(self) -> HeartbeatTiming:
        return self._timing

    @property
    def coordinator_known(self) -> bool:
        return self._coordinator_known

    @property
    def confirmed_sent_ms(self) -> int | None:
        """When the last heartbeat answered without error was sent (None: none yet)."""
        return self._confirmed_sent_ms

    @property
    def effective_session_timeout_ms(self) -> int:
        """The session timeout the broker reported, else the broker's default."""
        return self.session_timeout_ms or DEFAULT_SESSION_TIMEOUT_MS

    @property
    def coordinator_needed(self) -> bool:
        """The member wants to heartbeat but has no coordinator: the host should find one."""
        return not self._coordinator_known and not self._m.should_skip_heartbeat()

    @property
    def in_flight(self) -> int:
        """Heartbeats sent and not yet answered (leaves included)."""
        return len(self._in_flight)

    def _regular_in_flight(self) -> bool:
        return self._regular_count > 0

    # ------------------------------------------------------------------------------------------
    # Coordinator and poll timer
    # ------------------------------------------------------------------------------------------

    def close_lane(self) -> None:
        """Any entry of the core other than the fast paths: the next beat checks in full."""
        self._lane = None

    def on_coordinator_known(self, now_ms: int, changed: bool = False) -> None:
        """The host found the coordinator. ``changed``: another node than the one the member
        last heartbeated to. The next heartbeat then goes at once, without waiting for the
        interval or the backoff left from failures at the previous node (as librdkafka
        expedites it on a coordinator change): the backoff protects a coordinator that keeps
        failing, and this one has not been tried yet. Failures keep counting, so one at the
        new node backs off further."""
        self._lane = None
        self._coordinator_known = True
        if changed and self._m.state not in NOT_IN_GROUP:
            self._m.log.debug("Coordinator changed: the next heartbeat goes at once")
            self._timing.expedite()

    def on_coordinator_unknown(self, now_ms: int) -> None:
        self._lane = None
        self._coordinator_known = False

    def reset_poll_timer(self, now_ms: int) -> None:
        """The application called ``poll()``: restart ``max.poll.interval.ms``."""
        if self._poll_deadline_ms is not None and now_ms >= self._poll_deadline_ms:
            self._m.log.warning(
                "Time between polls exceeded max.poll.interval.ms by about %d ms",
                now_ms - self._poll_deadline_ms,
            )
        self._poll_deadline_ms = now_ms + self._cfg.rebalance_timeout_ms

    def stable_poll(self, now_ms: int) -> bool:
        """The application polled at ``now_ms`` while the member is STABLE: what
        ``handle(Poll(now_ms))`` does then (restart the poll timer), without the event. False
        (and nothing done) in any other state, or once closed or fatal: the caller then
        submits the `Poll` event."""
        m = self._m
        if self._sm.state is not S.STABLE or m._closed or m._fatal is not None:
            return False
        m._now = now_ms  # `m.handle_poll`: nothing else for a STABLE member
        deadline = self._poll_deadline_ms
        if deadline is not None and now_ms >= deadline:
            self.reset_poll_timer(now_ms)  # (it warns)
        else:  # `reset_poll_timer`, inline
            self._poll_deadline_ms = now_ms + self._cfg.rebalance_timeout_ms
        return True

    def poll_timer_expired(self, now_ms: int) -> bool:
        return self._poll_deadline_ms is not None and now_ms >= self._poll_deadline_ms

    # ------------------------------------------------------------------------------------------
    # Poll
    # ------------------------------------------------------------------------------------------

    def poll(self, now_ms: int) -> PollResult:
        """The heartbeat to send now, if any, and the time until the next call."""
        self._lane = None
        m = self._m
        state = self._sm.state
        if state is S.FATAL:
            return _poll_result((None, self.time_until_next_poll(now_ms)))
        if not self._coordinator_known or state in NOT_IN_GROUP:
            if not self._coordinator_known:
                m.on_heartbeat_request_skipped(now_ms, "coordinator unknown")
            return _poll_result((None, self.time_until_next_poll(now_ms)))

        deadline = self._poll_deadline_ms
        if deadline is not None and now_ms >= deadline and state not in LEAVING_STATES:
            m.log.warning(
                "Consumer poll timeout expired: the time between poll() calls exceeded "
                "max.poll.interval.ms (%d ms). Leaving the group; the member rejoins on the "
                "next poll(). Increase max.poll.interval.ms or process fewer records per poll.",
                self._cfg.rebalance_timeout_ms,
            )
            m.transition_to_sending_leave_group(now_ms, due_to_poll_timer=True)
            request = self._send(now_ms, _Kind.STALE_LEAVE)
            # The answer is ignored; the member may rejoin before or after it arrives.
            self._timing.reset()
            self._sent = _SentFields()
            return _poll_result((request, self.time_until_next_poll(now_ms)))

        if state is S.LEAVING:
            if m.leave_epoch() is None:
                m.on_heartbeat_request_skipped(now_ms, "close option REMAIN_IN_GROUP")
                return _poll_result((None, self.time_until_next_poll(now_ms)))
            # A leave goes out even if another heartbeat is in flight, and only once.
            request = self._send(now_ms, _Kind.LEAVE)
            return _poll_result((request, self.time_until_next_poll(now_ms)))

        if self._regular_count == 0 and self._can_send(now_ms, state):
            request = self._send(now_ms, _Kind.REGULAR)
            return _poll_result((request, self.time_until_next_poll(now_ms)))
        return _poll_result((None, self.time_until_next_poll(now_ms)))

    def stable_beat(self, now_ms: int, polled_ms: int = 0) -> tuple[HeartbeatRequest, int] | None:
        """A STABLE member's heartbeat on the regular schedule when nothing changed since the
        last one: the plain request `poll` would send now and the wait it would return, with
        the same bookkeeping; None (and nothing done) when anything else applies: the caller
        then calls `poll`. The host's per-heartbeat fast path: the tests here are `poll`'s,
        `_can_send`'s and `_build`'s for this one case, inline.

        ``polled_ms`` (0: none): the application's latest poll, not taken in yet: what
        `stable_poll` does with it comes first (the poll timer restarts), in the same call;
        declined (and nothing done) where `stable_poll` would decline or warn, so the caller
        then hands it over the usual way before `poll`."""
        m = self._m
        if self._sm.state is not S.STABLE or self._regular_count:
            return None
        deadline = self._poll_deadline_ms
        if polled_ms:  # `stable_poll(polled_ms)`, applied below once nothing declines
            if deadline is not None and polled_ms >= deadline:
                return None
            deadline = polled_ms + self._cfg.rebalance_timeout_ms
        if deadline is not None and now_ms >= deadline:
            return None  # the poll timer expired: `poll` leaves the group
        timing = self._timing
        # `timing.regular_wait(now_ms) == 0`, inline
        due = timing._timer_deadline_ms
        if due is not None and due > now_ms:
            return None
        last = timing._last_received_ms
        if last is not None and timing._backoff_ms > now_ms - last:
            return None
        # `_build` would return the plain request: nothing to send again since the last one
        # (and the coordinator known, and, with a poll, not closed or failed); while the lane
        # is open, nothing that those read has changed (see ``_lane``)
        plain = self._lane
        if plain is None:
            plain = self._plain
            sent = self._sent
            cfg = self._cfg
            if (
                plain is None
                or not self._coordinator_known
                or (polled_ms and (m._closed or m._fatal is not None))
                or plain.member_epoch != m._epoch
                or sent.assignment is not m._rec.current
                or sent.rebalance_timeout_ms != cfg.rebalance_timeout_ms
                or m._subscription is None
                or m._subscription is not m._fields_of
                or (sent.subscription is not m._fields and sent.subscription != m._fields)
                or (cfg.remote_assignor is not None and sent.server_assignor != cfg.remote_assignor)
            ):
                return None
            self._lane = plain
        if polled_ms:
            self._poll_deadline_ms = deadline  # (`stable_poll`'s ``m._now`` is set below)
        # `_send(now_ms, _Kind.REGULAR)`: not off schedule (STABLE), and
        # `m.on_heartbeat_request_generated` only notes the time for a STABLE member
        self._in_flight.append(_in_flight((plain, _Kind.REGULAR, now_ms, m._generation)))
        self._regular_count = 1
        timing._timer_deadline_ms = now_ms + timing.interval_ms
        self._lane_sent.append(now_ms)  # `self._metrics.record_heartbeat_sent(now_ms)`, lazily
        if LEVELS_CACHED.get(_DEBUG, True) and LOGGER.isEnabledFor(_DEBUG):
            m.log.debug("Sending %s heartbeat %s", _Kind.REGULAR.value, plain)
        m._now = now_ms
        # `time_until_next_poll`: a regular heartbeat in flight (the answer wakes the host)
        wait = timing.interval_ms
        if self._cfg.retry_backoff_max_ms > wait:
            wait = self._cfg.retry_backoff_max_ms
        if deadline is not None:
            half = (deadline - now_ms + 1) // 2
            if half < wait:
                wait = half
        return plain, wait

    def quiet_answer(
        self, now_ms: int, response: HeartbeatResponse, request: HeartbeatRequest
    ) -> tuple[int, int] | None:
        """Apply the answer to a STABLE member's regular heartbeat when it changes nothing (no
        error, no assignment, the same epoch, member id and interval): the bookkeeping
        `on_response` does for it. Returns `time_until_next_poll` then, and the new
        handout deadline (`consumer_sdk.membership.stall`), or None (and nothing done) for
        any other answer: the caller then calls `on_response`."""
        m = self._m
        in_flight = self._in_flight
        if (
            response.error_code
            or response.assignment is not None
            or self._sm.state is not S.STABLE
            or not in_flight
        ):
            return None
        record = in_flight[0]
        timing = self._timing
        if (
            record.request is not request
            or (
                # while the lane is open (see ``_lane``), its own heartbeat's record
                self._lane is not request
                and (
                    not self._coordinator_known
                    or record.kind is not _Kind.REGULAR
                    or record.generation != m._generation
                )
            )
            or response.member_epoch != m._epoch
            or (response.member_id and response.member_id != m._member_id)
            or (
                response.heartbeat_interval_ms > 0
                and response.heartbeat_interval_ms != timing.interval_ms
            )
        ):
            return None
        del in_flight[0]
        self._regular_count -= 1
        # `self._metrics.record_heartbeat_response_time(now_ms, now_ms - sent_ms)`, lazily
        sent_ms = record.sent_ms
        answered = self._lane_answered
        answered.append((now_ms, sent_ms))
        if len(answered) >= _LANE_NOTES:
            self._metrics.settle()
        # `timing.on_success(now_ms)`, inline (the backoff's jitter is drawn as there, with
        # `Backoff.backoff_ms(0)`'s arithmetic: see `Backoff.low`)
        timing._last_received_ms = now_ms
        timing._attempts = 0
        backoff = timing._backoff
        low = backoff.low
        if low is None:
            timing._backoff_ms = backoff._base
        elif backoff.span:
            factor = low + backoff.span * backoff._rng.random()
            timing._backoff_ms = min(backoff._max, int(backoff._base * factor))
        else:
            timing._backoff_ms = min(backoff._max, backoff._base)
        timing._last_failed = False
        self._unreleased_since_ms = None
        confirmed = self._confirmed_sent_ms
        if confirmed is None or sent_ms > confirmed:
            self._confirmed_sent_ms = sent_ms
            confirmed = sent_ms
        m._now = now_ms  # `m.on_heartbeat_success`: nothing else for this answer
        handout = confirmed + (self.session_timeout_ms or DEFAULT_SESSION_TIMEOUT_MS)
        if self._regular_count:
            return self.time_until_next_poll(now_ms), handout
        # `time_until_next_poll` for a STABLE member with no regular heartbeat in flight
        deadline = self._poll_deadline_ms
        half = -1
        if deadline is not None:
            if deadline <= now_ms:
                return 0, handout
            half = (deadline - now_ms + 1) // 2
        # `timing.regular_wait(now_ms)`, inline (just answered: the backoff counts from now)
        due = timing._timer_deadline_ms
        wait = 0 if due is None else due - now_ms
        if timing._backoff_ms > wait:
            wait = timing._backoff_ms
        if wait < 0:
            wait = 0
        return (half if 0 <= half < wait else wait), handout

    def _heartbeat_now(self, state: MemberState) -> bool:
        """JOINING, ACKNOWLEDGING and LEAVING heartbeat at once, except a join already answered
        without an assignment (librdkafka's mock answers epoch 0 and none while the target's
        partitions are held elsewhere): retried at once, it would loop as fast as the broker
        answers. Like librdkafka, it waits for the interval (a real broker always answers a
        join with an assignment)."""
        if state is S.JOINING and self._join_answered == self._m.generation:
            return False
        return state in HEARTBEAT_NOW

    def _can_send(self, now_ms: int, state: MemberState) -> bool:
        if self._regular_count > 0:
            return False
        timing = self._timing
        # `_heartbeat_now`, its call saved for the other states (STABLE: every heartbeat)
        if self._heartbeat_now(state) if state is S.JOINING else state in HEARTBEAT_NOW:
            return timing.failure_backoff_remaining(now_ms) == 0
        return timing.regular_wait(now_ms) == 0

    def time_until_next_poll(self, now_ms: int) -> int:
        """How long the host may wait before calling `poll` again."""
        state = self._sm.state
        timing = self._timing
        idle = timing.interval_ms
        backoff_max = self._cfg.retry_backoff_max_ms
        if backoff_max > idle:
            idle = backoff_max
        if state in NOT_IN_GROUP:  # FATAL included
            return idle
        if not self._coordinator_known:
            return 0 if state is S.LEAVING else idle
        if state is S.LEAVING:
            return 0
        deadline = self._poll_deadline_ms
        half = -1  # half the time left before the poll timer expires (-1: no timer)
        if deadline is not None and state not in LEAVING_STATES:
            poll_remaining = deadline - now_ms
            if poll_remaining <= 0:
                return 0
            half = (poll_remaining + 1) // 2
        if self._regular_count > 0:
            wait = idle  # the response wakes the host up
        elif self._heartbeat_now(state) if state is S.JOINING else state in HEARTBEAT_NOW:
            wait = timing.failure_backoff_remaining(now_ms)
        else:
            wait = timing.regular_wait(now_ms)
        if 0 <= half < wait:
            wait = half
        return wait

    # ------------------------------------------------------------------------------------------
    # Building requests
    # ------------------------------------------------------------------------------------------

    def _send(self, now_ms: int, kind: _Kind) -> HeartbeatRequest:
        m = self._m
        # An acknowledgement sent before the interval is up leaves the regular schedule as it
        # is: restarting the interval (as the Java client does) would delay what the next
        # heartbeat brings, such as the partitions a new member gets once the others have
        # released them, by the callbacks' time. (librdkafka does not acknowledge an empty
        # first assignment at all, so its schedule does not move either.)
        off_schedule = (
            self._sm.state is S.ACKNOWLEDGING and self._timing.interval_remaining(now_ms) > 0
        )
        request = self._build() if kind is _Kind.REGULAR else self._build_plain()
        self._in_flight.append(_in_flight((request, kind, now_ms, m.generation)))
        if kind is _Kind.REGULAR:
            self._regular_count += 1
        if not off_schedule:
            self._timing.on_send(now_ms)
        self._metrics.record_heartbeat_sent(now_ms)
        if LOGGER.isEnabledFor(logging.DEBUG):
            m.log.debug("Sending %s heartbeat %s", kind.value, request)
        m.on_heartbeat_request_generated(now_ms)
        if kind is not _Kind.REGULAR:
            self._sent = _SentFields()
        return request

    def _build_plain(self) -> HeartbeatRequest:
        """Only the identity fields (a leave, or a plain heartbeat that changes nothing).

        Requests are immutable, so the last one is reused while the epoch is the same: most
        heartbeats of a stable member are this one."""
        epoch = self._m.member_epoch
        plain = self._plain
        if plain is None or plain.member_epoch != epoch:
            plain = self._plain = HeartbeatRequest(
                group_id=self._cfg.group_id,
                member_id=self._m.member_id,
                member_epoch=epoch,
                instance_id=self._cfg.group_instance_id,
            )
        return plain

    def _build(self) -> HeartbeatRequest:
        """A full heartbeat when joining, else only what changed since it was last sent."""
        m = self._m
        cfg = self._cfg
        sent = self._sent
        full = self._sm.state is S.JOINING
        current = m.current_assignment
        assignment_changed = sent.assignment is not current and sent.assignment != current

        if not full and assignment_changed and m.holds_unacked_partitions:
            # TopicPartitions would be the acked set, which lacks partitions the member holds
            # mid-reconciliation. The coordinator reads a missing partition as released (a
            # revocation ack) and may hand it to another member while this one is about to
            # enable it. So keep it out, and everything else with it (the full heartbeat that
            # makes the coordinator resend the assignment needs TopicPartitions): a plain
            # heartbeat now, the full one once the pass has been applied.
            return self._build_plain()

        rebalance_timeout_ms = -1
        if full or sent.rebalance_timeout_ms != cfg.rebalance_timeout_ms:
            rebalance_timeout_ms = cfg.rebalance_timeout_ms
            sent.rebalance_timeout_ms = rebalance_timeout_ms

        # Names and regex always travel together (the embedded mock broker requires it).
        names: tuple[str, ...] | None = None
        regex: str | None = None
        subscription = m.subscription_fields
        if subscription is not None and (full or sent.subscription != subscription):
            names, regex = subscription
            sent.subscription = subscription

        assignor: str | None = None
        if cfg.remote_assignor is not None and (
            full or sent.server_assignor != cfg.remote_assignor
        ):
            assignor = cfg.remote_assignor
            sent.server_assignor = assignor

        # TopicPartitions is the ack: sent on join and whenever the local assignment changes.
        topic_partitions = None
        if full or assignment_changed:
            topic_partitions = current.to_wire()
            sent.assignment = current
        elif rebalance_timeout_ms == -1 and names is None and assignor is None:
            return self._build_plain()  # nothing changed (regex is None with names)

        return HeartbeatRequest(
            group_id=cfg.group_id,
            member_id=m.member_id,
            member_epoch=m.member_epoch,
            instance_id=cfg.group_instance_id,
            rack_id=cfg.client_rack if full else None,
            rebalance_timeout_ms=rebalance_timeout_ms,
            subscribed_topic_names=names,
            subscribed_topic_regex=regex,
            server_assignor=assignor,
            topic_partitions=topic_partitions,
        )

    def reset_sent_fields(self) -> None:
        """Make the next heartbeat full (after any error or failure)."""
        self._lane = None
        self._sent = _SentFields()

    # ------------------------------------------------------------------------------------------
    # Outcomes
    # ------------------------------------------------------------------------------------------

    def _pop(self, request: HeartbeatRequest | None) -> _InFlight | None:
        in_flight = self._in_flight
        if in_flight and in_flight[0].request is request:  # nearly always: the oldest
            record: _InFlight | None = in_flight.pop(0)
        else:
            record = self._take(request)
        if record is not None and record.kind is _Kind.REGULAR:
            self._regular_count -= 1
        return record

    def _take(self, request: HeartbeatRequest | None) -> _InFlight | None:
        in_flight = self._in_flight
        if in_flight and in_flight[0].request is request:  # nearly always: the oldest
            return in_flight.pop(0)
        if request is not None:
            for i, record in enumerate(self._in_flight):
                if record.request is request:
                    return self._in_flight.pop(i)
            for i, record in enumerate(self._in_flight):
                if record.request == request:
                    return self._in_flight.pop(i)
        if self._in_flight:
            return self._in_flight.pop(0)
        return None

    def on_response(
        self, now_ms: int, response: HeartbeatResponse, request: HeartbeatRequest | None = None
    ) -> None:
        """Apply a heartbeat response (``request``: the one it answers; default the oldest)."""
        self._lane = None
        m = self._m
        record = self._pop(request)
        if record is None:
            m.log.warning("Ignoring a heartbeat response with no heartbeat in flight")
            return
        self._metrics.record_heartbeat_response_time(now_ms, now_ms - record.sent_ms)
        if record.kind is _Kind.STALE_LEAVE:
            m.log.debug(
                "Ignoring the response to the poll-expiry leave heartbeat (%s)",
                E.name_of(response.error_code),
            )
            return
        stale = record.generation != m.generation
        if response.error_code == E.NONE:
            interval = response.heartbeat_interval_ms
            if interval > 0 and interval != self._timing.interval_ms:
                self._timing.update_interval(interval, record.sent_ms)
            self._timing.on_success(now_ms)
            if record.kind is _Kind.REGULAR:
                self._unreleased_since_ms = None
                if self._confirmed_sent_ms is None or record.sent_ms > self._confirmed_sent_ms:
                    self._confirmed_sent_ms = record.sent_ms
            if stale:
                m.log.debug("Ignoring a heartbeat response from an earlier membership")
            else:
                m.on_heartbeat_success(now_ms, response)
                if self._sm.state is S.RECONCILING:  # (maybe_reconcile's first test)
                    m.maybe_reconcile(now_ms, can_commit=False)
                if self._sm.state is S.JOINING:
                    self._join_answered = m.generation
        else:
            self._on_error_response(now_ms, response, stale)
        if record.kind is _Kind.LEAVE:
            m.complete_leave()

    def _log_episode(self, message: str, *args: object, warn: bool = False) -> None:
        """INFO (WARNING with ``warn``) for the first failure of an episode (failures since
        the last success), DEBUG for the retries that follow."""
        if self._timing.failed_attempts > 1:
            self._m.log.debug(message, *args)
        elif warn:
            self._m.log.warning(message, *args)
        else:
            self._m.log.info(message, *args)

    def _on_error_response(self, now_ms: int, response: HeartbeatResponse, stale: bool) -> None:
        m = self._m
        code = response.error_code
        name = E.name_of(code)
        detail = response.error_message or ""
        self._sent = _SentFields()
        moved = code in (E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE)
        self._timing.on_failure(now_ms, skip_backoff=moved)

        if moved:
            # Rediscover, then retry as soon as the coordinator is found, without backoff (as
            # the Java client does): while a new coordinator takes the group over it refuses
            # with NOT_COORDINATOR, and the lookup before each retry, one at most every
            # retry.backoff.ms, paces them (an exponential backoff here left the member up
            # to 400-800 ms behind a coordinator that had become ready). Logged once per
            # episode.
            self._coordinator_known = False
            self._log_episode(
                "Heartbeat failed with %s: finding the coordinator again, then retrying %s",
                name,
                detail,
            )
        elif code == E.COORDINATOR_LOAD_IN_PROGRESS:
            self._log_episode(
                "Heartbeat failed with %s; retrying with backoff (next in %d ms) %s",
                name,
                self._timing.backoff_remaining(now_ms),
                detail,
            )
        elif code in (E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID):
            self._timing.reset()  # rejoin as soon as the assignment is released
            if stale:
                m.log.info("Ignoring %s for a heartbeat of an earlier membership", name)
            else:
                m.log.warning("Heartbeat failed with %s: member is fenced %s", name, detail)
                m.transition_to_fenced(now_ms, code)
        elif code == E.TOPIC_AUTHORIZATION_FAILED:
            m.log.error(
                "Heartbeat failed with %s while %s; retrying in %d ms %s",
                name,
                m.state,
                self._timing.backoff_remaining(now_ms),
                detail,
            )
            if not stale:
                m.emit_error(code, _message(code, detail, "Not authorized to access topics"))
        elif code == E.GROUP_ID_NOT_FOUND and (stale or m.state is S.UNSUBSCRIBED):
            m.log.info("Ignoring %s: the member already left the group", name)
        elif stale:
            m.log.warning("Ignoring %s for a heartbeat of an earlier membership %s", name, detail)
        elif code == E.UNRELEASED_INSTANCE_ID and self._retry_unreleased(now_ms):
            self._log_episode(
                "Join refused with %s: the broker still counts an earlier incarnation of "
                "group.instance.id %r; retrying with backoff until it can have expired "
                "(%d ms left) %s",
                name,
                m.config.group_instance_id,
                self._unreleased_left_ms(now_ms),
                detail,
            )
        else:
            m.log.error("Heartbeat failed with fatal error %s %s", name, detail)
            if code == E.UNRELEASED_INSTANCE_ID and self._unreleased_since_ms is not None:
                detail = (
                    f"group.instance.id {m.config.group_instance_id!r} is still in use by a "
                    f"live member: joins were refused for "
                    f"{now_ms - self._unreleased_since_ms} ms, longer than the group's session "
                    f"timeout ({self.effective_session_timeout_ms} ms), so it is not an "
                    f"incarnation that crashed. {detail}"
                ).rstrip()
            message = _fatal_message(code, detail)
            subscription = m.subscription_fields
            if code == E.INVALID_REGULAR_EXPRESSION and subscription and subscription[1]:
                message = f"subscription pattern {subscription[1]!r}: {message}"
            m.transition_to_fatal(now_ms, code, message)
        m.on_heartbeat_failure(now_ms, retriable=False)

    def _unreleased_left_ms(self, now_ms: int) -> int:
        assert self._unreleased_since_ms is not None
        deadline = unreleased_retry_deadline_ms(
            self._unreleased_since_ms, self.effective_session_timeout_ms, self._timing.interval_ms
        )
        return deadline - now_ms

    def _retry_unreleased(self, now_ms: int) -> bool:
        """A join refused with UNRELEASED_INSTANCE_ID is retried (the member stays JOINING,
        owning nothing) until the broker can have expired a crashed incarnation."""
        if self._m.state is not S.JOINING or not self._m.config.is_static:
            return False
        if self._unreleased_since_ms is None:
            self._unreleased_since_ms = now_ms
        return self._unreleased_left_ms(now_ms) > 0

    def on_failure(
        self, now_ms: int, failure: Failure, request: HeartbeatRequest | None = None
    ) -> None:
        """A heartbeat got no response (timeout, disconnect, client-side error)."""
        self._lane = None
        m = self._m
        record = self._pop(request)
        if record is None:
            m.log.warning("Ignoring a heartbeat failure with no heartbeat in flight")
            return
        if record.kind is _Kind.STALE_LEAVE:
            m.log.debug("Poll-expiry leave heartbeat failed (%s); ignored", failure.kind.value)
            return
        stale = record.generation != m.generation
        self._sent = _SentFields()
        # A dropped connection to the coordinator is rediscovered and retried like
        # NOT_COORDINATOR: the first time at once, then with backoff.
        self._timing.on_failure(now_ms, immediate_first=failure.kind is FailureKind.DISCONNECTED)
        if failure.kind.retriable:
            if failure.kind is FailureKind.DISCONNECTED:
                self._coordinator_known = False
            self._log_episode(
                "Heartbeat failed (%s%s); retrying with backoff (next in %d ms)",
                failure.kind.value,
                f": {failure.message}" if failure.message else "",
                self._timing.backoff_remaining(now_ms),
                warn=True,  # a transport failure, not a coordinator that is loading
            )
        elif stale:
            m.log.warning("Ignoring %s for a heartbeat of an earlier membership", failure.kind)
        elif failure.kind is FailureKind.UNSUPPORTED_VERSION_CLIENT:
            m.transition_to_fatal(now_ms, E.UNSUPPORTED_VERSION, UNSUPPORTED_VERSION_MESSAGE)
        else:
            m.log.error("Heartbeat failed with fatal %s: %s", failure.kind.value, failure.message)
            m.transition_to_fatal(
                now_ms,
                E.UNKNOWN_SERVER_ERROR,
                f"Heartbeat failed ({failure.kind.value}): {failure.message}".rstrip(": "),
            )
        m.on_heartbeat_failure(now_ms, retriable=failure.kind.retriable)
        if record.kind is _Kind.LEAVE:
            m.complete_leave()


def _message(code: int, detail: str, default: str) -> str:
    name = E.name_of(code)
    return f"{name}: {detail}" if detail else f"{name}: {default}"


def _fatal_message(code: int, detail: str) -> str:
    if code == E.UNSUPPORTED_VERSION:
        return (
            f"{UNSUPPORTED_VERSION_MESSAGE} ({detail})" if detail else UNSUPPORTED_VERSION_MESSAGE
        )
    if code == E.INVALID_REGULAR_EXPRESSION:
        return _message(code, detail, "the subscription pattern is not a valid RE2J expression")
    if code == E.GROUP_AUTHORIZATION_FAILED:
        return _message(code, detail, "Not authorized to access the group")
    return _message(code, detail, "heartbeat failed")
