"""The rest of confluent-kafka's Consumer API on EmbeddedKafka: manual assignment, seek,
watermarks, offsets_for_times, metadata, member id and group metadata.

Where confluent-kafka has the behaviour, the same script runs against a
``confluent_kafka.Consumer`` (``group.protocol=consumer``) on the same cluster and the
outcomes are compared.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka import OFFSET_BEGINNING, OFFSET_END, OFFSET_INVALID, KafkaError

from consumer_sdk import Consumer, KafkaException, TopicPartition
from consumer_sdk.runtime._librdkafka import read_group_metadata, write_group_metadata
from consumer_sdk.testing import EmbeddedKafka
from tests.runtime.harness import config, wait_for

API_CONSUMER_GROUP_HEARTBEAT = 68
API_JOIN_GROUP = 11
API_OFFSET_COMMIT = 8
API_OFFSET_FETCH = 9

Records = dict[int, list[int]]


def _reference(kafka: EmbeddedKafka, group: str, **extra: Any) -> confluent_kafka.Consumer:
    conf = config(kafka, group, **extra)
    conf["group.protocol"] = "consumer"
    return confluent_kafka.Consumer(conf)


def _close(*consumers: Any) -> None:
    for c in consumers:
        with contextlib.suppress(Exception):
            c.close()


def _drain(consumer: Any, want: Callable[[Records], bool], what: str) -> Records:
    """Poll until ``want(records)`` holds; records are offsets per partition, in order."""
    got: Records = {}

    def step() -> bool:
        msg = consumer.poll(0.2)
        if msg is not None:
            assert msg.error() is None, msg.error()
            got.setdefault(msg.partition(), []).append(msg.offset())
        return want(got)

    wait_for(step, timeout=30, what=what)
    return got


def _code(call: Callable[[], Any]) -> int | None:
    try:
        call()
    except KafkaException as exc:
        return int(exc.args[0].code())
    return None


def _has(n: dict[int, int]) -> Callable[[Records], bool]:
    return lambda got: all(len(got.get(p, [])) >= k for p, k in n.items())


def _script(consumer: Any, topic: str) -> list[Any]:
    """One script of manual-assignment calls; returns everything observable."""
    out: list[Any] = []
    tp = TopicPartition
    consumer.assign([tp(topic, 0), tp(topic, 1, 3)])
    out.append(("assignment", sorted((p.topic, p.partition) for p in consumer.assignment())))
    got = _drain(consumer, _has({0: 2, 1: 2}), "records from both partitions")
    out.append(("starts", {p: offsets[:2] for p, offsets in got.items()}))
    out.append(
        ("error.incremental_assign.dup", _code(lambda: consumer.incremental_assign([tp(topic, 0)])))
    )
    out.append(
        (
            "error.incremental_unassign.missing",
            _code(lambda: consumer.incremental_unassign([tp(topic, 2)])),
        )
    )
    out.append(("error.seek.unassigned", _code(lambda: consumer.seek(tp(topic, 2, 1)))))
    out.append(("position.unassigned", [p.offset for p in consumer.position([tp(topic, 2)])]))
    consumer.seek(tp(topic, 0, 2))
    consumer.seek(tp(topic, 1, OFFSET_BEGINNING))
    out.append(
        ("position.after_seek", [p.offset for p in consumer.position([tp(topic, 0), tp(topic, 1)])])
    )
    got = _drain(consumer, _has({0: 3, 1: 3}), "records after seeking")
    out.append(("after_seek", {p: offsets[:3] for p, offsets in got.items()}))
    consumer.incremental_unassign([tp(topic, 1)])
    out.append(
        ("assignment.after_unassign", sorted((p.topic, p.partition) for p in consumer.assignment()))
    )
    consumer.pause([tp(topic, 0), tp(topic, 1)])  # partition 1 is no longer assigned: ignored
    consumer.seek(tp(topic, 0, 10))  # a paused partition continues there once resumed
    consumer.incremental_assign([tp(topic, 2, 15)])
    got = _drain(consumer, lambda g: len(g.get(2, [])) >= 5, "partition 2 from offset 15")
    out.append(("partition2", got[2][:5]))
    out.append(("while_paused", got.get(0, [])))
    consumer.resume([tp(topic, 0)])
    got = _drain(consumer, _has({0: 1}), "partition 0 after resume")
    out.append(("resumed", got[0][0]))
    consumer.seek(tp(topic, 2, OFFSET_END))
    wait_for(
        lambda: consumer.poll(0.1) is None and consumer.poll(0.3) is None,
        what="partition 2 at its end",
    )
    out.append(
        ("watermarks", [consumer.get_watermark_offsets(tp(topic, p), timeout=10) for p in range(3)])
    )
    out.append(("watermarks.cached", consumer.get_watermark_offsets(tp(topic, 2), cached=True)))
    out.append(
        (
            "offsets_for_times",
            [
                (p.partition, p.offset)
                for p in consumer.offsets_for_times(
                    [tp(topic, 0, 0), tp(topic, 1, int(time.time() * 1000) + 3_600_000)], timeout=10
                )
            ],
        )
    )
    metadata = consumer.list_topics(topic, timeout=10)
    out.append(("list_topics", sorted(metadata.topics[topic].partitions), len(metadata.brokers)))
    out.append(("cluster_id", consumer.cluster_id()))
    consumer.unassign()
    out.append(("assignment.after_unassign_all", consumer.assignment()))
    return out


def test_manual_assignment_matches_confluent_kafka(embedded_kafka: EmbeddedKafka) -> None:
    topic = "dropin-manual"
    embedded_kafka.create_topic(topic, partitions=3)
    for p in range(3):
        embedded_kafka.produce(topic, [f"{p}-{i}".encode() for i in range(20)], partition=p)
    sdk = Consumer(config(embedded_kafka, "dropin-manual-sdk", enable_auto_commit=False))
    ref = _reference(embedded_kafka, "dropin-manual-ref", enable_auto_commit=False)
    try:
        # Both groups have a committed offset for partition 0 (the script assigns it without
        # an offset, so it starts there).
        for c in (sdk, ref):
            c.commit(offsets=[TopicPartition(topic, 0, 7)], asynchronous=False)
        embedded_kafka.clear_requests()
        ours, theirs = _script(sdk, topic), _script(ref, topic)
        assert ours == theirs
        seen = {k: v for k, v, *_ in ours}
        assert seen["starts"] == {0: [7, 8], 1: [3, 4]}
        assert seen["after_seek"] == {0: [2, 3, 4], 1: [0, 1, 2]}
        assert seen["while_paused"] == [] and seen["resumed"] == 10
        assert seen["position.after_seek"] == [OFFSET_INVALID, OFFSET_INVALID]
        assert [v for k, v, *_ in ours if k.startswith("error")] == [
            KafkaError._CONFLICT,
            KafkaError._INVALID_ARG,
            KafkaError._STATE,
        ]
        # Manual assignment is no group membership: no heartbeat, no join.
        counts = embedded_kafka.request_counts()
        assert counts.get(API_CONSUMER_GROUP_HEARTBEAT, 0) == 0, counts
        assert counts.get(API_JOIN_GROUP, 0) == 0, counts
    finally:
        _close(sdk, ref)


def test_manual_assignment_commits_under_the_group_id(embedded_kafka: EmbeddedKafka) -> None:
    topic, group = "dropin-commit", "dropin-commit-g"
    embedded_kafka.create_topic(topic, partitions=2)
    embedded_kafka.produce(topic, [f"v{i}".encode() for i in range(30)], partition=0)
    first = Consumer(config(embedded_kafka, group, auto_commit_interval_ms=200))
    try:
        first.assign([TopicPartition(topic, 0)])
        got = _drain(first, _has({0: 12}), "12 records")
        assert got[0][:12] == list(range(12))
        # Auto-commit runs for a manual assignment too (generation -1).
        wait_for(
            lambda: first.committed([TopicPartition(topic, 0)])[0].offset >= 12,
            what="the auto-commit of consumed offsets",
        )
        explicit = first.commit(offsets=[TopicPartition(topic, 1, 4)], asynchronous=False)
        assert [(p.partition, p.offset) for p in explicit or []] == [(1, 4)]
        _drain(first, lambda g: g.get(0, [-1])[-1] >= 19, "records up to offset 19")
        first.commit(asynchronous=False)
        assert first.committed([TopicPartition(topic, 0)])[0].offset == 20
        # Seeking back and committing moves the committed offset back (reprocessing).
        first.seek(TopicPartition(topic, 0, 2))
        assert _drain(first, _has({0: 3}), "records after seeking back")[0][:3] == [2, 3, 4]
        first.commit(offsets=first.position([TopicPartition(topic, 0)]), asynchronous=False)
        assert first.committed([TopicPartition(topic, 0)])[0].offset == 5
        first.seek(TopicPartition(topic, 0, 20))
        assert _drain(first, _has({0: 1}), "the record at 20")[0] == [20]
    finally:
        first.close()
    # close() committed what was consumed: a new consumer resumes there.
    second = Consumer(config(embedded_kafka, group, enable_auto_commit=False))
    try:
        committed = second.committed([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        assert [p.offset for p in committed] == [21, 4]
        second.assign([TopicPartition(topic, 0)])
        assert _drain(second, _has({0: 1}), "the first record")[0][0] == 21
    finally:
        second.close()


def test_subscribe_and_assign_are_mutually_exclusive(embedded_kafka: EmbeddedKafka) -> None:
    topic = "dropin-mix"
    embedded_kafka.create_topic(topic, partitions=2)
    manual = Consumer(config(embedded_kafka, "dropin-mix-a"))
    subscribed = Consumer(config(embedded_kafka, "dropin-mix-b"))
    try:
        manual.assign([TopicPartition(topic, 0)])
        with pytest.raises(KafkaException, match="mutually exclusive") as info:
            manual.subscribe([topic])
        assert info.value.args[0].code() == KafkaError._STATE
        manual.unassign()
        manual.subscribe([topic])  # allowed once the manual assignment is gone

        subscribed.subscribe([topic])
        for call in (
            lambda: subscribed.assign([TopicPartition(topic, 0)]),
            lambda: subscribed.incremental_assign([TopicPartition(topic, 0)]),
            lambda: subscribed.incremental_unassign([TopicPartition(topic, 0)]),
            subscribed.unassign,
        ):
            with pytest.raises(KafkaException, match="subscribed consumer") as info:
                call()
            assert info.value.args[0].code() == KafkaError._STATE
        with pytest.raises(KafkaException) as info:
            manual.seek(TopicPartition(topic, 5, 0))
        assert info.value.args[0].code() == KafkaError._STATE
        with pytest.raises(KafkaException) as info:
            manual.seek(TopicPartition(topic, 0, OFFSET_INVALID))
        assert info.value.args[0].code() == KafkaError._INVALID_ARG
        with pytest.raises(TypeError):
            manual.assign(TopicPartition(topic, 0))  # type: ignore[arg-type]
    finally:
        _close(manual, subscribed)


def test_seek_in_on_assign_and_before_the_first_fetch_wins_over_committed(
    embedded_kafka: EmbeddedKafka,
) -> None:
    topic, group = "dropin-seek", "dropin-seek-g"
    embedded_kafka.create_topic(topic, partitions=3)
    for p in range(3):
        embedded_kafka.produce(topic, [f"{p}-{i}".encode() for i in range(20)], partition=p)
    setup = Consumer(config(embedded_kafka, group))
    setup.commit(offsets=[TopicPartition(topic, p, 10) for p in range(3)], asynchronous=False)
    setup.close()

    assigned: list[TopicPartition] = []

    def on_assign(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        assigned.extend(partitions)
        for tp in partitions:
            if tp.partition == 0:
                consumer.seek(TopicPartition(topic, 0, 2))
        # confluent-kafka's way: incremental_assign inside on_assign with start offsets.
        consumer.incremental_assign(
            [
                TopicPartition(tp.topic, tp.partition, 5 if tp.partition == 1 else OFFSET_INVALID)
                for tp in partitions
            ]
        )

    consumer = Consumer(config(embedded_kafka, group, enable_auto_commit=False))
    try:
        consumer.subscribe([topic], on_assign=on_assign)
        # Partition 2 keeps its committed start (10) in on_assign; seeking it right after the
        # assignment, before anything was fetched from it, must still win.
        early: list[Any] = []

        def assigned_yet() -> bool:
            msg = consumer.poll(0)
            if msg is not None:
                early.append(msg)
            return len(assigned) == 3

        wait_for(assigned_yet, what="the assignment")
        consumer.seek(TopicPartition(topic, 2, 0))
        got = _drain(consumer, _has({0: 1, 1: 1, 2: 1}), "records from every partition")
        for msg in reversed(early):
            got.setdefault(msg.partition(), []).insert(0, msg.offset())
        first = {p: offsets[0] for p, offsets in got.items()}
        assert first[0] == 2, "seek() inside on_assign wins over the committed offset"
        assert first[1] == 5, "incremental_assign() offsets inside on_assign are used"
        assert first[2] == 0, "seek() before the first fetch wins over the committed offset"
    finally:
        consumer.close()


def test_seek_right_after_assignment_before_any_fetch(embedded_kafka: EmbeddedKafka) -> None:
    """librdkafka refuses (_STATE) a seek before a partition's fetch started; the SDK
    restarts the partition at the seek offset instead, so the seek wins."""
    topic, group = "dropin-seek-early", "dropin-seek-early-g"
    embedded_kafka.create_topic(topic, partitions=1)
    embedded_kafka.produce(topic, [f"v{i}".encode() for i in range(20)], partition=0)
    consumer = Consumer(config(embedded_kafka, group, enable_auto_commit=False))
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 15)], asynchronous=False)
        for target in (3, 11, 0):
            consumer.assign([TopicPartition(topic, 0)])  # starts at the committed 15
            consumer.seek(TopicPartition(topic, 0, target))
            got = _drain(consumer, _has({0: 2}), f"records after seeking to {target}")
            assert got[0][:2] == [target, target + 1]
            consumer.unassign()
    finally:
        consumer.close()


def test_member_id_and_group_metadata(embedded_kafka: EmbeddedKafka) -> None:
    topic, group = "dropin-cgmd", "dropin-cgmd-g"
    embedded_kafka.create_topic(topic, partitions=2)
    sdk = Consumer(config(embedded_kafka, group, group_instance_id="inst-1"))
    ref = _reference(embedded_kafka, group + "-ref")
    try:
        member_id = sdk.memberid()
        assert member_id and member_id == sdk.member_id
        # Outside the group (as confluent-kafka before joining): generation -1.
        ours = read_group_metadata(sdk.consumer_group_metadata())
        assert ours.group_id == group and ours.generation_id == -1
        assert ours.member_id == member_id and ours.group_instance_id == "inst-1"
        theirs = ref.consumer_group_metadata()
        parsed = read_group_metadata(theirs)
        assert parsed.generation_id == -1 and parsed.member_id == ref.memberid()
        assert write_group_metadata(parsed.group_id, -1, parsed.member_id, None) == theirs

        sdk.subscribe([topic])
        wait_for(
            lambda: sdk.poll(0.1) is None and len(sdk.assignment()) == 2,
            what="the SDK member owning both partitions",
        )
        joined = read_group_metadata(sdk.consumer_group_metadata())
        assert joined.generation_id == sdk.member_epoch > 0
        assert joined.member_id == member_id
    finally:
        _close(sdk, ref)


def test_transactional_offsets_on_embedded_kafka(embedded_kafka: EmbeddedKafka) -> None:
    """The group metadata is accepted by a transactional producer's
    send_offsets_to_transaction. (The mock answers TxnOffsetCommit without storing the
    offsets, so exactly-once and committed offsets are tested on the real broker.)"""
    src, dst, group = "dropin-txn-in", "dropin-txn-out", "dropin-txn-g"
    embedded_kafka.create_topic(src, partitions=1)
    embedded_kafka.create_topic(dst, partitions=1)
    embedded_kafka.produce(src, [f"v{i}".encode() for i in range(10)], partition=0)
    consumer = Consumer(config(embedded_kafka, group, enable_auto_commit=False))
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": embedded_kafka.bootstrap_servers, "transactional.id": "dropin-tx"}
    )
    try:
        producer.init_transactions(30)
        consumer.subscribe([src])
        got = _drain(consumer, _has({0: 10}), "10 records")
        assert got[0] == list(range(10))
        producer.begin_transaction()
        producer.produce(dst, b"copy")
        producer.send_offsets_to_transaction(
            consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 30
        )
        producer.commit_transaction(30)
        with pytest.raises(confluent_kafka.KafkaException, match=r"group metadata|buffer"):
            producer.begin_transaction()
            producer.send_offsets_to_transaction(
                consumer.position(consumer.assignment()), b"not group metadata", 30
            )
        producer.abort_transaction(30)
    finally:
        _close(consumer)
        producer.flush(5)


def test_context_manager_gives_a_consumer(tmp_path: Path) -> None:
    """``with Consumer(...) as c`` is typed as ``Consumer`` (mypy sees its methods)."""
    snippet = tmp_path / "snippet.py"
    snippet.write_text(
        textwrap.dedent("""
        from consumer_sdk import Consumer, TopicPartition

        def use(config: dict[str, str]) -> str:
            with Consumer(config) as c:
                c.seek(TopicPartition("t", 0, 1))
                return c.memberid()
    """)
    )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--follow-imports=silent",
            str(snippet),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=Path(__file__).parents[2],
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_failed_on_assign_leaves_no_pending_start_offsets(embedded_kafka: EmbeddedKafka) -> None:
    """After on_assign raised, its partitions are not being assigned any more: seek() on them
    is refused until the retried callback assigns them, and then it works."""
    topic, group = "dropin-assign-fails", "dropin-assign-fails-g"
    embedded_kafka.create_topic(topic, partitions=1)
    embedded_kafka.produce(topic, [f"v{i}".encode() for i in range(10)], partition=0)
    calls: list[int] = []

    def on_assign(consumer: Consumer, partitions: list[TopicPartition]) -> None:
        calls.append(len(partitions))
        if len(calls) == 1:
            raise RuntimeError("first on_assign fails")

    consumer = Consumer(config(embedded_kafka, group, enable_auto_commit=False))
    try:
        consumer.subscribe([topic], on_assign=on_assign)

        def failed() -> bool:
            try:
                consumer.poll(0.05)
            except KafkaException as exc:
                assert "first on_assign fails" in exc.args[0].str()
                return True
            return False

        wait_for(failed, what="on_assign raising from poll()")
        if len(calls) == 1:  # not retried yet: the partition is not assigned
            with pytest.raises(KafkaException) as info:
                consumer.seek(TopicPartition(topic, 0, 3))
            assert info.value.args[0].code() == KafkaError._STATE
        got = _drain(consumer, _has({0: 1}), "a record once on_assign succeeded")
        assert len(calls) >= 2 and got[0][0] == 0
        consumer.seek(TopicPartition(topic, 0, 7))
        assert _drain(consumer, _has({0: 1}), "the record sought")[0][0] == 7
    finally:
        consumer.close()


def test_incremental_assign_in_on_assign_matches_confluent_kafka(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """confluent-kafka's way of choosing start offsets in a cooperative rebalance: the same
    on_assign, run by both clients (each alone in its own group), starts the same places."""
    topic = "dropin-incr-cb"
    embedded_kafka.create_topic(topic, partitions=3)
    for p in range(3):
        embedded_kafka.produce(topic, [f"{p}-{i}".encode() for i in range(20)], partition=p)

    def run(consumer: Any) -> dict[int, int]:
        consumer.commit(
            offsets=[TopicPartition(topic, p, 10) for p in range(3)], asynchronous=False
        )

        def on_assign(c: Any, partitions: list[TopicPartition]) -> None:
            c.incremental_assign(
                [
                    TopicPartition(
                        tp.topic,
                        tp.partition,
                        {0: OFFSET_BEGINNING, 1: 4}.get(tp.partition, OFFSET_INVALID),
                    )
                    for tp in partitions
                ]
            )

        consumer.subscribe([topic], on_assign=on_assign)
        got = _drain(consumer, _has({0: 1, 1: 1, 2: 1}), "a record from every partition")
        return {p: offsets[0] for p, offsets in got.items()}

    sdk = Consumer(config(embedded_kafka, "dropin-incr-cb-sdk", enable_auto_commit=False))
    ref = _reference(embedded_kafka, "dropin-incr-cb-ref", enable_auto_commit=False)
    try:
        ours, theirs = run(sdk), run(ref)
        assert ours == theirs == {0: 0, 1: 4, 2: 10}
    finally:
        _close(sdk, ref)


def test_on_assign_runs_before_the_committed_offsets_are_looked_up(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """As in confluent-kafka, on_assign does not wait for the OffsetFetch of the partitions it
    gets (a broker may hold that answer until its group writes are replicated); they still
    start at the committed offset."""
    topic = "dropin-assign-first"
    embedded_kafka.create_topic(topic, partitions=2)
    for p in range(2):
        embedded_kafka.produce(topic, [f"{p}-{i}".encode() for i in range(10)], partition=p)

    def run(consumer: Any) -> tuple[list[int], dict[int, int]]:
        consumer.commit(offsets=[TopicPartition(topic, p, 6) for p in range(2)], asynchronous=False)
        wait_for(lambda: bool(embedded_kafka.requests(API_OFFSET_COMMIT)), what="the commit")
        embedded_kafka.clear_requests()
        fetches_seen: list[int] = []

        def on_assign(c: Any, partitions: list[TopicPartition]) -> None:
            if partitions:
                fetches_seen.append(len(embedded_kafka.requests(API_OFFSET_FETCH)))

        consumer.subscribe([topic], on_assign=on_assign)
        got = _drain(consumer, _has({0: 1, 1: 1}), "a record from every partition")
        return fetches_seen, {p: offsets[0] for p, offsets in got.items()}

    sdk = Consumer(config(embedded_kafka, "dropin-assign-first-sdk", enable_auto_commit=False))
    ref = _reference(embedded_kafka, "dropin-assign-first-ref", enable_auto_commit=False)
    try:
        ours, theirs = run(sdk), run(ref)
        assert ours == theirs == ([0], {0: 6, 1: 6})
    finally:
        _close(sdk, ref)


def test_store_offsets_with_a_manual_assignment_matches_confluent_kafka(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """enable.auto.offset.store=false with assign(): stored offsets are what commit() sends;
    unassigning drops them (a new assignment starts with none stored)."""
    topic = "dropin-store"
    embedded_kafka.create_topic(topic, partitions=1)
    embedded_kafka.produce(topic, [f"v{i}".encode() for i in range(10)], partition=0)

    def run(consumer: Any) -> list[Any]:
        out: list[Any] = []
        consumer.assign([TopicPartition(topic, 0, 0)])
        _drain(consumer, _has({0: 5}), "5 records")
        consumer.store_offsets(offsets=[TopicPartition(topic, 0, 3)])
        out.append(_code(lambda: consumer.commit(asynchronous=False)))
        out.append(consumer.committed([TopicPartition(topic, 0)])[0].offset)
        consumer.unassign()
        consumer.assign([TopicPartition(topic, 0, 0)])
        _drain(consumer, _has({0: 2}), "2 records")
        out.append(_code(lambda: consumer.commit(asynchronous=False)))
        out.append(consumer.committed([TopicPartition(topic, 0)])[0].offset)
        consumer.unassign()
        return out

    extra = {"enable_auto_commit": False, "enable_auto_offset_store": False}
    sdk = Consumer(config(embedded_kafka, "dropin-store-sdk", **extra))
    ref = _reference(embedded_kafka, "dropin-store-ref", **extra)
    try:
        ours, theirs = run(sdk), run(ref)
        assert ours == theirs
        assert ours[:2] == [None, 3] and ours[3] == 3
    finally:
        _close(sdk, ref)
