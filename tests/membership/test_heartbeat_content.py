"""Heartbeat content: full vs delta, member id, subscription fields, the ack."""

from __future__ import annotations

import base64
import random
import re
import uuid

import pytest

from consumer_sdk.domain import HeartbeatRequest
from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.membership import FailureKind, GroupMembership, MemberState
from consumer_sdk.membership.ids import new_member_id

from .harness import INTERVAL, T1, T2, Driver, cfg, err, ok, owned_of, stable

S = MemberState


def _is_full(req: HeartbeatRequest) -> bool:
    """The server's definition of a full heartbeat."""
    return (
        req.rebalance_timeout_ms != -1
        and (req.subscribed_topic_names is not None or req.subscribed_topic_regex is not None)
        and req.topic_partitions is not None
    )


def test_first_heartbeat_includes_everything_needed_to_join() -> None:
    d = Driver(
        cfg(
            client_rack="rack-a",
            remote_assignor="uniform",
            rebalance_timeout_ms=123_000,
        )
    )
    req = d.join("t2", "t1", "t1")
    assert req == HeartbeatRequest(
        group_id="group",
        member_id="member-1",
        member_epoch=0,
        instance_id=None,
        rack_id="rack-a",
        rebalance_timeout_ms=123_000,
        subscribed_topic_names=("t1", "t2"),
        subscribed_topic_regex="",
        server_assignor="uniform",
        topic_partitions=(),
    )
    assert _is_full(req)


def test_regex_subscription_sends_empty_names_with_the_regex() -> None:
    d = Driver()
    d.subscribe(pattern="t.*")
    d.app_poll()
    req = d.must_hb()
    assert req.subscribed_topic_names == ()
    assert req.subscribed_topic_regex == "t.*"


def test_delta_heartbeat_sends_only_changes() -> None:
    d = Driver(cfg(client_rack="r", remote_assignor="range", group_instance_id="inst"))
    d.metadata()
    d.join("t1")
    d.respond(ok(1, {T1: [0]}))
    d.app_poll()
    d.run_callbacks()
    ack = d.must_hb()
    assert ack == HeartbeatRequest(
        group_id="group",
        member_id="member-1",
        member_epoch=1,
        instance_id="inst",
        topic_partitions=ack.topic_partitions,
    )
    assert owned_of(ack) == {T1: (0,)}
    d.respond(ok(1))
    d.advance(INTERVAL)
    plain = d.must_hb()
    assert plain == HeartbeatRequest(
        group_id="group", member_id="member-1", member_epoch=1, instance_id="inst"
    )


def test_ack_is_sent_once_per_local_assignment_change() -> None:
    d = stable({T1: [0]})
    for _ in range(3):
        d.advance(INTERVAL)
        assert d.must_hb().topic_partitions is None
        d.respond(ok(1))
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(ok(2, {T1: [0, 1]}))
    d.app_poll()
    d.run_callbacks()
    ack = d.must_hb()
    assert owned_of(ack) == {T1: (0, 1)}
    d.respond(ok(2))
    d.advance(INTERVAL)
    assert d.must_hb().topic_partitions is None


def test_assignment_sent_when_local_epoch_changes_even_with_same_partitions() -> None:
    """A partial ack bumps the local epoch: the (unchanged) owned set is sent again."""
    d = stable({T1: [0]})
    d.advance(INTERVAL)
    d.must_hb()
    d.metadata({T1: "t1"})
    d.respond(ok(2, {T1: [0], T2: [0]}))  # T2 cannot be named
    assert d.state is S.ACKNOWLEDGING
    ack = d.must_hb()
    assert owned_of(ack) == {T1: (0,)}


def test_subscription_change_in_group_is_sent_without_rejoining() -> None:
    d = stable()
    d.subscribe("t1", "t2")
    d.app_poll()
    assert d.state is S.STABLE
    d.advance(INTERVAL)
    req = d.must_hb()
    assert req.member_epoch == 1
    assert req.subscribed_topic_names == ("t1", "t2")
    assert req.subscribed_topic_regex == ""
    assert req.rebalance_timeout_ms == -1
    d.respond(ok(1))
    d.subscribe(pattern="t[0-9]")
    d.advance(INTERVAL)
    req = d.must_hb()
    assert (req.subscribed_topic_names, req.subscribed_topic_regex) == ((), "t[0-9]")
    d.respond(ok(1))
    d.subscribe("t1")
    d.advance(INTERVAL)
    req = d.must_hb()
    assert (req.subscribed_topic_names, req.subscribed_topic_regex) == (("t1",), "")


@pytest.mark.parametrize("subscription", [("t1",), "t.*"])
def test_names_and_regex_always_travel_together(subscription: tuple[str, ...] | str) -> None:
    d = Driver()
    d.metadata()
    if isinstance(subscription, str):
        d.subscribe(pattern=subscription)
    else:
        d.subscribe(*subscription)
    d.app_poll()
    sent = [d.must_hb()]
    d.respond(ok(1, {T1: [0]}))
    d.app_poll()
    d.run_callbacks()
    sent.append(d.must_hb())
    d.fail(FailureKind.TIMEOUT)
    d.advance(1000)
    sent.append(d.must_hb())
    for req in sent:
        assert (req.subscribed_topic_names is None) == (req.subscribed_topic_regex is None)
        assert req.member_id


@pytest.mark.parametrize(
    "outcome",
    [
        err(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS),
        err(ErrorCode.NOT_COORDINATOR),
        err(ErrorCode.TOPIC_AUTHORIZATION_FAILED),
        FailureKind.TIMEOUT,
        FailureKind.DISCONNECTED,
    ],
    ids=["load-in-progress", "not-coordinator", "topic-auth", "timeout", "disconnect"],
)
def test_any_error_or_failure_makes_the_next_heartbeat_full(outcome: object) -> None:
    d = stable({T1: [0, 1]}, remote_assignor="uniform", client_rack="r")
    d.advance(INTERVAL)
    assert not _is_full(d.must_hb())
    if isinstance(outcome, FailureKind):
        d.fail(outcome)
    else:
        d.respond(outcome)  # type: ignore[arg-type]
    d.core.on_coordinator_known(d.now)
    d.advance(1000)
    req = d.must_hb()
    assert _is_full(req)
    assert req.member_epoch == 1
    assert req.server_assignor == "uniform"
    assert req.rack_id is None  # rack only on join
    assert owned_of(req) == {T1: (0, 1)}
    assert (req.subscribed_topic_names, req.subscribed_topic_regex) == (("t1",), "")


def test_full_heartbeats_list_a_partition_until_its_revocation_callback_ran() -> None:
    """The soak's overlap (seed 20261124): a revocation arrives after a coordinator outage
    while the application thread is busy; every heartbeat until on_revoke has run (full ones
    after failures included) still reports the partition owned, so no broker can hand it on."""
    d = stable({T1: [0, 1]})
    d.advance(INTERVAL)
    d.must_hb()
    d.fail(FailureKind.DISCONNECTED)  # the coordinator broker went down
    d.core.on_coordinator_known(d.now)
    d.advance(1000)
    req = d.must_hb()
    assert _is_full(req) and owned_of(req) == {T1: (0, 1)}
    d.respond(ok(1, {T1: [0]}))  # revoke t1-1; the application has not polled yet
    for failure in (FailureKind.TIMEOUT, FailureKind.DISCONNECTED, None):
        d.advance(INTERVAL)
        req = d.must_hb()
        assert owned_of(req) in (None, {T1: (0, 1)}), req
        if failure is None:
            d.respond(ok(1))
        else:
            d.fail(failure)
            d.core.on_coordinator_known(d.now)
            d.advance(1000)
            full = d.must_hb()
            assert _is_full(full) and owned_of(full) == {T1: (0, 1)}, full
            d.respond(ok(1))
    d.app_poll()
    (revoke,) = d.pending_callbacks()
    assert revoke.partitions == (("t1", 1),)
    d.advance(INTERVAL)
    assert owned_of(d.must_hb()) in (None, {T1: (0, 1)})  # on_revoke still running
    d.respond(ok(1))
    d.run_callbacks()
    release = d.must_hb()
    assert owned_of(release) == {T1: (0,)}


def test_acks_reconciled_assignment_again_after_the_ack_is_lost() -> None:
    d = Driver()
    d.metadata()
    d.join("t1")
    d.respond(ok(1, {T1: [0, 1]}))
    d.app_poll()
    d.run_callbacks()
    ack = d.must_hb()
    assert owned_of(ack) == {T1: (0, 1)}
    d.fail(FailureKind.TIMEOUT)
    assert d.state is S.STABLE
    d.advance(1000)
    again = d.must_hb()
    assert owned_of(again) == {T1: (0, 1)}
    assert again.member_epoch == 1


def test_static_member_sends_instance_id_always() -> None:
    d = stable(group_instance_id="instance-7")
    d.advance(INTERVAL)
    assert d.must_hb().instance_id == "instance-7"
    d.respond(ok(1))
    d.unsubscribe()
    d.run_callbacks()
    leave = d.must_hb()
    assert (leave.instance_id, leave.member_epoch) == ("instance-7", -2)


def test_generated_member_id_is_a_22_char_urlsafe_uuid4() -> None:
    member_id = new_member_id(random.Random(1))
    assert len(member_id) == 22
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", member_id)
    assert not member_id.startswith("-")
    value = uuid.UUID(bytes=base64.urlsafe_b64decode(member_id + "=="))
    assert value.version == 4
    assert new_member_id(random.Random(1)) == member_id
    assert new_member_id(random.Random(2)) != member_id


def test_member_id_kept_for_the_members_lifetime() -> None:
    core = GroupMembership(cfg(), rng=random.Random(5))
    d = Driver(cfg(), member_id=None, seed=5)
    assert d.core.member_id == core.member_id
    ids = {d.join("t1").member_id}
    d.respond(ok(1, {}))
    d.app_poll()
    d.run_callbacks()
    d.must_hb()
    d.respond(err(ErrorCode.FENCED_MEMBER_EPOCH))
    ids.add(d.must_hb().member_id)  # rejoin after fencing
    d.respond(ok(3, {}))
    d.unsubscribe()
    d.run_callbacks()
    ids.add(d.must_hb().member_id)  # leave
    d.subscribe("t1")
    d.app_poll()
    ids.add(d.must_hb().member_id)  # join again
    assert ids == {core.member_id}


def test_empty_member_id_is_refused() -> None:
    with pytest.raises(ValueError):
        GroupMembership(cfg(), member_id_factory=lambda: "")


def test_config_validation() -> None:
    with pytest.raises(ValueError):
        cfg(group_id="")
    with pytest.raises(ValueError):
        cfg(group_instance_id="")
    with pytest.raises(ValueError):
        cfg(rebalance_timeout_ms=0)
    with pytest.raises(ValueError):
        cfg(retry_backoff_jitter=1.5)


def test_full_heartbeat_waits_while_the_member_holds_unacked_partitions() -> None:
    """After an error mid-reconciliation the acked set would understate what the member holds;
    a plain heartbeat goes out instead, and the full one (with the ack) after the pass."""
    d = stable({T1: [0]})
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(ok(2, {T1: [0, 1]}))
    (assigned,) = d.pending_callbacks()  # t1-1 is held, not acked
    d.advance(INTERVAL)
    d.must_hb()
    d.fail(FailureKind.TIMEOUT)
    d.advance(1000)
    plain = d.must_hb()
    assert plain == HeartbeatRequest("group", "member-1", 2)
    d.respond(ok(2))
    d.complete(assigned)
    full = d.must_hb()  # the ack, and everything else: a full heartbeat
    assert _is_full(full)
    assert owned_of(full) == {T1: (0, 1)}


def test_failed_assigned_callback_keeps_heartbeats_plain_until_retried() -> None:
    d = stable({T1: [0]})
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(ok(2, {T1: [0, 1]}))
    d.run_callbacks(error="boom")
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(err(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
    d.advance(1000)
    assert d.must_hb().topic_partitions is None
    d.respond(ok(2))
    d.run_callbacks()  # the retry succeeds
    assert owned_of(d.must_hb()) == {T1: (0, 1)}
