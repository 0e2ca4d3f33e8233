"""Reconciliation: ordering, commit gate, callbacks, aborts, metadata."""

from __future__ import annotations

import pytest

from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.membership import (
    AssignmentChanged,
    CallbackKind,
    CallbacksNeeded,
    CommitNeeded,
    MemberState,
)

from .harness import INTERVAL, T1, T2, T3, Driver, cfg, err, ok, owned_of, stable

S = MemberState
ASSIGNED, REVOKED, LOST = CallbackKind.ASSIGNED, CallbackKind.REVOKED, CallbackKind.LOST


def _deliver(d: Driver, epoch: int, spec: dict) -> None:  # type: ignore[type-arg]
    """Send a regular heartbeat and answer it with a new target."""
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(ok(epoch, spec))


def _kinds(events: list[object]) -> list[object]:
    out: list[object] = []
    for e in events:
        if isinstance(e, CallbacksNeeded):
            out.append((e.kind, e.partitions))
        elif isinstance(e, CommitNeeded):
            out.append("commit")
    return out


# ----------------------------------------------------------------------------------------------
# Join
# ----------------------------------------------------------------------------------------------


def test_reconciling_when_receiving_assignment_found_in_metadata() -> None:
    d = Driver()
    d.metadata()
    d.join("t1")
    d.respond(ok(1, {T1: [1, 0]}))
    assert d.state is S.RECONCILING
    # Assign-only without auto-commit may run from the background loop.
    assert d.pending_callbacks()[0].partitions == (("t1", 0), ("t1", 1))
    assert d.core.assigned_partitions == {("t1", 0), ("t1", 1)}
    assert d.core.fetchable_partitions == frozenset()  # not until the callback completes
    d.run_callbacks()
    assert d.core.fetchable_partitions == {("t1", 0), ("t1", 1)}
    assert d.state is S.ACKNOWLEDGING
    ack = d.must_hb()
    assert owned_of(ack) == {T1: (0, 1)} and ack.member_epoch == 1
    assert d.state is S.STABLE


def test_member_joining_with_empty_assignment_calls_listener_and_becomes_stable() -> None:
    d = Driver()
    d.metadata()
    d.join("t1")
    d.respond(ok(1, {}))
    assert d.state is S.RECONCILING  # empty differs from "nothing received yet"
    (assigned,) = d.pending_callbacks()
    assert (assigned.kind, assigned.partitions) == (ASSIGNED, ())
    d.run_callbacks()
    assert d.state is S.ACKNOWLEDGING
    ack = d.must_hb()
    assert ack.topic_partitions == ()
    assert d.state is S.STABLE
    assert d.states() == [S.JOINING, S.RECONCILING, S.ACKNOWLEDGING, S.STABLE]


def test_joining_response_without_assignment_keeps_joining() -> None:
    d = Driver()
    d.join("t1")
    d.respond(ok(1))
    assert d.state is S.JOINING
    assert d.core.member_epoch == 1


def test_reconciliation_skipped_when_same_assignment_received() -> None:
    d = stable({T1: [0, 1]})
    _deliver(d, 1, {T1: [1, 0]})
    assert d.state is S.STABLE
    assert d.pending_callbacks() == []
    d.advance(INTERVAL)
    assert d.must_hb().topic_partitions is None


def test_new_partitions_when_others_owned_only_added_are_passed() -> None:
    d = stable({T1: [0]})
    _deliver(d, 2, {T1: [0, 1], T2: [0]})
    (cb,) = d.pending_callbacks()
    assert (cb.kind, cb.partitions) == (ASSIGNED, (("t1", 1), ("t2", 0)))
    assert d.core.fetchable_partitions == {("t1", 0)}
    d.run_callbacks()
    assert d.core.fetchable_partitions == {("t1", 0), ("t1", 1), ("t2", 0)}


# ----------------------------------------------------------------------------------------------
# Revocation: gate, commit, ordering
# ----------------------------------------------------------------------------------------------


def test_revocation_waits_for_poll_without_auto_commit() -> None:
    d = stable({T1: [0, 1]})
    _deliver(d, 2, {T1: [0]})
    assert d.state is S.RECONCILING
    d.core.poll(d.now)  # background pass: canCommit=false
    assert d.pending_callbacks() == []
    assert d.core.fetchable_partitions == {("t1", 0), ("t1", 1)}
    d.app_poll()  # the application is inside poll(): revocation may start
    (revoked,) = d.pending_callbacks()
    assert (revoked.kind, revoked.partitions) == (REVOKED, (("t1", 1),))
    assert d.core.fetchable_partitions == {("t1", 0)}  # pending revocation
    d.complete(revoked)
    (assigned,) = d.pending_callbacks()
    assert (assigned.kind, assigned.partitions) == (ASSIGNED, ())
    d.complete(assigned)
    assert d.state is S.ACKNOWLEDGING
    assert owned_of(d.must_hb()) == {T1: (0,)}
    assert d.core.assigned_partitions == {("t1", 0)}


def test_revoke_then_assign_in_order_when_both() -> None:
    d = stable({T1: [0, 1]})
    _deliver(d, 2, {T1: [1], T2: [0]})
    d.app_poll()
    (revoked,) = d.pending_callbacks()
    assert (revoked.kind, revoked.partitions) == (REVOKED, (("t1", 0),))
    assert d.core.assigned_partitions == {("t1", 0), ("t1", 1)}  # not applied before revoke
    d.complete(revoked)
    (assigned,) = d.pending_callbacks()
    assert (assigned.kind, assigned.partitions) == (ASSIGNED, (("t2", 0),))
    assert d.core.assigned_partitions == {("t1", 1), ("t2", 0)}
    assert d.core.fetchable_partitions == {("t1", 1)}
    d.complete(assigned)
    assert d.state is S.ACKNOWLEDGING


def test_revocation_with_successful_auto_commit() -> None:
    d = stable({T1: [0, 1]}, auto_commit=True)
    _deliver(d, 2, {T1: [0]})
    d.core.poll(d.now)
    assert d.pending_commits() == []  # the commit-before-rebalance waits for poll() too
    d.app_poll()
    (commit,) = d.pending_commits()
    assert commit.member_epoch == 2
    assert commit.deadline_ms == d.now + d.config.rebalance_timeout_ms
    assert d.pending_callbacks() == []  # no revocation before the commit completes
    assert d.core.fetchable_partitions == {("t1", 0)}  # revoked one already paused
    d.complete_commit(commit)
    (revoked,) = d.pending_callbacks()
    assert revoked.kind is REVOKED
    d.run_callbacks()
    assert d.state is S.ACKNOWLEDGING
    assert _kinds(d.seen)[-3:] == ["commit", (REVOKED, (("t1", 1),)), (ASSIGNED, ())]


def test_failed_auto_commit_completes_revocation_anyway() -> None:
    d = stable({T1: [0, 1]}, auto_commit=True)
    _deliver(d, 2, {T1: [0]})
    d.app_poll()
    (commit,) = d.pending_commits()
    d.complete_commit(commit, error="STALE_MEMBER_EPOCH")
    d.run_callbacks()
    assert d.state is S.ACKNOWLEDGING


def test_auto_commit_gates_even_assign_only_passes() -> None:
    d = Driver(cfg(auto_commit=True))
    d.metadata()
    d.join("t1")
    d.respond(ok(1, {T1: [0]}))
    d.core.poll(d.now)
    assert d.pending_callbacks() == [] and d.pending_commits() == []
    d.app_poll()
    (commit,) = d.pending_commits()
    d.complete_commit(commit)
    assert d.pending_callbacks()[0].kind is ASSIGNED


def test_revocation_without_callbacks_when_no_listener() -> None:
    d = Driver()
    d.metadata()
    d.subscribe("t1", listener=False)
    d.app_poll()
    d.must_hb()
    d.respond(ok(1, {T1: [0, 1]}))
    assert d.state is S.ACKNOWLEDGING  # no listener: nothing to wait for
    assert d.callbacks() == []
    assert AssignmentChanged((("t1", 0), ("t1", 1))) in d.seen
    d.must_hb()
    d.respond(ok(1))
    _deliver(d, 2, {T1: [1]})
    assert d.state is S.RECONCILING  # still only inside poll()
    d.app_poll()
    assert d.state is S.ACKNOWLEDGING
    assert d.core.assigned_partitions == {("t1", 1)}


# ----------------------------------------------------------------------------------------------
# Callback failures
# ----------------------------------------------------------------------------------------------


def test_revoked_callback_failure_means_no_ack_and_a_retry() -> None:
    d = stable({T1: [0, 1]})
    _deliver(d, 2, {T1: [0]})
    d.app_poll()
    (revoked,) = d.pending_callbacks()
    d.complete(revoked, error="boom")
    assert d.state is S.RECONCILING
    assert not d.core._manager.reconciliation_in_progress
    assert d.core.assigned_partitions == {("t1", 0), ("t1", 1)}
    d.advance(INTERVAL)
    assert d.must_hb().topic_partitions is None  # no ack
    d.respond(ok(2))
    d.app_poll()  # retried
    (again,) = d.pending_callbacks()
    assert (again.kind, again.partitions) == (REVOKED, (("t1", 1),))
    d.run_callbacks()
    assert d.state is S.ACKNOWLEDGING


def test_assigned_callback_failure_keeps_partitions_unfetchable_and_retries() -> None:
    d = stable({T1: [0]})
    _deliver(d, 2, {T1: [0, 1]})
    (assigned,) = d.pending_callbacks()
    d.complete(assigned, error="boom")
    assert d.state is S.RECONCILING
    assert d.core.assigned_partitions == {("t1", 0), ("t1", 1)}
    assert d.core.fetchable_partitions == {("t1", 0)}
    d.advance(INTERVAL)
    assert d.must_hb().topic_partitions is None
    d.respond(ok(2))
    d.core.poll(d.now)  # retried from the background: nothing to revoke
    (retry,) = d.pending_callbacks()
    # The partition whose callback failed is offered again (Java would pass an empty set).
    assert (retry.kind, retry.partitions) == (ASSIGNED, (("t1", 1),))
    d.complete(retry)
    assert d.core.fetchable_partitions == {("t1", 0), ("t1", 1)}
    assert d.state is S.ACKNOWLEDGING
    assert owned_of(d.must_hb()) == {T1: (0, 1)}


def test_partitions_lost_while_the_assigned_callback_runs_stay_unfetchable() -> None:
    """Issue 12 item 9: fenced while on_assign runs, the member has lost every partition, the
    added ones included; when the callback completes none becomes fetchable (the runtime
    unfences only ``fetchable_partitions``), and on_lost gets them all."""
    d = stable({T1: [0]})
    _deliver(d, 2, {T1: [0, 1]})
    (assigned,) = d.pending_callbacks()
    assert (assigned.kind, assigned.partitions) == (ASSIGNED, (("t1", 1),))
    assert d.core.fetchable_partitions == {("t1", 0)}
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(err(ErrorCode.FENCED_MEMBER_EPOCH))
    assert d.state is S.FENCED
    assert d.core.pending_revocation == {("t1", 0), ("t1", 1)}
    assert d.core.fetchable_partitions == frozenset()
    d.complete(assigned)  # on_assign returns after the fencing
    assert d.core.fetchable_partitions == frozenset()
    assert d.core.pending_revocation == {("t1", 0), ("t1", 1)}
    (lost,) = d.pending_callbacks()
    assert (lost.kind, lost.partitions) == (LOST, (("t1", 0), ("t1", 1)))
    d.complete(lost)
    assert d.core.assigned_partitions == frozenset() and d.state is S.JOINING


def test_listener_callbacks_basic_sequence() -> None:
    d = stable({T1: [0]})
    _deliver(d, 2, {T1: [1]})
    d.app_poll()
    d.run_callbacks()
    assert _kinds(d.seen) == [
        (ASSIGNED, (("t1", 0),)),
        (REVOKED, (("t1", 0),)),
        (ASSIGNED, (("t1", 1),)),
    ]


# ----------------------------------------------------------------------------------------------
# Delayed and concurrent reconciliation
# ----------------------------------------------------------------------------------------------


def test_delayed_result_discarded_if_member_not_reconciling_anymore() -> None:
    d = stable({T1: [0]})
    _deliver(d, 2, {T1: [0, 1]})
    (assigned,) = d.pending_callbacks()
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(err(ErrorCode.FENCED_MEMBER_EPOCH))
    assert d.state is S.FENCED
    d.complete(assigned)
    assert d.state is S.FENCED  # not ACKNOWLEDGING: the pass was dropped
    assert d.core.current_assignment.partitions == {(T1, 0)}


def _fence_and_rejoin(d: Driver, new_target: dict) -> None:  # type: ignore[type-arg]
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(err(ErrorCode.FENCED_MEMBER_EPOCH))
    (lost,) = [c for c in d.pending_callbacks() if c.kind is LOST]
    d.complete(lost)  # completes before the older reconciliation step
    assert d.state is S.JOINING
    d.must_hb()
    d.respond(ok(5, new_target))


def test_delayed_result_discarded_after_commit_if_member_rejoins() -> None:
    d = stable({T1: [0, 1]}, auto_commit=True)
    _deliver(d, 2, {T1: [0]})
    d.app_poll()
    (commit,) = d.pending_commits()
    _fence_and_rejoin(d, {T2: [0]})
    assert d.state is S.RECONCILING
    d.complete_commit(commit)
    assert [c for c in d.pending_callbacks() if c.kind is REVOKED] == []
    # The new pass (for the new target) starts on the next poll.
    d.app_poll()
    (new_commit,) = d.pending_commits()
    d.complete_commit(new_commit)
    d.run_callbacks()
    assert d.state is S.ACKNOWLEDGING
    assert d.core.assigned_partitions == {("t2", 0)}


def test_delayed_result_discarded_after_revoked_callback_if_member_rejoins() -> None:
    d = stable({T1: [0, 1]})
    _deliver(d, 2, {T1: [0]})
    d.app_poll()
    (revoked,) = d.pending_callbacks()
    _fence_and_rejoin(d, {T1: [0]})
    d.complete(revoked)
    assert not [c for c in d.pending_callbacks() if c.kind is ASSIGNED and c.partitions == ()]
    assert d.state is S.RECONCILING


def test_delayed_result_discarded_after_assigned_callback_if_member_rejoins() -> None:
    d = stable({T1: [0]})
    _deliver(d, 2, {T1: [0, 1]})
    (assigned,) = d.pending_callbacks()
    _fence_and_rejoin(d, {T2: [0]})
    d.complete(assigned)
    assert d.state is S.RECONCILING
    assert d.core.current_assignment.is_none


def test_delayed_result_applied_when_target_changed_with_new_assignment() -> None:
    d = stable({T1: [0]})
    _deliver(d, 2, {T1: [0, 1]})
    (assigned,) = d.pending_callbacks()
    _deliver(d, 3, {T1: [0, 1, 2]})  # new target while the pass waits
    assert d.state is S.RECONCILING
    d.complete(assigned)
    assert d.state is S.ACKNOWLEDGING
    ack = d.must_hb()
    assert owned_of(ack) == {T1: (0, 1)}  # the old set is acked first
    assert d.state is S.RECONCILING  # then the newer target is reconciled
    d.respond(ok(3))
    d.core.poll(d.now)
    (nxt,) = d.pending_callbacks()
    assert nxt.partitions == (("t1", 2),)


def test_delayed_result_applied_when_target_changed_with_metadata_update() -> None:
    d = stable({T1: [0]})
    d.metadata({T1: "t1"})
    _deliver(d, 2, {T1: [0, 1], T2: [0]})
    (assigned,) = d.pending_callbacks()
    assert assigned.partitions == (("t1", 1),)
    assert d.core.metadata_needed
    d.metadata()  # T2 can be named now, but a pass is running
    d.complete(assigned)
    ack = d.must_hb()
    assert owned_of(ack) == {T1: (0, 1)}
    assert d.state is S.RECONCILING
    d.respond(ok(2))
    d.core.poll(d.now)
    (nxt,) = d.pending_callbacks()
    assert nxt.partitions == (("t2", 0),)


def test_poll_runs_background_reconciliation_with_can_commit_false() -> None:
    """Nothing but the background loop starts the pass for a target that waited on another."""
    d = stable({T1: [0]})
    _deliver(d, 2, {T1: [0, 1]})
    (first,) = d.pending_callbacks()
    _deliver(d, 3, {T1: [0, 1, 2]})
    d.complete(first)
    d.must_hb()  # the ack moves the member back to RECONCILING
    assert d.state is S.RECONCILING
    assert d.pending_callbacks() == []
    d.core.poll(d.now)
    (second,) = d.pending_callbacks()
    assert second.partitions == (("t1", 2),)


# ----------------------------------------------------------------------------------------------
# Topic id resolution and metadata
# ----------------------------------------------------------------------------------------------


def test_unresolved_topics_reconcile_resolvable_subset_and_request_metadata() -> None:
    d = Driver()
    d.metadata({T1: "t1"})
    d.join("t1", "t2")
    d.respond(ok(1, {T1: [0], T2: [0, 1]}))
    assert d.core.metadata_needed
    assert d.core.unresolved_topic_ids == {T2}
    (cb,) = d.pending_callbacks()
    assert cb.partitions == (("t1", 0),)
    d.run_callbacks()
    ack = d.must_hb()
    assert owned_of(ack) == {T1: (0,)}  # partial ack
    assert d.state is S.RECONCILING  # the rest still waits for metadata


def test_metadata_updates_reconcile_unresolved_assignments() -> None:
    d = Driver()
    d.metadata({})
    d.join("t1")
    d.respond(ok(1, {T1: [0]}))
    d.run_callbacks()  # an empty pass: nothing resolvable yet
    d.must_hb()
    assert d.state is S.RECONCILING
    d.metadata({T1: "t1"})
    assert not d.core.metadata_needed
    (cb,) = d.pending_callbacks()
    assert (cb.kind, cb.partitions) == (ASSIGNED, (("t1", 0),))


def test_metadata_update_without_the_topic_requests_another() -> None:
    d = Driver()
    d.metadata({})
    d.join("t1")
    d.respond(ok(1, {T1: [0]}))
    d.run_callbacks()
    d.must_hb()
    d.metadata({T3: "t3"})
    assert d.core.metadata_needed
    assert d.core.unresolved_topic_ids == {T1}


def test_partial_ack_not_repeated_on_background_reconcile() -> None:
    d = stable({T1: [0]})
    d.metadata({T1: "t1"})
    _deliver(d, 2, {T1: [0], T2: [0]})
    assert d.state is S.ACKNOWLEDGING  # same resolvable set, new local epoch: ack it
    assert owned_of(d.must_hb()) == {T1: (0,)}
    assert d.state is S.RECONCILING
    for _ in range(3):
        d.core.poll(d.now)
        d.app_poll()
        assert d.state is S.RECONCILING
    d.respond(ok(2))
    d.advance(INTERVAL)
    assert d.must_hb().topic_partitions is None
    assert d.pending_callbacks() == []


def test_new_assignment_replaces_previous_one_waiting_on_metadata() -> None:
    d = stable({T1: [0]})
    d.metadata({T1: "t1"})
    _deliver(d, 2, {T1: [0], T2: [0]})
    d.must_hb()
    d.respond(ok(2))
    _deliver(d, 3, {T1: [0, 1]})
    assert d.core.unresolved_topic_ids == frozenset()
    (cb,) = d.pending_callbacks()
    assert cb.partitions == (("t1", 1),)


def test_new_empty_assignment_replaces_previous_one_waiting_on_metadata() -> None:
    d = Driver()
    d.metadata({})
    d.join("t2")
    d.respond(ok(1, {T2: [0]}))
    d.run_callbacks()
    d.must_hb()
    d.respond(ok(1))
    _deliver(d, 2, {})
    assert d.state is S.ACKNOWLEDGING
    d.must_hb()
    assert d.state is S.STABLE
    assert d.core.unresolved_topic_ids == frozenset()


def test_new_assignment_not_in_metadata_replaces_previous_one_waiting_on_metadata() -> None:
    d = Driver()
    d.metadata({})
    d.join("t1")
    d.respond(ok(1, {T1: [0]}))
    d.run_callbacks()
    d.must_hb()
    d.respond(ok(1))
    _deliver(d, 2, {T2: [0]})
    assert d.core.unresolved_topic_ids == {T2}
    d.must_hb()  # partial ack of the (empty) resolvable part
    d.respond(ok(2))
    d.metadata({T1: "t1"})
    assert d.pending_callbacks() == []
    d.metadata({T2: "t2"})
    assert d.pending_callbacks()[0].partitions == (("t2", 0),)


def test_revoke_uses_local_topic_name_cache_when_metadata_is_flushed() -> None:
    d = stable({T1: [0, 1]})
    d.metadata({})  # metadata no longer knows t1
    _deliver(d, 2, {T1: [1]})
    assert not d.core.metadata_needed
    d.app_poll()
    (revoked,) = d.pending_callbacks()
    assert revoked.partitions == (("t1", 0),)


def test_keeps_unresolved_assignment_until_resolved() -> None:
    d = Driver()
    d.metadata({})
    d.join("t1")
    d.respond(ok(1, {T1: [0]}))
    for _ in range(5):
        d.run_callbacks()
        d.advance(INTERVAL)
        req = d.hb()
        if req is not None:
            d.respond(ok(1))
        d.app_poll()
        assert d.core.target_assignment.partitions == {(T1, 0)}
        assert d.core.metadata_needed
    d.metadata()
    d.run_callbacks()
    assert owned_of(d.must_hb()) == {T1: (0,)}


@pytest.mark.parametrize("auto_commit", [False, True])
def test_rebalance_never_hands_out_revoked_partitions(auto_commit: bool) -> None:
    """Between the start of a revocation and the ack, the revoked partition isn't fetchable."""
    d = stable({T1: [0, 1]}, auto_commit=auto_commit)
    _deliver(d, 2, {T1: [0]})
    d.app_poll()
    for commit in d.pending_commits():
        d.complete_commit(commit)
    assert ("t1", 1) not in d.core.fetchable_partitions
    d.run_callbacks()
    assert ("t1", 1) not in d.core.assigned_partitions
