"""Leave, close options, static members, and the poll timer / STALE member."""

from __future__ import annotations

import pytest

from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.membership import (
    CallbackKind,
    CloseOption,
    FailureKind,
    LeaveCompleted,
    MemberState,
    Subscribe,
)

from .harness import INTERVAL, T1, Driver, cfg, drive_to, err, ok, stable

S = MemberState
REVOKED, LOST, ASSIGNED = CallbackKind.REVOKED, CallbackKind.LOST, CallbackKind.ASSIGNED


def _leaves(d: Driver) -> list[LeaveCompleted]:
    d.drain()
    return [e for e in d.seen if isinstance(e, LeaveCompleted)]


# ----------------------------------------------------------------------------------------------
# Unsubscribe
# ----------------------------------------------------------------------------------------------


def test_unsubscribe_from_stable_revokes_then_sends_one_leave() -> None:
    d = stable()
    d.unsubscribe()
    assert d.state is S.PREPARE_LEAVING
    assert d.core.fetchable_partitions == frozenset()
    (revoked,) = d.pending_callbacks()
    assert (revoked.kind, revoked.partitions) == (REVOKED, (("t1", 0), ("t1", 1)))
    assert d.core.time_until_next_poll(d.now) > 0  # nothing to send while releasing
    d.complete(revoked)
    assert d.state is S.LEAVING
    assert d.core.assigned_partitions == frozenset()
    assert d.core.time_until_next_poll(d.now) == 0
    leave = d.must_hb()
    assert (leave.member_id, leave.member_epoch) == ("member-1", -1)
    assert leave.topic_partitions is None and leave.subscribed_topic_names is None
    assert d.state is S.UNSUBSCRIBED
    assert _leaves(d) == []  # completes with the answer
    d.fail(FailureKind.TIMEOUT)
    assert _leaves(d) == [LeaveCompleted(heartbeat_sent=True)]
    d.advance(60_000)
    assert d.hb() is None  # never retried


@pytest.mark.parametrize("answer", ["ok", "error"])
def test_leave_completes_on_any_answer(answer: str) -> None:
    d = stable()
    d.unsubscribe()
    d.run_callbacks()
    d.must_hb()
    d.respond(ok(-1) if answer == "ok" else err(ErrorCode.UNKNOWN_MEMBER_ID))
    assert _leaves(d) == [LeaveCompleted(heartbeat_sent=True)]
    assert d.state is S.UNSUBSCRIBED


def test_revoke_callback_failure_still_leaves() -> None:
    d = stable()
    d.unsubscribe()
    d.run_callbacks(error="boom")
    assert d.state is S.LEAVING
    assert d.must_hb().member_epoch == -1


def test_leave_with_nothing_owned_needs_no_callback() -> None:
    d = stable({T1: []})
    d.unsubscribe()
    assert d.state is S.LEAVING
    assert d.pending_callbacks() == []


def test_leave_while_joining() -> None:
    d = Driver()
    d.join("t1")
    d.unsubscribe()
    assert d.state is S.LEAVING
    d.respond(ok(1, {T1: [0]}))  # the join answer arrives while leaving: ignored
    assert d.state is S.LEAVING
    assert d.must_hb().member_epoch == -1  # sent although the join was in flight


def test_leave_already_in_progress_is_a_no_op() -> None:
    d = stable()
    d.unsubscribe()
    d.unsubscribe()
    assert len(d.pending_callbacks()) == 1


def test_leave_when_member_already_left() -> None:
    d = Driver()
    d.unsubscribe()
    assert d.state is S.UNSUBSCRIBED
    assert _leaves(d) == [LeaveCompleted(heartbeat_sent=False)]
    assert d.hb() is None


def test_leave_when_member_fenced_does_not_rejoin() -> None:
    d = drive_to(S.FENCED)
    (lost,) = d.pending_callbacks()
    d.unsubscribe()
    assert d.state is S.UNSUBSCRIBED
    assert d.core.assigned_partitions == frozenset()
    d.complete(lost)
    assert d.state is S.UNSUBSCRIBED
    assert d.hb() is None
    assert _leaves(d) == [LeaveCompleted(heartbeat_sent=False)]


def test_leave_when_member_stale_sends_nothing_and_does_not_rejoin() -> None:
    d = drive_to(S.STALE)
    d.unsubscribe()
    d.run_callbacks()
    d.app_poll()
    assert d.state is S.STALE
    assert d.hb() is None
    assert _leaves(d) == [LeaveCompleted(heartbeat_sent=False)]
    d.subscribe("t1")  # a new subscription rejoins
    d.app_poll()
    assert d.state is S.JOINING


def test_new_assignment_ignored_when_preparing_to_leave() -> None:
    d = drive_to(S.PREPARE_LEAVING)
    d.respond(ok(2, {T1: [0, 1, 2]}))
    assert d.state is S.PREPARE_LEAVING
    assert d.core.target_assignment.partitions == {(T1, 0), (T1, 1)}


def test_ignore_heartbeat_response_when_not_in_group() -> None:
    d = drive_to(S.UNSUBSCRIBED)
    d.respond(ok(4, {T1: [0]}))
    assert d.state is S.UNSUBSCRIBED
    assert d.core.member_epoch == -1
    assert d.core.target_assignment.is_none


def test_leave_during_reconciliation_then_rejoin() -> None:
    d = stable({T1: [0]})
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(ok(2, {T1: [0, 1]}))
    (assigned,) = d.pending_callbacks()
    d.unsubscribe()
    (revoked,) = d.pending_callbacks()[1:]
    assert revoked.kind is REVOKED
    d.complete(assigned)  # the pass is dropped: the member is leaving
    assert d.state is S.PREPARE_LEAVING
    d.complete(revoked)
    d.must_hb()
    d.subscribe("t1")
    d.app_poll()
    assert d.state is S.JOINING
    join = d.must_hb()
    assert (join.member_epoch, join.topic_partitions) == (0, ())
    assert join.rebalance_timeout_ms != -1


def test_leave_skipped_without_coordinator() -> None:
    d = stable()
    d.unsubscribe()
    d.run_callbacks()
    d.core.on_coordinator_unknown(d.now)
    assert d.hb() is None
    assert d.state is S.UNSUBSCRIBED
    assert _leaves(d) == [LeaveCompleted(heartbeat_sent=False)]


def test_leave_goes_out_while_another_heartbeat_is_in_flight() -> None:
    d = drive_to(S.LEAVING)
    assert d.core.in_flight_heartbeats == 1
    leave = d.must_hb()
    assert leave.member_epoch == -1
    assert d.core.in_flight_heartbeats == 2
    d.respond(ok(1))  # the older heartbeat's answer: ignored while unsubscribed
    assert _leaves(d) == []
    d.respond(ok(-1))
    assert _leaves(d) == [LeaveCompleted(heartbeat_sent=True)]


def test_subscribe_during_leave_joins_after_it() -> None:
    d = stable()
    d.unsubscribe()
    d.subscribe("t1")
    d.app_poll()
    assert d.state is S.PREPARE_LEAVING
    d.run_callbacks()
    d.must_hb()
    d.app_poll()
    assert d.state is S.JOINING


# ----------------------------------------------------------------------------------------------
# Close options (KIP-1092) and static members
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("instance", "option", "epoch"),
    [
        (None, CloseOption.DEFAULT, -1),
        (None, CloseOption.LEAVE_GROUP, -1),
        (None, CloseOption.REMAIN_IN_GROUP, None),
        ("inst", CloseOption.DEFAULT, -2),
        ("inst", CloseOption.LEAVE_GROUP, -1),
        ("inst", CloseOption.REMAIN_IN_GROUP, -2),
    ],
)
def test_leave_epoch_on_close(instance: str | None, option: CloseOption, epoch: int | None) -> None:
    d = stable(group_instance_id=instance)
    d.close(option)
    d.run_callbacks()
    req = d.hb()
    if epoch is None:
        assert req is None
        assert _leaves(d) == [LeaveCompleted(heartbeat_sent=False)]
    else:
        assert req is not None and req.member_epoch == epoch
        assert req.instance_id == instance
    assert d.state is S.UNSUBSCRIBED


@pytest.mark.parametrize(("instance", "epoch"), [(None, -1), ("inst", -2)])
def test_leave_epoch_on_unsubscribe(instance: str | None, epoch: int) -> None:
    d = stable(group_instance_id=instance)
    d.unsubscribe()
    d.run_callbacks()
    assert d.must_hb().member_epoch == epoch


def test_close_commits_before_releasing_with_auto_commit() -> None:
    d = stable(auto_commit=True)
    d.close()
    assert d.pending_callbacks() == []
    (commit,) = d.pending_commits()
    assert commit.reason == "close"
    d.complete_commit(commit, error="timed out")  # a failed commit does not block
    (revoked,) = d.pending_callbacks()
    assert revoked.kind is REVOKED
    d.complete(revoked)
    assert d.must_hb().member_epoch == -1


def test_after_close_nothing_more_happens() -> None:
    d = stable()
    d.close()
    d.run_callbacks()
    d.must_hb()
    d.subscribe("t1")
    d.app_poll()
    d.close()
    assert d.state is S.UNSUBSCRIBED
    d.advance(60_000)
    assert d.hb() is None


def test_close_in_fatal_completes_at_once() -> None:
    d = drive_to(S.FATAL)
    d.close()
    assert _leaves(d) == [LeaveCompleted(heartbeat_sent=False)]
    assert d.hb() is None


def test_close_during_prepare_leaving_updates_the_option() -> None:
    d = stable(group_instance_id="inst")
    d.unsubscribe()
    d.close(CloseOption.LEAVE_GROUP)
    d.run_callbacks()
    assert d.must_hb().member_epoch == -1


def test_subscribe_without_topics_is_unsubscribe() -> None:
    d = stable()
    d.core.handle(Subscribe(()), d.now)
    assert d.state is S.PREPARE_LEAVING


def test_subscribe_validation() -> None:
    with pytest.raises(ValueError):
        Subscribe(("t1",), "t.*")
    with pytest.raises(ValueError):
        Subscribe((), "")
    with pytest.raises(ValueError):
        Subscribe(("",))


# ----------------------------------------------------------------------------------------------
# Poll timer and STALE
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("state", [S.JOINING, S.RECONCILING, S.ACKNOWLEDGING, S.STABLE])
def test_poll_timer_expiry_leaves_and_goes_stale(state: MemberState) -> None:
    d = drive_to(state)
    d.app_poll()
    owned = d.core.assigned_partitions
    d.advance(d.config.rebalance_timeout_ms)
    leave = d.must_hb()
    assert leave.member_epoch == -1
    assert d.state is S.STALE
    assert d.states()[-3:] == [S.PREPARE_LEAVING, S.LEAVING, S.STALE]
    lost = [c for c in d.pending_callbacks() if c.kind is LOST]
    assert bool(lost) == bool(owned)
    assert d.core.fetchable_partitions == frozenset()
    d.advance(60_000)
    assert d.hb() is None  # no heartbeats while stale


def test_stale_static_member_leaves_with_epoch_minus_two() -> None:
    d = stable(group_instance_id="inst")
    d.advance(d.config.rebalance_timeout_ms)
    assert d.must_hb().member_epoch == -2


def test_stale_member_waits_for_lost_callback_to_rejoin() -> None:
    d = stable()
    d.advance(d.config.rebalance_timeout_ms)
    d.must_hb()
    (lost,) = d.pending_callbacks()
    d.app_poll()
    assert d.state is S.STALE  # waits for the lost callback
    assert d.hb() is None
    d.complete(lost)
    assert d.state is S.JOINING
    join = d.must_hb()
    assert (join.member_id, join.member_epoch, join.topic_partitions) == ("member-1", 0, ())
    assert join.rebalance_timeout_ms != -1 and join.subscribed_topic_names == ("t1",)


def test_stale_member_rejoins_when_timer_resets_no_callbacks() -> None:
    d = stable({T1: []})
    d.advance(d.config.rebalance_timeout_ms)
    d.must_hb()
    assert d.state is S.STALE
    assert d.pending_callbacks() == []
    d.app_poll()
    assert d.state is S.JOINING


def test_stale_member_with_lost_callback_done_before_poll() -> None:
    d = stable()
    d.advance(d.config.rebalance_timeout_ms)
    d.must_hb()
    d.run_callbacks()
    assert d.state is S.STALE  # released, but still waiting for poll()
    d.app_poll()
    assert d.state is S.JOINING


def test_stale_leave_response_is_ignored() -> None:
    d = stable()
    d.advance(d.config.rebalance_timeout_ms)
    d.must_hb()
    d.respond(err(ErrorCode.GROUP_AUTHORIZATION_FAILED))
    assert d.state is S.STALE
    assert d.errors() == []


def test_poll_timer_expiry_does_not_mark_leaving_member_stale() -> None:
    d = stable()
    d.unsubscribe()
    d.advance(d.config.rebalance_timeout_ms)
    req = d.must_hb()  # still heartbeating while releasing; the poll timer is ignored
    assert req.member_epoch == 1
    assert d.state is S.PREPARE_LEAVING
    d.respond(ok(1))
    d.run_callbacks()
    assert d.must_hb().member_epoch == -1
    assert d.state is S.UNSUBSCRIBED


def test_polling_keeps_the_member_in_the_group() -> None:
    d = stable(rebalance_timeout_ms=10_000)
    for _ in range(10):
        d.app_poll()
        d.advance(INTERVAL)
        req = d.must_hb()
        assert req.member_epoch == 1
        d.respond(ok(1))
    assert d.state is S.STABLE


def test_rejoin_after_stale_uses_full_heartbeat_with_regex() -> None:
    d = Driver(cfg())
    d.metadata()
    d.subscribe(pattern="t.*")
    d.app_poll()
    d.must_hb()
    d.respond(ok(1, {}))
    d.app_poll()
    d.run_callbacks()
    d.must_hb()
    d.respond(ok(1))
    d.advance(d.config.rebalance_timeout_ms)
    d.must_hb()
    d.app_poll()
    join = d.must_hb()
    assert (join.subscribed_topic_names, join.subscribed_topic_regex) == ((), "t.*")


@pytest.mark.parametrize("state", list(S))
def test_unsubscribe_in_each_state(state: MemberState) -> None:
    d = drive_to(state)
    owned = d.core.assigned_partitions
    transitions_before = len(d.transitions)
    d.unsubscribe()
    d.run_callbacks()
    d.drain()
    new = [t.new for t in d.transitions[transitions_before:]]
    if state in (S.JOINING, S.RECONCILING, S.ACKNOWLEDGING, S.STABLE):
        assert new[:2] == [S.PREPARE_LEAVING, S.LEAVING]
        released = [c for c in d.callbacks() if c.kind in (REVOKED, LOST)]
        if owned:
            assert released[-1].kind is REVOKED  # epoch > 0
            assert set(released[-1].partitions) == owned
        leave = d.hb()
        assert leave is not None and leave.member_epoch == -1
        assert d.state is S.UNSUBSCRIBED
    elif state in (S.PREPARE_LEAVING, S.LEAVING):
        assert S.PREPARE_LEAVING not in new[:1]  # the ongoing leave just goes on
        d.run_callbacks()
        assert d.state in (S.LEAVING, S.UNSUBSCRIBED)
    elif state is S.FENCED:
        assert new == [S.UNSUBSCRIBED]
        assert d.hb() is None
    elif state is S.FATAL:
        assert new == []
        assert d.errors()[-1].fatal
        assert LeaveCompleted(heartbeat_sent=False) in d.seen
    else:  # UNSUBSCRIBED, STALE: nothing to leave
        assert new == []
        assert LeaveCompleted(heartbeat_sent=False) in d.seen
        d.advance(60_000)
        assert d.hb() is None
    d.app_poll()
    assert d.state is not S.JOINING  # unsubscribed members never rejoin on their own


# ----------------------------------------------------------------------------------------------
# Leaving with the membership unconfirmed past the session (see membership.stall)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["unsubscribe", "close"])
def test_leave_unconfirmed_past_the_session_releases_as_lost_without_a_commit(how: str) -> None:
    """Cut off from the coordinator for longer than the session, the member cannot know it
    was fenced; another member may own its partitions by now, so they are lost, not revoked
    (and the auto-commit before a revocation is not made)."""
    d = stable(auto_commit=True)
    d.core.set_session_timeout(20_000)
    confirmed = d.core.confirmed_sent_ms
    assert confirmed is not None
    d.advance(INTERVAL)
    d.must_hb()
    d.fail(FailureKind.DISCONNECTED)  # no answer confirms the membership any more
    d.advance(confirmed + 20_001 - d.now)
    d.unsubscribe() if how == "unsubscribe" else d.close()
    assert d.state is S.PREPARE_LEAVING
    (lost,) = d.pending_callbacks()
    assert (lost.kind, lost.partitions) == (LOST, (("t1", 0), ("t1", 1)))
    assert d.pending_commits() == []


def test_leave_within_the_session_still_revokes() -> None:
    d = stable()
    d.core.set_session_timeout(20_000)
    confirmed = d.core.confirmed_sent_ms
    assert confirmed is not None
    d.advance(INTERVAL)
    d.must_hb()
    d.fail(FailureKind.DISCONNECTED)
    d.advance(confirmed + 20_000 - d.now)  # still within one session of the confirmed send
    d.unsubscribe()
    (revoked,) = d.pending_callbacks()
    assert revoked.kind is REVOKED
