"""consumer.health() through a coordinator outage, a failed commit and a stuck application
(EmbeddedKafka, fault injection)."""

from __future__ import annotations

from typing import Any

import pytest

from consumer_sdk import KafkaException, TopicPartition
from consumer_sdk.observability.samples import collect
from consumer_sdk.testing import EmbeddedKafka
from tests.runtime.harness import Member, Timeline, config, wait_for

TOPIC_AUTHORIZATION_FAILED = 29
OFFSET_COMMIT = 8


def _metric(consumer: Any, name: str) -> float:
    return next(s.value for s in collect(consumer) if s.name == name and len(s.labels) == 3)


def test_health_through_outage_commit_failure_and_stuck_application(
    embedded_kafka_factory: Any,
) -> None:
    kafka: EmbeddedKafka = embedded_kafka_factory(
        brokers=2, heartbeat_interval_ms=300, session_timeout_ms=6000
    )
    topic, group = "health-t", "health-g"
    kafka.create_topic(topic, partitions=2, replication_factor=1)
    for p in (0, 1):
        kafka.partition_set_leader(topic, p, 1)
    kafka.set_group_coordinator(group, 2)
    kafka.produce(topic, [f"r{i}".encode() for i in range(10)])
    conf = config(kafka, group, enable_auto_commit=False, max_poll_interval_ms=3000)
    member = Member("m", conf, [topic], Timeline())
    c = member.consumer
    try:
        # (lag 0 over every partition: a partition with no record handed out yet and no
        # committed offset has no known lag, so it is not in lag_total but in lag_unknown)
        healthy = wait_for(
            lambda: (h := c.health()).ready and h.lag_total == 0 and h.lag_unknown == 0 and h, 30
        )
        assert healthy.live and healthy.in_group and healthy.coordinator_known
        assert healthy.state == "STABLE" and healthy.member_epoch > 0
        assert set(healthy.assignment) == {(topic, 0), (topic, 1)}
        assert healthy.last_heartbeat_age_s is not None and healthy.last_error is None
        assert healthy.reasons == ()
        assert len(member.records) == 10

        # The coordinator goes away: not ready (within a heartbeat or two), still live.
        kafka.broker_down(2)
        outage = wait_for(lambda: not (h := c.health()).ready and h, 20, "not ready")
        assert outage.live, outage.reasons
        assert any("coordinator" in r or "heartbeat" in r for r in outage.reasons), outage
        kafka.broker_up(2)
        back = wait_for(lambda: (h := c.health()).ready and h, 30, "ready again")
        assert back.live and back.in_group

        # A failed commit is the last error and counts in commit-failed-total.
        assert _metric(c, "commit-failed-total") == 0
        kafka.push_request_errors(OFFSET_COMMIT, [TOPIC_AUTHORIZATION_FAILED])
        with pytest.raises(KafkaException):
            c.commit(offsets=[TopicPartition(topic, 0, 1)], asynchronous=False)
        error = c.health().last_error
        assert error is not None and error.name == "TOPIC_AUTHORIZATION_FAILED", error
        assert _metric(c, "commit-failed-total") == 1

        # The application stops polling: not live once max.poll.interval.ms has passed.
        member.pause_polling()
        stuck = wait_for(lambda: not (h := c.health()).live and h, 15, "not live")
        assert any("no poll()" in r for r in stuck.reasons), stuck.reasons
        member.resume_polling()
        wait_for(lambda: (h := c.health()).live and h.ready, 30, "live and ready again")
        assert c.health().as_dict()["assignment"] in ([[topic, 0], [topic, 1]],)
    finally:
        member.stop()
    closed = c.health()
    assert not closed.live and not closed.ready and "closed" in closed.reasons


def test_lag_unknown_counts_the_partitions_lag_total_leaves_out(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """A partition with no record handed out and no committed offset has no known lag: it is
    not in ``lag_total`` (0 once partition 0 is read) but in ``lag_unknown``, until a record
    of its own is read. A `GroupMember` (no records) has no lag at all."""
    from consumer_sdk import GroupMember

    topic, group = "health-lag", "health-lag-g"
    embedded_kafka.create_topic(topic, partitions=2)
    embedded_kafka.produce(topic, [b"a", b"b", b"c"], partition=0)
    member = Member(
        "m", config(embedded_kafka, group, enable_auto_commit=False), [topic], Timeline()
    )
    c = member.consumer
    try:
        first = wait_for(
            lambda: len(member.records) == 3 and (h := c.health()).lag_total == 0 and h, 30
        )
        assert len(first.assignment) == 2
        assert first.lag_unknown == 1, first  # partition 1: nothing read, nothing committed
        embedded_kafka.produce(topic, [b"d"], partition=1)
        wait_for(lambda: len(member.records) == 4, 30, "partition 1's record")
        both = wait_for(lambda: (h := c.health()).lag_unknown == 0 and h, 30, "both known")
        assert both.lag_total == 0 and both.as_dict()["lag_unknown"] == 0
    finally:
        member.stop()
    bare = GroupMember({"bootstrap.servers": embedded_kafka.bootstrap_servers, "group.id": group})
    try:
        assert bare.health().lag_unknown is None and bare.health().lag_total is None
    finally:
        bare.close()
