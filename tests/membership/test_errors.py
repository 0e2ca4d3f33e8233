"""The heartbeat error policy, fencing and fatal errors in every state."""

from __future__ import annotations

import pytest

from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.membership import (
    UNSUPPORTED_VERSION_MESSAGE,
    CallbackKind,
    ErrorEvent,
    FailureKind,
    LeaveCompleted,
    MemberState,
    StateChanged,
)

from .harness import INTERVAL, T1, Driver, drive_to, err, ok, stable

S = MemberState
E = ErrorCode

FATAL_CODES = [
    E.GROUP_AUTHORIZATION_FAILED,
    E.INVALID_REQUEST,
    E.GROUP_MAX_SIZE_REACHED,
    E.UNSUPPORTED_ASSIGNOR,
    E.UNSUPPORTED_VERSION,
    E.UNRELEASED_INSTANCE_ID,
    E.FENCED_INSTANCE_ID,
    E.INVALID_REGULAR_EXPRESSION,
    E.UNKNOWN_SERVER_ERROR,
    E.GROUP_ID_NOT_FOUND,
    E.STALE_MEMBER_EPOCH,  # not expected from a heartbeat: "any other code" is fatal
    9999,
]


def _in_flight_stable() -> Driver:
    d = stable()
    d.advance(INTERVAL)
    d.must_hb()
    return d


@pytest.mark.parametrize("code", FATAL_CODES, ids=lambda c: E.name_of(c))
def test_fatal_error_codes(code: int) -> None:
    d = _in_flight_stable()
    d.respond(err(code, "details"))  # type: ignore[arg-type]
    assert d.state is S.FATAL
    fatal = [e for e in d.errors() if e.fatal]
    assert len(fatal) == 1 and fatal[0].code == code
    assert "details" in fatal[0].message
    assert d.core.fatal_error == fatal[0]
    # The lost callback releases the assignment.
    lost = d.callbacks(CallbackKind.LOST)
    assert lost and lost[0].partitions == (("t1", 0), ("t1", 1))
    d.run_callbacks()
    assert d.core.assigned_partitions == frozenset()
    # Terminal: no more requests, and every later call gets the error again.
    d.advance(60_000)
    assert d.hb() is None
    assert not d.core.coordinator_needed
    before = len(d.errors())
    d.app_poll()
    d.subscribe("t2")
    d.unsubscribe()
    again = d.errors()[before:]
    assert len(again) == 3 and all(e == fatal[0] for e in again)
    assert d.state is S.FATAL


def test_unsupported_version_message_is_actionable() -> None:
    d = _in_flight_stable()
    d.respond(err(E.UNSUPPORTED_VERSION))
    (event,) = d.errors()
    assert "Kafka 4.0" in event.message
    assert "group.protocol=classic" in event.message
    assert event.message.startswith(UNSUPPORTED_VERSION_MESSAGE)


def test_unsupported_version_from_the_client_is_fatal() -> None:
    d = Driver()
    d.join("t1")
    d.fail(FailureKind.UNSUPPORTED_VERSION_CLIENT, "no ConsumerGroupHeartbeat")
    assert d.state is S.FATAL
    (event,) = d.errors()
    assert event.fatal and event.code == E.UNSUPPORTED_VERSION
    assert event.message == UNSUPPORTED_VERSION_MESSAGE


@pytest.mark.parametrize("kind", [FailureKind.AUTHENTICATION, FailureKind.FATAL])
def test_non_retriable_client_failures_are_fatal(kind: FailureKind) -> None:
    d = _in_flight_stable()
    d.fail(kind, "boom")
    assert d.state is S.FATAL
    assert d.errors()[0].fatal


def test_transition_to_failed_when_trying_to_join() -> None:
    d = Driver()
    d.join("t1")
    d.respond(err(E.GROUP_AUTHORIZATION_FAILED))
    assert d.state is S.FATAL
    assert d.callbacks() == []  # nothing owned, no lost callback


def test_topic_authorization_failed_is_surfaced_but_not_fatal() -> None:
    d = _in_flight_stable()
    d.respond(err(E.TOPIC_AUTHORIZATION_FAILED, "no ACL for t1"))
    assert d.state is S.STABLE
    (event,) = d.errors()
    assert event == ErrorEvent(E.TOPIC_AUTHORIZATION_FAILED, event.message, fatal=False)
    assert "no ACL for t1" in event.message
    assert d.core.fatal_error is None
    d.advance(1000)
    req = d.must_hb()  # keeps heartbeating (with backoff), full
    assert req.rebalance_timeout_ms != -1
    d.respond(ok(1))
    assert d.state is S.STABLE


@pytest.mark.parametrize("code", [E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE])
def test_coordinator_errors_trigger_rediscovery(code: E) -> None:
    d = _in_flight_stable()
    d.respond(err(code))
    assert d.state is S.STABLE
    assert d.errors() == []
    assert d.core.coordinator_needed
    d.advance(60_000)
    assert d.hb() is None
    d.core.on_coordinator_known(d.now)
    assert d.must_hb().member_epoch == 1


def test_coordinator_load_in_progress_is_retried() -> None:
    d = _in_flight_stable()
    d.respond(err(E.COORDINATOR_LOAD_IN_PROGRESS))
    assert d.state is S.STABLE and d.core.coordinator_known and d.errors() == []


def test_group_id_not_found_is_fatal_when_stable() -> None:
    d = _in_flight_stable()
    d.respond(err(E.GROUP_ID_NOT_FOUND))
    assert d.state is S.FATAL


def test_group_id_not_found_ignored_while_unsubscribed() -> None:
    d = drive_to(S.UNSUBSCRIBED)  # leave heartbeat in flight
    d.respond(err(E.GROUP_ID_NOT_FOUND))
    assert d.state is S.UNSUBSCRIBED
    assert d.errors() == []
    assert LeaveCompleted(heartbeat_sent=True) in d.seen


# ----------------------------------------------------------------------------------------------
# Fencing
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", [E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID])
def test_fenced_member_releases_and_rejoins_with_same_id_and_epoch_zero(code: E) -> None:
    d = _in_flight_stable()
    d.respond(err(code))
    assert d.state is S.FENCED
    assert d.core.member_epoch == 0
    assert d.core.member_id == "member-1"
    # Partitions are pending revocation (not fetchable) before the lost callback runs.
    assert d.core.fetchable_partitions == frozenset()
    assert d.core.pending_revocation == {("t1", 0), ("t1", 1)}
    (lost,) = d.pending_callbacks()
    assert lost.kind is CallbackKind.LOST
    # No heartbeat until the assignment is released.
    d.advance(60_000)
    assert d.hb() is None
    d.complete(lost)
    assert d.state is S.JOINING
    assert d.core.assigned_partitions == frozenset()
    rejoin = d.must_hb()
    assert (rejoin.member_id, rejoin.member_epoch, rejoin.topic_partitions) == ("member-1", 0, ())
    assert rejoin.rebalance_timeout_ms != -1


def test_fenced_member_rejoins_even_if_lost_callback_fails() -> None:
    d = _in_flight_stable()
    d.respond(err(E.FENCED_MEMBER_EPOCH))
    d.run_callbacks(error="listener exploded")
    assert d.state is S.JOINING


def test_fenced_when_assignment_empty_rejoins_at_once() -> None:
    d = stable({T1: []})
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(err(E.FENCED_MEMBER_EPOCH))
    assert d.callbacks(CallbackKind.LOST) == []
    assert d.state is S.JOINING
    assert d.states()[-2:] == [S.FENCED, S.JOINING]


def test_same_assignment_reconciled_again_after_fencing() -> None:
    d = _in_flight_stable()
    d.respond(err(E.FENCED_MEMBER_EPOCH))
    d.run_callbacks()
    d.must_hb()
    d.respond(ok(2, {T1: [0, 1]}))
    d.app_poll()
    assigned = d.callbacks(CallbackKind.ASSIGNED)[-1]
    assert assigned.partitions == (("t1", 0), ("t1", 1))


@pytest.mark.parametrize("state", list(S))
def test_fencing_in_each_state(state: MemberState) -> None:
    d = drive_to(state)
    owned = d.core.assigned_partitions
    if d.core.in_flight_heartbeats:
        d.respond(err(E.FENCED_MEMBER_EPOCH))
    else:
        d.core._manager.transition_to_fenced(d.now, E.FENCED_MEMBER_EPOCH)
    events = d.drain()
    new_states = [e.new for e in events if isinstance(e, StateChanged)]
    if state in (S.JOINING, S.RECONCILING, S.ACKNOWLEDGING, S.STABLE):
        assert d.state in (S.FENCED, S.JOINING)
        assert new_states[0] is S.FENCED
        assert d.core.member_epoch == 0
        if owned:
            assert d.pending_callbacks()[-1].kind is CallbackKind.LOST
            d.run_callbacks()
        assert d.state is S.JOINING
    elif state is S.PREPARE_LEAVING:
        # Fenced while releasing: no leave heartbeat, no rejoin.
        assert new_states == [S.LEAVING, S.UNSUBSCRIBED]
        assert LeaveCompleted(heartbeat_sent=False) in events
        d.run_callbacks()
        assert d.state is S.UNSUBSCRIBED
        assert d.hb() is None
    elif state is S.LEAVING:
        assert new_states == [S.UNSUBSCRIBED]
        assert LeaveCompleted(heartbeat_sent=False) in events
        assert d.hb() is None
    else:
        # Not in the group (UNSUBSCRIBED, FENCED, STALE, FATAL): nothing happens.
        assert new_states == []
        assert d.state is state
    assert d.core.fatal_error is None or state is S.FATAL


# ----------------------------------------------------------------------------------------------
# Fatal
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", list(S))
def test_fatal_in_each_state(state: MemberState) -> None:
    d = drive_to(state)
    owned = d.core.assigned_partitions
    was_leaving = d.core.leave_in_progress
    applied = d.core._manager.transition_to_fatal(d.now, E.GROUP_AUTHORIZATION_FAILED, "no")
    events = d.drain()
    if state in (S.FENCED, S.STALE, S.FATAL):
        assert not applied
        assert d.state is state
        assert not any(isinstance(e, ErrorEvent) for e in events)
        return
    assert applied and d.state is S.FATAL
    assert ErrorEvent(E.GROUP_AUTHORIZATION_FAILED, "no", fatal=True) in events
    lost = [e for e in events if getattr(e, "kind", None) is CallbackKind.LOST]
    if state in (S.PREPARE_LEAVING, S.LEAVING) or state is S.UNSUBSCRIBED:
        assert lost == []  # already leaving or left: no lost callback
        if was_leaving:
            assert any(isinstance(e, LeaveCompleted) for e in events)
    else:
        assert bool(lost) == bool(owned)
    d.run_callbacks()
    d.advance(60_000)
    assert d.hb() is None


def test_fatal_response_while_fenced_is_ignored() -> None:
    """A stale in-flight answer can't move a FENCED member to FATAL (illegal transition)."""
    d = _in_flight_stable()
    d.advance(d.config.rebalance_timeout_ms)
    d.must_hb()  # poll-expiry leave, sent although a heartbeat is in flight
    assert d.state is S.STALE
    d.respond(err(E.GROUP_AUTHORIZATION_FAILED))  # answer to the earlier heartbeat
    assert d.state is S.STALE
    assert d.core.fatal_error is None


def test_fatal_marks_pending_revocation_before_signalling_lost() -> None:
    d = _in_flight_stable()
    d.respond(err(E.INVALID_REQUEST))
    assert d.core.pending_revocation == {("t1", 0), ("t1", 1)}
    assert d.core.fetchable_partitions == frozenset()


def test_fatal_failure_when_member_already_left() -> None:
    d = drive_to(S.UNSUBSCRIBED)
    d.respond(ok(-1))  # the leave completes
    d.drain()
    d.core._manager.transition_to_fatal(d.now, E.GROUP_AUTHORIZATION_FAILED, "late")
    assert d.state is S.FATAL
    assert d.callbacks(CallbackKind.LOST) == []
