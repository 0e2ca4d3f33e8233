"""Broker-side faults on a running member: coordinator moves, the coordinator down for less
and more than the session timeout, RTT spikes above the heartbeat interval, a topic deleted
while assigned, partitions added, and the broker dropping ConsumerGroupHeartbeat support."""

from __future__ import annotations

import time
from typing import Any

import pytest

from consumer_sdk import Consumer, GroupMember, MemberState
from consumer_sdk.testing import EmbeddedKafka
from tests.reliability.support import (
    FIND_COORDINATOR,
    HB,
    App,
    Callbacks,
    HeartbeatSpy,
    config,
    hb_timestamps_ms,
    timed_close,
    wait_for,
)

SESSION_MS = 4000


def cluster(factory: Any, brokers: int = 2) -> EmbeddedKafka:
    kafka: EmbeddedKafka = factory(
        brokers=brokers, heartbeat_interval_ms=300, session_timeout_ms=SESSION_MS
    )
    kafka.create_topic("bf", partitions=2, replication_factor=1)
    for p in range(2):
        kafka.partition_set_leader("bf", p, 1)
    return kafka


def stable_member(kafka: EmbeddedKafka, group: str, coordinator: int = 2) -> tuple[App, Callbacks]:
    kafka.set_group_coordinator(group, coordinator)
    member = GroupMember(config(kafka, group))
    app, cb = App(member), Callbacks()
    cb.subscribe(member, ["bf"])
    app.poll_until(lambda: member.state is MemberState.STABLE and len(member.assignment()) == 2)
    return app, cb


def test_coordinator_moved_is_rediscovered_without_losing_partitions(
    embedded_kafka_factory: Any,
) -> None:
    kafka = cluster(embedded_kafka_factory, brokers=3)
    app, cb = stable_member(kafka, "bf-move", coordinator=2)
    try:
        lookups = len(kafka.requests(FIND_COORDINATOR))
        kafka.set_group_coordinator("bf-move", 3)
        app.poll_until(
            lambda: len(hb_timestamps_ms(kafka, broker=3)) >= 3,
            what="heartbeats on the new coordinator",
        )
        assert len(kafka.requests(FIND_COORDINATOR)) > lookups
        assert cb.kinds() == ["assign"], "no callback: the group state moved with the coordinator"
        assert app.errors == [] and app.member.state is MemberState.STABLE
    finally:
        assert timed_close(app.member) < 5.5


@pytest.mark.parametrize(
    ("down_s", "lost"),
    [pytest.param(1.5, False, id="shorter"), pytest.param(6.0, True, id="longer")],
)
def test_coordinator_down_shorter_and_longer_than_the_session(
    embedded_kafka_factory: Any, down_s: float, lost: bool
) -> None:
    kafka = cluster(embedded_kafka_factory)
    app, cb = stable_member(kafka, f"bf-down-{lost}")
    spy = HeartbeatSpy(app.member)
    try:
        kafka.broker_down(2)
        started = time.monotonic()
        app.poll_for(down_s)
        failures = [c for c in spy.snapshot() if c.failure is not None]
        kafka.broker_up(2)
        assert failures, "heartbeats failed while the coordinator was down"
        attempts = [c.sent for c in spy.snapshot() if c.sent >= started]
        assert len(attempts) <= down_s / 0.1 + 2, "retries back off instead of spinning"
        if lost:
            app.poll_until(lambda: "lost" in cb.kinds(), what="on_lost after the session expired")
        app.poll_until(
            lambda: app.member.state is MemberState.STABLE and len(app.member.assignment()) == 2,
            what="the member stable again",
        )
        assert cb.kinds().count("lost") == (1 if lost else 0), cb.events
        fatal = [e for e in app.errors if e.args[0].fatal()]
        assert fatal == [], "an unreachable coordinator is never fatal"
    finally:
        assert timed_close(app.member) < 5.5


def test_rtt_spike_above_the_heartbeat_interval_keeps_the_membership(
    embedded_kafka_factory: Any,
) -> None:
    kafka = cluster(embedded_kafka_factory)
    app, cb = stable_member(kafka, "bf-rtt")
    spy = HeartbeatSpy(app.member)
    try:
        kafka.set_rtt(2, 1500)  # 5x the 300 ms interval; the heartbeat timeout is 1 s
        app.poll_for(3.0)
        kafka.set_rtt(2, 0)
        slow = [c for c in spy.snapshot() if c.failure is not None or c.done - c.sent > 0.3]
        assert slow, "the spike slowed or timed out heartbeats"
        app.poll_until(
            lambda: (
                spy.answered_after(len(spy.snapshot()) - 1) == 0
                and any(c.error_code == 0 and c.sent > time.monotonic() - 1 for c in spy.snapshot())
            ),
            what="heartbeats answered promptly again",
        )
        assert app.member.state is MemberState.STABLE and len(app.member.assignment()) == 2
        assert "lost" not in cb.kinds(), "the session outlived the spike"
        assert [e for e in app.errors if e.args[0].fatal()] == []
    finally:
        kafka.set_rtt(2, 0)
        assert timed_close(app.member) < 5.5


def test_topic_deleted_while_assigned_no_crash_no_hang(embedded_kafka_factory: Any) -> None:
    """The mock keeps the deleted topic in the group's assignment (it never recomputes on
    topic changes); the fetcher reports UNKNOWN_TOPIC_OR_PART through poll() as error
    events. The member keeps heartbeating, stays STABLE and poll() keeps returning in time."""
    kafka = cluster(embedded_kafka_factory, brokers=1)
    consumer = Consumer(config(kafka, "bf-delete"))
    app, cb = App(consumer), Callbacks()
    try:
        kafka.produce("bf", [b"x"] * 4)
        cb.subscribe(consumer, ["bf"])
        app.next_record()
        kafka.delete_topic("bf")
        beats = len(kafka.requests(HB))
        slowest = 0.0
        for _ in range(20):
            started = time.monotonic()
            app.poll_once(0.1)
            slowest = max(slowest, time.monotonic() - started)
        assert slowest < 1.0, f"poll(0.1) took {slowest:.2f}s"
        app.poll_until(lambda: len(kafka.requests(HB)) >= beats + 3, what="heartbeats go on")
        assert consumer.state is MemberState.STABLE
        assert [e for e in app.errors if e.args[0].fatal()] == []
        assert "lost" not in cb.kinds()
    finally:
        assert timed_close(consumer) < 5.5


def test_partitions_added_by_recreating_the_topic(embedded_kafka_factory: Any) -> None:
    """The mock has no CreatePartitions and does not recompute assignments on metadata
    changes. Recreating the topic with 4 partitions (a new topic id) leaves the running member
    with its old assignment, untouched; the next membership change recomputes, and the
    members then cover all 4 partitions."""
    kafka = cluster(embedded_kafka_factory, brokers=1)
    app, cb = stable_member(kafka, "bf-grow", coordinator=1)
    other = GroupMember(config(kafka, "bf-grow"))
    other_app, other_cb = App(other), Callbacks()
    try:
        kafka.delete_topic("bf")
        kafka.create_topic("bf", partitions=4, replication_factor=1)
        app.poll_for(1.0)
        assert app.member.state is MemberState.STABLE and "lost" not in cb.kinds()
        other_cb.subscribe(other, ["bf"])

        def covered() -> bool:
            other_app.poll_once(0.02)
            owned = {(t.topic, t.partition) for m in (app.member, other) for t in m.assignment()}
            return owned == {("bf", p) for p in range(4)}

        app.poll_until(covered, what="both members covering the 4 partitions")
        assert [e for e in app.errors + other_app.errors if e.args[0].fatal()] == []
    finally:
        assert timed_close(other) < 5.5
        assert timed_close(app.member) < 5.5


def test_broker_drops_heartbeat_support_mid_session(embedded_kafka_factory: Any) -> None:
    kafka = cluster(embedded_kafka_factory, brokers=1)
    app, cb = stable_member(kafka, "bf-nohb", coordinator=1)
    try:
        kafka.set_api_version(HB, -1, -1)
        # The client negotiated ApiVersions on connect; the mock closes a connection that uses
        # an API it no longer offers, and the reconnect learns the new ranges.
        app.poll_until(lambda: app.fatal_errors(), timeout=15, what="a fatal error from poll()")
        error = app.fatal_errors()[0].args[0]
        assert error.code() == 35  # UNSUPPORTED_VERSION
        assert "ConsumerGroupHeartbeat" in error.str() and "group.protocol=classic" in error.str()
        assert app.member.state is MemberState.FATAL
        assert cb.parts("lost") == [(("bf", 0), ("bf", 1))]
    finally:
        took = timed_close(app.member, timeout=5.0)
    assert took < 5.5, f"close() took {took:.1f}s"


def test_coordinator_back_after_many_failed_reconnects_is_reached_within_a_second(
    embedded_kafka_factory: Any,
) -> None:
    """Reconnect backoff is capped at reconnect.backoff.max.ms (1 s by default, as the Java
    client): after a 4 s outage (dozens of failed attempts) the member is back well inside
    the 6 s session instead of waiting out a multi-second backoff and being fenced."""
    kafka: EmbeddedKafka = embedded_kafka_factory(
        brokers=2, heartbeat_interval_ms=300, session_timeout_ms=6000
    )
    kafka.create_topic("bf", partitions=2, replication_factor=1)
    for p in range(2):
        kafka.partition_set_leader("bf", p, 1)
    app, cb = stable_member(kafka, "bf-backoff")
    spy = HeartbeatSpy(app.member)
    try:
        kafka.broker_down(2)
        app.poll_for(4.0)
        kafka.broker_up(2)
        up = time.monotonic()
        app.poll_until(
            lambda: any(c.error_code == 0 and c.sent > up for c in spy.snapshot()),
            what="a heartbeat answered after the outage",
        )
        back = min(c.sent for c in spy.snapshot() if c.error_code == 0 and c.sent > up) - up
        assert back < 1.5, f"first answered heartbeat {back:.1f}s after the broker came back"
        app.poll_for(1.0)
        assert "lost" not in cb.kinds() and app.member.state is MemberState.STABLE
    finally:
        assert timed_close(app.member) < 5.5


def test_fenced_consumer_hands_out_no_buffered_record_of_lost_partitions(
    embedded_kafka_factory: Any,
) -> None:
    """Fencing is applied to the data plane by the background thread at once: records that
    librdkafka already buffered for the lost partitions are dropped even before on_lost runs
    in the next poll() (a zombie must not process what the next owner processes)."""
    kafka: EmbeddedKafka = embedded_kafka_factory(
        brokers=1, heartbeat_interval_ms=300, session_timeout_ms=6000
    )
    kafka.create_topic("bf", partitions=2, replication_factor=1)
    consumer = Consumer(config(kafka, "bf-zombie", enable_auto_commit=False))
    app, cb = App(consumer), Callbacks()
    try:
        cb.subscribe(consumer, ["bf"])
        kafka.produce("bf", [b"first"])
        app.next_record()
        kafka.produce("bf", [b"buffered"] * 50)
        kafka.push_broker_errors(1, HB, [(110, 0)])  # FENCED_MEMBER_EPOCH, app not polling
        wait_for(lambda: app.member.state is MemberState.FENCED, what="fenced (not polling)")
        assert consumer._fetcher.poll(1.0) is None, "a lost partition's record was handed out"
        assert "lost" not in cb.kinds(), "on_lost runs only inside the next poll()"
        app.poll_until(lambda: "lost" in cb.kinds(), what="on_lost")
    finally:
        assert timed_close(consumer) < 5.5
