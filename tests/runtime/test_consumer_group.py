"""Consumers of this SDK in groups on EmbeddedKafka: ownership, delivery, faults, commits.

Tests taking ``kafka_backend`` run on EmbeddedKafka and on the real broker (they need no
mock-only fault).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import confluent_kafka
import pytest

from consumer_sdk import CloseOption, Consumer, KafkaException, MemberState, TopicPartition
from consumer_sdk.errors import ConfigError
from consumer_sdk.testing import EmbeddedKafka, KafkaCluster
from tests.runtime.harness import Member, Timeline, config, wait_for


def all_records(members: list[Member]) -> list[tuple[str, int, int]]:
    return [(t, p, o) for m in members for (t, p, o, _) in m.records]


def owned_union(members: list[Member]) -> set[tuple[str, int]]:
    return set().union(*(m.owned for m in members))


def disjoint_cover(members: list[Member], topic: str, partitions: int) -> bool:
    owned = [m.owned for m in members]
    total = sum(len(o) for o in owned)
    return total == partitions and owned_union(members) == {(topic, p) for p in range(partitions)}


def test_three_members_then_a_fourth_joins_and_one_leaves(
    kafka_backend: EmbeddedKafka | KafkaCluster,
) -> None:
    topic, group = "rt-scale", "rt-scale-g"
    kafka_backend.create_topic(topic, partitions=6)
    kafka_backend.produce(topic, [f"a{i}".encode() for i in range(300)])
    timeline = Timeline()
    members = [Member(f"m{i}", config(kafka_backend, group), [topic], timeline) for i in range(3)]
    try:
        wait_for(
            lambda: disjoint_cover(members, topic, 6) and all(m.owned for m in members),
            what="3 members owning disjoint partitions that cover the topic",
        )
        kafka_backend.produce(topic, [f"b{i}".encode() for i in range(300)])
        members.append(Member("m3", config(kafka_backend, group), [topic], timeline))
        wait_for(
            lambda: disjoint_cover(members, topic, 6) and all(m.owned for m in members),
            what="4 members sharing the topic",
        )
        leaver = members[1]
        leaver.stop()
        assert leaver.consumer.state is MemberState.UNSUBSCRIBED
        kafka_backend.produce(topic, [f"c{i}".encode() for i in range(300)])
        rest = [m for m in members if m is not leaver]
        wait_for(lambda: disjoint_cover(rest, topic, 6), what="the leaver's partitions moving")
        wait_for(lambda: len(set(all_records(members))) == 900, what="all 900 records consumed")
        consumed = all_records(members)
        assert len(consumed) == len(set(consumed)) == 900, "a record was consumed twice"
        assert timeline.overlaps() == []
        assert not any(m.errors for m in members), [m.errors for m in members]
    finally:
        for m in members:
            m.stop()


def test_mixed_group_with_confluent_kafka_consumer(
    kafka_backend: EmbeddedKafka | KafkaCluster,
) -> None:
    topic, group = "rt-mixed", "rt-mixed-g"
    kafka_backend.create_topic(topic, partitions=4)
    timeline = Timeline()
    ours = Member("sdk", config(kafka_backend, group), [topic], timeline)
    theirs_owned: set[tuple[str, int]] = set()
    theirs = confluent_kafka.Consumer(
        {**config(kafka_backend, group), "group.protocol": "consumer"}
    )

    def their_assign(c: Any, parts: list[TopicPartition]) -> None:
        theirs_owned.update((p.topic, p.partition) for p in parts)
        timeline.record("ck", "assign", parts)

    def their_revoke(c: Any, parts: list[TopicPartition]) -> None:
        theirs_owned.difference_update((p.topic, p.partition) for p in parts)
        timeline.record("ck", "revoke", parts)

    theirs.subscribe([topic], on_assign=their_assign, on_revoke=their_revoke)
    stop = threading.Event()

    def drive() -> None:
        while not stop.is_set():
            theirs.poll(0.1)

    driver = threading.Thread(target=drive, daemon=True)
    driver.start()
    try:
        wait_for(
            lambda: len(ours.owned) == 2 and len(theirs_owned) == 2,
            what="a 2/2 split between the SDK and confluent-kafka",
        )
        assert not (ours.owned & theirs_owned)
        ours.stop()
        wait_for(lambda: len(theirs_owned) == 4, what="confluent-kafka taking over on leave")
        ours2 = Member("sdk2", config(kafka_backend, group), [topic], timeline)
        wait_for(lambda: len(ours2.owned) == 2 and len(theirs_owned) == 2, what="rebalance back")
        stop.set()
        driver.join(5)
        closer = threading.Thread(target=theirs.close, daemon=True)
        closer.start()
        closer.join(10)
        wait_for(lambda: len(ours2.owned) == 4, what="the SDK taking over confluent's partitions")
        ours2.stop()
        assert timeline.overlaps() == []
    finally:
        stop.set()
        ours.stop()


def test_fencing_loses_partitions_then_rejoins_with_the_same_member_id(
    embedded_kafka: EmbeddedKafka,
) -> None:
    topic, group = "rt-fence", "rt-fence-g"
    embedded_kafka.create_topic(topic, partitions=2)
    member = Member("m", config(embedded_kafka, group), [topic], Timeline())
    try:
        wait_for(lambda: len(member.owned) == 2, what="initial assignment")
        member_id = member.consumer.member_id
        for code in (110, 25):  # FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID
            lost_before, assigns_before = member.lost_count, member.assign_count
            embedded_kafka.push_request_errors(68, [code])
            wait_for(lambda n=lost_before: member.lost_count > n, what=f"on_lost after {code}")
            wait_for(
                lambda n=assigns_before: member.assign_count > n and len(member.owned) == 2,
                what="rejoin and reassignment",
            )
            assert member.consumer.member_id == member_id
            assert member.consumer.member_epoch > 0
    finally:
        member.stop()


def test_coordinator_moved_keeps_the_assignment(embedded_kafka: EmbeddedKafka) -> None:
    topic, group = "rt-move", "rt-move-g"
    embedded_kafka.create_topic(topic, partitions=3)
    embedded_kafka.set_group_coordinator(group, 1)
    member = Member("m", config(embedded_kafka, group), [topic], Timeline())
    try:
        wait_for(lambda: len(member.owned) == 3, what="initial assignment")
        embedded_kafka.clear_requests()
        embedded_kafka.set_group_coordinator(group, 3)
        wait_for(
            lambda: any(r.api_key == 68 and r.broker_id == 3 for r in embedded_kafka.requests(68)),
            what="heartbeats reaching the new coordinator",
        )
        time.sleep(1.0)  # a few more heartbeat intervals on the new coordinator
        assert member.lost_count == 0 and len(member.owned) == 3
        assert member.consumer.state is MemberState.STABLE
    finally:
        member.stop()
        embedded_kafka.set_group_coordinator(group, 1)


def test_a_coordinator_change_found_by_a_commit_expedites_the_heartbeat(
    embedded_kafka_factory: Any,
) -> None:
    """The coordinator moves; a commit meets NOT_COORDINATOR and finds the new node: the
    member heartbeats there at once (as librdkafka does on a coordinator change), not a whole
    interval (6 s here) after its last heartbeat."""
    interval_ms = 6000
    kafka: EmbeddedKafka = embedded_kafka_factory(
        brokers=3, heartbeat_interval_ms=interval_ms, session_timeout_ms=30_000
    )
    topic, group = "rt-expedite", "rt-expedite-g"
    kafka.create_topic(topic, partitions=2)
    kafka.set_group_coordinator(group, 1)
    member = Member("m", config(kafka, group), [topic], Timeline())
    try:
        wait_for(
            lambda: len(member.owned) == 2 and member.consumer.state is MemberState.STABLE,
            what="initial assignment",
        )
        kafka.clear_requests()
        wait_for(
            lambda: any(r.broker_id == 1 for r in kafka.requests(68)),
            what="a regular heartbeat at the first coordinator",
            timeout=30,
        )
        last = max(r.timestamp_us for r in kafka.requests(68) if r.broker_id == 1)
        kafka.set_group_coordinator(group, 2)
        # The mock's OffsetCommit takes any broker: the old coordinator's answer is injected.
        kafka.push_request_errors(8, [16])  # NOT_COORDINATOR
        member.consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)
        wait_for(
            lambda: any(r.broker_id == 2 for r in kafka.requests(68)),
            what="a heartbeat at the new coordinator",
            timeout=30,
        )
        moved = min(r.timestamp_us for r in kafka.requests(68) if r.broker_id == 2)
        commits = [r for r in kafka.requests(8) if r.broker_id == 1]
        assert commits, "the commit went to the old coordinator first"
        # Without the expedite the heartbeat waits for the interval: moved - last >= 6 s.
        assert (moved - last) / 1000 < interval_ms / 2, (moved - last) / 1000
        assert member.lost_count == 0 and len(member.owned) == 2
    finally:
        member.stop()


@pytest.mark.parametrize(("down_s", "expect_lost"), [(2.0, False), (8.0, True)])
def test_coordinator_down_shorter_and_longer_than_the_session(
    embedded_kafka_factory: Any, down_s: float, expect_lost: bool
) -> None:
    kafka: EmbeddedKafka = embedded_kafka_factory(
        brokers=2, heartbeat_interval_ms=300, session_timeout_ms=4000
    )
    topic, group = "rt-down", "rt-down-g"
    kafka.create_topic(topic, partitions=2, replication_factor=1)
    kafka.partition_set_leader(topic, 0, 1)
    kafka.partition_set_leader(topic, 1, 1)
    kafka.set_group_coordinator(group, 2)
    member = Member("m", config(kafka, group), [topic], Timeline())
    try:
        wait_for(lambda: len(member.owned) == 2, what="initial assignment")
        kafka.broker_down(2)
        time.sleep(down_s)
        kafka.broker_up(2)
        if expect_lost:
            wait_for(lambda: member.lost_count == 1, what="on_lost after the session expired")
        wait_for(
            lambda: len(member.owned) == 2 and member.consumer.state is MemberState.STABLE,
            what="the member stable again",
        )
        time.sleep(0.5)
        assert member.lost_count == (1 if expect_lost else 0)
    finally:
        member.stop()


def test_poll_interval_exceeded_goes_stale_then_rejoins(
    kafka_backend: EmbeddedKafka | KafkaCluster,
) -> None:
    topic, group = "rt-stale", "rt-stale-g"
    kafka_backend.create_topic(topic, partitions=2)
    states: list[MemberState] = []
    member = Member(
        "m", config(kafka_backend, group, max_poll_interval_ms=1500), [topic], Timeline()
    )
    try:
        wait_for(lambda: len(member.owned) == 2, what="initial assignment")
        member.pause_polling()
        wait_for(
            lambda: member.consumer.state is MemberState.STALE,
            timeout=10,
            what="STALE after max.poll.interval.ms",
        )
        states.append(member.consumer.state)
        member.resume_polling()
        wait_for(lambda: member.lost_count == 1, what="on_lost when polling resumes")
        wait_for(lambda: len(member.owned) == 2, what="rejoined with partitions")
        assert states == [MemberState.STALE]
    finally:
        member.stop()


def test_static_member_restart_keeps_its_partitions(
    kafka_backend: EmbeddedKafka | KafkaCluster,
) -> None:
    topic, group = "rt-static", "rt-static-g"
    kafka_backend.create_topic(topic, partitions=4)
    timeline = Timeline()
    a = Member("a", config(kafka_backend, group, group_instance_id="inst-a"), [topic], timeline)
    b = Member("b", config(kafka_backend, group, group_instance_id="inst-b"), [topic], timeline)
    try:
        wait_for(lambda: len(a.owned) == 2 and len(b.owned) == 2, what="2/2 split")
        before = set(a.owned)
        a.stop()  # static: leaves with epoch -2, partitions stay reserved
        time.sleep(1.0)
        assert len(b.owned) == 2, "a static member's partitions must not move on a -2 leave"
        a2 = Member(
            "a2", config(kafka_backend, group, group_instance_id="inst-a"), [topic], timeline
        )
        wait_for(lambda: a2.owned == before, what="the restarted static member's partitions")
        a2.stop(option=CloseOption.LEAVE_GROUP)
        wait_for(lambda: len(b.owned) == 4, what="partitions moving after leaving for good")
    finally:
        a.stop()
        b.stop()


def test_unsubscribe_leaves_and_close_is_bounded_and_idempotent(
    kafka_backend: EmbeddedKafka | KafkaCluster,
) -> None:
    topic, group = "rt-unsub", "rt-unsub-g"
    kafka_backend.create_topic(topic, partitions=2)
    timeline = Timeline()
    a = Member("a", config(kafka_backend, group), [topic], timeline)
    b = Member("b", config(kafka_backend, group), [topic], timeline)
    try:
        wait_for(lambda: len(a.owned) == 1 and len(b.owned) == 1, what="1/1 split")
        a.pause_polling()
        time.sleep(0.2)
        a.consumer.unsubscribe(timeout=10)
        assert a.consumer.state is MemberState.UNSUBSCRIBED and not a.owned
        wait_for(lambda: len(b.owned) == 2, what="b owning both after a unsubscribed")
        took = a.stop(close_timeout=5)
        assert took < 5
        a.consumer.close()  # twice is fine
        with pytest.raises(KafkaException, match="closed"):
            a.consumer.poll(0.1)
        assert timeline.overlaps() == []
    finally:
        a.stop()
        b.stop()


def test_committed_offsets_equal_what_was_processed(
    kafka_backend: EmbeddedKafka | KafkaCluster,
) -> None:
    topic, group = "rt-commit", "rt-commit-g"
    kafka_backend.create_topic(topic, partitions=3)
    kafka_backend.produce(topic, [f"v{i}".encode() for i in range(150)])
    member = Member(
        "m",
        config(kafka_backend, group, enable_auto_commit=False),
        [topic],
        Timeline(),
        on_record=lambda m, msg: m.consumer.commit(msg),
    )
    wait_for(lambda: len(member.records) == 150, what="150 records")
    member.stop()
    last: dict[int, int] = {}
    for _, p, o, _ in member.records:
        last[p] = max(last.get(p, -1), o)
    checker = Consumer(config(kafka_backend, group))
    try:
        committed = checker.committed([TopicPartition(topic, p) for p in range(3)])
        # a partition the (sticky) partitioner gave no record has nothing committed (-1001)
        got = {tp.partition: tp.offset for tp in committed if tp.offset >= 0}
        assert got == {p: o + 1 for p, o in last.items()}
    finally:
        checker.close()


def test_stale_member_epoch_commit_raises(embedded_kafka: EmbeddedKafka) -> None:
    topic, group = "rt-stale-commit", "rt-stale-commit-g"
    embedded_kafka.create_topic(topic, partitions=1)
    embedded_kafka.produce(topic, [b"x"] * 3)
    c = Consumer(config(embedded_kafka, group, enable_auto_commit=False))
    try:
        c.subscribe([topic])
        msg = wait_for(lambda: c.poll(0.2), what="a record")
        embedded_kafka.push_request_errors(8, [113])
        with pytest.raises(KafkaException, match="STALE_MEMBER_EPOCH") as info:
            c.commit(msg, asynchronous=False)
        assert info.value.args[0].code() == 113
        assert c.commit(msg, asynchronous=False)[0].offset == msg.offset() + 1
    finally:
        c.close()


def test_callback_exception_is_raised_from_poll(embedded_kafka: EmbeddedKafka) -> None:
    topic, group = "rt-cb-raise", "rt-cb-raise-g"
    embedded_kafka.create_topic(topic, partitions=1)
    calls: list[int] = []

    def on_assign(c: Any, parts: list[TopicPartition]) -> None:
        calls.append(len(parts))
        if len(calls) == 1:
            raise RuntimeError("boom in on_assign")

    c = Consumer(config(embedded_kafka, group))
    try:
        c.subscribe([topic], on_assign=on_assign)
        with pytest.raises(KafkaException, match="boom in on_assign"):
            wait_for(lambda: c.poll(0.2) or False, timeout=10, what="the callback error")
        embedded_kafka.produce(topic, [b"after-retry"])
        msg = wait_for(lambda: c.poll(0.2), timeout=10, what="a record after the retried callback")
        assert msg.value() == b"after-retry"
        assert len(calls) >= 2 and c.state is MemberState.STABLE
        assert [tp.partition for tp in c.assignment()] == [0]
    finally:
        c.close()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"session.timeout.ms": 6000}, "session.timeout.ms: not allowed"),
        ({"heartbeat.interval.ms": 100}, "heartbeat.interval.ms: not allowed"),
        ({"partition.assignment.strategy": "range"}, "partition.assignment.strategy: not allowed"),
        ({"group.id": ""}, "group.id: must be a non-empty string"),
        ({"max.poll.interval.ms": "soon"}, "max.poll.interval.ms: expected an integer"),
        ({"enable.auto.comit": True}, "did you mean 'enable.auto.commit'"),
        ({"auto.offset.reset": "middle"}, "auto.offset.reset: expected"),
    ],
)
def test_bad_configuration_names_the_key(extra: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g", **extra})


def test_metrics_and_stats_cb_group_block(embedded_kafka: EmbeddedKafka) -> None:
    import json

    topic, group = "rt-metrics", "rt-metrics-g"
    embedded_kafka.create_topic(topic, partitions=2)
    stats: list[dict[str, Any]] = []
    c = Consumer(
        {
            **config(embedded_kafka, group),
            "statistics.interval.ms": 200,
            "stats_cb": lambda s: stats.append(json.loads(s)),
        }
    )
    try:
        c.subscribe([topic])
        wait_for(lambda: c.poll(0.1) is None and c.state is MemberState.STABLE, what="stable")

        def stable_stats() -> bool:
            c.poll(0.1)
            return any(s["cgrp"]["join_state"] == "stable" for s in stats)

        wait_for(stable_stats, what="a stats_cb with a cgrp block")
        block = stats[-1]["cgrp"]
        assert block["assignment_size"] == 2 and block["member_id"] == c.member_id
        assert block["rebalance_cnt"] >= 1 and block["state"] == "up"
        assert "brokers" in stats[-1], "librdkafka's own statistics are kept"
        metrics = c.metrics()
        assert metrics["heartbeat-total"] >= 1 and metrics["assigned-partitions"] == 2
        assert metrics["rebalance-total"] >= 1
        for name in (
            "rebalance-latency-avg",
            "partition-assigned-latency-max",
            "commit-latency-avg",
            "last-heartbeat-seconds-ago",
        ):
            assert name in metrics
    finally:
        c.close()


def test_log_lines_carry_the_reference_prefix(
    embedded_kafka: EmbeddedKafka, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    topic, group = "rt-log", "rt-log-g"
    embedded_kafka.create_topic(topic, partitions=1)
    caplog.set_level(logging.INFO, logger="consumer_sdk")
    c = Consumer({**config(embedded_kafka, group), "client.id": "log-client"})
    try:
        c.subscribe([topic])
        wait_for(lambda: c.poll(0.1) is None and c.state is MemberState.STABLE, what="stable")
        prefix = f"[Consumer clientId=log-client, groupId={group}, memberId={c.member_id}"
        lines = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert any(line.startswith(prefix) and "to STABLE" in line for line in lines), lines
    finally:
        c.close()


def test_sync_commit_timeout_bounds_retries(embedded_kafka: EmbeddedKafka) -> None:
    topic, group = "rt-commit-timeout", "rt-commit-timeout-g"
    embedded_kafka.create_topic(topic, partitions=1)
    embedded_kafka.produce(topic, [b"x"])
    c = Consumer(config(embedded_kafka, group, enable_auto_commit=False))
    try:
        c.subscribe([topic])
        msg = wait_for(lambda: c.poll(0.2), what="a record")
        embedded_kafka.push_request_errors(8, [14] * 50)  # COORDINATOR_LOAD_IN_PROGRESS
        started = time.monotonic()
        with pytest.raises(KafkaException, match="COORDINATOR_LOAD_IN_PROGRESS"):
            c.commit(msg, asynchronous=False, timeout=0.5)
        assert time.monotonic() - started < 2.0
    finally:
        embedded_kafka.clear_request_errors(8)
        c.close()
