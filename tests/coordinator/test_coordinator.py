"""Scenario tests of the coordinator model against the group coordinator's server rules."""

from __future__ import annotations

import uuid

import pytest

from consumer_sdk.coordinator import (
    CoordinatorConfig,
    CoordinatorEvent,
    EventKind,
    GroupCoordinator,
    GroupState,
    MemberAssignmentState,
)
from consumer_sdk.domain import HeartbeatRequest
from consumer_sdk.error_codes import ErrorCode as E
from tests.coordinator.support import Client, parts, wire

MAS = MemberAssignmentState


def make(topics: dict[str, int] | None = None, **config: object) -> GroupCoordinator:
    config.setdefault("assignment_interval_ms", 0)
    return GroupCoordinator(CoordinatorConfig(**config), topics or {"t": 4})  # type: ignore[arg-type]


def tp(c: GroupCoordinator, topic: str, *ps: int) -> frozenset[tuple[uuid.UUID, int]]:
    tid = c.topics.topic_id(topic)
    assert tid is not None
    return frozenset((tid, p) for p in ps)


def test_first_member_joins_and_gets_every_partition() -> None:
    c = make()
    a = Client(c, "a")
    r = a.join(0)
    assert r.error_code == 0
    assert r.member_epoch == 2  # groups start at epoch 1; the first assignment is epoch 2
    assert parts(r) == tp(c, "t", 0, 1, 2, 3)
    assert r.heartbeat_interval_ms == 5000
    d = c.describe("g")
    assert (d.state, d.group_epoch, d.assignment_epoch) == (GroupState.STABLE, 2, 2)


def test_second_member_waits_until_the_first_revokes() -> None:
    c = make()
    a, b = Client(c, "a"), Client(c, "b")
    a.join(0)
    a.ack(1)
    rb = b.join(10)
    # b moves to the new epoch but nothing is free yet.
    assert rb.member_epoch == 3 and parts(rb) == frozenset()
    assert c.member("g", "b").state is MAS.UNRELEASED_PARTITIONS  # type: ignore[union-attr]

    ra = a.hb(20)  # delta heartbeat: a learns what it keeps, at its old epoch
    kept = parts(ra)
    assert ra.member_epoch == 2 and kept is not None and len(kept) == 2
    assert c.member("g", "a").state is MAS.UNREVOKED_PARTITIONS  # type: ignore[union-attr]
    revoked = tp(c, "t", 0, 1, 2, 3) - kept

    # Until a acks, b gets none of the revoked partitions, however often it asks.
    for now in (30, 40):
        assert b.hb(now).assignment is None
        assert c.member("g", "b").assigned == frozenset()  # type: ignore[union-attr]
    assert a.hb(45, owned=tp(c, "t", 0, 1, 2, 3)).member_epoch == 2  # still owns them

    ra = a.hb(50, owned=kept)  # the ack
    assert ra.member_epoch == 3 and ra.assignment is None  # assignment unchanged
    rb = b.hb(60)
    assert rb.member_epoch == 3 and parts(rb) == revoked
    # The server sees both members reconciled to epoch 3 as soon as b is given them.
    assert c.describe("g").state is GroupState.STABLE
    assert b.ack(70).assignment is None
    assert c.check_exclusive("g") == []


def test_lost_response_is_tolerated_with_the_previous_epoch_and_owned_subset() -> None:
    c = make()
    a, b = Client(c, "a"), Client(c, "b")
    a.join(0)
    b.join(10)
    kept = parts(a.hb(20))
    assert kept is not None
    a.hb(30, owned=kept)  # moves a to epoch 3; pretend the response is lost
    assert c.member_epoch("g", "a") == 3
    r = a.full(40, owned=kept, epoch=2)
    assert r.error_code == 0 and r.member_epoch == 3 and parts(r) == kept
    # The previous epoch with partitions that are not assigned anymore is fenced.
    r = a.full(50, owned=tp(c, "t", 0, 1, 2, 3), epoch=2)
    assert r.error_code == E.FENCED_MEMBER_EPOCH
    # ...and so is a delta heartbeat without TopicPartitions.
    assert a.hb(55, epoch=2).error_code == E.FENCED_MEMBER_EPOCH


def test_epoch_fencing_and_unknown_members_and_groups() -> None:
    c = make()
    a = Client(c, "a")
    a.join(0)
    assert a.hb(1, epoch=7).error_code == E.FENCED_MEMBER_EPOCH
    assert Client(c, "zz").hb(2, epoch=5).error_code == E.UNKNOWN_MEMBER_ID
    assert Client(c, "a", group_id="nope").hb(3, epoch=2).error_code == E.GROUP_ID_NOT_FOUND
    assert Client(c, "a", group_id="nope").leave(4).error_code == E.GROUP_ID_NOT_FOUND
    assert Client(c, "zz").leave(5).error_code == E.UNKNOWN_MEMBER_ID
    # Errors leave the group unchanged.
    assert c.describe("g").group_epoch == 2


@pytest.mark.parametrize(
    ("request_", "code"),
    [
        (HeartbeatRequest("g", "", 0), E.INVALID_REQUEST),
        (HeartbeatRequest("", "m", 0), E.INVALID_REQUEST),
        (
            HeartbeatRequest("g", "m", 0, subscribed_topic_names=("t",), topic_partitions=()),
            E.INVALID_REQUEST,
        ),  # no RebalanceTimeoutMs
        (
            HeartbeatRequest("g", "m", 0, rebalance_timeout_ms=1, subscribed_topic_names=("t",)),
            E.INVALID_REQUEST,
        ),  # no TopicPartitions
        (
            HeartbeatRequest(
                "g",
                "m",
                0,
                rebalance_timeout_ms=1,
                subscribed_topic_names=("t",),
                topic_partitions=wire({(__import__("uuid").UUID(int=1), 0)}),
            ),
            E.INVALID_REQUEST,
        ),  # owned partitions on join
        (
            HeartbeatRequest("g", "m", 0, rebalance_timeout_ms=1, topic_partitions=()),
            E.INVALID_REQUEST,
        ),
        (HeartbeatRequest("g", "m", -2), E.INVALID_REQUEST),  # static leave without InstanceId
        (HeartbeatRequest("g", "m", -3), E.INVALID_REQUEST),
        (
            HeartbeatRequest(
                "g",
                "m",
                0,
                rebalance_timeout_ms=1,
                subscribed_topic_names=("t",),
                topic_partitions=(),
                server_assignor="sticky",
            ),
            E.UNSUPPORTED_ASSIGNOR,
        ),
        (
            HeartbeatRequest(
                "g", "m", 0, rebalance_timeout_ms=1, subscribed_topic_regex="(", topic_partitions=()
            ),
            E.INVALID_REGULAR_EXPRESSION,
        ),
    ],
)
def test_invalid_requests_are_rejected(request_: HeartbeatRequest, code: int) -> None:
    c = make()
    r = c.heartbeat(0, request_)
    assert r.error_code == code
    assert r.error_message
    assert c.group_ids() == []


def test_assignment_is_sent_on_join_full_request_or_change_only() -> None:
    c = make()
    a = Client(c, "a")
    assert a.join(0).assignment is not None
    assert a.ack(1).assignment is None  # delta, unchanged
    assert a.hb(2).assignment is None
    assert a.full(3, owned=a.assignment).assignment is not None  # full request


def test_dynamic_member_rejoining_with_epoch_zero_gets_its_state_back() -> None:
    c = make()
    a, b = Client(c, "a"), Client(c, "b")
    a.join(0)
    a.ack(1)
    b.join(2)
    before = c.describe("g").group_epoch
    r = a.join(3)  # e.g. fenced client-side; same member id
    assert r.error_code == 0 and r.member_epoch == 3
    assert parts(r) is not None and len(parts(r) or ()) == 2
    assert c.describe("g").group_epoch == before


def test_static_member_leaves_with_minus_two_and_a_new_instance_adopts_its_assignment() -> None:
    c = make()
    s1 = Client(c, "s1", instance_id="i1")
    d = Client(c, "d")
    s1.join(0)
    d.join(1)
    s1.ack(2)
    s1.ack(3)
    d.ack(4)
    mine = frozenset(c.member("g", "s1").assigned)  # type: ignore[union-attr]
    epoch = c.describe("g").group_epoch
    r = s1.leave(10, epoch=-2)
    assert (r.error_code, r.member_epoch) == (0, -2)
    assert c.member("g", "s1").member_epoch == -2  # type: ignore[union-attr]
    assert c.describe("g").group_epoch == epoch  # no rebalance
    # The reserved partitions are not handed to the other member.
    d.hb(11)
    assert c.member("g", "d").assigned.isdisjoint(mine)  # type: ignore[union-attr]
    # A second instance with the same instance id adopts the assignment.
    s2 = Client(c, "s2", instance_id="i1")
    r = s2.join(20)
    assert r.error_code == 0 and parts(r) == mine and r.member_epoch == epoch
    assert c.member("g", "s1") is None
    assert c.describe("g").group_epoch == epoch


def test_second_live_static_instance_gets_unreleased_instance_id() -> None:
    c = make()
    Client(c, "s1", instance_id="i1").join(0)
    r = Client(c, "s2", instance_id="i1").join(1)
    assert r.error_code == E.UNRELEASED_INSTANCE_ID
    # The 4.3 baseline says the same for the owner itself rejoining with epoch 0...
    assert Client(c, "s1", instance_id="i1").join(2).error_code == E.UNRELEASED_INSTANCE_ID
    # ...which apache/kafka#23542 changes (modelled by static_rejoin_in_place).
    c2 = make(static_rejoin_in_place=True)
    Client(c2, "s1", instance_id="i1").join(0)
    assert Client(c2, "s1", instance_id="i1").join(2).error_code == 0
    assert Client(c2, "s2", instance_id="i1").join(3).error_code == E.UNRELEASED_INSTANCE_ID


def test_static_member_id_mismatch_is_fenced_instance_id() -> None:
    c = make()
    s1 = Client(c, "s1", instance_id="i1")
    s1.join(0)
    other = Client(c, "s9", instance_id="i1", epoch=s1.epoch)
    assert other.hb(1).error_code == E.FENCED_INSTANCE_ID
    assert other.leave(2, epoch=-2).error_code == E.FENCED_INSTANCE_ID
    assert Client(c, "x", instance_id="nope").hb(3, epoch=2).error_code == E.UNKNOWN_MEMBER_ID


def test_static_member_leaving_for_good_with_minus_one_is_removed() -> None:
    c = make()
    s1 = Client(c, "s1", instance_id="i1")
    s1.join(0)
    assert s1.leave(1, epoch=-1).member_epoch == -1
    assert c.member("g", "s1") is None
    assert Client(c, "s2", instance_id="i1").join(2).error_code == 0


def test_session_expiry_removes_the_member_and_frees_its_partitions() -> None:
    events: list[CoordinatorEvent] = []
    c = GroupCoordinator(
        CoordinatorConfig(assignment_interval_ms=0), {"t": 4}, listener=events.append
    )
    a, b = Client(c, "a"), Client(c, "b")
    a.join(0)
    a.ack(1)
    b.join(2)
    kept = parts(a.hb(3))
    a.hb(4, owned=kept)
    b.hb(5)
    b.ack(6)
    for now in range(10_000, 50_001, 5_000):  # b keeps heartbeating, a goes silent
        b.hb(now)
        c.tick(now)
    assert c.member("g", "a") is None
    assert any(e.kind is EventKind.SESSION_EXPIRED and e.member_id == "a" for e in events)
    r = b.hb(50_100)
    assert r.error_code == 0
    b.ack(50_200)
    assert c.member("g", "b").assigned == tp(c, "t", 0, 1, 2, 3)  # type: ignore[union-attr]
    assert a.hb(50_300).error_code == E.UNKNOWN_MEMBER_ID


def test_static_member_at_minus_two_expires_after_the_session_timeout() -> None:
    c = make()
    s1 = Client(c, "s1", instance_id="i1")
    s1.join(0)
    s1.leave(1, epoch=-2)  # the session timer of the last heartbeat keeps running
    c.tick(44_999)
    assert c.member("g", "s1") is not None
    c.tick(45_000)
    assert c.member("g", "s1") is None


def test_rebalance_timeout_fences_a_member_that_never_revokes() -> None:
    c = make()
    a = Client(c, "a", rebalance_timeout_ms=20_000)
    b = Client(c, "b")
    a.join(0)
    a.ack(1)
    b.join(1_000)
    a.hb(2_000)  # a is told to revoke (UNREVOKED, rebalance timer armed)
    assert c.member("g", "a").rebalance_deadline_ms == 22_000  # type: ignore[union-attr]
    for now in (7_000, 12_000, 17_000):  # it heartbeats, still owning everything
        assert a.hb(now, owned=tp(c, "t", 0, 1, 2, 3)).error_code == 0
        b.hb(now)
        c.tick(now)
    removed = c.tick(22_000)
    assert removed == [("g", "a", EventKind.REBALANCE_TIMEOUT)]
    assert b.hb(22_100).error_code == 0
    b.ack(22_200)
    assert c.member("g", "b").assigned == tp(c, "t", 0, 1, 2, 3)  # type: ignore[union-attr]


def test_regex_subscription_follows_topic_creation_and_deletion() -> None:
    c = make({"orders-a": 2, "other": 3})
    m = Client(c, "m", regex="orders-.*")
    assert parts(m.join(0)) == tp(c, "orders-a", 0, 1)
    epoch = c.describe("g").group_epoch
    c.create_topic(10, "payments", 2)  # no match: no new epoch
    assert c.describe("g").group_epoch == epoch
    c.create_topic(20, "orders-b", 2)
    assert c.describe("g").group_epoch == epoch + 1
    m.ack(30)
    assert parts(m.last) == tp(c, "orders-a", 0, 1) | tp(c, "orders-b", 0, 1)  # type: ignore[arg-type]
    m.ack(31)
    c.delete_topic(40, "orders-a")
    r = m.hb(50)
    assert r.member_epoch == epoch + 1  # must revoke orders-a first
    assert c.member("g", "m").state is MAS.UNREVOKED_PARTITIONS  # type: ignore[union-attr]
    r = m.ack(60)
    assert r.member_epoch == epoch + 2 and c.describe("g").state is GroupState.STABLE
    # full match, as RE2J's matches(): "orders" alone does not match "orders-.*"
    assert c.topics.get("orders-b") is not None


def test_partition_increase_bumps_the_epoch_and_assigns_new_partitions() -> None:
    c = make({"t": 2})
    a = Client(c, "a")
    a.join(0)
    a.ack(1)
    epoch = c.describe("g").group_epoch
    c.add_partitions(10, "t", 2)
    assert c.describe("g").group_epoch == epoch + 1
    assert c.describe("g").state is GroupState.ASSIGNING
    r = a.hb(20)
    assert parts(r) == tp(c, "t", 0, 1, 2, 3) and r.member_epoch == epoch + 1


def test_subscription_change_revokes_unsubscribed_topics_first() -> None:
    c = make({"t": 2, "u": 2})
    a = Client(c, "a", topics=("t", "u"))
    a.join(0)
    a.ack(1)
    epoch = a.epoch
    a.topics = ("t",)
    r = a.full(10, owned=a.assignment)
    assert r.member_epoch == epoch  # revoke at the same epoch
    assert parts(r) == tp(c, "t", 0, 1)
    assert c.member("g", "a").pending_revocation == tp(c, "u", 0, 1)  # type: ignore[union-attr]
    r = a.ack(20)
    assert r.member_epoch > epoch
    assert c.member("g", "a").pending_revocation == frozenset()  # type: ignore[union-attr]


def test_server_assignor_is_chosen_by_the_members() -> None:
    c = make({"t": 4, "u": 4})
    Client(c, "a", topics=("t", "u"), assignor="range").join(0)
    assert c.describe("g").assignor == "range"


def test_assignment_interval_batches_target_computation() -> None:
    c = GroupCoordinator(CoordinatorConfig(assignment_interval_ms=1_000), {"t": 4})
    a, b = Client(c, "a"), Client(c, "b")
    a.join(0)
    rb = b.join(100)  # within the interval: the target is not recomputed yet
    assert parts(rb) == frozenset() and c.describe("g").state is GroupState.ASSIGNING
    assert c.describe("g").assignment_epoch == 2
    b.hb(1_100)
    assert c.describe("g").assignment_epoch == 3


def test_offset_commit_member_epoch_rules() -> None:
    c = make()
    a, b = Client(c, "a"), Client(c, "b")
    a.join(0)
    a.ack(1)
    b.join(2)
    kept = parts(a.hb(3))
    assert kept is not None
    a.hb(4, owned=kept)  # a at epoch 3 now, keeping partitions it had since epoch 2
    (keep_p,) = sorted(p for _, p in kept)[:1]
    offsets = {("t", keep_p): 10}
    assert c.offset_commit(5, "g", "a", 3, offsets) == {("t", keep_p): 0}
    assert c.offset_commit(5, "g", "a", 4, offsets) == {("t", keep_p): E.STALE_MEMBER_EPOCH}
    # An older epoch is fine for a partition assigned at or before it (KIP-1251)...
    assert c.offset_commit(5, "g", "a", 2, offsets) == {("t", keep_p): 0}
    # ...but not for one assigned later.
    b.hb(6)
    (b_p,) = sorted(p for _, p in c.member("g", "b").assigned)[:1]  # type: ignore[union-attr]
    assert c.offset_commit(7, "g", "b", 2, {("t", b_p): 1}) == {("t", b_p): E.STALE_MEMBER_EPOCH}
    assert c.offset_commit(8, "g", "zz", 3, offsets) == {("t", keep_p): E.UNKNOWN_MEMBER_ID}
    assert c.offset_commit(8, "g", "", -1, offsets) == {("t", keep_p): E.UNKNOWN_MEMBER_ID}
    assert c.offset_commit(8, "g", "a", 3, offsets, api_version=8) == {
        ("t", keep_p): E.UNSUPPORTED_VERSION
    }
    assert c.offset_commit(8, "g", "a", 3, {("nope", 0): 1}) == {
        ("nope", 0): E.UNKNOWN_TOPIC_OR_PARTITION
    }
    assert c.committed("g")[("t", keep_p)] == 10
    assert c.offset_commit(8, "empty", "", -1, {("t", 0): 5}) == {("t", 0): 0}


def test_injected_errors_and_failover() -> None:
    c = make()
    a = Client(c, "a")
    a.join(0)
    c.inject_error("a", E.COORDINATOR_LOAD_IN_PROGRESS, count=2)
    assert a.hb(1).error_code == E.COORDINATOR_LOAD_IN_PROGRESS
    assert a.hb(2).error_code == E.COORDINATOR_LOAD_IN_PROGRESS
    assert a.hb(3).error_code == 0
    c.inject_error(None, E.FENCED_MEMBER_EPOCH)
    assert a.hb(4).error_code == E.FENCED_MEMBER_EPOCH
    c.unload(10)
    assert a.hb(11).error_code == E.NOT_COORDINATOR
    c.tick(100_000)  # an unloaded coordinator expires nobody
    assert c.member("g", "a") is not None
    c.load(100_000, load_ms=2_000)
    assert a.hb(101_000).error_code == E.COORDINATOR_LOAD_IN_PROGRESS
    assert a.hb(102_000).error_code == 0  # group state was kept
    c.tick(102_000 + 45_000)
    assert c.member("g", "a") is None


def test_describe_reports_targets_and_states() -> None:
    c = make()
    assert c.describe("g").state is GroupState.DEAD
    a = Client(c, "a")
    a.join(0)
    d = c.describe("g")
    m = d.member("a")
    assert m is not None and m.target == m.assigned and m.holds == m.assigned
    a.leave(1)
    assert c.describe("g").state is GroupState.EMPTY


def test_each_heartbeat_moves_the_session_deadline() -> None:
    """One timer per member, moved by every heartbeat: a member that heartbeated until 30 s
    is still there at its first deadline (45 s) and expires exactly at 75 s; members whose
    deadlines fall together expire in the order they last heartbeated."""
    events: list[CoordinatorEvent] = []
    c = GroupCoordinator(
        CoordinatorConfig(assignment_interval_ms=0), {"t": 4}, listener=events.append
    )
    # one group each: nothing to revoke, so only their sessions can end them
    a, b, d = (
        Client(c, "a", group_id="ga"),
        Client(c, "b", group_id="gb"),
        Client(c, "d", group_id="gd"),
    )
    a.join(0)
    b.join(0)
    d.join(0)
    for now in (10_000, 20_000, 30_000):
        d.hb(now)
        b.hb(now)
        a.hb(now)
    for now in (44_999, 45_000, 60_000, 74_999):
        assert c.tick(now) == []
    assert [m for _, m, _ in c.tick(75_000)] == ["d", "b", "a"]
    assert [e.member_id for e in events if e.kind is EventKind.SESSION_EXPIRED] == ["d", "b", "a"]
    # A coordinator that loads again restarts every session from the load.
    e = Client(c, "e", group_id="ge")
    e.join(80_000)
    c.unload(90_000)
    c.load(100_000)
    assert c.tick(124_999) == [] and c.tick(144_999) == []
    assert [m for _, m, _ in c.tick(145_000)] == ["e"]


def test_a_stable_member_behind_a_new_target_moves_on_or_revokes() -> None:
    """A stable member's plain heartbeat after another member's change: with the same
    partitions in its target it just moves to the new epoch; with other partitions (as many)
    it revokes first, at its epoch."""
    c = make({"t": 2, "u": 2, "v": 2})
    a = Client(c, "a", topics=("t", "u"))
    b = Client(c, "b", topics=("t",))
    d = Client(c, "d", topics=("v",))
    for i, client in enumerate((a, b, d)):
        client.join(i)
    for now in range(10, 60, 10):
        for client in (a, b, d):
            client.ack(now) if client.last and client.last.assignment else client.hb(now)
    assert c.describe("g").state is GroupState.STABLE
    assert c.member("g", "a").assigned == tp(c, "u", 0, 1)  # type: ignore[union-attr]
    assert c.member("g", "b").assigned == tp(c, "t", 0, 1)  # type: ignore[union-attr]
    b.topics = ("u",)
    b.full(100, owned=b.assignment)
    epoch = c.describe("g").assignment_epoch
    # d's target (v) is unchanged: it moves to the new epoch with what it has.
    r = d.hb(110)
    assert (r.member_epoch, r.assignment) == (epoch, None)
    assert c.member("g", "d").state is MAS.STABLE  # type: ignore[union-attr]
    # a's target is now t (two partitions, as before): it must give u back first.
    r = a.hb(120)
    assert r.member_epoch < epoch and parts(r) == frozenset()
    assert c.member("g", "a").pending_revocation == tp(c, "u", 0, 1)  # type: ignore[union-attr]
