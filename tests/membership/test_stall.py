"""The stall rules of `consumer_sdk.membership.stall`: records are handed out only within one
session of the last confirmed heartbeat's send, and a static member's join refused with
UNRELEASED_INSTANCE_ID is retried (owning nothing) until a crashed incarnation can have
expired, then fatal with the reason."""

from __future__ import annotations

from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.membership import MemberState
from consumer_sdk.membership.stall import (
    DEFAULT_SESSION_TIMEOUT_MS,
    UNRELEASED_MARGIN_MS,
    handout_deadline_ms,
    may_hand_out,
    unreleased_retry_deadline_ms,
)

from .harness import INTERVAL, T1, Driver, cfg, err, ok, stable

S = MemberState
E = ErrorCode


def test_hand_out_within_one_session_of_the_confirmed_send() -> None:
    assert may_hand_out(10_000, None, 6000)  # not in a group: no bound
    assert handout_deadline_ms(None, 6000) is None
    assert handout_deadline_ms(1000, 6000) == 7000
    assert may_hand_out(7000, 1000, 6000)
    assert not may_hand_out(7001, 1000, 6000)


def test_core_tracks_the_send_time_of_the_last_answered_heartbeat() -> None:
    d = stable()
    sent_at = d.now
    d.advance(INTERVAL)
    d.must_hb()
    sent_at = d.now
    d.advance(30)
    d.respond(ok(1))
    assert d.core.confirmed_sent_ms == sent_at  # the send, not the answer
    # A heartbeat sent before a stall and answered after it confirms only its send time.
    d.advance(INTERVAL)
    d.must_hb()
    before_stall = d.now
    d.advance(60_000)
    d.respond(ok(1))
    assert d.core.confirmed_sent_ms == before_stall
    assert not may_hand_out(d.now, d.core.confirmed_sent_ms, d.core.session_timeout_ms)
    # A failed heartbeat confirms nothing; the next answered one does.
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(err(E.COORDINATOR_LOAD_IN_PROGRESS))
    assert d.core.confirmed_sent_ms == before_stall
    d.advance(INTERVAL)
    d.must_hb()
    fresh = d.now
    d.respond(ok(1))
    assert d.core.confirmed_sent_ms == fresh
    assert may_hand_out(d.now, d.core.confirmed_sent_ms, d.core.session_timeout_ms)


def test_session_timeout_defaults_to_the_brokers_default_until_told() -> None:
    d = stable()
    assert d.core.session_timeout_ms == DEFAULT_SESSION_TIMEOUT_MS
    d.core.set_session_timeout(6000)
    assert d.core.session_timeout_ms == 6000


def test_fenced_member_is_not_confirmed_until_its_rejoin_is_answered() -> None:
    d = stable()
    d.advance(INTERVAL)
    d.must_hb()
    confirmed = d.core.confirmed_sent_ms
    d.respond(err(E.UNKNOWN_MEMBER_ID))
    assert d.state is S.FENCED
    assert d.core.confirmed_sent_ms == confirmed


def _static_joining(session_ms: int = 6000) -> Driver:
    d = Driver(cfg(group_instance_id="i-1"))
    d.core.set_session_timeout(session_ms)
    d.metadata()
    d.join("t1")
    return d


def test_unreleased_instance_id_at_join_is_retried_until_the_old_incarnation_expired() -> None:
    d = _static_joining()
    first = d.now
    d.respond(err(E.UNRELEASED_INSTANCE_ID))
    assert d.state is S.JOINING and not d.errors()
    assert d.core.assigned_partitions == frozenset()
    deadline = unreleased_retry_deadline_ms(first, 6000, 0)
    assert deadline == first + 6000 + UNRELEASED_MARGIN_MS
    retries = 0
    while True:
        nxt = d.core.poll(d.now).next_poll_ms
        d.advance(max(nxt, 1))
        req = d.hb()
        if req is None:
            continue
        assert req.member_epoch == 0  # still a join, never holding anything
        if d.now < deadline:
            d.respond(err(E.UNRELEASED_INSTANCE_ID))
            assert d.state is S.JOINING
            retries += 1
            continue
        d.respond(err(E.UNRELEASED_INSTANCE_ID))
        break
    assert retries >= 5  # backed off (retry.backoff.max.ms 1 s), not hammered
    assert d.state is S.FATAL
    [fatal] = [e for e in d.errors() if e.fatal]
    assert fatal.code == E.UNRELEASED_INSTANCE_ID
    assert "still in use by a live member" in fatal.message
    assert "session timeout (6000 ms)" in fatal.message


def test_unreleased_then_accepted_joins_normally() -> None:
    d = _static_joining()
    d.respond(err(E.UNRELEASED_INSTANCE_ID))
    d.advance(2000)
    req = d.must_hb()
    assert req.member_epoch == 0
    d.respond(ok(3, {T1: [0, 1]}))
    assert d.state is S.RECONCILING
    # A later episode starts its own window.
    d.app_poll()
    d.run_all()
    d.must_hb()
    d.respond(ok(3))
    assert d.state is S.STABLE


def test_unreleased_outside_a_join_or_for_a_dynamic_member_stays_fatal() -> None:
    d = stable(group_instance_id="i-1")
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(err(E.UNRELEASED_INSTANCE_ID))
    assert d.state is S.FATAL
    dyn = Driver(cfg())
    dyn.metadata()
    dyn.join("t1")
    dyn.respond(err(E.UNRELEASED_INSTANCE_ID))
    assert dyn.state is S.FATAL
