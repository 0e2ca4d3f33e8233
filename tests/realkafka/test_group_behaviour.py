"""Group behaviour on the real broker, with a confluent-kafka ``group.protocol=consumer`` member
in the same group as the oracle where one makes sense: scale out and in under both server-side
assignors, static membership, broker-evaluated regex subscriptions, the broker's OffsetCommit
epoch rule, commits in on_revoke, max.poll.interval.ms expiry and client.rack.
"""

from __future__ import annotations

import time
from typing import Any

import confluent_kafka
import pytest

from consumer_sdk import CloseOption, Consumer, KafkaException, MemberState, TopicPartition
from consumer_sdk.domain import OffsetCommitPartition, OffsetCommitRequest
from consumer_sdk.protocol.client import ClusterClient
from consumer_sdk.testing import KafkaCluster, KafkaClusterError
from tests.realkafka.support import CkMember, unique
from tests.runtime.harness import Member, Partition, Timeline, config, wait_for

pytestmark = pytest.mark.realkafka

AnyMember = Member | CkMember


def _owned_by(members: list[AnyMember]) -> dict[Partition, list[str]]:
    owners: dict[Partition, list[str]] = {}
    for m in members:
        for p in set(m.owned):
            owners.setdefault(p, []).append(m.name)
    return owners


def _disjoint_cover(members: list[AnyMember], partitions: set[Partition]) -> bool:
    owners = _owned_by(members)
    return set(owners) == partitions and all(len(v) == 1 for v in owners.values())


def _consumed(members: list[AnyMember]) -> set[tuple[str, int, int]]:
    return {(t, p, o) for m in members for (t, p, o, _) in m.records}


def _end_offsets(kafka: KafkaCluster, topic: str, partitions: int) -> dict[Partition, int]:
    consumer = confluent_kafka.Consumer(
        {"bootstrap.servers": kafka.bootstrap_servers, "group.id": unique("eo")}
    )
    try:
        return {
            (topic, p): consumer.get_watermark_offsets(
                confluent_kafka.TopicPartition(topic, p), timeout=10
            )[1]
            for p in range(partitions)
        }
    finally:
        consumer.close()


@pytest.mark.parametrize("assignor", ["uniform", "range"])
def test_scale_out_and_in_with_a_confluent_member(real_kafka: KafkaCluster, assignor: str) -> None:
    """2 SDK + 1 confluent-kafka member, out to 4 + 1, in to 2 + 1: ownership disjoint and
    complete at every moment, every record consumed, commits visible through AdminClient."""
    kafka, partitions = real_kafka, 8
    topic, group = unique("scale"), unique("scale-g")
    kafka.create_topic(topic, partitions)
    every = {(topic, p) for p in range(partitions)}
    timeline = Timeline()

    def cfg(i: int) -> dict[str, Any]:
        return config(
            kafka,
            group,
            group_remote_assignor=assignor,
            client_rack=f"rack-{i}",
            auto_commit_interval_ms=500,
        )

    sent = 0

    def produce(n: int) -> None:
        nonlocal sent
        kafka.produce(topic, [(f"k{sent + i}", f"v{sent + i}") for i in range(n)])
        sent += n

    produce(400)
    members: list[AnyMember] = [
        Member("sdk0", cfg(0), [topic], timeline),
        Member("sdk1", cfg(1), [topic], timeline),
        CkMember("ck", cfg(9), [topic], timeline),
    ]
    try:
        wait_for(
            lambda: _disjoint_cover(members, every) and all(m.owned for m in members),
            timeout=60,
            what="3 members covering the topic",
        )
        described = kafka.describe_group(group)
        assert described.assignor == assignor
        assert sorted(m.rack or "" for m in described.members) == ["rack-0", "rack-1", "rack-9"]

        produce(400)
        members += [
            Member("sdk2", cfg(2), [topic], timeline),
            Member("sdk3", cfg(3), [topic], timeline),
        ]
        wait_for(
            lambda: _disjoint_cover(members, every) and all(m.owned for m in members),
            timeout=60,
            what="5 members covering the topic",
        )

        produce(400)
        leaving = [m for m in members if m.name in ("sdk1", "sdk3")]
        for m in leaving:
            m.stop()
        rest = [m for m in members if m not in leaving]
        wait_for(lambda: _disjoint_cover(rest, every), timeout=60, what="the leavers' partitions")
        produce(400)

        every_record = {
            (t, p, o)
            for (t, p), end in _end_offsets(kafka, topic, partitions).items()
            for o in range(end)
        }
        assert len(every_record) == sent == 1600
        wait_for(lambda: _consumed(members) >= every_record, timeout=60, what="every record")
        ends = {tp: end for tp, end in _end_offsets(kafka, topic, partitions).items() if end}
        try:
            wait_for(lambda: kafka.committed(group) == ends, timeout=30, what="the commits")
        except AssertionError:
            assert kafka.committed(group) == ends  # shows the difference
        assert timeline.overlaps() == []
        assert not any(m.errors for m in members), {m.name: m.errors for m in members}
        final = kafka.describe_group(group)
        assert {m.member_id for m in final.members} >= {
            m.consumer.member_id for m in rest if isinstance(m, Member)
        }
        assert sum(len(m.partitions) for m in final.members) == partitions
    finally:
        for m in members:
            m.stop()


def test_static_leave_keeps_the_assignment_for_the_same_instance(real_kafka: KafkaCluster) -> None:
    """close() of a static member leaves with epoch -2: the broker keeps its partitions (nobody
    else gets them) and a new member with the same instance id gets exactly them back."""
    kafka = real_kafka
    topic, group = unique("static"), unique("static-g")
    kafka.create_topic(topic, 4)
    timeline = Timeline()
    a = Member("a", config(kafka, group, group_instance_id="inst-a"), [topic], timeline)
    ck = CkMember("ck", config(kafka, group, group_instance_id="inst-ck"), [topic], timeline)
    a2: Member | None = None
    try:
        wait_for(lambda: len(a.owned) == 2 and len(ck.owned) == 2, timeout=60, what="2/2 split")
        before = set(a.owned)
        old_member_id = a.consumer.member_id
        a.stop()
        # the broker still lists the instance (its session has not expired) and its partitions
        gone = kafka.describe_group(group)
        kept = [m for m in gone.members if m.instance_id == "inst-a"]
        assert kept and kept[0].partitions == before, gone
        a2 = Member("a2", config(kafka, group, group_instance_id="inst-a"), [topic], timeline)
        wait_for(
            lambda: a2 is not None and a2.owned == before,
            timeout=60,
            what="the same partitions for the same instance id",
        )
        ck_assigned = [
            parts
            for _, name, kind, parts in timeline.events
            if name == "ck" and kind == "assign" and parts
        ]
        assert len(ck_assigned) == 1, f"the static member's partitions moved: {ck_assigned}"
        assert a2.consumer.member_id != old_member_id
        described = kafka.describe_group(group)
        assert {m.instance_id for m in described.members} == {"inst-a", "inst-ck"}
        a2.stop(option=CloseOption.LEAVE_GROUP)
        wait_for(lambda: len(ck.owned) == 4, timeout=60, what="partitions moving on a real leave")
        assert timeline.overlaps() == []
    finally:
        a.stop()
        if a2 is not None:
            a2.stop()
        ck.stop()


def test_duplicate_instance_id_is_the_brokers_error_for_both_clients(
    real_kafka: KafkaCluster,
) -> None:
    """A second live member with a taken instance id gets UNRELEASED_INSTANCE_ID, whichever
    client holds the id: a _FATAL event from poll() naming it, as confluent-kafka's; then the
    SDK raises the fatal error itself."""
    kafka = real_kafka
    topic = unique("dup")
    kafka.create_topic(topic, 2)
    group = unique("dup-g")
    holder = CkMember("ck", config(kafka, group, group_instance_id="i-1"), [topic], Timeline())
    duplicate = Consumer(config(kafka, group, group_instance_id="i-1"))
    try:
        wait_for(lambda: len(holder.owned) == 2, timeout=60, what="confluent-kafka holding i-1")
        duplicate.subscribe([topic])
        events: list[confluent_kafka.KafkaError] = []

        def fatal_event() -> bool:
            msg = duplicate.poll(0.2)
            if msg is not None and msg.error() is not None:
                events.append(msg.error())
            return bool(events)

        wait_for(fatal_event, timeout=30, what="the SDK's _FATAL event")
        assert events[0].code() == confluent_kafka.KafkaError._FATAL
        assert "UNRELEASED_INSTANCE_ID" in events[0].str()
        with pytest.raises(KafkaException, match="UNRELEASED_INSTANCE_ID") as info:
            duplicate.poll(0.2)
        assert info.value.args[0].fatal() and info.value.args[0].code() == 111
        assert duplicate.state is MemberState.FATAL
        assert len(holder.owned) == 2 and not holder.errors
    finally:
        duplicate.close(timeout=5)
        holder.stop()

    group = unique("dup-g")
    sdk = Member("sdk", config(kafka, group, group_instance_id="i-2"), [topic], Timeline())
    ck: CkMember | None = None
    try:
        wait_for(lambda: len(sdk.owned) == 2, timeout=60, what="the SDK holding i-2")
        ck = CkMember("ck2", config(kafka, group, group_instance_id="i-2"), [topic], Timeline())
        wait_for(lambda: ck is not None and ck.errors, timeout=30, what="confluent-kafka's error")
        # librdkafka reports it as its _FATAL error event, naming the broker's error
        assert ck.errors[0].code() == confluent_kafka.KafkaError._FATAL
        assert "instance ID is still used by another member" in ck.errors[0].str()
        assert len(sdk.owned) == 2 and not sdk.errors
    finally:
        if ck is not None:
            ck.stop()
        sdk.stop()


def test_regex_subscription_is_evaluated_by_the_broker(real_kafka: KafkaCluster) -> None:
    """A new matching topic is assigned, added partitions are read from offset 0, a deleted
    topic is revoked; the confluent-kafka member in its own group sees the same."""
    kafka = real_kafka
    prefix = unique("rx")
    first = f"{prefix}-a"
    kafka.create_topic(first, 1)
    kafka.create_topic(f"{prefix}x-b", 1)  # no match: RE2J full match of the whole name
    pattern = f"^{prefix}-.*"
    sdk = Member("sdk", config(kafka, unique("rx-g")), [pattern], Timeline())
    ck = CkMember("ck", config(kafka, unique("rx-ck")), [pattern], Timeline())
    members = [sdk, ck]
    try:
        wait_for(
            lambda: all(m.owned == {(first, 0)} for m in members),
            timeout=60,
            what="the matching topic",
        )
        second = f"{prefix}-b"
        kafka.create_topic(second, 2)
        kafka.produce(second, ["s0", "s1", "s2"], partition=1)
        # the broker refreshes regex subscriptions on its own schedule (about 10 s)
        want = {(first, 0), (second, 0), (second, 1)}
        wait_for(
            lambda: all(m.owned == want for m in members), timeout=90, what="the new matching topic"
        )

        kafka.add_partitions(second, 4)
        kafka.produce(second, [f"n{i}" for i in range(5)], partition=3)
        want |= {(second, 2), (second, 3)}
        wait_for(
            lambda: all(m.owned == want for m in members), timeout=60, what="the added partitions"
        )
        for m in members:
            wait_for(
                lambda m=m: (
                    {(t, p, o) for t, p, o, _ in m.records}
                    >= {
                        (second, 1, 0),
                        (second, 1, 1),
                        (second, 1, 2),
                        *((second, 3, o) for o in range(5)),
                    }
                ),
                timeout=30,
                what=f"{m.name} reading the new partitions from offset 0",
            )

        kafka.delete_topic(first)
        want.discard((first, 0))
        wait_for(
            lambda: all(m.owned == want for m in members),
            timeout=60,
            what="the deleted topic revoked",
        )
        kafka.produce(second, ["after-delete"], partition=0)
        wait_for(
            lambda: any(r[3] == b"after-delete" for r in sdk.records),
            timeout=30,
            what="the SDK member still consuming",
        )
        assert sdk.consumer.state is MemberState.STABLE
        assert not sdk.errors, sdk.errors
        described = kafka.describe_group(sdk.consumer.group_id)
        [member] = described.members
        assert member.subscribed_regex == pattern
    finally:
        for m in members:
            m.stop()


def test_new_partitions_start_at_latest_like_confluent_kafka(real_kafka: KafkaCluster) -> None:
    """With auto.offset.reset=latest, records written to a just-added partition before the
    member is assigned it are skipped by confluent-kafka; the SDK behaves the same."""
    kafka = real_kafka
    topic = unique("latest")
    kafka.create_topic(topic, 1)
    sdk = Member(
        "sdk", config(kafka, unique("lt-g"), auto_offset_reset="latest"), [topic], Timeline()
    )
    ck = CkMember(
        "ck", config(kafka, unique("lt-ck"), auto_offset_reset="latest"), [topic], Timeline()
    )
    try:
        wait_for(lambda: sdk.owned and ck.owned, timeout=60, what="assignments")
        kafka.add_partitions(topic, 2)
        kafka.produce(topic, ["early"], partition=1)  # races the assignment of partition 1
        wait_for(lambda: len(sdk.owned) == len(ck.owned) == 2, timeout=60, what="partition 1")
        time.sleep(2.0)  # both positions are resolved by now
        kafka.produce(topic, ["late"], partition=1)
        wait_for(
            lambda: all(any(r[3] == b"late" for r in m.records) for m in (sdk, ck)),
            timeout=30,
            what="the record produced after the assignment",
        )
        sdk_seen = {r[3] for r in sdk.records}
        ck_seen = {r[3] for r in ck.records}
        assert (b"early" in sdk_seen) == (b"early" in ck_seen), (sdk_seen, ck_seen)
    finally:
        sdk.stop()
        ck.stop()


def test_offset_commit_needs_the_current_member_epoch(real_kafka: KafkaCluster) -> None:
    """The broker accepts OffsetCommit only at the member's current epoch (older or newer:
    STALE_MEMBER_EPOCH), and does not check ownership: the SDK commits only what it owns."""
    kafka = real_kafka
    topic, group = unique("epoch"), unique("epoch-g")
    kafka.create_topic(topic, 4)
    timeline = Timeline()
    a = Member("a", config(kafka, group, enable_auto_commit=False), [topic], timeline)
    b: Member | None = None
    try:
        wait_for(lambda: len(a.owned) == 4, timeout=60, what="a owning everything")
        first_epoch = a.consumer.member_epoch
        b = Member("b", config(kafka, group, enable_auto_commit=False), [topic], timeline)
        wait_for(
            lambda: b is not None and len(a.owned) == 2 and len(b.owned) == 2,
            timeout=60,
            what="2/2 split",
        )
        current = a.consumer.member_epoch
        assert current > first_epoch

        def commit(epoch: int, partition: int) -> int:
            request = OffsetCommitRequest(
                group, a.consumer.member_id, epoch, (OffsetCommitPartition(topic, partition, 1),)
            )
            with ClusterClient({"bootstrap.servers": kafka.bootstrap_servers}) as client:
                [result] = client.offset_commit(request, timeout_s=10)
            return result.error_code

        mine = min(p for _, p in a.owned)
        theirs = min(p for _, p in b.owned)
        assert commit(first_epoch, mine) == 113  # STALE_MEMBER_EPOCH
        assert commit(current + 1, mine) == 113
        assert commit(current, mine) == 0
        assert commit(current, theirs) == 0  # not checked by the broker
        assert kafka.committed(group) == {(topic, mine): 1, (topic, theirs): 1}
    finally:
        a.stop()
        if b is not None:
            b.stop()


def test_commit_in_on_revoke_hands_over_without_duplicates(real_kafka: KafkaCluster) -> None:
    """A member committing synchronously in on_revoke: the new owner starts exactly at the
    committed offset (nothing read twice, nothing skipped), visible through AdminClient."""
    kafka = real_kafka
    topic, group = unique("revoke"), unique("revoke-g")
    kafka.create_topic(topic, 4)
    kafka.produce(topic, [f"v{i}" for i in range(400)])
    committed_in_revoke: list[dict[Partition, int]] = []

    class Committing(Member):
        def _revoke(self, consumer: Any, parts: list[TopicPartition]) -> None:
            try:
                consumer.commit(asynchronous=False)
            except KafkaException as exc:
                # nothing consumed since the last commit (e.g. the revoke of close()):
                # _NO_OFFSET, as confluent-kafka raises it
                if exc.args[0].code() != confluent_kafka.KafkaError._NO_OFFSET:
                    raise
            committed_in_revoke.append(dict(kafka.committed(group)))
            super()._revoke(consumer, parts)

    timeline = Timeline()
    cfg = config(kafka, group, enable_auto_commit=False)
    a = Committing("a", cfg, [topic], timeline)
    b: Member | None = None
    try:
        wait_for(lambda: len(a.records) >= 100, timeout=60, what="a consuming")
        b = Member("b", cfg, [topic], timeline)
        wait_for(
            lambda: b is not None and len(a.owned) == 2 and len(b.owned) == 2,
            timeout=60,
            what="2/2 split",
        )
        assert committed_in_revoke, "on_revoke ran"
        wait_for(lambda: len(_consumed([a, b])) == 400, timeout=60, what="all 400 records")
        a_records = [(t, p, o) for t, p, o, _ in a.records]
        b_records = [(t, p, o) for t, p, o, _ in b.records]
        assert not set(a_records) & set(b_records), "a record read by both members"
        ends = _end_offsets(kafka, topic, 4)
        for (t, p), offset in committed_in_revoke[0].items():
            if (t, p) in b.owned:
                b_offsets = [o for tt, pp, o in b_records if (tt, pp) == (t, p)]
                b_first = min(b_offsets, default=ends[(t, p)])
                assert b_first == offset, f"{(t, p)}: b started at {b_first}, committed {offset}"
        assert timeline.overlaps() == []
    finally:
        a.stop()
        if b is not None:
            b.stop()


def test_poll_interval_expiry_leaves_then_rejoins(real_kafka: KafkaCluster) -> None:
    """A member that stops polling past max.poll.interval.ms leaves the group (the other
    member gets everything; the SDK left as STALE, no session timeout involved), then rejoins."""
    kafka = real_kafka
    topic, group = unique("mpi"), unique("mpi-g")
    kafka.create_topic(topic, 4)
    timeline = Timeline()
    slow = Member("slow", config(kafka, group, max_poll_interval_ms=2000), [topic], timeline)
    other = Member("other", config(kafka, group), [topic], timeline)
    try:
        wait_for(
            lambda: len(slow.owned) == 2 and len(other.owned) == 2, timeout=60, what="2/2 split"
        )
        old_id = slow.consumer.member_id
        before = set(slow.owned)
        slow.pause_polling()
        # the SDK leaves by itself (STALE) once max.poll.interval.ms passes without a poll
        wait_for(lambda: slow.consumer.state is MemberState.STALE, timeout=30, what="STALE")
        wait_for(lambda: len(other.owned) == 4, timeout=30, what="other taking over")
        members = kafka.describe_group(group).members
        assert [m.member_id for m in members] == [other.consumer.member_id]
        slow.resume_polling()
        wait_for(lambda: slow.lost_count == 1, timeout=30, what="on_lost when polling resumes")
        wait_for(
            lambda: len(slow.owned) == 2 and len(other.owned) == 2, timeout=60, what="rejoined"
        )
        assert slow.consumer.member_id == old_id  # KIP-848: the member id survives a rejoin
        # ownership ends at the expiry (the member has left), but the stuck application hears
        # of it only from its next poll(): on_lost, as in confluent-kafka and the Java client
        lost = {
            p
            for _, name, kind, parts in timeline.events
            if name == "slow" and kind == "lost"
            for p in parts
        }
        assert lost == before
        overlaps = timeline.overlaps()
        assert all("while owned by slow" in o for o in overlaps), overlaps
    finally:
        slow.stop()
        other.stop()


def test_describe_of_an_unknown_group(real_kafka: KafkaCluster) -> None:
    with pytest.raises(KafkaClusterError) as info:
        real_kafka.describe_group(unique("nobody"))
    assert info.value.code == 69  # GROUP_ID_NOT_FOUND
