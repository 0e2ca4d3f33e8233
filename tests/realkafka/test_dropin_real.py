"""The drop-in methods against the real broker, side by side with confluent-kafka's consumer
(``group.protocol=consumer``): timestamps (which the embedded mock does not index),
watermarks, seeking to a time, and manual-assignment commits under a group id."""

from __future__ import annotations

import time
import uuid
from typing import Any

import confluent_kafka
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from consumer_sdk import Consumer
from consumer_sdk.testing import wait_until

pytestmark = pytest.mark.realkafka

PER_PARTITION = 20


@pytest.fixture(scope="module")
def servers(real_kafka: Any) -> str:
    return str(getattr(real_kafka, "bootstrap_servers", real_kafka))


def _topic(servers: str, partitions: int) -> str:
    name = f"dropin-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": servers})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(60)
    return name


def _consumers(servers: str, group: str) -> tuple[Consumer, confluent_kafka.Consumer]:
    conf = {
        "bootstrap.servers": servers,
        "group.id": group,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    return Consumer(conf), confluent_kafka.Consumer({**conf, "group.protocol": "consumer"})


def _first_offset(consumer: Any, partition: int) -> int:
    def first() -> int | None:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None and msg.partition() == partition:
            return int(msg.offset())
        return None

    result: int = wait_until(first, 60, 0.0, f"a record from partition {partition}")
    return result


def test_times_watermarks_and_seek_to_time_match_confluent_kafka(servers: str) -> None:
    topic = _topic(servers, 2)
    base = int(time.time() * 1000) - 3_600_000  # an hour ago, one record per second
    producer = Producer({"bootstrap.servers": servers})
    for p in range(2):
        for i in range(PER_PARTITION):
            producer.produce(topic, f"{p}-{i}".encode(), partition=p, timestamp=base + i * 1000)
    producer.flush(60)
    queries = [base - 10_000, base + 5_500, base + 19_000, base + 60_000]
    expected = [0, 6, 19, -1]
    sdk, ref = _consumers(servers, f"dropin-times-{uuid.uuid4().hex[:8]}")
    try:
        outcomes = []
        for consumer in (sdk, ref):
            found = [
                consumer.offsets_for_times([TopicPartition(topic, 1, ts)], timeout=30)[0].offset
                for ts in queries
            ]
            marks = [
                consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
                for p in range(2)
            ]
            # Seek to a time: assign at the offset offsets_for_times gave, then seek on.
            consumer.assign([TopicPartition(topic, 1, found[1])])
            first = _first_offset(consumer, 1)
            consumer.seek(TopicPartition(topic, 1, found[2]))
            after_seek = _first_offset(consumer, 1)
            outcomes.append((found, marks, first, after_seek))
            consumer.unassign()
        assert outcomes[0] == outcomes[1]
        assert outcomes[0] == (expected, [(0, PER_PARTITION)] * 2, 6, 19)
    finally:
        sdk.close()
        ref.close()


def _commit_code(consumer: Any, topic: str, offset: int) -> int | None:
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    except KafkaException as exc:
        return int(exc.args[0].code())
    return None


def test_manual_assignment_commits_like_confluent_kafka(servers: str) -> None:
    """Generation -1 commits: accepted while the group has no members, refused
    (UNKNOWN_MEMBER_ID) once a KIP-848 member is in it; the same for both clients."""
    topic = _topic(servers, 1)
    group = f"dropin-manual-{uuid.uuid4().hex[:8]}"
    sdk, ref = _consumers(servers, group)
    member = confluent_kafka.Consumer(
        {"bootstrap.servers": servers, "group.id": group, "group.protocol": "consumer"}
    )
    try:
        for consumer in (sdk, ref):
            consumer.assign([TopicPartition(topic, 0)])
        assert [_commit_code(sdk, topic, 2), _commit_code(ref, topic, 3)] == [None, None]
        assert sdk.committed([TopicPartition(topic, 0)], 30)[0].offset == 3
        member.subscribe([topic])
        wait_until(
            lambda: member.poll(0.2) is None and member.assignment(),
            60,
            0.0,
            "a group member owning the partition",
        )
        assert [_commit_code(sdk, topic, 4), _commit_code(ref, topic, 4)] == [
            KafkaError.UNKNOWN_MEMBER_ID
        ] * 2
    finally:
        for c in (sdk, ref, member):
            c.close()
