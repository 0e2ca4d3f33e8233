"""Consumer lifecycle and offsets, each scenario run with this SDK and with a confluent-kafka
``group.protocol=consumer`` member on the same EmbeddedKafka: close/unsubscribe (commits before
the leave, a leave on every close), blocking poll, store_offsets with kill -9, reset=error,
on_commit / error_cb, coordinator-load backoff, regex subscriptions."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest

from consumer_sdk import Consumer, KafkaError, KafkaException, MemberState, TopicPartition
from consumer_sdk.testing import EmbeddedKafka
from tests.runtime.harness import wait_for

HB_MS = 300
# Long enough that a hand-over by session timeout can never pass for one by a leave.
SESSION_MS = 12_000
LEAVE_HANDOVER_S = 5.0
IMPLS = ["sdk", "ck"]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def kafka() -> Iterator[EmbeddedKafka]:
    cluster = EmbeddedKafka(brokers=1, heartbeat_interval_ms=HB_MS, session_timeout_ms=SESSION_MS)
    try:
        yield cluster
    finally:
        cluster.close()


def _conf(kafka: EmbeddedKafka, group: str, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": kafka.bootstrap_servers,
        "group.id": group,
        "auto.offset.reset": "earliest",
        **extra,
    }


def _consumer(impl: str, conf: dict[str, Any]) -> Any:
    if impl == "ck":
        return confluent_kafka.Consumer({**conf, "group.protocol": "consumer"})
    return Consumer(conf)


def _committed(kafka: EmbeddedKafka, group: str, topic: str, partitions: int) -> dict[int, int]:
    checker = Consumer(_conf(kafka, group))
    try:
        found = checker.committed([TopicPartition(topic, p) for p in range(partitions)])
        return {tp.partition: tp.offset for tp in found}
    finally:
        checker.close()


class Poller:
    """Polls a consumer on its own thread; tracks what it owns (sdk or ck alike)."""

    def __init__(self, consumer: Any, topic: str) -> None:
        self.consumer = consumer
        self.owned: set[int] = set()
        self.records: list[tuple[int, int]] = []
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        consumer.subscribe(
            [topic], on_assign=self._assign, on_revoke=self._revoke, on_lost=self._revoke
        )
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _assign(self, c: Any, parts: list[TopicPartition]) -> None:
        self.owned.update(p.partition for p in parts)

    def _revoke(self, c: Any, parts: list[TopicPartition]) -> None:
        self.owned.difference_update(p.partition for p in parts)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                msg = self.consumer.poll(0.05)
            except Exception as exc:
                self.errors.append(exc)
                continue
            if msg is not None and msg.error() is None:
                self.records.append((msg.partition(), msg.offset()))

    def stop(self) -> None:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join(10)
            self.consumer.close()


def _poll_until(
    consumer: Any, condition: Callable[[], bool], what: str, timeout: float = 20.0
) -> None:
    def step() -> bool:
        consumer.poll(0.05)
        return condition()

    wait_for(step, timeout=timeout, what=what)


# ----------------------------------------------------------------------------------------
# close() and unsubscribe()
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("how", ["close", "unsubscribe"])
def test_async_commit_in_on_revoke_during_close_lands(
    kafka: EmbeddedKafka, impl: str, how: str
) -> None:
    topic, group = f"lc-revcommit-{impl}-{how}", f"lc-revcommit-{impl}-{how}-g"
    kafka.create_topic(topic, partitions=2)
    kafka.produce(topic, [f"v{i}".encode() for i in range(40)])
    c = _consumer(impl, _conf(kafka, group, **{"enable.auto.commit": False}))
    commits: list[Any] = []

    def on_revoke(consumer: Any, parts: list[TopicPartition]) -> None:
        if parts:
            commits.append(consumer.commit(asynchronous=True))

    c.subscribe([topic], on_revoke=on_revoke)
    seen: dict[int, int] = {}
    try:
        deadline = time.monotonic() + 30
        while len(seen) < 2 or sum(o + 1 for o in seen.values()) < 40:
            assert time.monotonic() < deadline, f"consumed only {seen}"
            msg = c.poll(0.1)
            if msg is not None and msg.error() is None:
                seen[msg.partition()] = msg.offset()
        if how == "unsubscribe":
            c.unsubscribe()
            # the SDK's unsubscribe waits for the leave; confluent-kafka's returns at once
            end = time.monotonic() + 5
            while time.monotonic() < end and not commits:
                c.poll(0.1)
    finally:
        c.close()
    assert commits == [None], "on_revoke ran once, with the partitions"
    assert _committed(kafka, group, topic, 2) == {p: o + 1 for p, o in seen.items()}


@pytest.mark.parametrize("impl", IMPLS)
def test_raising_on_revoke_in_close_still_leaves_then_raises(
    kafka: EmbeddedKafka, impl: str
) -> None:
    topic, group = f"lc-raise-{impl}", f"lc-raise-{impl}-g"
    kafka.create_topic(topic, partitions=2)
    other = Poller(Consumer(_conf(kafka, group)), topic)
    raiser = _consumer(impl, _conf(kafka, group))
    owned: set[int] = set()
    closing = threading.Event()

    def on_assign(consumer: Any, parts: list[TopicPartition]) -> None:
        owned.update(p.partition for p in parts)

    def on_revoke(consumer: Any, parts: list[TopicPartition]) -> None:
        owned.difference_update(p.partition for p in parts)
        if closing.is_set():
            raise RuntimeError("boom in on_revoke")

    raiser.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
    try:
        _poll_until(raiser, lambda: len(owned) == 1 and len(other.owned) == 1, "a 1/1 split")
        started = time.monotonic()
        closing.set()
        with pytest.raises(Exception) as info:
            raiser.close()
        wait_for(
            lambda: len(other.owned) == 2,
            timeout=SESSION_MS / 1000,
            what="the other member taking over",
        )
        handover = time.monotonic() - started
        assert handover < LEAVE_HANDOVER_S, f"hand-over took {handover:.1f}s: no leave sent"
        if impl == "sdk":
            # Documented difference: confluent-kafka re-raises the callback's own exception.
            assert isinstance(info.value, KafkaException)
            assert info.value.args[0].code() == KafkaError._APPLICATION
            assert "boom in on_revoke" in str(info.value)
            assert isinstance(info.value.__cause__, RuntimeError)
            assert raiser.state is MemberState.UNSUBSCRIBED
        else:
            assert isinstance(info.value, RuntimeError)
    finally:
        other.stop()
        raiser.close()  # a second close is a no-op


@pytest.mark.parametrize("impl", IMPLS)
def test_close_with_zero_timeout_still_leaves(kafka: EmbeddedKafka, impl: str) -> None:
    topic, group = f"lc-zero-{impl}", f"lc-zero-{impl}-g"
    kafka.create_topic(topic, partitions=2)
    other = Poller(Consumer(_conf(kafka, group)), topic)
    revoked: list[int] = []
    owned: set[int] = set()
    c = _consumer(impl, _conf(kafka, group))

    def on_revoke(consumer: Any, parts: list[TopicPartition]) -> None:
        owned.difference_update(p.partition for p in parts)
        revoked.extend(p.partition for p in parts)

    c.subscribe(
        [topic], on_assign=lambda _, ps: owned.update(p.partition for p in ps), on_revoke=on_revoke
    )
    try:
        _poll_until(c, lambda: len(owned) == 1 and len(other.owned) == 1, "a 1/1 split")
        mine = sorted(owned)
        revoked.clear()
        started = time.monotonic()
        if impl == "sdk":
            c.close(timeout=0)
        else:
            c.close()  # confluent-kafka's close() takes no timeout
        wait_for(
            lambda: len(other.owned) == 2,
            timeout=SESSION_MS / 1000,
            what="the other member taking over",
        )
        handover = time.monotonic() - started
        assert handover < LEAVE_HANDOVER_S, f"hand-over took {handover:.1f}s: no leave sent"
        assert revoked == mine, "on_revoke ran inside close"
    finally:
        other.stop()
        c.close()


def test_close_commits_pending_async_and_auto_commit_with_the_real_epoch(
    kafka: EmbeddedKafka,
) -> None:
    topic, group = "lc-close-auto", "lc-close-auto-g"
    kafka.create_topic(topic, partitions=1)
    kafka.produce(topic, [b"x"] * 10)
    commits: list[tuple[Any, list[TopicPartition]]] = []
    c = Consumer(
        _conf(
            kafka,
            group,
            **{
                "auto.commit.interval.ms": 60_000,  # only the close commit can commit
                "on_commit": lambda err, parts: commits.append((err, parts)),
            },
        )
    )
    c.subscribe([topic])
    got = []
    while len(got) < 10:
        msg = c.poll(5)
        assert msg is not None
        got.append(msg.offset())
    c.close()
    assert _committed(kafka, group, topic, 1) == {0: 10}
    assert [(e, [(p.partition, p.offset) for p in ps]) for e, ps in commits] == [(None, [(0, 10)])]


def test_normal_close_logs_no_warning(
    kafka: EmbeddedKafka, caplog: pytest.LogCaptureFixture
) -> None:
    topic, group = "lc-quiet", "lc-quiet-g"
    kafka.create_topic(topic, partitions=2)
    kafka.produce(topic, [b"x"] * 4)
    caplog.set_level(logging.INFO, logger="consumer_sdk")
    c = Consumer(_conf(kafka, group))
    c.subscribe([topic])
    for _ in range(4):
        assert c.poll(10) is not None
    c.commit(asynchronous=True)
    c.close()
    noisy = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert noisy == []


# ----------------------------------------------------------------------------------------
# Blocking poll
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("call", ["poll", "consume"])
def test_poll_without_timeout_blocks_until_a_record_without_spinning(
    kafka: EmbeddedKafka, impl: str, call: str
) -> None:
    topic, group = f"lc-block-{impl}-{call}", f"lc-block-{impl}-{call}-g"
    kafka.create_topic(topic, partitions=1)
    c = _consumer(impl, _conf(kafka, group))
    assigned = threading.Event()
    c.subscribe([topic], on_assign=lambda *_: assigned.set())
    try:
        _poll_until(c, assigned.is_set, "the assignment")
        time.sleep(0.5)  # let the fetcher settle on the empty partition
        producer = threading.Timer(2.0, kafka.produce, (topic, [b"late"]))
        cpu0, wall0 = time.process_time(), time.monotonic()
        producer.start()
        if call == "poll":
            msg = c.poll() if impl == "sdk" else c.poll(-1)
            msgs = [msg]
        else:
            msgs = c.consume(1, -1)
        cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
        producer.join()
        assert [m.value() for m in msgs] == [b"late"]
        assert wall >= 1.5, "returned before the record was produced"
        # The whole process (fetcher threads, heartbeat thread, this thread): well under 5%
        # of one core while blocked (a spinning poll would use ~100%).
        assert cpu / wall < 0.05, f"{cpu:.3f}s CPU in {wall:.2f}s while blocked in {call}()"
    finally:
        c.close()


# ----------------------------------------------------------------------------------------
# store_offsets and enable.auto.offset.store
# ----------------------------------------------------------------------------------------


def _start_member(
    kafka: EmbeddedKafka, impl: str, group: str, topic: str, store_below: int
) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.runtime.store_member",
            impl,
            kafka.bootstrap_servers,
            group,
            topic,
            str(store_below),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        cwd=ROOT,
        env=env,
    )


def _read_offsets(
    proc: subprocess.Popen[str], until: Callable[[list[int]], bool], timeout: float
) -> list[int]:
    offsets: list[int] = []
    done = threading.Event()

    def reader() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            offsets.append(json.loads(line)["o"])
            if until(offsets):
                done.set()
                return
        done.set()

    threading.Thread(target=reader, daemon=True).start()
    assert done.wait(timeout), f"member printed only {offsets[-5:]} in {timeout}s"
    return offsets


@pytest.mark.parametrize("impl", IMPLS)
def test_stored_offsets_survive_kill_9(kafka: EmbeddedKafka, impl: str) -> None:
    topic, group = f"lc-store-{impl}", f"lc-store-{impl}-g"
    kafka.create_topic(topic, partitions=1)
    kafka.produce(topic, [f"v{i}".encode() for i in range(100)])
    first = _start_member(kafka, impl, group, topic, store_below=40)
    try:
        offsets = _read_offsets(first, lambda o: o[-1] == 99, timeout=60)
        assert offsets == list(range(100))
        # Auto-commit commits only what was stored: 40, although 100 records were polled.
        wait_for(
            lambda: _committed(kafka, group, topic, 1) == {0: 40},
            timeout=20,
            what="the stored offset committed",
        )
        time.sleep(1.0)  # several auto-commit intervals: still the stored offset
        assert _committed(kafka, group, topic, 1) == {0: 40}
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    second = _start_member(kafka, impl, group, topic, store_below=1000)
    try:
        # The dead member's partition moves after the session timeout.
        resumed = _read_offsets(second, lambda o: len(o) >= 60, timeout=SESSION_MS / 1000 + 40)
        assert resumed[:60] == list(range(40, 100))
    finally:
        second.send_signal(signal.SIGKILL)
        second.wait(10)


def test_store_offsets_errors_match_confluent_kafka(kafka: EmbeddedKafka) -> None:
    topic = "lc-store-err"
    kafka.create_topic(topic, partitions=2)
    kafka.produce(topic, [b"x"] * 2, partition=0)
    codes: dict[str, list[int]] = {}
    for impl in IMPLS:
        got = codes.setdefault(impl, [])
        for store in (True, False):
            c = _consumer(
                impl,
                _conf(kafka, f"lc-store-err-{impl}-{store}", **{"enable.auto.offset.store": store}),
            )
            try:
                c.subscribe([topic])
                msg = wait_for(lambda c=c: c.poll(0.2), what="a record")
                for kwargs in ({"message": msg}, {"offsets": [TopicPartition(topic, 7, 1)]}):
                    try:
                        c.store_offsets(**kwargs)
                        got.append(0)
                    except KafkaException as exc:
                        got.append(exc.args[0].code())
            finally:
                c.close()
    assert (
        codes["sdk"]
        == codes["ck"]
        == [
            KafkaError._INVALID_ARG,
            KafkaError._INVALID_ARG,
            0,
            KafkaError._STATE,
        ]
    )


def test_commit_without_arguments_commits_only_stored_offsets(kafka: EmbeddedKafka) -> None:
    topic, group = "lc-store-commit", "lc-store-commit-g"
    kafka.create_topic(topic, partitions=1)
    kafka.produce(topic, [b"x"] * 5)
    c = Consumer(
        _conf(kafka, group, **{"enable.auto.offset.store": False, "enable.auto.commit": False})
    )
    c.subscribe([topic])
    try:
        msgs = [wait_for(lambda: c.poll(0.2), what="a record") for _ in range(5)]
        c.store_offsets(msgs[1])
        assert [(tp.partition, tp.offset) for tp in c.commit(asynchronous=False)] == [(0, 2)]
        c.store_offsets(offsets=[TopicPartition(topic, 0, 4)])
        c.commit(asynchronous=False)
        assert _committed(kafka, group, topic, 1) == {0: 4}
    finally:
        c.close()
    assert _committed(kafka, group, topic, 1) == {0: 4}, "close commits nothing unstored"


# ----------------------------------------------------------------------------------------
# auto.offset.reset=error
# ----------------------------------------------------------------------------------------


def test_offset_reset_error_matches_confluent_kafka(kafka: EmbeddedKafka) -> None:
    topic = "lc-reset-err"
    kafka.create_topic(topic, partitions=2)
    kafka.produce(topic, [b"x"] * 6)
    seen: dict[str, list[tuple[int | None, int, str]]] = {}
    for impl in IMPLS:
        c = _consumer(
            impl, _conf(kafka, f"lc-reset-err-{impl}-g", **{"auto.offset.reset": "error"})
        )
        c.subscribe([topic])
        got = seen.setdefault(impl, [])
        try:
            deadline = time.monotonic() + 20
            while len(got) < 2 and time.monotonic() < deadline:
                for msg in c.consume(10, 0.2):
                    error = msg.error()
                    got.append(
                        (
                            msg.partition(),
                            error.code() if error else 0,
                            error.str() if error else "",
                        )
                    )
            assert c.poll(1.0) is None, "no record (and no second error) after the reset error"
        finally:
            c.close()
    assert sorted(seen["sdk"]) == sorted(seen["ck"])
    assert sorted(seen["sdk"]) == [
        (
            p,
            KafkaError._AUTO_OFFSET_RESET,
            "no previously committed offset available: Local: No offset stored",
        )
        for p in (0, 1)
    ]


# ----------------------------------------------------------------------------------------
# on_commit, error_cb, metrics
# ----------------------------------------------------------------------------------------


def test_on_commit_runs_for_every_commit_on_the_application_thread(kafka: EmbeddedKafka) -> None:
    topic, group = "lc-oncommit", "lc-oncommit-g"
    kafka.create_topic(topic, partitions=1)
    kafka.produce(topic, [b"x"] * 2)
    calls: list[tuple[int | None, list[tuple[int, int]], str]] = []

    def on_commit(err: KafkaError | None, parts: list[TopicPartition]) -> None:
        calls.append(
            (
                err.code() if err else None,
                [(p.partition, p.offset) for p in parts],
                threading.current_thread().name,
            )
        )

    c = Consumer(_conf(kafka, group, **{"on_commit": on_commit, "auto.commit.interval.ms": 300}))
    c.subscribe([topic])
    me = threading.current_thread().name
    try:
        first = wait_for(lambda: c.poll(0.2), what="a record")
        wait_for(lambda: c.poll(0.2), what="a record")
        _poll_until(c, lambda: bool(calls), "the auto-commit's on_commit")
        assert calls[-1][:2] == (None, [(0, 2)])
        c.commit(first, asynchronous=True)  # nothing new
        _poll_until(c, lambda: calls[-1][0] == KafkaError._NO_OFFSET, "_NO_OFFSET")
        kafka.produce(topic, [b"x"])
        third = wait_for(lambda: c.poll(0.2), what="a record")
        c.commit(third, asynchronous=False)
        _poll_until(c, lambda: calls[-1][:2] == (None, [(0, 3)]), "the sync commit's on_commit")
        before = len(calls)
        # The next OffsetCommit (the auto-commit's or this async one) fails.
        kafka.push_request_errors(8, [KafkaError.UNKNOWN_MEMBER_ID])
        kafka.produce(topic, [b"y"])
        fourth = wait_for(lambda: c.poll(0.2), what="a record")
        c.commit(fourth, asynchronous=True)
        _poll_until(
            c,
            lambda: any(code == KafkaError.UNKNOWN_MEMBER_ID for code, *_ in calls[before:]),
            "a failed commit",
        )
        metrics = c.metrics()
        assert metrics["commit-total"] >= 3 and metrics["commit-rate"] > 0
        assert metrics["commit-latency-max"] >= metrics["commit-latency-avg"] >= 0
    finally:
        c.close()
    assert {name for *_, name in calls} == {me}


def test_poll_returns_poll_interval_exceeded_as_an_event(kafka: EmbeddedKafka) -> None:
    """As librdkafka: an error event from poll() (error_cb is not called for it)."""
    topic, group = "lc-errcb", "lc-errcb-g"
    kafka.create_topic(topic, partitions=1)
    errors: list[KafkaError] = []
    cb_errors: list[KafkaError] = []
    c = Consumer(
        _conf(kafka, group, **{"max.poll.interval.ms": 1000, "error_cb": cb_errors.append})
    )
    c.subscribe([topic])

    def polled_error() -> bool:
        msg = c.poll(0.05)
        if msg is not None and msg.error() is not None:
            errors.append(msg.error())
        return bool(errors)

    try:
        _poll_until(c, lambda: c.state is MemberState.STABLE, "stable")
        wait_for(lambda: c.state is MemberState.STALE, timeout=10, what="stale")
        wait_for(polled_error, timeout=10, what="the error event from poll()")
        assert cb_errors == []
        assert errors[0].code() == KafkaError._MAX_POLL_EXCEEDED
        assert "maximum poll interval (1000ms) exceeded" in errors[0].str()
        _poll_until(c, lambda: c.state is MemberState.STABLE, "rejoined")
    finally:
        c.close()


def test_a_stable_members_polls_reach_the_loop_as_a_time_not_as_events(
    kafka: EmbeddedKafka,
) -> None:
    """A STABLE member's polls restart its poll timer through `MemberNetwork.polled_ms`, read
    by the loop's next run, without a `Poll` event: the core's poll deadline is always the
    last poll the loop took in plus max.poll.interval.ms, and a member that keeps polling
    stays in the group well past that interval (the expiry itself: the test above)."""
    kafka.create_topic("polled", partitions=1)
    c = Consumer(_conf(kafka, "polled", **{"max.poll.interval.ms": 1000}))
    net = c._net
    try:
        c.subscribe(["polled"])
        _poll_until(c, lambda: c.state is MemberState.STABLE, "stable")
        epoch, submitted = c.member_epoch, net._submitted
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            c.poll(0.05)
            taken, deadline = net.call(
                lambda d: (net._polled_taken, d.core._heartbeat._poll_deadline_ms)
            )
            assert deadline == taken + 1000
        assert taken >= net.polled_ms - 1000 and taken > 0
        assert c.state is MemberState.STABLE and c.member_epoch == epoch
        assert net._submitted == submitted  # no event posted, no wake-up
    finally:
        c.close()


@pytest.mark.parametrize("noted", [False, True], ids=["polled", "noted-then-polled"])
@pytest.mark.parametrize("what", ["event", "failure", "on_commit"])
def test_a_stable_members_poll_0_sees_what_the_loop_queued_before_its_poll_note_is_due(
    kafka: EmbeddedKafka, what: str, noted: bool
) -> None:
    """`GroupMember.poll(0)` of a stable member returns at once until
    its poll gate's time (`PollGate`); an event the loop hands over, or the member's failure, in
    that time clears it, and `note_poll` called after that does not set it again: the very
    next ``poll(0)`` raises the event's error or the failure, as the full path does; an
    ``on_commit`` call the loop queued runs in it."""
    from consumer_sdk import GroupMember
    from consumer_sdk.membership import ErrorEvent

    topic, group = f"pnd-{what}-{noted}", f"pnd-{what}-{noted}-g"
    kafka.create_topic(topic, partitions=1)
    commits: list[Any] = []
    on_commit = lambda err, parts: commits.append(err)  # noqa: E731
    m = GroupMember(
        _conf(kafka, group, **{"max.poll.interval.ms": 300_000, "on_commit": on_commit})
    )
    net = m._net
    try:
        m.subscribe([topic])
        _poll_until(m, lambda: m.state is MemberState.STABLE, "stable")
        wait_for(lambda: m.poll(0) is None and m._poll_note_due > 0, what="poll noted")
        due = m._poll_note_due

        def queue(driver: Any) -> None:  # loop thread
            if what == "event":
                driver.core.background_events.append(
                    ErrorEvent(KafkaError._TRANSPORT, "injected", False)
                )
                net._publish()
            elif what == "failure":
                net._fail(RuntimeError("injected"))
            else:  # what the loop's commit hook does for a commit nobody waits on
                m._report_commit(None, {})

        net.call(queue)
        if noted:
            gap_end = time.monotonic() + 0.005  # past note_poll's minimum gap between polls
            while time.monotonic() < gap_end:
                pass
            net.note_poll()
        polled_at = time.monotonic()
        if what == "on_commit":
            m.poll(0)
            assert commits == [None]
        else:
            with pytest.raises(KafkaException, match="injected"):
                m.poll(0)
        assert polled_at < due  # the poll came while the note was not due yet
    finally:
        with contextlib.suppress(KafkaException):
            m.close(timeout=2)


def test_a_stable_members_poll_0_raises_once_closed_while_its_poll_note_is_not_due(
    kafka: EmbeddedKafka,
) -> None:
    """A stable member's ``poll(0)`` reads only its poll gate's time (`PollGate`); closing
    clears it (so does the leave's change of state), so a ``poll(0)`` right after ``close()``
    raises that the member is closed, as it does at any other moment."""
    from consumer_sdk import GroupMember

    topic, group = "pnd-closed", "pnd-closed-g"
    kafka.create_topic(topic, partitions=1)
    m = GroupMember(_conf(kafka, group, **{"max.poll.interval.ms": 300_000}))
    m.subscribe([topic])
    _poll_until(m, lambda: m.state is MemberState.STABLE, "stable")
    wait_for(lambda: m.poll(0) is None and m._poll_note_due > 0, what="poll noted")
    due = m._poll_note_due
    m.close(timeout=2)
    polled_at = time.monotonic()
    with pytest.raises(KafkaException) as info:
        m.poll(0)
    assert info.value.args[0].code() == KafkaError._STATE
    assert polled_at < due  # the poll came while the note was not due yet


def test_error_cb_gets_unreachable_coordinator() -> None:
    errors: list[KafkaError] = []
    c = Consumer(
        {
            "bootstrap.servers": "127.0.0.1:1",
            "group.id": "lc-nowhere",
            "retry.backoff.max.ms": 200,
            "error_cb": errors.append,
        }
    )
    c.subscribe(["t"])
    try:
        _poll_until(
            c,
            lambda: any("coordinator unreachable" in e.str() for e in errors),
            "error_cb for the coordinator",
        )
        group_error = next(e for e in errors if "coordinator unreachable" in e.str())
        assert group_error.code() == KafkaError._TRANSPORT and group_error.retriable()
    finally:
        c.close(timeout=1)


# ----------------------------------------------------------------------------------------
# Backoff on coordinator-load errors
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code", [KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS]
)
def test_coordinator_load_errors_back_off_and_log_once(
    kafka: EmbeddedKafka, caplog: pytest.LogCaptureFixture, code: int
) -> None:
    topic, group = f"lc-load-{code}", f"lc-load-{code}-g"
    kafka.create_topic(topic, partitions=1)
    caplog.set_level(logging.INFO, logger="consumer_sdk")
    c = Consumer(_conf(kafka, group, **{"retry.backoff.ms": 100, "retry.backoff.max.ms": 800}))
    c.subscribe([topic])
    try:
        _poll_until(c, lambda: c.state is MemberState.STABLE, "stable")
        caplog.clear()
        failures = 6
        kafka.clear_requests()
        kafka.push_request_errors(68, [code] * failures)
        _poll_until(c, lambda: len(kafka.requests(68)) > failures, "the episode to end", timeout=30)
        stamps = [r.timestamp_us for r in kafka.requests(68)][: failures + 1]
        gaps_ms = [(b - a) / 1000 for a, b in itertools.pairwise(stamps)]
        if code == KafkaError.NOT_COORDINATOR:
            # Retried once the coordinator is found again, as the Java client: each retry
            # waits for a lookup, at most one every retry.backoff.ms (+-20% jitter).
            minimum = [100 * 0.8] * 5
        else:
            # Exponential backoff with +-20% jitter, capped at 800 ms: 100, 200, 400, 800, 800.
            minimum = [100 * 0.8, 200 * 0.8, 400 * 0.8, 800 * 0.8, 800 * 0.8]
        assert all(g >= m for g, m in zip(gaps_ms[1:], minimum, strict=False)), gaps_ms
        _poll_until(c, lambda: c.state is MemberState.STABLE, "stable again")
        messages = [r for r in caplog.records if "Heartbeat failed" in r.getMessage()]
        assert [r.levelno for r in messages] == [logging.INFO], "one INFO per episode"
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    finally:
        kafka.clear_request_errors(68)
        c.close()


# ----------------------------------------------------------------------------------------
# Regex subscriptions: the pattern goes to the broker as is
# ----------------------------------------------------------------------------------------


def test_regex_is_sent_as_is_and_evaluated_by_the_broker(kafka: EmbeddedKafka) -> None:
    kafka.create_topic("lc-rx-a", partitions=1)
    kafka.create_topic("lc-rx-b", partitions=1)
    kafka.create_topic("lc-other", partitions=1)
    owned: dict[str, set[tuple[str, int]]] = {}
    for impl in IMPLS:
        got = owned.setdefault(impl, set())
        c = _consumer(impl, _conf(kafka, f"lc-rx-{impl}-g"))
        c.subscribe(
            ["^lc-rx-.*"],
            on_assign=lambda _, ps, got=got: got.update((p.topic, p.partition) for p in ps),
        )
        try:
            _poll_until(c, lambda got=got: len(got) == 2, f"{impl}: the matching topics")
        finally:
            c.close()
    assert owned["sdk"] == owned["ck"] == {("lc-rx-a", 0), ("lc-rx-b", 0)}


def test_regex_python_syntax_is_not_validated_client_side(kafka: EmbeddedKafka) -> None:
    # RE2J (the broker) accepts \p{Ll} and \Q..\E, which Python's re refuses: subscribe() takes
    # them as is (the real-broker tier checks what they match; librdkafka's mock broker cannot
    # compile them, so they are not sent to EmbeddedKafka here).
    c = Consumer(_conf(kafka, "lc-rx-syntax-g"))
    try:
        for pattern in (r"^\p{Ll}+-x", r"^\Qlc.x\E", "^(?=lookahead)"):
            c.subscribe([pattern])
        with pytest.raises(ValueError, match="no pattern"):
            c.subscribe(["^"])
    finally:
        c.close(timeout=0)


def test_a_stable_members_waits_end_just_after_its_next_heartbeat(kafka: EmbeddedKafka) -> None:
    """Where the network loop cannot end the application thread's wait inside librdkafka
    (no `Fetcher.wake`), poll() and consume() wait in slices and look for rebalance work in
    between; that work comes from heartbeat answers. A stable member's slice ends just after
    its next heartbeat is due and is short while an answer is awaited, so an assignment
    reaches on_assign within a few ms of its answer, not one whole slice later."""
    kafka.create_topic("slices", partitions=1)
    c = Consumer(_conf(kafka, "slices"))
    c._net.app_waker = None  # as when librdkafka's handle cannot be found
    try:
        c.subscribe(["slices"])
        _poll_until(c, lambda: c.state is MemberState.STABLE, "stable")
        seen = []
        net = c._net
        deadline = time.monotonic() + 3 * HB_MS / 1000
        while time.monotonic() < deadline:
            snap = net.snapshot  # the loop publishes both together
            in_flight, due = snap.heartbeat_in_flight, snap.heartbeat_due_ms / 1000
            got = c._slice(snap)
            seen.append((in_flight, due - time.monotonic(), got))
            time.sleep(0.001)
        for in_flight, until, got in seen:
            expected = 0.005 if in_flight else min(0.02, max(until, 0.0) + 0.005)
            assert abs(got - expected) < 2e-3, (in_flight, until, got)
        assert any(got < 0.015 for _, _, got in seen), "no wait was shortened by a heartbeat"
        assert max(got for _, _, got in seen) <= 0.02
    finally:
        c.close()
