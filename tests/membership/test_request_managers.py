"""Coordinator, metadata and commit request managers, driven with virtual time."""

from __future__ import annotations

import random
import uuid
from dataclasses import dataclass

from consumer_sdk.domain import (
    Broker,
    ClusterMetadata,
    Coordinator,
    PartitionResult,
    TopicMetadata,
)
from consumer_sdk.error_codes import ErrorCode as E
from consumer_sdk.membership import Failure, FailureKind
from consumer_sdk.membership.heartbeat import Backoff
from consumer_sdk.membership.requests import (
    CommitKind,
    CommitRequestManager,
    CoordinatorManager,
    FindCoordinatorSend,
    MetadataManager,
    MetadataSend,
)


def backoff(jitter: float = 0.0) -> Backoff:
    return Backoff(100, 1000, jitter, random.Random(7))


@dataclass(frozen=True)
class Off:
    offset: int
    leader_epoch: int = -1
    metadata: str | None = None


OK = Coordinator("g", 1, "localhost", 9092)


# -- coordinator -------------------------------------------------------------------------------


def test_coordinator_one_request_at_a_time_only_while_needed() -> None:
    c = CoordinatorManager("g", backoff())
    assert c.poll(0, needed=False) is None
    assert c.poll(0, needed=True) == FindCoordinatorSend("g")
    assert c.poll(1, needed=True) is None  # in flight
    assert c.on_response(5, OK) is None
    assert c.coordinator == OK
    assert c.poll(6, needed=True) is None  # known
    c.mark_unknown("NOT_COORDINATOR")
    # As the Java client: the next lookup waits retry.backoff.ms from the last answer.
    assert c.poll(7, needed=True) is None
    assert c.time_until_next_poll(7, needed=True, idle_ms=5000) == 98
    assert c.poll(105, needed=True) == FindCoordinatorSend("g")


def test_coordinator_backs_off_exponentially_with_jitter() -> None:
    c = CoordinatorManager("g", backoff(jitter=0.2))
    now, gaps = 0, []
    for _ in range(6):
        assert c.poll(now, needed=True) is not None
        c.on_failure(now, Failure(FailureKind.DISCONNECTED, "refused"))
        wait = c.time_until_next_poll(now, needed=True, idle_ms=5000)
        assert c.poll(now + wait - 1, needed=True) is None
        gaps.append(wait)
        now += wait
    assert 80 <= gaps[0] <= 120
    assert 160 <= gaps[1] <= 240
    assert 800 <= gaps[-1] <= 1000  # capped at retry.backoff.max.ms
    assert c.poll(now, needed=True) is not None
    c.on_response(now, OK)
    c.mark_unknown("test")
    # Success reset the backoff: the next lookup waits one step (retry.backoff.ms, jittered),
    # not the grown backoff.
    assert c.poll(now + 1, needed=True) is None
    assert c.poll(now + 120, needed=True) is not None


def test_coordinator_error_codes_retry_and_authorization_is_reported() -> None:
    c = CoordinatorManager("g", backoff())
    c.poll(0, needed=True)
    assert c.on_response(0, Coordinator("g", -1, "", -1, E.COORDINATOR_NOT_AVAILABLE)) is None
    assert c.coordinator is None
    assert c.poll(50, needed=True) is None
    assert c.poll(100, needed=True) is not None
    reported = c.on_response(100, Coordinator("g", -1, "", -1, E.GROUP_AUTHORIZATION_FAILED))
    assert reported is not None and reported[0] == E.GROUP_AUTHORIZATION_FAILED
    assert "GROUP_AUTHORIZATION_FAILED" in reported[1]
    c.poll(1000, needed=True)
    auth = c.on_failure(1000, Failure(FailureKind.AUTHENTICATION, "SASL PLAIN failed"))
    assert auth is not None and "SASL PLAIN failed" in auth[1]


# -- metadata ----------------------------------------------------------------------------------


def md(*topics: tuple[str, uuid.UUID]) -> ClusterMetadata:
    return ClusterMetadata(
        (Broker(1, "localhost", 9092),),
        tuple(TopicMetadata(name, tid, ()) for name, tid in topics),
        1,
    )


def test_metadata_merges_requests_and_retries_failures() -> None:
    mm = MetadataManager(backoff())
    assert mm.poll(0) is None
    mm.request(["b", "a"])
    send = mm.poll(0)
    assert send == MetadataSend(("a", "b"))
    mm.request(["c"])
    assert mm.poll(1) is None  # one at a time
    mm.on_failure(2, Failure(FailureKind.TIMEOUT, "slow"))
    assert mm.poll(50) is None  # backoff
    assert mm.poll(102) == MetadataSend(("a", "b", "c"))
    ta, tb = uuid.uuid4(), uuid.uuid4()
    mm.on_response(110, md(("a", ta), ("b", tb)))
    assert mm.topic_names == {ta: "a", tb: "b"} and mm.version == 1
    mm.on_response(120, md(("a", ta)))  # nothing new
    assert mm.version == 1
    mm.request(None)
    assert mm.poll(130) == MetadataSend(None)


# -- commits -----------------------------------------------------------------------------------


def results(code: int, *parts: tuple[str, int]) -> list[PartitionResult]:
    return [PartitionResult(t, p, code) for t, p in parts]


def test_async_commit_is_sent_with_member_epoch_and_never_retried() -> None:
    cm = CommitRequestManager("g", None, backoff())
    cid = cm.commit(0, {("t", 0): Off(5), ("t", 1): Off(9, 3, "m")}, CommitKind.ASYNC)
    assert cm.poll(0, "m1", 4, coordinator_known=False) == []
    (send,) = cm.poll(1, "m1", 4, coordinator_known=True)
    assert send.commit_id == cid
    r = send.request
    assert (r.group_id, r.member_id, r.member_epoch) == ("g", "m1", 4)
    assert [(o.topic, o.partition, o.offset, o.leader_epoch, o.metadata) for o in r.offsets] == [
        ("t", 0, 5, -1, None),
        ("t", 1, 9, 3, "m"),
    ]
    assert cm.poll(2, "m1", 4, True) == []  # in flight
    rediscover = cm.on_response(3, cid, results(E.NOT_COORDINATOR, ("t", 0), ("t", 1)))
    assert rediscover
    (done,) = cm.drain_completed()
    assert done.kind is CommitKind.ASYNC and done.error_code == E.NOT_COORDINATOR
    assert cm.pending == 0


def test_sync_commit_retries_retriable_errors_until_deadline() -> None:
    cm = CommitRequestManager("g", None, backoff())
    cid = cm.commit(0, {("t", 0): Off(5), ("t", 1): Off(6)}, CommitKind.SYNC, timeout_ms=1500)
    assert len(cm.poll(0, "m", 1, True)) == 1
    # Partial success: only the failed partition is retried.
    cm.on_response(1, cid, results(0, ("t", 0)) + results(E.COORDINATOR_LOAD_IN_PROGRESS, ("t", 1)))
    assert cm.drain_completed() == []
    assert cm.poll(50, "m", 1, True) == []
    assert cm.time_until_next_poll(50, True, 5000) == 51
    (retry,) = cm.poll(101, "m", 2, True)
    assert [(o.partition, o.offset) for o in retry.request.offsets] == [(1, 6)]
    assert retry.request.member_epoch == 2  # epoch read at send time
    cm.on_response(102, cid, results(0, ("t", 1)))
    (done,) = cm.drain_completed()
    assert done.ok and done.committed == {("t", 0): 5, ("t", 1): 6}


def test_rebalance_commit_retries_a_stale_epoch_with_backoff() -> None:
    cm = CommitRequestManager("g", None, backoff())
    b = cm.commit(0, {("t", 1): Off(5)}, CommitKind.REBALANCE)
    cm.poll(0, "m", 1, True)
    cm.on_response(1, b, results(E.STALE_MEMBER_EPOCH, ("t", 1)))
    assert cm.drain_completed() == []
    (retry,) = cm.poll(200, "m", 2, True)
    assert retry.commit_id == b and retry.request.member_epoch == 2


def _refused_sync_commit(cm: CommitRequestManager) -> int:
    """A sync commit of t[0] and t[1] sent at epoch 1 and refused as stale."""
    a = cm.commit(0, {("t", 0): Off(5), ("t", 1): Off(6)}, CommitKind.SYNC, timeout_ms=30_000)
    (sent,) = cm.poll(0, "m", 1, True)
    assert sent.request.member_epoch == 1
    cm.on_response(1, a, results(E.STALE_MEMBER_EPOCH, ("t", 0), ("t", 1)))
    assert cm.drain_completed() == [] and cm.awaiting_epoch
    return a


def test_sync_commit_refused_as_stale_goes_out_again_under_the_newer_epoch() -> None:
    cm = CommitRequestManager("g", None, backoff())
    a = _refused_sync_commit(cm)
    held = frozenset({("t", 0), ("t", 1), ("t", 2)})
    # Not resent under the refused epoch, and no busy wait for the newer one.
    assert cm.poll(100, "m", 1, True, owned=lambda: held, epoch_wait_ms=1000) == []
    assert cm.time_until_next_poll(100, True, 5000) == 5000
    (retry,) = cm.poll(400, "m", 2, True, owned=lambda: held, epoch_wait_ms=1000)
    assert retry.commit_id == a and retry.request.member_epoch == 2
    assert [(o.partition, o.offset) for o in retry.request.offsets] == [(0, 5), (1, 6)]
    cm.on_response(401, a, results(0, ("t", 0), ("t", 1)))
    (done,) = cm.drain_completed()
    assert done.ok and done.committed == {("t", 0): 5, ("t", 1): 6}


def test_sync_commit_refused_as_stale_fails_once_a_partition_is_being_given_up() -> None:
    cm = CommitRequestManager("g", None, backoff())
    a = _refused_sync_commit(cm)
    assert cm.poll(400, "m", 2, True, owned=lambda: {("t", 0)}, epoch_wait_ms=1000) == []
    (done,) = cm.drain_completed()
    assert done.commit_id == a and done.error_code == E.STALE_MEMBER_EPOCH
    assert "no longer this member's" in done.error_message


def test_sync_commit_refused_as_stale_fails_when_no_newer_epoch_comes() -> None:
    cm = CommitRequestManager("g", None, backoff())
    a = _refused_sync_commit(cm)
    held = frozenset({("t", 0), ("t", 1)})
    assert cm.poll(900, "m", 1, True, owned=lambda: held, epoch_wait_ms=1000) == []
    assert cm.drain_completed() == []
    assert cm.poll(1001, "m", 1, True, owned=lambda: held, epoch_wait_ms=1000) == []
    (done,) = cm.drain_completed()
    assert done.commit_id == a and done.error_code == E.STALE_MEMBER_EPOCH
    assert "no newer member epoch" in done.error_message and not cm.awaiting_epoch


def test_sync_commit_gives_up_at_deadline_and_unsent_commit_expires() -> None:
    cm = CommitRequestManager("g", None, backoff())
    a = cm.commit(0, {("t", 0): Off(5)}, CommitKind.SYNC, timeout_ms=150)
    cm.poll(0, "m", 1, True)
    cm.on_failure(100, a, Failure(FailureKind.TIMEOUT, "no answer"))
    (done,) = cm.drain_completed()
    assert done.error_code == E.REQUEST_TIMED_OUT and "timeout" in done.error_message
    b = cm.commit(200, {("t", 0): Off(6)}, CommitKind.ASYNC, timeout_ms=300)
    assert cm.poll(300, "m", 1, coordinator_known=False) == []
    assert cm.time_until_next_poll(300, False, 5000) == 200
    cm.poll(500, "m", 1, coordinator_known=False)
    (expired,) = cm.drain_completed()
    assert expired.commit_id == b and expired.error_code == E.REQUEST_TIMED_OUT


def test_committed_offsets_never_go_backwards_until_forgotten() -> None:
    cm = CommitRequestManager("g", None, backoff())
    a = cm.commit(0, {("t", 0): Off(10)}, CommitKind.ASYNC)
    cm.poll(0, "m", 1, True)
    cm.on_response(1, a, results(0, ("t", 0)))
    b = cm.commit(2, {("t", 0): Off(7)}, CommitKind.ASYNC)
    assert cm.poll(2, "m", 1, True) == []
    assert [r.commit_id for r in cm.drain_completed()] == [a, b]
    cm.forget([("t", 0)])
    cm.commit(3, {("t", 0): Off(7)}, CommitKind.ASYNC)
    assert len(cm.poll(3, "m", 1, True)) == 1


def test_auto_commit_interval_and_one_in_flight() -> None:
    cm = CommitRequestManager("g", None, backoff(), auto_commit_interval_ms=5000)
    assert not cm.auto_commit_due(0)  # starts the interval
    assert not cm.auto_commit_due(4999)
    assert cm.time_until_next_poll(4000, True, 60_000) == 1000
    assert cm.auto_commit_due(5000)
    a = cm.commit(5000, {("t", 0): Off(1)}, CommitKind.AUTO)
    cm.poll(5000, "m", 1, True)
    assert not cm.auto_commit_due(10_000)  # the previous one is still in flight
    cm.on_response(10_001, a, results(E.COORDINATOR_LOAD_IN_PROGRESS, ("t", 0)))
    (done,) = cm.drain_completed()
    assert done.kind is CommitKind.AUTO and not done.ok  # auto-commits are not retried
    assert cm.auto_commit_due(15_000)
    cm.skip_auto_commit(15_000)
    assert not cm.auto_commit_due(19_999)
    assert CommitRequestManager("g", None, backoff()).auto_commit_due(10**9) is False


def test_non_retriable_failure_ends_sync_commit_at_once() -> None:
    cm = CommitRequestManager("g", "static-1", backoff())
    a = cm.commit(0, {("t", 0): Off(1)}, CommitKind.SYNC)
    (send,) = cm.poll(0, "m", -5, True)
    assert send.request.member_epoch == -1 and send.request.instance_id == "static-1"
    cm.on_response(1, a, results(E.UNKNOWN_MEMBER_ID, ("t", 0)))
    (done,) = cm.drain_completed()
    assert done.error_code == E.UNKNOWN_MEMBER_ID and "UNKNOWN_MEMBER_ID" in done.error_message


def test_deleted_topic_of_a_released_partition_is_dropped_not_retried() -> None:
    cm = CommitRequestManager("g", None, backoff())
    gone, keep = ("gone", 0), ("keep", 0)
    cid = cm.commit(0, {gone: Off(5), keep: Off(7)}, CommitKind.REBALANCE, 60_000, releasing=[gone])
    cm.poll(0, "m", 1, True)
    cm.on_response(1, cid, results(E.UNKNOWN_TOPIC_OR_PARTITION, gone) + results(0, keep))
    (done,) = cm.drain_completed()
    assert done.error_code == E.UNKNOWN_TOPIC_OR_PARTITION and "gone[0]" in done.error_message
    assert done.committed == {keep: 7} and done.dropped == {gone: E.UNKNOWN_TOPIC_OR_PARTITION}
    assert cm.pending == 0
    # A partition the member keeps is retried as before (the error may be transient).
    cid = cm.commit(2, {keep: Off(9)}, CommitKind.REBALANCE, 60_000, releasing=[gone])
    cm.poll(2, "m", 1, True)
    cm.on_response(3, cid, results(E.UNKNOWN_TOPIC_OR_PARTITION, keep))
    assert cm.drain_completed() == [] and cm.pending == 1
