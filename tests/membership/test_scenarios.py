"""Multi-member scenarios against the scripted coordinator."""

from __future__ import annotations

import pytest

from consumer_sdk.membership import CallbackKind, CloseOption, MemberState

from .cluster import Cluster
from .coordinator import MockBrokerAbort, ScriptedCoordinator

S = MemberState


def _cluster(**topics: int) -> Cluster:
    return Cluster(ScriptedCoordinator(dict(topics or {"t1": 4}), heartbeat_interval_ms=500))


def _all_assigned(c: Cluster) -> dict[str, frozenset[tuple[str, int]]]:
    return {name: m.core.fetchable_partitions for name, m in c.members.items()}


def test_single_member_gets_everything() -> None:
    c = _cluster(t1=3)
    a = c.add("a", "t1")
    c.settle(5)
    assert a.core.state is S.STABLE
    assert a.core.fetchable_partitions == {("t1", 0), ("t1", 1), ("t1", 2)}


def test_two_members_split_and_revocation_precedes_reassignment() -> None:
    c = _cluster(t1=4)
    a = c.add("a", "t1")
    c.settle(5)
    b = c.add("b", "t1")
    c.settle(20)
    assigned = _all_assigned(c)
    assert assigned["a"] | assigned["b"] == {("t1", p) for p in range(4)}
    assert not assigned["a"] & assigned["b"]
    assert len(assigned["a"]) == len(assigned["b"]) == 2
    assert a.core.state is S.STABLE and b.core.state is S.STABLE
    kinds = [cb.kind for cb in a.driver.callbacks()]
    assert CallbackKind.REVOKED in kinds
    # b got nothing before a's revocation was acked: its first non-empty ASSIGNED callback
    # came after a's REVOKED callback completed.
    assert b.core.member_epoch == a.core.member_epoch


def test_member_leaving_hands_partitions_over() -> None:
    c = _cluster(t1=4)
    a = c.add("a", "t1")
    b = c.add("b", "t1")
    c.settle(20)
    b.driver.unsubscribe()
    c.settle(20)
    assert b.core.state is S.UNSUBSCRIBED
    assert "b-id" not in c.coordinator.members
    assert a.core.fetchable_partitions == {("t1", p) for p in range(4)}


def test_lost_ack_is_recovered_with_the_previous_epoch() -> None:
    c = _cluster(t1=2)
    a = c.add("a", "t1")
    c.app_poll(a)
    c.background_poll(a)
    c.deliver(a)  # join answered: epoch 2, assignment
    c.app_poll(a)
    c.run_callback(a)
    assert a.core.state is S.ACKNOWLEDGING
    c.background_poll(a)  # the ack
    c.deliver(a, "lost")  # processed by the coordinator, answer lost
    assert a.core.state is S.STABLE
    server = c.coordinator.members["a-id"]
    epoch_before = a.core.member_epoch
    assert server.epoch == epoch_before  # nothing new to bump
    c.coordinator.add_topic("t2", 1)  # a rebalance the member does not know about yet
    a.driver.subscribe("t1", "t2")
    c.advance(5000)
    c.background_poll(a)  # carries the new subscription: bumps the member's server epoch
    c.deliver(a, "lost")
    assert server.epoch > a.core.member_epoch
    c.advance(1000)
    retry = c.background_poll(a)
    assert retry is not None and retry.member_epoch == server.previous_epoch
    response = c.deliver(a)
    assert response is not None and response.error_code == 0  # lost response tolerated
    c.metadata(a)
    c.settle(10)
    assert a.core.state is S.STABLE
    assert ("t2", 0) in a.core.fetchable_partitions


def test_fenced_by_the_coordinator_rejoins_with_same_id() -> None:
    c = _cluster(t1=2)
    a = c.add("a", "t1")
    c.settle(5)
    c.advance(c.coordinator.session_timeout_ms)
    c.tick()  # the coordinator drops the silent member
    assert "a-id" not in c.coordinator.members
    c.settle(10)
    assert a.core.state is S.STABLE
    assert "a-id" in c.coordinator.members
    assert CallbackKind.LOST in [cb.kind for cb in a.driver.callbacks()]


def test_static_member_leaves_with_minus_two_and_comes_back() -> None:
    c = _cluster(t1=2)
    a = c.add("a", "t1", group_instance_id="a-static")
    c.settle(5)
    a.driver.close(CloseOption.DEFAULT)
    c.settle(5)
    server = c.coordinator.members["a-id"]
    assert server.epoch == -2  # kept, partitions reserved
    again = c.add("a2", "t1", group_instance_id="a-static")
    c.settle(5)
    assert again.core.fetchable_partitions == {("t1", 0), ("t1", 1)}


def test_regex_subscription_with_metadata_arriving_later() -> None:
    c = _cluster(t1=1, t2=1)
    a = c.add("a", pattern="t.*")
    a.driver.metadata({})  # the member's metadata is empty at first
    c.app_poll(a)
    c.background_poll(a)
    c.deliver(a)
    c.app_poll(a)
    assert a.core.metadata_needed
    c.settle(5)
    assert a.core.fetchable_partitions == {("t1", 0), ("t2", 0)}


def test_mock_broker_constraint_is_enforced_by_the_test_coordinator() -> None:
    from consumer_sdk.domain import HeartbeatRequest

    with pytest.raises(MockBrokerAbort):
        ScriptedCoordinator({"t1": 1}).heartbeat(
            0, HeartbeatRequest("group", "m", 0, subscribed_topic_names=("t1",))
        )


@pytest.mark.parametrize("auto_commit", [False, True])
def test_three_members_churn_stays_safe(auto_commit: bool) -> None:
    c = _cluster(t1=6, t2=3)
    members = [c.add(n, "t1", "t2", auto_commit=auto_commit) for n in "abc"]
    c.settle(20)
    members[1].driver.unsubscribe()
    c.settle(10)
    members[1].driver.subscribe("t1")
    c.settle(20)
    owned = [m.core.fetchable_partitions for m in members]
    assert sum(len(o) for o in owned) == 9
    assert len(set().union(*owned)) == 9


def test_full_heartbeat_mid_reconciliation_does_not_release_unacked_partitions() -> None:
    """Found by the property test. a holds t1-0..3 (ASSIGNED callback pending, nothing acked)
    when its heartbeat's answer is lost. The coordinator meanwhile moved t1-1/t1-3 to pending
    revocation. Reporting the acked set (empty) in the full heartbeat that follows would tell
    the coordinator they are released: it would give them to b while a is about to enable them.
    """
    c = Cluster(ScriptedCoordinator({"t1": 4}, heartbeat_interval_ms=100))
    a = c.add("a", "t1")
    b = c.add("b", "t1")
    c.app_poll(a)
    c.background_poll(a)
    c.deliver(a)  # a gets t1-0..3, its ASSIGNED callback is pending
    c.app_poll(b)
    c.background_poll(b)
    c.deliver(b)  # b joins: the coordinator wants t1-1/t1-3 revoked from a
    c.advance(a.core.time_until_next_poll(c.now))
    assert c.background_poll(a) is not None
    c.deliver(a, "lost")  # processed (revocation pending), answer lost
    c.advance(a.core.time_until_next_poll(c.now))
    retry = c.background_poll(a)
    assert retry is not None
    assert retry.topic_partitions is None  # not the (empty) acked set
    c.deliver(a)
    assert c.coordinator.holders("t1", 1) == {"a-id"}
    c.settle(20)  # invariants are checked at every step
    assert a.core.fetchable_partitions == {("t1", 0), ("t1", 2)}
    assert b.core.fetchable_partitions == {("t1", 1), ("t1", 3)}
