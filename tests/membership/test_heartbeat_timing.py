"""Heartbeat timing: interval, immediate heartbeats, in-flight rule, backoff."""

from __future__ import annotations

import random

import pytest

from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.membership import FailureKind, MemberState
from consumer_sdk.membership.heartbeat import Backoff, HeartbeatTiming

from .harness import INTERVAL, T1, Driver, cfg, err, ok, stable

S = MemberState


def test_no_heartbeat_before_subscribe_and_poll() -> None:
    d = Driver()
    assert d.hb() is None
    d.subscribe("t1")
    assert d.state is S.UNSUBSCRIBED
    assert d.hb() is None  # subscribe alone does not join: the next poll() does
    d.app_poll()
    assert d.state is S.JOINING
    assert d.core.time_until_next_poll(d.now) == 0


def test_heartbeat_on_startup_is_immediate() -> None:
    d = Driver()
    req = d.join("t1")
    assert req.member_epoch == 0


def test_heartbeat_not_sent_while_another_is_in_flight() -> None:
    d = Driver()
    d.join("t1")
    d.advance(60_000)
    assert d.hb() is None  # JOINING is immediate, but the join is still in flight
    d.respond(ok(1))
    assert d.core.in_flight_heartbeats == 0


def test_interval_comes_from_the_broker() -> None:
    d = stable()
    d.advance(INTERVAL - 1)
    assert d.hb() is None
    assert d.core.time_until_next_poll(d.now) == 1
    d.advance(1)
    req = d.must_hb()
    assert req.member_epoch == 1
    d.advance(10)
    d.respond(ok(1, interval=7000))
    assert d.core.heartbeat_interval_ms == 7000
    # A changed interval counts from the send of the heartbeat that brought it.
    d.advance(6989)
    assert d.hb() is None
    d.advance(1)
    assert d.hb() is not None


def test_unchanged_interval_keeps_counting_from_the_send() -> None:
    d = stable()
    d.advance(INTERVAL)
    d.must_hb()
    d.advance(1000)
    d.respond(ok(1))
    d.advance(INTERVAL - 1000)
    assert d.hb() is not None


def test_acknowledging_heartbeats_immediately() -> None:
    d = Driver()
    d.metadata()
    d.join("t1")
    d.respond(ok(1, {T1: [0]}))
    d.app_poll()
    d.run_callbacks()
    assert d.state is S.ACKNOWLEDGING
    assert d.core.time_until_next_poll(d.now) == 0
    ack = d.must_hb()  # no need to wait for the interval
    assert ack.topic_partitions is not None


def test_an_acknowledgement_keeps_the_regular_schedule() -> None:
    d = Driver()
    d.metadata()
    join_sent = d.now
    d.join("t1")
    d.advance(15)
    d.respond(ok(1, {T1: [0]}))  # the first interval counts from the join's send
    d.advance(25)  # the application's callbacks
    d.app_poll()
    d.run_callbacks()
    ack = d.must_hb()
    assert ack.topic_partitions is not None
    d.advance(5)
    d.respond(ok(1))
    assert d.state is S.STABLE
    assert d.core.time_until_next_poll(d.now) == join_sent + INTERVAL - d.now
    d.advance(join_sent + INTERVAL - d.now - 1)
    assert d.hb() is None
    d.advance(1)
    regular = d.must_hb()
    assert regular.topic_partitions is None
    # A regular heartbeat restarts the interval.
    d.respond(ok(1))
    d.advance(INTERVAL - 1)
    assert d.hb() is None
    d.advance(1)
    assert d.hb() is not None


def test_skipping_heartbeat_when_unsubscribed() -> None:
    d = Driver()
    assert d.state is S.UNSUBSCRIBED
    assert d.hb() is None
    assert d.core.time_until_next_poll(d.now) > 0


@pytest.mark.parametrize("state", [S.FENCED, S.STALE, S.FATAL])
def test_no_heartbeat_in_skip_states(state: MemberState) -> None:
    from .harness import drive_to

    d = drive_to(state)
    d.advance(60_000)
    assert d.hb() is None
    assert d.core.time_until_next_poll(d.now) >= 1000


def test_no_coordinator_means_no_heartbeat_and_no_spin() -> None:
    d = Driver()
    d.core.on_coordinator_unknown(d.now)
    d.subscribe("t1")
    d.app_poll()
    assert d.core.coordinator_needed
    assert d.hb() is None
    assert d.core.time_until_next_poll(d.now) >= 1000  # does not spin
    d.core.on_coordinator_known(d.now)
    assert not d.core.coordinator_needed
    assert d.hb() is not None


def test_coordinator_not_needed_when_not_in_group() -> None:
    d = Driver()
    d.core.on_coordinator_unknown(d.now)
    assert not d.core.coordinator_needed


def test_backoff_values_grow_exponentially_with_jitter_and_cap() -> None:
    rng = random.Random(7)
    backoff = Backoff(100, 1000, 0.2, rng)
    for attempts, nominal in [(0, 100), (1, 200), (2, 400), (3, 800)]:
        for _ in range(50):
            value = backoff.backoff_ms(attempts)
            assert nominal * 0.8 - 1 <= value <= nominal * 1.2
    for attempts in (4, 5, 10, 100):
        for _ in range(50):
            assert 800 <= backoff.backoff_ms(attempts) <= 1000
    no_jitter = Backoff(100, 1000, 0.0, rng)
    assert [no_jitter.backoff_ms(n) for n in range(6)] == [100, 200, 400, 800, 1000, 1000]


def test_backoff_is_deterministic_for_a_seed() -> None:
    a = Backoff(100, 1000, 0.2, random.Random(3))
    b = Backoff(100, 1000, 0.2, random.Random(3))
    assert [a.backoff_ms(n) for n in range(8)] == [b.backoff_ms(n) for n in range(8)]


def test_timing_reset_skips_backoff() -> None:
    timing = HeartbeatTiming(Backoff(100, 1000, 0.0, random.Random(0)))
    timing.on_failure(0)
    assert timing.backoff_remaining(0) == 100
    timing.reset()
    assert timing.backoff_remaining(0) == 0
    assert timing.interval_remaining(0) == 0


def _retry_delay(d: Driver) -> int:
    """Advance 1 ms at a time until a heartbeat goes; return the wait."""
    start = d.now
    while d.hb() is None:
        d.advance(1)
        assert d.now - start < 5000
    return d.now - start


def test_retriable_failures_back_off_exponentially_and_reset_on_success() -> None:
    d = stable(retry_backoff_jitter=0.0)
    d.advance(INTERVAL)
    d.must_hb()
    delays = []
    for _ in range(6):
        d.fail(FailureKind.TIMEOUT)
        delays.append(_retry_delay(d))
    assert delays == [100, 200, 400, 800, 1000, 1000]
    d.respond(ok(1))
    # After a success the interval applies again, and the backoff starts over.
    d.advance(INTERVAL)
    d.must_hb()
    d.fail(FailureKind.TIMEOUT)
    assert _retry_delay(d) == 100


def test_error_responses_back_off() -> None:
    d = stable(retry_backoff_jitter=0.0)
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(err(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
    assert d.state is S.STABLE
    assert d.core.time_until_next_poll(d.now) == 100
    assert _retry_delay(d) == 100


@pytest.mark.parametrize(
    "code",
    [
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.FENCED_MEMBER_EPOCH,
        ErrorCode.UNKNOWN_MEMBER_ID,
    ],
)
def test_backoff_skipped_after_coordinator_and_fencing_errors(code: ErrorCode) -> None:
    d = stable({T1: []}, retry_backoff_jitter=0.0)  # nothing owned: fencing rejoins at once
    for _ in range(3):  # build up a backoff first
        d.advance(INTERVAL)
        d.must_hb()
        d.fail(FailureKind.TIMEOUT)
        _retry_delay(d)
        d.respond(ok(1))
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(err(code))
    if code in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE):
        # The earlier failures were followed by a success, so this is the first failure of
        # a new episode: retried as soon as the coordinator is found again (as Java and
        # librdkafka do); repeated coordinator errors back off (next test).
        assert d.core.coordinator_needed
        assert d.hb() is None
        d.core.on_coordinator_known(d.now)
        assert d.core.time_until_next_poll(d.now) == 0
    else:
        assert d.state is S.JOINING
        assert d.core.time_until_next_poll(d.now) == 0  # right away, no backoff
    req = d.must_hb()
    assert req.rebalance_timeout_ms != -1  # and full


@pytest.mark.parametrize("code", [ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE])
def test_repeated_coordinator_errors_are_retried_once_the_coordinator_is_found(
    code: ErrorCode,
) -> None:
    """As the Java client: after NOT_COORDINATOR or COORDINATOR_NOT_AVAILABLE the heartbeat
    goes as soon as the coordinator is found again, every time (the lookup before it, one at
    most every retry.backoff.ms, paces the retries: `CoordinatorManager`); a
    COORDINATOR_LOAD_IN_PROGRESS that follows backs off from retry.backoff.ms, not from where
    the episode's count left it."""
    d = stable(retry_backoff_jitter=0.0)
    d.advance(INTERVAL)
    d.must_hb()
    delays = []
    for _ in range(6):
        d.respond(err(code))
        assert d.hb() is None, "no heartbeat before the coordinator is found again"
        d.core.on_coordinator_known(d.now)
        delay = d.core.time_until_next_poll(d.now)
        delays.append(delay)
        if delay:
            assert d.hb() is None
            d.advance(delay)
        d.must_hb()
    assert delays == [0, 0, 0, 0, 0, 0]
    loading = []
    for _ in range(3):
        d.respond(err(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
        loading.append(d.core.time_until_next_poll(d.now))
        assert d.hb() is None
        d.advance(loading[-1])
        d.must_hb()
    assert loading == [100, 200, 400]
    d.respond(ok(1))
    assert d.state is S.STABLE
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(err(code))  # a new episode after the success: immediate again
    d.core.on_coordinator_known(d.now)
    assert d.core.time_until_next_poll(d.now) == 0


@pytest.mark.parametrize(
    "failure",
    [ErrorCode.NOT_COORDINATOR, FailureKind.DISCONNECTED, FailureKind.TIMEOUT],
)
def test_a_changed_coordinator_gets_the_next_heartbeat_at_once(
    failure: ErrorCode | FailureKind,
) -> None:
    """Backed off after failures at one node, the member finds the coordinator on another
    (a killed broker: FindCoordinator names the dead node until its partitions move). The
    backoff protected the failing node; the new one gets the heartbeat right away, as
    librdkafka expedites it on a coordinator change. One more failure there backs off
    further than before: the episode's failures keep counting (NOT_COORDINATOR's retries
    count none: they go once the coordinator is found)."""
    d = stable(retry_backoff_jitter=0.0)
    d.advance(INTERVAL)
    d.must_hb()
    delays = []
    for _ in range(3):
        if isinstance(failure, ErrorCode):
            d.respond(err(failure))
        else:
            d.fail(failure)
        if not d.core.coordinator_known:
            d.core.on_coordinator_known(d.now)  # the same node again
        delays.append(d.core.time_until_next_poll(d.now))
        d.advance(delays[-1])
        d.must_hb()
    if isinstance(failure, ErrorCode):
        d.respond(err(failure))
    else:
        d.fail(failure)
    d.core.on_coordinator_unknown(d.now)
    d.advance(10)
    d.core.on_coordinator_known(d.now, changed=True)
    assert d.core.time_until_next_poll(d.now) == 0
    d.must_hb()
    d.fail(FailureKind.DISCONNECTED)
    d.core.on_coordinator_known(d.now)
    if failure is ErrorCode.NOT_COORDINATOR:  # retried once found, the exponent at 0
        assert delays == [0, 0, 0]
        assert d.core.time_until_next_poll(d.now) == 100
    elif failure is FailureKind.DISCONNECTED:
        assert delays == [0, 100, 200]
        assert d.core.time_until_next_poll(d.now) == 800
    else:
        assert delays == [100, 200, 400]
        assert d.core.time_until_next_poll(d.now) == 1000


def test_a_changed_coordinator_expedites_a_stable_members_heartbeat() -> None:
    """The coordinator moved and the host learned it from another request (an OffsetCommit
    answered NOT_COORDINATOR): the member heartbeats to the new node at once instead of at
    the end of the interval. Finding the same node again changes nothing."""
    d = stable()
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(ok(1))
    d.advance(100)
    d.core.on_coordinator_unknown(d.now)
    d.core.on_coordinator_known(d.now)
    assert d.core.time_until_next_poll(d.now) == INTERVAL - 100
    d.core.on_coordinator_unknown(d.now)
    d.core.on_coordinator_known(d.now, changed=True)
    assert d.core.time_until_next_poll(d.now) == 0
    assert d.must_hb().member_epoch == 1
    d.respond(ok(1))
    assert d.hb() is None  # then the interval again
    assert d.core.time_until_next_poll(d.now) == INTERVAL


def test_a_changed_coordinator_does_not_wake_a_member_out_of_the_group() -> None:
    d = Driver()
    d.core.on_coordinator_known(d.now, changed=True)
    assert d.hb() is None
    d.subscribe("t1")
    d.app_poll()
    assert d.must_hb().member_epoch == 0


def test_disconnect_marks_coordinator_unknown_timeout_does_not() -> None:
    d = stable()
    d.advance(INTERVAL)
    d.must_hb()
    d.fail(FailureKind.TIMEOUT)
    assert d.core.coordinator_known
    d.advance(1000)
    d.must_hb()
    d.fail(FailureKind.DISCONNECTED)
    assert not d.core.coordinator_known
    assert d.core.coordinator_needed
    assert d.state is S.STABLE


def test_joining_retries_after_backoff_not_in_a_tight_loop() -> None:
    d = Driver(cfg(retry_backoff_jitter=0.0))
    d.join("t1")
    d.respond(err(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
    assert d.state is S.JOINING
    assert d.hb() is None
    assert d.core.time_until_next_poll(d.now) == 100
    d.advance(100)
    assert d.must_hb().member_epoch == 0


def test_a_join_answered_without_an_assignment_waits_for_the_interval() -> None:
    """librdkafka's mock answers a joining member epoch 0 and no assignment while its target's
    partitions are still held by others (a SIGSTOPped member: up to a session timeout). The
    member heartbeats again after the interval, as librdkafka does, not at once (the chaos soak
    saw 8,500 heartbeats in one second). A real broker always answers a join with an
    assignment, so this changes nothing there."""
    d = Driver()
    d.metadata()
    d.join("t1")
    d.respond(ok(0, interval=500))
    assert d.state is S.JOINING
    assert d.hb() is None
    assert d.core.time_until_next_poll(d.now) == 500
    d.advance(499)
    assert d.hb() is None
    d.advance(1)
    again = d.must_hb()
    assert again.member_epoch == 0
    d.respond(ok(1, {T1: [0]}))
    assert d.state is S.RECONCILING
    # a later rejoin (fenced) goes out at once again
    d.app_poll()
    d.run_callbacks()
    d.must_hb()
    d.respond(ok(1))
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(err(ErrorCode.FENCED_MEMBER_EPOCH))
    d.run_callbacks()
    assert d.state is S.JOINING
    assert d.must_hb().member_epoch == 0


def test_time_until_next_poll_is_bounded_by_half_the_poll_timer() -> None:
    d = stable(rebalance_timeout_ms=4000)
    d.app_poll()
    # interval (5000) is longer than half the remaining poll timer (2000)
    assert d.core.time_until_next_poll(d.now) == 2000
    d.advance(3999)
    assert d.core.time_until_next_poll(d.now) == 1
    d.advance(1)
    assert d.core.time_until_next_poll(d.now) == 0


def test_time_until_next_poll_while_in_flight_waits_for_the_response() -> None:
    d = stable()
    d.advance(INTERVAL)
    d.must_hb()
    assert d.core.time_until_next_poll(d.now) > 0


def test_queued_application_events_make_poll_due() -> None:
    from consumer_sdk.membership import Subscribe

    d = Driver()
    d.core.submit(Subscribe(("t1",)))
    assert d.core.time_until_next_poll(d.now) == 0
    d.core.poll(d.now)
    assert d.core.app_events == type(d.core.app_events)()


def test_response_without_request_is_ignored() -> None:
    d = stable()
    d.respond(ok(7, {T1: [5]}))
    d.fail(FailureKind.TIMEOUT)
    assert d.state is S.STABLE
    assert d.core.member_epoch == 1
