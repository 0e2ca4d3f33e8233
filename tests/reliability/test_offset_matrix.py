"""Fault matrix for OffsetCommit and OffsetFetch errors, one cluster per case.

OffsetCommit: a synchronous ``commit()`` retries retriable errors (rediscovering the
coordinator after NOT_COORDINATOR / COORDINATOR_NOT_AVAILABLE / REQUEST_TIMED_OUT) and raises
the others with their code (STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID, authorization errors,
OFFSET_METADATA_TOO_LARGE).

OffsetFetch (the committed offsets a newly assigned partition starts from): retriable errors
and STALE_MEMBER_EPOCH are retried without surfacing, and the partition still starts at the
committed offset; UNKNOWN_MEMBER_ID and authorization errors are raised from ``poll()``, and
the assignment is retried so the member recovers once the error is gone.
"""

from __future__ import annotations

from typing import Any

import pytest

from consumer_sdk import Consumer, GroupMember, KafkaException, MemberState, TopicPartition
from consumer_sdk.testing import EmbeddedKafka
from tests.reliability.support import (
    FIND_COORDINATOR,
    OFFSET_COMMIT,
    OFFSET_FETCH,
    App,
    config,
    timed_close,
)

COMMIT_CODES: dict[str, tuple[int, str]] = {
    "NOT_COORDINATOR": (16, "retried+rediscover"),
    "COORDINATOR_NOT_AVAILABLE": (15, "retried+rediscover"),
    "REQUEST_TIMED_OUT": (7, "retried"),
    "COORDINATOR_LOAD_IN_PROGRESS": (14, "retried"),
    "UNKNOWN_TOPIC_OR_PARTITION": (3, "retried"),
    "UNKNOWN_TOPIC_ID": (100, "retried"),
    "STALE_MEMBER_EPOCH": (113, "raised"),
    "UNKNOWN_MEMBER_ID": (25, "raised"),
    "GROUP_AUTHORIZATION_FAILED": (30, "raised"),
    "TOPIC_AUTHORIZATION_FAILED": (29, "raised"),
    "OFFSET_METADATA_TOO_LARGE": (12, "raised"),
}

FETCH_CODES: dict[str, tuple[int, str]] = {
    "NOT_COORDINATOR": (16, "retried"),
    "COORDINATOR_NOT_AVAILABLE": (15, "retried"),
    "COORDINATOR_LOAD_IN_PROGRESS": (14, "retried"),
    "UNSTABLE_OFFSET_COMMIT": (88, "retried"),
    "STALE_MEMBER_EPOCH": (113, "retried"),
    "UNKNOWN_MEMBER_ID": (25, "raised"),
    "GROUP_AUTHORIZATION_FAILED": (30, "raised"),
}


def _stable(app: App) -> None:
    app.poll_until(
        lambda: app.member.state is MemberState.STABLE and len(app.member.assignment()) == 2,
        what="a stable member with both partitions",
    )


@pytest.mark.parametrize(
    ("name", "code", "outcome"),
    [pytest.param(n, c, o, id=f"OffsetCommit-{n}") for n, (c, o) in COMMIT_CODES.items()],
)
def test_sync_commit_error(embedded_kafka_factory: Any, name: str, code: int, outcome: str) -> None:
    kafka: EmbeddedKafka = embedded_kafka_factory(
        brokers=1, heartbeat_interval_ms=500, session_timeout_ms=6000
    )
    kafka.create_topic("oc", partitions=2, replication_factor=1)
    member = GroupMember(config(kafka, f"oc-{code}", enable_auto_commit=False))
    app = App(member)
    try:
        member.subscribe(["oc"])
        _stable(app)
        lookups = len(kafka.requests(FIND_COORDINATOR))
        kafka.push_broker_errors(1, OFFSET_COMMIT, [(code, 0)])
        offsets = [TopicPartition("oc", 0, 42), TopicPartition("oc", 1, 7)]
        if outcome.startswith("retried"):
            committed = member.commit(offsets=offsets, asynchronous=False)
            assert committed == offsets
            assert len(kafka.requests(OFFSET_COMMIT)) == 2, "one failed attempt, one retry"
            if outcome.endswith("rediscover"):
                assert len(kafka.requests(FIND_COORDINATOR)) > lookups
        else:
            with pytest.raises(KafkaException) as info:
                member.commit(offsets=offsets, asynchronous=False)
            error = info.value.args[0]
            assert error.code() == code
            assert f"commit failed: {name}" in error.str()
            assert len(kafka.requests(OFFSET_COMMIT)) == 1, "not retried"
            assert member.commit(offsets=offsets, asynchronous=False) == offsets
        assert [tp.offset for tp in member.committed(offsets)] == [42, 7]
        assert member.state is MemberState.STABLE, "a commit error does not touch membership"
    finally:
        took = timed_close(member)
    assert took < 5.5


@pytest.mark.parametrize(
    ("name", "code", "outcome"),
    [pytest.param(n, c, o, id=f"OffsetFetch-{n}") for n, (c, o) in FETCH_CODES.items()],
)
def test_offset_fetch_error_on_assignment(
    embedded_kafka_factory: Any, name: str, code: int, outcome: str
) -> None:
    kafka: EmbeddedKafka = embedded_kafka_factory(
        brokers=1, heartbeat_interval_ms=500, session_timeout_ms=6000
    )
    kafka.create_topic("of", partitions=2, replication_factor=1)
    kafka.produce("of", [b"old"] * 10, partition=0)
    kafka.produce("of", [b"new"], partition=0)
    group = f"of-{code}"
    # Commit offset 10 for partition 0 as a standalone (not yet member) group.
    from consumer_sdk.domain import OffsetCommitPartition, OffsetCommitRequest
    from consumer_sdk.protocol.client import ClusterClient

    with ClusterClient({"bootstrap.servers": kafka.bootstrap_servers}) as client:
        request = OffsetCommitRequest(group, "", -1, (OffsetCommitPartition("of", 0, 10),))
        assert [r.error_code for r in client.offset_commit(request, 5)] == [0]
    consumer = Consumer(config(kafka, group, enable_auto_commit=False))
    app = App(consumer)
    try:
        kafka.push_broker_errors(1, OFFSET_FETCH, [(code, 0)])
        consumer.subscribe(["of"])
        first = app.next_record(what="the first record")
        assert (first.partition(), first.offset(), first.value()) == (0, 10, b"new"), (
            "partition 0 starts at the committed offset, not at auto.offset.reset"
        )
        if outcome == "retried":
            assert app.errors == [], "a retriable OffsetFetch error is not the application's"
            assert len(kafka.requests(OFFSET_FETCH)) >= 2
        else:
            assert app.error_codes() == [code]
            assert name in app.errors[0].args[0].str()
        # A record can come out of the poll that ran on_assign, before the network loop
        # acknowledged the reconciliation (RECONCILING until then, as in Java's consumer).
        app.poll_until(lambda: consumer.state is MemberState.STABLE, what="STABLE")
    finally:
        took = timed_close(consumer)
    assert took < 5.5


def test_fenced_member_commits_with_epoch_minus_one(embedded_kafka_factory: Any) -> None:
    """Outside the group (fenced, rejoining) a commit carries epoch -1, not the rejoin epoch 0:
    the old partitions' offsets must not pass for a member's."""
    kafka: EmbeddedKafka = embedded_kafka_factory(
        brokers=1, heartbeat_interval_ms=300, session_timeout_ms=6000
    )
    kafka.create_topic("oc", partitions=1, replication_factor=1)
    member = GroupMember(config(kafka, "oc-fenced", enable_auto_commit=False))
    sent: list[int] = []
    commits = member._net.commits
    real = type(commits)

    class _Spy(real):  # type: ignore[valid-type,misc]
        __slots__ = ()  # (the manager is slotted: its class is swapped, not its method)

        def poll(self, *args: Any, **kwargs: Any) -> Any:
            sends = real.poll(self, *args, **kwargs)
            sent.extend(s.request.member_epoch for s in sends)
            return sends

    commits.__class__ = _Spy
    outcome: list[str] = []

    def on_lost(consumer: Any, parts: list[TopicPartition]) -> None:
        try:
            consumer.commit(offsets=[TopicPartition("oc", 0, 9)], asynchronous=False)
            outcome.append("committed")
        except KafkaException as exc:
            outcome.append(exc.args[0].str())

    app = App(member)
    try:
        member.subscribe(["oc"], on_lost=on_lost)
        _stable_one = lambda: member.state is MemberState.STABLE and member.assignment()  # noqa: E731
        app.poll_until(_stable_one, what="stable")
        in_group = member.member_epoch
        member.commit(offsets=[TopicPartition("oc", 0, 5)], asynchronous=False)
        kafka.push_broker_errors(1, 68, [(110, 0)])  # FENCED_MEMBER_EPOCH
        app.poll_until(lambda: outcome, what="the commit inside on_lost")
        assert sent == [in_group, -1]
        assert outcome[0].startswith("commit failed: UNKNOWN_MEMBER_ID"), outcome
        app.poll_until(_stable_one, what="rejoined")
        assert member.committed([TopicPartition("oc", 0)])[0].offset == 5
    finally:
        assert timed_close(member) < 5.5
