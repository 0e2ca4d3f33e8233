"""The source's offset/commit protocol, driven in Spark's call order without Spark.

A ``FakeQuery`` calls the ``GroupReader`` like MicroBatchExecution does (latestOffset,
offset log, commit of the previous batch, partitions, read) and "reads" a range by
recording its offsets, so hand-offs can be checked offset by offset.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from consumer_sdk import GroupMember as GroupMemberType
from consumer_sdk.testing import EmbeddedKafka
from spark_integration.driver import GroupReader
from spark_integration.offsets import SourceOffset
from spark_integration.options import SourceOptions
from tests.spark.helpers import PlainMember, Record, all_records, committed, produce, wait_for

PARTS = 4


def options(kafka: EmbeddedKafka, group: str, topic: str, **extra: str) -> SourceOptions:
    return SourceOptions.parse(
        {
            "kafka.bootstrap.servers": kafka.bootstrap_servers,
            "group.id": group,
            "subscribe": topic,
            "startingOffsets": "earliest",
            "joinTimeoutMs": "20000",
            **extra,
        }
    )


class FakeQuery:
    """Spark's micro-batch loop over one GroupReader; batches complete instantly."""

    def __init__(
        self, reader: GroupReader, start: dict[str, Any] | None = None, max_rows: int | None = None
    ) -> None:
        self.reader = reader
        self.max_rows = max_rows
        self.start = reader.initial_offset() if start is None else start
        self.sink: list[Record] = []
        self.batches = 0

    def plan_next(self) -> dict[str, Any] | None:
        """latestOffset + offset log + commit(previous end); None when nothing is new."""
        end = self.reader.latest_offset(self.start, max_rows=self.max_rows)
        if json.dumps(end) == json.dumps(self.start):
            return None
        if self.batches:
            self.reader.commit(self.start)
        return end

    def run_batch(self, end: dict[str, Any]) -> None:
        for r in self.reader.plan(self.start, end):
            self.sink.extend(
                (r.topic, r.partition, o) for o in range(r.from_offset, r.until_offset)
            )
        self.start = end
        self.batches += 1

    def trigger(self) -> bool:
        end = self.plan_next()
        if end is None:
            return False
        self.run_batch(end)
        return True

    def drain(self, limit: int = 50) -> None:
        for _ in range(limit):
            if not self.trigger():
                return
        raise AssertionError("the query never caught up")

    def positions(self) -> dict[int, int]:
        return {p: o for (_, p), o in SourceOffset.from_json(self.start).positions.items()}


def test_batches_commit_what_is_durable_and_are_rate_limited(embedded_kafka: EmbeddedKafka) -> None:
    topic, group = "gr-basic", "gr-basic-g"
    embedded_kafka.create_topic(topic, partitions=PARTS)
    produce(embedded_kafka, topic, PARTS, 25, "a")
    reader = GroupReader(options(embedded_kafka, group, topic))
    try:
        query = FakeQuery(reader, max_rows=40)
        assert reader.initial_offset() is query.start  # idempotent: Spark calls it twice
        assert query.positions() == dict.fromkeys(range(PARTS), 0)
        end = query.plan_next()
        assert end is not None
        assert sum(SourceOffset.from_json(end).positions.values()) == 40
        query.run_batch(end)
        assert len(query.sink) == 40
        # Batch 0 is durable once Spark asks for batch 1: then Kafka holds its end.
        assert committed(embedded_kafka, group, topic, PARTS) == dict.fromkeys(range(PARTS), 0)
        assert query.trigger()
        assert committed(embedded_kafka, group, topic, PARTS) == {
            p: o for (_, p), o in SourceOffset.from_json(end).positions.items()
        }
        query.drain()
        assert sorted(query.sink) == sorted(all_records(embedded_kafka, topic, PARTS))
        assert committed(embedded_kafka, group, topic, PARTS) == query.positions()
        unchanged = reader.latest_offset(query.start)
        assert json.dumps(unchanged) == json.dumps(query.start)
    finally:
        reader.close()
    kinds = [e["kind"] for e in reader.events]
    assert kinds[0] == "start" and "revoke" in kinds and kinds[-1] == "close"


@pytest.mark.parametrize("early", [False, True], ids=["joins-at-first-call", "started-early"])
def test_initial_offset_waits_for_the_reconciled_assignment(
    embedded_kafka: EmbeddedKafka, early: bool
) -> None:
    """initialOffset returns once the member is STABLE with its whole assignment (not while
    it is still acknowledging it), and the event log says when; also when the join was
    started before (as the stream reader does when Spark constructs it)."""
    topic, group = f"gr-join-{early}", f"gr-join-{early}-g"
    embedded_kafka.create_topic(topic, partitions=PARTS)
    produce(embedded_kafka, topic, PARTS, 5, "a")
    reader = GroupReader(options(embedded_kafka, group, topic))
    try:
        if early:
            reader.start()
            reader.start()  # idempotent
        start = SourceOffset.from_json(reader.initial_offset())
        member = reader.member
        assert member.state.name == "STABLE" and member.member_epoch > 0
        everything = {(topic, p) for p in range(PARTS)}
        assert reader.owned == everything == set(start.positions)
        kinds = [e["kind"] for e in reader.events]
        assert kinds[:3] == ["start", "assign", "stable"], kinds
        stable = reader.events[2]
        assert stable["partitions"] == [f"{topic}:{p}" for p in range(PARTS)]
        assert stable["epoch"] == member.member_epoch
        query = FakeQuery(reader)
        query.drain()
        assert sorted(query.sink) == sorted(all_records(embedded_kafka, topic, PARTS))
    finally:
        reader.close()


def test_a_reader_started_but_never_called_leaves_on_close(embedded_kafka: EmbeddedKafka) -> None:
    """Stopped before Spark's first call: the member started early still leaves the group,
    and the next member gets every partition at once."""
    topic, group = "gr-early-stop", "gr-early-stop-g"
    embedded_kafka.create_topic(topic, partitions=PARTS)
    produce(embedded_kafka, topic, PARTS, 5, "a")
    reader = GroupReader(options(embedded_kafka, group, topic))
    reader.start()
    reader.close()
    assert [e["kind"] for e in reader.events][-2:] == ["left", "close"]
    assert reader.member is None
    with pytest.raises(RuntimeError, match="closed"):
        reader.initial_offset()
    successor = GroupReader(options(embedded_kafka, group, topic))
    try:
        start = SourceOffset.from_json(successor.initial_offset())
        assert set(start.positions) == {(topic, p) for p in range(PARTS)}
    finally:
        successor.close()


def test_revocation_between_batches_hands_off_exactly(embedded_kafka: EmbeddedKafka) -> None:
    topic, group = "gr-handoff", "gr-handoff-g"
    embedded_kafka.create_topic(topic, partitions=PARTS)
    produce(embedded_kafka, topic, PARTS, 30, "a")
    reader = GroupReader(options(embedded_kafka, group, topic))
    other: PlainMember | None = None
    try:
        query = FakeQuery(reader)
        query.drain()
        produce(embedded_kafka, topic, PARTS, 30, "b")
        other = PlainMember(embedded_kafka, group, topic)

        def shared() -> bool:
            query.trigger()  # the reader serves its member once per trigger
            return bool(other and other.owned) and len(reader.owned) == PARTS - len(other.owned)

        wait_for(shared, 30, "the other member taking some partitions")
        revoke = next(e for e in reader.events if e["kind"] == "revoke")
        # The revoked partitions were committed at exactly what the sink holds.
        sink_at = {p: max(o for _, q, o in query.sink if q == p) + 1 for p in range(PARTS)}
        assert revoke["committed"]
        for key, offset in revoke["committed"].items():
            assert offset == sink_at[int(key.split(":")[1])]
        produce(embedded_kafka, topic, PARTS, 30, "c")
        total = len(all_records(embedded_kafka, topic, PARTS))
        wait_for(
            lambda: (
                (query.trigger() or True) and len(set(query.sink) | set(other.records)) == total
            ),
            30,
            "all",
        )
        other.close()
        wait_for(
            lambda: (query.trigger() or True) and len(reader.owned) == PARTS,
            30,
            "the partitions coming back",
        )
        produce(embedded_kafka, topic, PARTS, 30, "d")
        query.drain()
        produced = all_records(embedded_kafka, topic, PARTS)
        assert len(query.sink) == len(set(query.sink)), "the query read a record twice"
        assert not set(query.sink) & set(other.records), "a record was read by both members"
        assert set(query.sink) | set(other.records) == produced
        assert other.records, "the other member read nothing"
        assert not other.errors
    finally:
        if other is not None:
            other.close()
        reader.close()


def test_a_revocation_waits_for_the_inflight_batch(embedded_kafka: EmbeddedKafka) -> None:
    """Revoked while batch N+1 runs: Spark's commit(end of N), which comes after N+1 was
    planned, does not serve it; the next latestOffset (N+1 durable) does and commits N+1's
    end, so the next owner starts exactly there: no record in both owners' sinks."""
    from consumer_sdk import MemberState

    topic, group = "gr-inflight", "gr-inflight-g"
    embedded_kafka.create_topic(topic, partitions=PARTS)
    produce(embedded_kafka, topic, PARTS, 20, "a")
    reader = GroupReader(options(embedded_kafka, group, topic))
    other: PlainMember | None = None
    try:
        query = FakeQuery(reader)
        query.drain()
        produce(embedded_kafka, topic, PARTS, 20, "b")
        end = reader.latest_offset(query.start)  # batch N+1 planned (offset log written)
        other = PlainMember(embedded_kafka, group, topic)
        member = reader.member
        assert member is not None

        def revocation_known() -> bool:
            reader.commit(query.start)  # Spark's commit of batch N while N+1 runs
            # RECONCILING: the revocation is queued for the member's next poll, and stays
            # so (unacknowledged) as long as nothing serves it.
            return member.state is MemberState.RECONCILING

        wait_for(revocation_known, 30, "the member learning of a revocation")
        reader.commit(query.start)
        assert len(reader.owned) == PARTS and not other.owned, "served while N+1 in flight"
        query.run_batch(end)  # N+1 completes, including every partition
        wait_for(lambda: (query.trigger() or True) and bool(other.owned), 30, "the hand-over")
        revoked = {p for p in range(PARTS)} - {p for _, p in reader.owned}
        assert revoked
        ends = {p: o for (_, p), o in SourceOffset.from_json(end).positions.items()}
        assert (
            committed(embedded_kafka, group, topic, PARTS).items()
            >= {p: ends[p] for p in revoked}.items()
        )
        produce(embedded_kafka, topic, PARTS, 20, "c")
        total = all_records(embedded_kafka, topic, PARTS)
        wait_for(
            lambda: (query.trigger() or True) and set(query.sink) | set(other.records) == total,
            30,
            "every record read",
        )
        assert not set(query.sink) & set(other.records), "a record in both sinks"
        assert len(query.sink) == len(set(query.sink))
    finally:
        if other is not None:
            other.close()
        reader.close()


def test_restart_resumes_from_the_checkpoint_not_the_lagging_commit(
    embedded_kafka: EmbeddedKafka,
) -> None:
    topic, group = "gr-restart", "gr-restart-g"
    embedded_kafka.create_topic(topic, partitions=PARTS)
    produce(embedded_kafka, topic, PARTS, 20, "a")
    first = GroupReader(options(embedded_kafka, group, topic))
    query = FakeQuery(first)
    query.drain()
    produce(embedded_kafka, topic, PARTS, 20, "b")
    kafka_at = query.positions()
    end = first.latest_offset(query.start)
    query.run_batch(end)  # completed and in the checkpoint, but never committed to Kafka
    first.close()  # leaves; commits only what it knew durable
    assert committed(embedded_kafka, group, topic, PARTS) == kafka_at
    # Restart: Spark replays nothing (the batch is in the commit log) and asks latestOffset.
    second = GroupReader(options(embedded_kafka, group, topic))
    try:
        resumed = FakeQuery(second, start=query.start)
        resumed.sink = list(query.sink)
        produce(embedded_kafka, topic, PARTS, 20, "c")
        resumed.drain()
        assert len(resumed.sink) == len(set(resumed.sink)) == 60 * PARTS
        assert set(resumed.sink) == all_records(embedded_kafka, topic, PARTS)
        assert committed(embedded_kafka, group, topic, PARTS) == resumed.positions()
    finally:
        second.close()


def test_replay_of_an_unfinished_batch_after_restart(embedded_kafka: EmbeddedKafka) -> None:
    """A batch in the offset log but not the commit log is re-planned from the two logged
    offsets alone (ranges equal) where this run owns the partitions, and skipped where
    another member owns them (it reads them from the group's committed offset)."""
    topic, group = "gr-replay", "gr-replay-g"
    embedded_kafka.create_topic(topic, partitions=PARTS)
    produce(embedded_kafka, topic, PARTS, 20, "a")
    first = GroupReader(options(embedded_kafka, group, topic, maxOffsetsPerTrigger="40"))
    query = FakeQuery(first, max_rows=40)
    query.trigger()
    end = query.plan_next()
    assert end is not None
    planned = first.plan(query.start, end)
    first.close()  # the run dies before the batch completes
    second = GroupReader(options(embedded_kafka, group, topic))
    try:
        assert planned and second.plan(query.start, end) == planned
    finally:
        second.close()
    other = PlainMember(embedded_kafka, group, topic)
    third: GroupReader | None = None
    try:
        wait_for(lambda: len(other.records) == 80 - 40, 20, "the other member reading")
        third = GroupReader(options(embedded_kafka, group, topic))
        # Partitions the other member owns are skipped; any handed to this run start at
        # what the other member committed on revoke, past the batch.
        assert third.plan(query.start, end) == []
    finally:
        other.close()
        if third is not None:
            third.close()


def test_starting_offsets_apply_where_the_group_has_no_commit(
    embedded_kafka: EmbeddedKafka,
) -> None:
    topic = "gr-starting"
    embedded_kafka.create_topic(topic, partitions=PARTS)
    produce(embedded_kafka, topic, PARTS, 10, "a")
    cases = {
        "latest": dict.fromkeys(range(PARTS), 10),
        "earliest": dict.fromkeys(range(PARTS), 0),
        json.dumps({topic: {"0": 3, "1": -1, "2": -2}}): {0: 3, 1: 10, 2: 0, 3: 0},
    }
    for i, (spec, expected) in enumerate(cases.items()):
        reader = GroupReader(
            options(embedded_kafka, f"gr-starting-{i}", topic, startingOffsets=spec)
        )
        try:
            initial = SourceOffset.from_json(reader.initial_offset())
            assert {p: o for (_, p), o in initial.positions.items()} == expected, spec
            reader.latest_offset(reader.initial_offset())  # batch 0's start is durable
        finally:
            reader.close()
    # With a committed offset the group wins over startingOffsets.
    reader = GroupReader(
        options(embedded_kafka, "gr-starting-0", topic, startingOffsets="earliest")
    )
    try:
        initial = SourceOffset.from_json(reader.initial_offset())
        assert {p: o for (_, p), o in initial.positions.items()} == dict.fromkeys(range(PARTS), 10)
    finally:
        reader.close()


def test_offsets_missing_from_the_log_fail_or_restart_at_earliest(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """A checkpoint beyond the log (recreated topic): failOnDataLoss decides."""
    from spark_integration.offsets import DataLossError

    topic = "gr-loss"
    embedded_kafka.create_topic(topic, partitions=1)
    produce(embedded_kafka, topic, 1, 10, "a")
    checkpoint = SourceOffset({(topic, 0): 500}).to_json()
    strict = GroupReader(options(embedded_kafka, "gr-loss-a", topic))
    try:
        with pytest.raises(DataLossError, match="failOnDataLoss=false"):
            strict.latest_offset(checkpoint)
    finally:
        strict.close()
    lenient = GroupReader(options(embedded_kafka, "gr-loss-b", topic, failOnDataLoss="false"))
    try:
        end = SourceOffset.from_json(lenient.latest_offset(checkpoint))
        assert end.starts == {(topic, 0): 0} and end.positions == {(topic, 0): 10}
    finally:
        lenient.close()


def test_assignment_survives_a_transient_offset_fetch_error(embedded_kafka: EmbeddedKafka) -> None:
    topic, group = "gr-fetcherr", "gr-fetcherr-g"
    embedded_kafka.create_topic(topic, partitions=2)
    produce(embedded_kafka, topic, 2, 10, "a")
    first = GroupReader(options(embedded_kafka, group, topic))
    query = FakeQuery(first)
    query.drain()
    first.close()
    embedded_kafka.push_request_errors(9, [14])  # OffsetFetch: COORDINATOR_LOAD_IN_PROGRESS
    second = GroupReader(options(embedded_kafka, group, topic))
    try:
        initial = SourceOffset.from_json(second.initial_offset())
        assert {p: o for (_, p), o in initial.positions.items()} == {0: 10, 1: 10}
    finally:
        embedded_kafka.clear_request_errors(9)
        second.close()


def test_available_now_stops_at_the_snapshot_and_min_rows_waits(
    embedded_kafka: EmbeddedKafka,
) -> None:
    topic, group = "gr-avail", "gr-avail-g"
    embedded_kafka.create_topic(topic, partitions=2)
    produce(embedded_kafka, topic, 2, 20, "a")
    reader = GroupReader(options(embedded_kafka, group, topic))
    try:
        start = reader.initial_offset()
        # ReadMinRows: 40 records are not enough for a batch of 100.
        assert json.dumps(reader.latest_offset(start, min_rows=100)) == json.dumps(start)
        reader.prepare_for_trigger_available_now()
        produce(embedded_kafka, topic, 2, 20, "late")  # after the snapshot: not in this run
        query = FakeQuery(reader, start=start, max_rows=15)
        query.drain()
        assert query.positions() == {0: 20, 1: 20} and query.batches == 3
        assert len(query.sink) == 40
    finally:
        reader.close()


def test_available_now_prepared_before_the_join_bounds_at_the_join(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """Spark's order for AvailableNow: prepare (which joins) before initialOffset. The bound
    comes from the assignment's own lookup, for fresh partitions and for partitions with a
    committed offset alike; records produced after it are left for the next run."""
    topic, group = "gr-avail-join", "gr-avail-join-g"
    embedded_kafka.create_topic(topic, partitions=2)
    produce(embedded_kafka, topic, 2, 20, "a")
    for run, end in enumerate([20, 40]):  # the second run resumes at the committed 20
        if run:
            produce(embedded_kafka, topic, 2, 10, "b")
        reader = GroupReader(options(embedded_kafka, group, topic))
        try:
            reader.prepare_for_trigger_available_now()
            produce(embedded_kafka, topic, 2, 10, f"late{run}")  # after the bound
            query = FakeQuery(reader, max_rows=15)
            query.drain()
            assert query.positions() == {0: end, 1: end}
        finally:
            reader.close()
        assert committed(embedded_kafka, group, topic, 2) == {0: end, 1: end}


def test_new_topic_matching_the_pattern_starts_at_earliest(embedded_kafka: EmbeddedKafka) -> None:
    """startingOffsets=latest applies to what exists at start; later topics are read whole."""
    group = "gr-pattern-g"
    embedded_kafka.create_topic("grpat-a", partitions=2)
    produce(embedded_kafka, "grpat-a", 2, 5, "a")
    reader = GroupReader(
        SourceOptions.parse(
            {
                "kafka.bootstrap.servers": embedded_kafka.bootstrap_servers,
                "group.id": group,
                "subscribePattern": "grpat-.*",
                "startingOffsets": "latest",
                "joinTimeoutMs": "20000",
            }
        )
    )
    try:
        query = FakeQuery(reader)
        assert query.positions() == {0: 5, 1: 5}  # latest for the topic present at start
        embedded_kafka.create_topic("grpat-b", partitions=2)
        produce(embedded_kafka, "grpat-b", 2, 7, "b")

        def sees_b() -> bool:
            query.trigger()
            return any(t == "grpat-b" for t, _ in reader.owned)

        wait_for(sees_b, 30, "the new topic assigned")
        query.drain()
        read_b = sorted(r for r in query.sink if r[0] == "grpat-b")
        assert read_b == sorted(all_records(embedded_kafka, "grpat-b", 2))  # from offset 0
        assert not [r for r in query.sink if r[0] == "grpat-a"]
    finally:
        reader.close()


def test_starting_offsets_by_timestamp_and_strategy(embedded_kafka: EmbeddedKafka) -> None:
    import time as _time

    import confluent_kafka

    topic = "gr-bytime"
    embedded_kafka.create_topic(topic, partitions=2)
    producer = confluent_kafka.Producer({"bootstrap.servers": embedded_kafka.bootstrap_servers})
    base = int(_time.time() * 1000) - 100_000
    for p in range(2):
        for i in range(10):
            producer.produce(topic, b"v", partition=p, timestamp=base + i * 1000)
    assert producer.flush(10) == 0
    del producer  # no librdkafka reconnect noise after the module's cluster stops

    def initial(**extra: str) -> dict[int, int]:
        reader = GroupReader(
            options(embedded_kafka, f"gr-bytime-{len(extra)}-{sorted(extra)}", topic, **extra)
        )
        try:
            start = SourceOffset.from_json(reader.initial_offset())
            return {p: o for (_, p), o in start.positions.items()}
        finally:
            reader.close()

    # The librdkafka mock answers every timestamp lookup with "no such record" (-1): the
    # strategies and precedence are tested here, the lookups themselves on a real broker.
    by_ts = json.dumps({topic: {"0": base + 6500}})
    # Partition 1 is not listed: startingOffsets (earliest here) applies to it.
    assert initial(
        startingOffsetsByTimestamp=by_ts, startingOffsetsByTimestampStrategy="latest"
    ) == {0: 10, 1: 0}
    with pytest.raises(ValueError, match=r"startingOffsetsByTimestamp: no record .*bytime\[0\]"):
        initial(startingOffsetsByTimestamp=by_ts)
    future = str(base + 10_000_000)
    with pytest.raises(ValueError, match=r"startingTimestamp: no record at or after .*bytime\[0\]"):
        initial(startingTimestamp=future)
    assert initial(startingTimestamp=future, startingOffsetsByTimestampStrategy="latest") == {
        0: 10,
        1: 10,
    }


def test_min_offsets_per_trigger_waits_for_rows_or_the_delay(
    embedded_kafka: EmbeddedKafka,
) -> None:
    import time as _time

    topic, group = "gr-minrows", "gr-minrows-g"
    embedded_kafka.create_topic(topic, partitions=2)
    reader = GroupReader(
        options(embedded_kafka, group, topic, minOffsetsPerTrigger="50", maxTriggerDelay="3s")
    )
    try:
        start = reader.initial_offset()
        produce(embedded_kafka, topic, 2, 10, "a")  # 20 < 50
        assert json.dumps(reader.latest_offset(start, min_rows=50)) == json.dumps(start)
        produce(embedded_kafka, topic, 2, 15, "b")  # 50 in all: a batch at once
        end = reader.latest_offset(start, min_rows=50)
        assert sum(SourceOffset.from_json(end).positions.values()) == 50
        produce(embedded_kafka, topic, 2, 5, "c")  # 10 < 50: held back up to 3 s
        assert json.dumps(reader.latest_offset(end, min_rows=50)) == json.dumps(end)
        # Trigger.Once / AvailableNow (ReadAllAvailable) ignore the minimum.
        assert json.dumps(reader.latest_offset(end, min_rows=50, all_available=True)) != (
            json.dumps(end)
        )
        held = _time.monotonic()
        wait_for(
            lambda: json.dumps(reader.latest_offset(end, min_rows=50)) != json.dumps(end),
            20,
            "maxTriggerDelay releasing the small batch",
        )
        assert _time.monotonic() - held >= 1.0
    finally:
        reader.close()


def test_unreachable_broker_or_missing_topic_fail_at_start(embedded_kafka: EmbeddedKafka) -> None:
    import socket
    import time as _time

    from spark_integration.offsets import SourceStartupError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once closed
    reader = GroupReader(
        SourceOptions.parse(
            {
                "kafka.bootstrap.servers": dead,
                "group.id": "g",
                "subscribe": "t",
                "joinTimeoutMs": "2000",
            }
        )
    )
    began = _time.monotonic()
    try:
        with pytest.raises(
            SourceStartupError,
            match=rf"no Kafka broker answered at kafka.bootstrap.servers={dead} "
            r"within 2000 ms \(joinTimeoutMs\)",
        ):
            reader.initial_offset()
        assert _time.monotonic() - began < 15
    finally:
        reader.close()
    embedded_kafka.create_topic("gr-exists", partitions=1)
    reader = GroupReader(
        options(embedded_kafka, "gr-missing-g", "gr-exists,gr-nope", joinTimeoutMs="1500")
    )
    try:
        with pytest.raises(
            SourceStartupError, match=r"subscribed topic\(s\) \['gr-nope'\] do not exist"
        ):
            reader.initial_offset()
        assert reader.member is None  # the member built during the check was closed
    finally:
        reader.close()


def test_assign_reads_fixed_partitions_and_commits_without_membership(
    embedded_kafka: EmbeddedKafka,
) -> None:
    topic, group = "gr-assign", "gr-assign-g"
    embedded_kafka.create_topic(topic, partitions=3)
    produce(embedded_kafka, topic, 3, 10, "a")
    opts = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": embedded_kafka.bootstrap_servers,
            "group.id": group,
            "assign": json.dumps({topic: [0, 2]}),
            "startingOffsets": "earliest",
        }
    )
    reader = GroupReader(opts)
    try:
        query = FakeQuery(reader)
        query.drain()
        assert {p for _, p, _ in query.sink} == {0, 2} and len(query.sink) == 20
        assert committed(embedded_kafka, group, topic, 3) == {0: 10, 2: 10}
        assert reader.member is not None and not isinstance(reader.member, GroupMemberType)
    finally:
        reader.close()


def test_the_commit_log_commits_a_batch_without_a_later_spark_call(
    embedded_kafka: EmbeddedKafka, tmp_path: Any
) -> None:
    """With checkpointLocation, a batch is committed to Kafka once its commit-log entry
    exists (Trigger.Once has no later Spark call), by the watcher and exactly on close."""
    topic, group = "gr-durable", "gr-durable-g"
    embedded_kafka.create_topic(topic, partitions=2)
    produce(embedded_kafka, topic, 2, 10, "a")
    ck = tmp_path / "ck"
    (ck / "offsets").mkdir(parents=True)
    (ck / "commits").mkdir()

    def log_batch(batch: int, offset: dict[str, Any], done: bool) -> None:
        meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": {}})
        (ck / "offsets" / str(batch)).write_text(f"v1\n{meta}\n{json.dumps(offset)}")
        if done:
            (ck / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')

    reader = GroupReader(options(embedded_kafka, group, topic, checkpointLocation=str(ck)))
    try:
        start = reader.initial_offset()
        end = reader.latest_offset(start)
        log_batch(0, end, done=False)
        assert committed(embedded_kafka, group, topic, 2) == {0: 0, 1: 0}
        log_batch(0, end, done=True)
        wait_for(
            lambda: committed(embedded_kafka, group, topic, 2) == {0: 10, 1: 10},
            10,
            "the watcher committing the batch in the commit log",
        )
        produce(embedded_kafka, topic, 2, 5, "b")
        end2 = reader.latest_offset(end)
        log_batch(1, end2, done=True)
    finally:
        reader.close()  # reads the commit log before leaving, whatever the watcher did
    assert committed(embedded_kafka, group, topic, 2) == {0: 15, 1: 15}


def test_offsets_behind_latest_and_description_in_the_reported_latest_offset(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """pyspark gives Python sources no metrics: the lag of the planned batch (as Spark's
    Kafka source names it) and the description travel in reportLatestOffset."""
    topic, group = "gr-lag", "gr-lag-g"
    embedded_kafka.create_topic(topic, partitions=2)
    embedded_kafka.produce(topic, [b"x"] * 30, partition=0)
    embedded_kafka.produce(topic, [b"x"] * 10, partition=1)
    reader = GroupReader(options(embedded_kafka, group, topic))
    try:
        start = reader.initial_offset()
        reader.latest_offset(start, max_rows=20)  # 15 of 30 and 5 of 10 (backlog shares)
        report = reader.report_latest_offset()
        assert report is not None
        assert report[topic] == {"0": 30, "1": 10}
        assert report["@source"] == {
            "description": f"kip848[Subscribe[{topic}], group={group}]",
            "minOffsetsBehindLatest": "5",
            "maxOffsetsBehindLatest": "15",
            "avgOffsetsBehindLatest": "10.0",
        }
    finally:
        reader.close()


_IMPORT_PROBE = textwrap.dedent(
    """
    import sys, types
    from spark_integration import driver
    if sys.argv[1] == "stream-reader":
        sys.modules["__main__"].__spec__ = types.SimpleNamespace(name=driver.STREAM_READER_MAIN)
    driver._member_class()
    loaded = "hypothesis" in sys.modules
    heavy = [m for m in ("pydantic", "urllib.request", "http.client") if m in sys.modules]
    import hypothesis.strategies  # importable again after the member's import
    print(loaded, ",".join(heavy) or "-")
    """
)


def test_the_stream_reader_process_imports_the_member_without_hypothesis() -> None:
    """kio registers hypothesis strategies whenever hypothesis is importable; pyspark's
    stream-reader process (its runner module is ``__main__``) imports the member with it
    hidden, and only there. Neither imports pydantic (the member's configuration is checked
    without it) nor an HTTP client (only an OIDC token source needs one)."""
    for process, loaded in (("stream-reader", "False -"), ("any other", "True -")):
        out = subprocess.run(
            [sys.executable, "-c", _IMPORT_PROBE, process],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert out.stdout.strip() == loaded, (process, out.stdout, out.stderr)


def test_a_member_built_during_a_failed_start_is_closed(embedded_kafka: EmbeddedKafka) -> None:
    # The member is created and subscribed on its own thread while the broker check runs;
    # when the check fails, nothing may keep it (its connections, its place on the network
    # loop): it is closed, and a closed member refuses to be polled.
    from confluent_kafka import KafkaError, KafkaException

    from consumer_sdk import GroupMember
    from spark_integration.offsets import SourceStartupError

    embedded_kafka.create_topic("gr-built", partitions=2)
    built: list[GroupMemberType] = []

    def factory(config: dict[str, Any]) -> GroupMemberType:
        member = GroupMember(config)
        built.append(member)
        return member

    reader = GroupReader(
        options(embedded_kafka, "gr-built-g", "gr-built,gr-absent", joinTimeoutMs="1500"),
        member_factory=factory,
    )

    def closed() -> bool:
        try:
            built[0].poll(0)
        except KafkaException as exc:
            assert exc.args[0].code() == KafkaError._STATE, exc
            return True
        return False

    try:
        with pytest.raises(SourceStartupError, match=r"\['gr-absent'\] do not exist"):
            reader.initial_offset()
        wait_for(lambda: len(built) == 1, 20, "the member built during the check")
        wait_for(closed, 20, "the member built during the failed start to be closed")
    finally:
        reader.close()
        for member in built:
            member.close(timeout=1)


_CONSTRUCT_PROBE = textwrap.dedent(
    """
    import sys, threading, time, types
    from spark_integration import driver
    from spark_integration.options import SourceOptions
    from spark_integration.source import Kip848StreamReader
    if sys.argv[1] == "stream-reader":
        sys.modules["__main__"].__spec__ = types.SimpleNamespace(name=driver.STREAM_READER_MAIN)
    options = {"kafka.bootstrap.servers": "127.0.0.1:1", "group.id": "g"}
    options["subscribe" if sys.argv[2] == "subscribe" else "assign"] = (
        "t" if sys.argv[2] == "subscribe" else '{"t": [0]}'
    )
    Kip848StreamReader(SourceOptions.parse(options))
    member_module = "consumer_sdk.runtime.group_member"
    if sys.argv[1] != "stream-reader" or sys.argv[2] != "subscribe":
        # Nothing may have been started: neither the importing thread (started, if at all,
        # inside the constructor) nor the import itself.
        importing = any(t.name == "kip848-import" for t in threading.enumerate())
        print(importing or member_module in sys.modules)
        sys.exit(0)
    deadline = time.monotonic() + 60
    while member_module not in sys.modules and time.monotonic() < deadline:
        time.sleep(0.01)
    print(member_module in sys.modules)
    """
)


def test_the_stream_reader_starts_importing_the_member_when_spark_constructs_it() -> None:
    """In the stream-reader process, constructing a group reader starts importing the
    member (it overlaps Spark's calls before the first that needs it); the planner's and
    executors' copies, and ``assign`` readers (no member), import nothing."""
    for process, mode, imported in (
        ("stream-reader", "subscribe", "True"),
        ("stream-reader", "assign", "False"),
        ("any other", "subscribe", "False"),
    ):
        out = subprocess.run(
            [sys.executable, "-c", _CONSTRUCT_PROBE, process, mode],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        assert out.stdout.strip() == imported, (process, mode, out.stdout, out.stderr)
