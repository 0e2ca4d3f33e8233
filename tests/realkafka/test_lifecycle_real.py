"""Lifecycle on the real broker, side by side with a confluent-kafka ``group.protocol=consumer``
member: RE2J regex subscriptions sent as is (``\\p{Ll}``, ``\\Q..\\E``), the broker's
INVALID_REGULAR_EXPRESSION, and the close paths (a commit made in on_revoke during close lands;
a raising on_revoke or ``close(timeout=0)`` still hands the partitions over by a leave)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from consumer_sdk import Consumer, KafkaError, KafkaException, MemberState, TopicPartition
from consumer_sdk.testing import KafkaCluster
from tests.realkafka.support import unique
from tests.runtime.harness import wait_for
from tests.runtime.test_lifecycle import IMPLS, Poller, _consumer, _poll_until

pytestmark = pytest.mark.realkafka

# real_kafka: heartbeat 500 ms, session timeout 6 s. A hand-over by a leave takes about one
# heartbeat interval; without a leave it takes the session timeout.
LEAVE_HANDOVER_S = 4.0


def _conf(kafka: KafkaCluster, group: str, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": kafka.bootstrap_servers,
        "group.id": group,
        "auto.offset.reset": "earliest",
        **extra,
    }


def _assigned_topics(kafka: KafkaCluster, impl: str, group: str, pattern: str) -> set[str]:
    got: set[str] = set()
    joined = threading.Event()

    def on_assign(_: Any, parts: list[TopicPartition]) -> None:
        got.update(p.topic for p in parts)
        joined.set()

    c = _consumer(impl, _conf(kafka, group))
    c.subscribe([pattern], on_assign=on_assign)
    try:
        _poll_until(c, joined.is_set, f"{impl}: the first assignment", timeout=30)
        end = time.monotonic() + 2.0  # a second reconciliation would add more topics
        while time.monotonic() < end:
            c.poll(0.1)
    finally:
        c.close()
    return got


def test_re2j_patterns_go_to_the_broker_as_is(real_kafka: KafkaCluster) -> None:
    sfx = unique("")[-6:]
    lower, upper, dotted, wild = (f"lcabc-{sfx}", f"lcABC-{sfx}", f"lc.x-{sfx}", f"lcYx-{sfx}")
    for topic in (lower, upper, dotted, wild):
        real_kafka.create_topic(topic, partitions=1)
    # \p{Ll}: lower-case letters only (Python's re has no \p{..}).
    assert _assigned_topics(real_kafka, "sdk", unique("lc-pll"), rf"^lc\p{{Ll}}+-{sfx}") == {lower}
    # \Q..\E: a literal '.', so lcYx does not match (Python's re has no \Q..\E).
    for impl in IMPLS:
        pattern = rf"^\Qlc.x-{sfx}\E"
        assert _assigned_topics(real_kafka, impl, unique(f"lc-q-{impl}"), pattern) == {dotted}
    # confluent-kafka checks the pattern with librdkafka's own engine and refuses \p{Ll}.
    ck = _consumer("ck", _conf(real_kafka, unique("lc-pll-ck")))
    try:
        with pytest.raises(KafkaException) as info:
            ck.subscribe([rf"^lc\p{{Ll}}+-{sfx}"])
        assert info.value.args[0].code() == KafkaError._INVALID_ARG
    finally:
        ck.close()


def test_invalid_regex_is_the_brokers_error_naming_the_pattern(real_kafka: KafkaCluster) -> None:
    pattern = "^lc-bad(" + unique("")[-4:]
    c = Consumer(_conf(real_kafka, unique("lc-badre")))
    c.subscribe([pattern])  # not checked client-side: the broker's RE2J decides
    try:

        def raised() -> KafkaException | None:
            try:
                c.poll(0.2)
            except KafkaException as exc:
                return exc
            return None

        error = wait_for(raised, timeout=30, what="the broker's verdict").args[0]
        assert error.code() == KafkaError.INVALID_REGULAR_EXPRESSION and error.fatal()
        assert repr(pattern) in error.str()
        assert c.state is MemberState.FATAL
    finally:
        c.close(timeout=2)


@pytest.mark.parametrize("impl", IMPLS)
def test_async_commit_in_on_revoke_during_close_lands(real_kafka: KafkaCluster, impl: str) -> None:
    topic, group = unique(f"lc-rc-{impl}"), unique(f"lc-rc-{impl}-g")
    real_kafka.create_topic(topic, partitions=1)
    real_kafka.produce(topic, [f"v{i}".encode() for i in range(30)])
    c = _consumer(impl, _conf(real_kafka, group, **{"enable.auto.commit": False}))
    c.subscribe([topic], on_revoke=lambda consumer, parts: parts and consumer.commit())
    last = -1
    try:
        deadline = time.monotonic() + 60
        while last < 29:
            assert time.monotonic() < deadline, f"consumed up to {last}"
            msg = c.poll(0.2)
            if msg is not None and msg.error() is None:
                last = msg.offset()
    finally:
        c.close()
    assert real_kafka.committed(group) == {(topic, 0): 30}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("how", ["raising on_revoke", "timeout 0"])
def test_close_hands_over_by_a_leave(real_kafka: KafkaCluster, impl: str, how: str) -> None:
    topic = unique(f"lc-ho-{impl}-{how.split()[0]}")
    group = topic + "-g"
    real_kafka.create_topic(topic, partitions=2)
    other = Poller(Consumer(_conf(real_kafka, group)), topic)
    owned: set[int] = set()
    closing = threading.Event()

    def on_revoke(_: Any, parts: list[TopicPartition]) -> None:
        owned.difference_update(p.partition for p in parts)
        if closing.is_set() and how == "raising on_revoke":
            raise RuntimeError("boom in on_revoke")

    c = _consumer(impl, _conf(real_kafka, group))
    c.subscribe(
        [topic], on_assign=lambda _, ps: owned.update(p.partition for p in ps), on_revoke=on_revoke
    )
    try:
        _poll_until(c, lambda: len(owned) == 1 and len(other.owned) == 1, "a 1/1 split", timeout=60)
        closing.set()
        started = time.monotonic()
        raised: BaseException | None = None
        try:
            if impl == "sdk" and how == "timeout 0":
                c.close(timeout=0)
            else:
                c.close()
        except Exception as exc:
            raised = exc
        wait_for(lambda: len(other.owned) == 2, timeout=30, what="the other member taking over")
        handover = time.monotonic() - started
        assert handover < LEAVE_HANDOVER_S, f"hand-over took {handover:.1f}s: no leave sent"
        if how == "raising on_revoke":
            assert raised is not None and "boom in on_revoke" in str(raised)
        else:
            assert raised is None
    finally:
        other.stop()
        c.close()


def test_normal_run_and_close_log_no_warning(
    real_kafka: KafkaCluster, caplog: pytest.LogCaptureFixture
) -> None:
    topic, group = unique("lc-quiet"), unique("lc-quiet-g")
    real_kafka.create_topic(topic, partitions=2)
    real_kafka.produce(topic, [b"x"] * 4)
    caplog.set_level(logging.INFO, logger="consumer_sdk")
    members = [Consumer(_conf(real_kafka, group)) for _ in range(2)]
    try:
        for m in members:
            m.subscribe([topic])
        got = 0
        deadline = time.monotonic() + 60
        while got < 4:
            assert time.monotonic() < deadline, f"consumed {got} of 4"
            for m in members:
                msg = m.poll(0.1)
                got += msg is not None and msg.error() is None
        for m in members:
            m.commit(asynchronous=True)
    finally:
        for m in members:
            m.close()
    noisy = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert noisy == []
