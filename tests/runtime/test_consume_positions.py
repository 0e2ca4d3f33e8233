"""consume() keeps no per-record bookkeeping on its common path: positions and leader epochs
come from librdkafka's application position when asked. These tests pin what that position
must be (the offset after the last record handed to the application, or an explicit one)
through batches, fencing, seeks, revocation and mixed poll()/consume(), against EmbeddedKafka
(tests taking ``kafka_backend``: and the real broker) and against confluent-kafka itself."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import confluent_kafka

from consumer_sdk import Consumer, KafkaError, KafkaException, TopicPartition
from consumer_sdk.runtime.error_channel import error_event
from consumer_sdk.testing import EmbeddedKafka, KafkaCluster
from tests.runtime.harness import Timeline, config, fetcher_over, wait_for

Seen = dict[int, list[int]]  # partition -> offsets delivered, in order


def _take(read: Callable[[], list[Any]], seen: Seen, want: int, what: str) -> None:
    """Call ``read`` until ``want`` records were delivered in all (deadline 60 s)."""
    deadline = time.monotonic() + 60
    while sum(map(len, seen.values())) < want:
        assert time.monotonic() < deadline, f"{what}: only {sum(map(len, seen.values()))}"
        for msg in read():
            if msg is not None and msg.error() is None:
                seen.setdefault(msg.partition(), []).append(msg.offset())


def _expected(seen: Seen) -> dict[int, int]:
    return {p: offsets[-1] + 1 for p, offsets in seen.items() if offsets}


def _positions(consumer: Any, topic: str, partitions: int) -> dict[int, int]:
    tps = consumer.position([TopicPartition(topic, p) for p in range(partitions)])
    return {tp.partition: tp.offset for tp in tps if tp.offset >= 0}


def _contiguous(seen: Seen, start: int = 0) -> None:
    for p, offsets in seen.items():
        assert offsets == list(range(start, start + len(offsets))), f"partition {p}: {offsets}"


def _raw_committed(kafka: EmbeddedKafka, group: str, topic: str, n: int) -> dict[int, tuple]:
    raw = confluent_kafka.Consumer(
        {"bootstrap.servers": kafka.bootstrap_servers, "group.id": group}
    )
    try:
        tps = raw.committed([TopicPartition(topic, p) for p in range(n)], timeout=20)
        return {tp.partition: (tp.offset, tp.leader_epoch) for tp in tps if tp.offset >= 0}
    finally:
        raw.close()


def test_consume_batches_then_commit_and_position_match_last_delivered(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """Several partitions with different leader epochs, uneven batches: position() and the
    committed offsets (OffsetFetch, read by confluent-kafka) are the last delivered offset + 1
    with that record's leader epoch, mid-stream and at the end."""
    topic, group, n = "cp-batches", "cp-batches-g", 4
    embedded_kafka.create_topic(topic, partitions=n)
    for p in range(n):
        # A different leader epoch per partition (the mock refuses commits that carry an
        # epoch older than the leader's, so the moves come before the records).
        for move in range(p + 1):
            embedded_kafka.partition_set_leader(topic, p, 1 + (p + move + 1) % 3)
        embedded_kafka.produce(
            topic, [f"{p}-{i}".encode() for i in range(120 + 10 * p)], partition=p
        )
    total = sum(120 + 10 * p for p in range(n))
    consumer = Consumer(config(embedded_kafka, group, enable_auto_commit=False))
    epochs: dict[int, int] = {}
    seen: Seen = {}

    def read(count: int) -> list[Any]:
        msgs = consumer.consume(count, 0.2)
        for m in msgs:
            if m.error() is None:
                epochs[m.partition()] = m.leader_epoch()
        return msgs

    try:
        consumer.assign([TopicPartition(topic, p) for p in range(n)])
        for step, (count, want) in enumerate([(37, 150), (1, 151), (500, total // 2), (13, total)]):
            _take(lambda c=count: read(c), seen, want, f"step {step}")
            assert _positions(consumer, topic, n) == _expected(seen)
            consumer.commit(asynchronous=False)
            committed = _raw_committed(embedded_kafka, group, topic, n)
            assert committed == {p: (o, epochs[p]) for p, o in _expected(seen).items()}
        _contiguous(seen)
        assert len(set(epochs.values())) == n, f"one leader epoch per partition: {epochs}"
    finally:
        consumer.close()


def test_seek_between_consume_batches_matches_confluent_kafka(
    kafka_backend: EmbeddedKafka | KafkaCluster,
) -> None:
    """The same sequence on this SDK and on confluent-kafka, one partition so both get the
    same records: positions after batches, after a seek (unknown until the next record),
    after the next record and after seeking forward are equal."""
    topic = "cp-seek"
    kafka_backend.create_topic(topic, partitions=1)
    kafka_backend.produce(topic, [f"v{i}".encode() for i in range(200)], partition=0)
    conf = {
        "bootstrap.servers": kafka_backend.bootstrap_servers,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    ours = Consumer({**conf, "group.id": "cp-seek-sdk"})
    theirs = confluent_kafka.Consumer({**conf, "group.id": "cp-seek-raw"})
    tp = TopicPartition(topic, 0)

    def sequence(c: Any) -> list[Any]:
        trace: list[Any] = []
        seen: Seen = {}
        c.assign([TopicPartition(topic, 0, 0)])
        _take(lambda: c.consume(40 - sum(map(len, seen.values())), 0.2), seen, 40, "first 40")
        trace += [seen[0][-1], c.position([tp])[0].offset]
        c.seek(TopicPartition(topic, 0, 7))
        trace.append(c.position([tp])[0].offset)
        seen.clear()
        _take(lambda: c.consume(1, 0.2), seen, 1, "after seek")
        trace += [seen[0], c.position([tp])[0].offset]
        c.seek(TopicPartition(topic, 0, 150))
        seen.clear()
        _take(lambda: c.consume(25 - sum(map(len, seen.values())), 0.2), seen, 25, "forward")
        trace += [seen[0], c.position([tp])[0].offset]
        return trace

    try:
        mine, raw = sequence(ours), sequence(theirs)
        assert mine == raw
        assert mine[:3] == [39, 40, -1001] and mine[3] == [7] and mine[4] == 8
        assert mine[5] == list(range(150, 175)) and mine[6] == 175
    finally:
        ours.close()
        theirs.close()


def test_poll_and_consume_mixed_keep_exact_positions(
    kafka_backend: EmbeddedKafka | KafkaCluster,
) -> None:
    """poll() buffers a batch from librdkafka that consume() must not count as delivered;
    alternating them (with a pause/resume between) keeps every position exact and every
    partition's records in order, none skipped or repeated."""
    topic, n = "cp-mixed", 3
    kafka_backend.create_topic(topic, partitions=n)
    for p in range(n):
        kafka_backend.produce(topic, [f"{p}-{i}".encode() for i in range(400)], partition=p)
    consumer = Consumer(config(kafka_backend, "cp-mixed-g", enable_auto_commit=False))
    seen: Seen = {}
    try:
        consumer.assign([TopicPartition(topic, p) for p in range(n)])
        plan: list[tuple[str, int]] = [
            ("poll", 1),
            ("consume", 30),
            ("poll", 5),
            ("consume", 300),
            ("pause", 0),
            ("poll", 40),
            ("resume", 0),
            ("consume", 7),
            ("poll", 200),
            ("consume", 1000),
        ]
        for step, (kind, count) in enumerate(plan):
            if kind == "pause":
                consumer.pause([TopicPartition(topic, 0)])
                continue
            if kind == "resume":
                consumer.resume([TopicPartition(topic, 0)])
                continue
            want = min(sum(map(len, seen.values())) + count, 400 * n)
            if kind == "poll":
                _take(lambda: [consumer.poll(0.2)], seen, want, f"step {step}")
            else:
                _take(lambda c=count: consumer.consume(c, 0.2), seen, want, f"step {step}")
            assert _positions(consumer, topic, n) == _expected(seen), f"after step {step}"
        _take(lambda: consumer.consume(500, 0.2), seen, 400 * n, "the rest")
        _contiguous(seen)
        assert _positions(consumer, topic, n) == dict.fromkeys(range(n), 400)
    finally:
        consumer.close()


class _ConsumeMember:
    """A subscribed Consumer driven by consume() on its own thread."""

    def __init__(self, name: str, conf: dict[str, Any], topic: str, timeline: Timeline) -> None:
        self.name, self.timeline = name, timeline
        self.consumer = Consumer(conf)
        self.records: list[tuple[int, int, float]] = []  # partition, offset, when
        self.errors: list[BaseException] = []
        self.owned: set[int] = set()
        self._stop = threading.Event()
        self.consumer.subscribe([topic], on_assign=self._assign, on_revoke=self._revoke)
        self._thread = threading.Thread(target=self._loop, name=f"app-{name}", daemon=True)
        self._thread.start()

    def _assign(self, _: Any, parts: list[TopicPartition]) -> None:
        self.owned.update(tp.partition for tp in parts)
        self.timeline.record(self.name, "assign", parts)

    def _revoke(self, _: Any, parts: list[TopicPartition]) -> None:
        self.owned.difference_update(tp.partition for tp in parts)
        self.timeline.record(self.name, "revoke", parts)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                msgs = self.consumer.consume(50, 0.1)
            except KafkaException as exc:
                self.errors.append(exc)
                continue
            now = time.monotonic()
            self.records += [(m.partition(), m.offset(), now) for m in msgs if m.error() is None]
            time.sleep(0.005)  # some processing: the stream is still flowing at the rebalance

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.consumer.close()


def test_revocation_mid_stream_hands_partitions_over_exactly(
    kafka_backend: EmbeddedKafka | KafkaCluster,
) -> None:
    """A consume() member loses partitions to a joining member while records keep coming:
    the revocation commit is its last delivered offset + 1 (records it fenced and dropped are
    not counted), so the next owner starts right there: every partition's records are
    delivered once, in order, across the two owners."""
    topic, group, n = "cp-revoke", "cp-revoke-g", 4
    kafka_backend.create_topic(topic, partitions=n)
    produced = [0] * n
    stop_producing = threading.Event()

    def produce() -> None:
        while not stop_producing.is_set():
            for p in range(n):
                kafka_backend.produce(
                    topic, [f"{p}-{produced[p] + i}".encode() for i in range(40)], partition=p
                )
                produced[p] += 40
            time.sleep(0.05)

    producer = threading.Thread(target=produce, daemon=True)
    timeline = Timeline()
    members: list[_ConsumeMember] = []
    try:
        producer.start()
        members.append(_ConsumeMember("a", config(kafka_backend, group), topic, timeline))
        wait_for(
            lambda: len(members[0].owned) == n and len(members[0].records) > 200,
            timeout=60,
            what="member a consuming every partition",
        )
        members.append(_ConsumeMember("b", config(kafka_backend, group), topic, timeline))
        wait_for(
            lambda: (
                members[1].owned
                and members[0].owned
                and {p for p, _, _ in members[1].records} == members[1].owned
            ),
            timeout=60,
            what="member b consuming the partitions it took over",
        )
        stop_producing.set()
        producer.join(30)
        wait_for(
            lambda: sum(len(m.records) for m in members) >= sum(produced),
            timeout=60,
            what=f"all {sum(produced)} records consumed",
        )
        time.sleep(0.5)  # nothing more may arrive (a duplicate would)
        assert [m.errors for m in members] == [[], []]
        by_partition: Seen = {}
        for m in members:  # a's records of a moved partition all precede b's
            for p, o, _ in sorted(m.records, key=lambda r: r[2]):
                by_partition.setdefault(p, []).append(o)
        for p in members[1].owned:
            last_a = max((r[2] for r in members[0].records if r[0] == p), default=0.0)
            first_b = min(r[2] for r in members[1].records if r[0] == p)
            assert last_a < first_b, f"partition {p} delivered by both members at once"
        merged = {p: sorted(offsets) for p, offsets in by_partition.items()}
        assert merged == {p: list(range(produced[p])) for p in range(n)}, "lost or repeated"
        assert timeline.overlaps() == []
    finally:
        stop_producing.set()
        for m in members:
            m.stop()


def test_fenced_during_a_consume_call_drops_without_moving_the_position(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """The network loop fences a partition while consume() waits inside librdkafka, which
    then returns new records of it: they are dropped, its position stays after the last
    delivered record (librdkafka's own counted the dropped ones), and after unfencing they
    come again, none skipped."""
    topic = "cp-inflight"
    fetcher = fetcher_over(embedded_kafka, topic, 10)
    seen: Seen = {}
    try:
        fetcher.assign({(topic, 0): None, (topic, 1): None})
        _take(lambda: fetcher.consume(100, 0.2), seen, 20, "the first records")
        assert fetcher.positions() == {(topic, 0): 10, (topic, 1): 10}

        def fence_then_produce() -> None:
            time.sleep(0.5)  # consume() below is waiting inside librdkafka by now
            fetcher.fence([(topic, 0)])
            embedded_kafka.produce(topic, [f"0-{i}".encode() for i in range(10, 15)], partition=0)

        helper = threading.Thread(target=fence_then_produce)
        helper.start()
        deadline = time.monotonic() + 30
        # librdkafka's own position reaches 15 once the new records were returned (dropped).
        while fetcher.consumer.position([TopicPartition(topic, 0)])[0].offset != 15:
            assert time.monotonic() < deadline, "the records produced while fenced never came"
            assert fetcher.consume(100, 3.0) == [], "a fenced partition's record was handed out"
        helper.join()
        assert fetcher.positions() == {(topic, 0): 10, (topic, 1): 10}
        assert fetcher.leader_epoch((topic, 0)) >= 0
        fetcher.unfence([(topic, 0)])
        seen.clear()
        _take(lambda: fetcher.consume(100, 0.2), seen, 5, "the records dropped while fenced")
        assert seen == {0: [10, 11, 12, 13, 14]}
        assert fetcher.positions() == {(topic, 0): 15, (topic, 1): 10}
    finally:
        fetcher.close()


def test_fenced_between_consume_calls_keeps_the_position_for_revocation(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """Fenced between calls (a revocation pending): later batches drop its records, its
    position (what the revocation commit carries, with the last record's epoch) stays; the
    other partition's position moves on; after unassign it has none."""
    topic = "cp-fence"
    fetcher = fetcher_over(embedded_kafka, topic, 100)
    seen: Seen = {}
    try:
        fetcher.assign({(topic, 0): None, (topic, 1): None})
        while len(seen.get(0, [])) < 5 or len(seen.get(1, [])) < 5:
            _take(
                lambda: fetcher.consume(7, 0.2),
                seen,
                sum(map(len, seen.values())) + 1,
                "the first records of both partitions",
            )
        before = _expected(seen)
        epoch = fetcher.leader_epoch((topic, 0))
        fetcher.fence([(topic, 0)])
        # Any other change keeps partition 0 fenced: a seek back on partition 1 (it may
        # have delivered all its records already).
        fetcher.seek((topic, 1), before[1] - 1)
        assert fetcher.positions() == {(topic, 0): before[0]}
        later: Seen = {}
        _take(lambda: fetcher.consume(50, 0.2), later, 101 - before[1], "the other partition")
        assert set(later) == {1}, "a fenced partition's record was handed out"
        assert fetcher.positions() == {(topic, 0): before[0], (topic, 1): 100}
        assert fetcher.committable()[(topic, 0)] == (before[0], epoch)
        fetcher.unassign([(topic, 0)])
        assert fetcher.positions() == {(topic, 1): 100}
    finally:
        fetcher.close()


def test_auto_commit_commits_consume_positions_while_the_application_waits_in_consume(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """The loop thread's auto-commit reads librdkafka's positions only between consume()
    calls' batches: an application that keeps waiting inside consume() (idle, no records)
    must not starve it."""
    topic, group, n = "cp-autocommit", "cp-autocommit-g", 3
    embedded_kafka.create_topic(topic, partitions=n)
    for p in range(n):
        embedded_kafka.produce(topic, [f"{p}-{i}".encode() for i in range(50)], partition=p)
    consumer = Consumer(config(embedded_kafka, group, auto_commit_interval_ms=300))
    seen: Seen = {}
    try:
        consumer.subscribe([topic])
        _take(lambda: consumer.consume(500, 0.2), seen, 50 * n, "every record")
        stop = threading.Event()
        errors: list[BaseException] = []

        def keep_consuming() -> None:
            while not stop.is_set():
                try:
                    assert consumer.consume(500, 1.0) == []
                except BaseException as exc:  # surfaced below
                    errors.append(exc)
                    return

        app = threading.Thread(target=keep_consuming)
        app.start()
        try:
            wait_for(
                lambda: (
                    _raw_committed(embedded_kafka, group, topic, n)
                    == {p: (50, 0) for p in range(n)}
                    or None
                ),
                timeout=60,
                what="auto-commit of every partition's position",
            )
        finally:
            stop.set()
            app.join(10)
        assert errors == []
    finally:
        consumer.close()


def test_auto_commit_and_heartbeats_never_wait_for_the_application_holding_the_fetcher(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """The loop's auto-commit reads what the application side published: with the
    application thread holding the fetcher (both its locks, as across a wait inside librdkafka
    the loop cannot end), every auto-commit read has the consumed positions of librdkafka's
    own partitions, commits them, and heartbeats go on. It used to wait up to 100 ms for the
    application, then leave those partitions out (or block the loop on the fetcher's lock)."""
    topic, group, n, per = "cp-published", "cp-published-g", 3, 40
    embedded_kafka.create_topic(topic, partitions=n)
    for p in range(n):
        embedded_kafka.produce(topic, [f"{p}-{i}".encode() for i in range(per)], partition=p)
    consumer = Consumer(config(embedded_kafka, group, auto_commit_interval_ms=200))
    seen: Seen = {}
    try:
        consumer.subscribe([topic])
        _take(lambda: consumer.consume(500, 0.2), seen, per * n, "every record")
        fetcher = consumer._fetcher
        assert fetcher._native, "consume() left the positions to librdkafka: the case that waited"
        expected = {(topic, p): per for p in range(n)}
        # The driver's hook, timed on the loop thread (the part of its run that was the
        # application's: the read of the positions).
        driver = consumer._net._driver
        hook = driver.committable
        assert hook is not None
        reads: list[tuple[float, dict[tuple[str, int], int]]] = []

        def timed() -> Any:
            started = time.perf_counter()
            offsets, manual = hook()
            took = time.perf_counter() - started
            reads.append((took, {p: o.offset for p, o in offsets.items()}))
            return offsets, manual

        driver.committable = timed
        held, release = threading.Event(), threading.Event()

        def hold() -> None:
            with fetcher._flight, fetcher._lock:
                held.set()
                release.wait(60)

        holder = threading.Thread(target=hold)
        holder.start()
        try:
            assert held.wait(10)
            during = len(reads)
            beats: set[int | None] = {consumer._net.snapshot.last_heartbeat_response_ms}

            def progressed() -> bool:
                beats.add(consumer._net.snapshot.last_heartbeat_response_ms)
                return len(reads) - during >= 3 and len(beats) >= 3

            wait_for(progressed, timeout=30, what="auto-commit reads and heartbeats")
            assert all(positions == expected for _, positions in reads[during:]), reads[during:]
            wait_for(
                lambda: (
                    _raw_committed(embedded_kafka, group, topic, n)
                    == {p: (per, 0) for p in range(n)}
                ),
                timeout=30,
                what="the auto-commit of every position",
            )
        finally:
            release.set()
            holder.join(10)
            driver.committable = hook
        # No wait in the read (it used to give up after 100 ms); the bound is loose for a
        # loaded machine.
        slowest = max(took for took, _ in reads[during:])
        assert slowest < 0.1, f"an auto-commit read kept the loop {slowest * 1000:.0f} ms"
    finally:
        consumer.close()


def test_the_published_positions_follow_every_hand_out(embedded_kafka: EmbeddedKafka) -> None:
    """What the loop reads (`Fetcher.publication`, no lock, no call into librdkafka) equals
    the exact positions (read from librdkafka on the application side) after every
    hand-out: small and large consume() batches, poll(), a seek, a fence and a rewind, an
    unassignment."""
    topic = "cp-publication"
    fetcher = fetcher_over(embedded_kafka, topic, 1500)
    seen: Seen = {}

    def check(what: str) -> None:
        published = fetcher.publication
        assert published.positions() == fetcher.committable(), what
        assert published.assigned == fetcher.assigned(), what

    try:
        fetcher.assign({(topic, 0): 3, (topic, 1): None})
        check("assigned: the explicit start only")
        assert fetcher.publication.positions() == {(topic, 0): (3, -1)}
        for step in range(12):  # small batches: published with their records
            _take(lambda: fetcher.consume(7, 0.5), seen, 7 * (step + 1), f"batch {step}")
            check(f"after small batch {step}")
        _take(lambda: fetcher.consume(500, 0.5), seen, 7 * 12 + 1100, "large batches")
        check("after large batches")
        assert fetcher.publication.positions() == {
            (topic, p): (offsets[-1] + 1, 0) for p, offsets in seen.items()
        }
        for _ in range(5):
            assert fetcher.poll(5.0) is not None
            check("after poll()")
        fetcher.seek((topic, 1), 100)
        check("after a seek")
        assert (topic, 1) not in fetcher.publication.positions()
        _take(lambda: fetcher.consume(3, 0.5), seen, sum(map(len, seen.values())) + 3, "more")
        check("after the seek's first records")
        fetcher.fence([(topic, 0)])
        fetcher.consume(50, 0.5)
        check("fenced")
        fetcher.unfence([(topic, 0)])
        check("rewound")
        fetcher.unassign([(topic, 0)])
        check("unassigned")
        assert set(fetcher.publication.positions()) == {(topic, 1)}
    finally:
        fetcher.close()


def test_poll_hands_out_a_buffered_record_only_as_its_slow_path_would(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """`Consumer.poll` serves a record the fetcher already buffered in one frame. It must
    still note the poll for the member, run a queued ``error_cb`` and return a waiting error
    event first, raise once the consumer is fatally failed, drop a fenced partition's
    records and hold every record back past the zombie-record gate; and every record comes
    once, in order (fails when any of those guards is taken off the record path)."""
    import math

    topic = "cp-poll-record-path"
    embedded_kafka.create_topic(topic, partitions=2)
    for p in (0, 1):
        embedded_kafka.produce(topic, [f"{p}-{i}".encode() for i in range(400)], partition=p)
    errors: list[KafkaError] = []
    consumer = Consumer(
        {**config(embedded_kafka, "cp-poll-record-path-g"), "error_cb": errors.append}
    )
    fetcher = consumer._fetcher
    seen: Seen = {}

    def record(msg: Any) -> Any:
        if msg is not None and msg.error() is None:
            seen.setdefault(msg.partition(), []).append(msg.offset())
        return msg

    def refill() -> None:
        """poll() until the fetcher holds at least 10 records taken from librdkafka."""
        deadline = time.monotonic() + 30
        while len(fetcher._cursor.msgs) - fetcher._cursor.taken < 10:
            assert time.monotonic() < deadline, "the fetcher buffered no records"
            record(consumer.poll(0.2))

    try:
        consumer.subscribe([topic])
        refill()
        # The poll is noted for the member (max.poll.interval.ms, rebalance progress).
        consumer._next_post_poll = 0.0
        assert record(consumer.poll(0)) is not None
        assert consumer._next_post_poll > 0, "the poll was not noted"
        # A queued error_cb call runs before the next record is handed out.
        consumer._queue_error(KafkaError(KafkaError._TRANSPORT, "cp test"))
        assert record(consumer.poll(0)) is not None
        assert [e.code() for e in errors] == [KafkaError._TRANSPORT]
        # A waiting error event comes before the buffered records.
        consumer._error_events.append(error_event(KafkaError(KafkaError._FAIL, "cp test")))
        event = consumer.poll(0)
        assert event is not None and event.error() is not None
        # A fatally failed consumer raises.
        consumer._fatal = KafkaException(KafkaError(KafkaError._FATAL, "cp test", fatal=True))
        try:
            raised = False
            try:
                consumer.poll(0)
            except KafkaException:
                raised = True
            assert raised, "poll() handed out a record on a fatally failed consumer"
        finally:
            consumer._fatal = None
        # Fenced partitions: their buffered records are dropped, then come again.
        refill()
        parts = [(topic, 0), (topic, 1)]
        fetcher.fence(parts)
        assert record(consumer.poll(0)) is None, "a fenced partition's record was handed out"
        fetcher.unfence(parts)
        # Past the gate (no heartbeat confirmed the membership for a session) nothing goes
        # out, buffered or not; when it opens again the records come.
        refill()
        fetcher.set_gate(lambda: -math.inf)
        assert record(consumer.poll(0)) is None, "a record was handed out past the gate"
        fetcher.set_gate(consumer._handout_until)
        _take(lambda: [consumer.poll(0.2)], seen, 800, "every record")
        assert sorted(seen) == [0, 1]
        _contiguous(seen)
    finally:
        consumer.close()


def test_poll_positions_count_only_the_records_handed_out_of_a_buffered_batch(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """`Consumer.poll` hands buffered records out by moving the fetcher's buffer on, with
    nothing per partition; positions are derived when read. After each record handed out of
    the middle of a batch, the position (``position()``, the commit's, and the publication
    the loop's auto-commit reads) is exactly the offset after it; a partition fenced while
    its records are buffered gets none of them handed out and keeps its position; unfenced,
    every record comes once, in order (fails when the fence check leaves the record path,
    or when records not handed out yet count)."""
    topic = "cp-poll-batch-positions"
    embedded_kafka.create_topic(topic, partitions=2)
    for p in (0, 1):
        embedded_kafka.produce(topic, [f"{p}-{i}".encode() for i in range(400)], partition=p)
    consumer = Consumer(config(embedded_kafka, "cp-poll-batch-positions-g"))
    fetcher = consumer._fetcher
    seen: Seen = {}

    def waiting() -> list[Any]:
        batch = fetcher._cursor
        return batch.msgs[batch.taken :]

    def hand_out(timeout: float = 0) -> Any:
        msg = consumer.poll(timeout)
        if msg is not None and msg.error() is None:
            seen.setdefault(msg.partition(), []).append(msg.offset())
        return msg

    def check(what: str) -> None:
        want = {(topic, p): o for p, o in _expected(seen).items()}
        published = {k: o for k, (o, _) in fetcher.publication.positions().items()}
        committable = {k: o for k, (o, _) in fetcher.committable().items()}
        assert published == want, f"{what}: published {published}, handed out {want}"
        assert committable == want, f"{what}: committable {committable}, handed out {want}"
        assert _positions(consumer, topic, 2) == _expected(seen), what

    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 30
        while len(waiting()) < 20:  # a batch taken from librdkafka, most of it waiting
            assert time.monotonic() < deadline, "the fetcher buffered no records"
            hand_out(0.2)
        for i in range(5):  # out of the middle of the batch, by the one-frame path
            assert hand_out() is not None
            check(f"record {i}")
        fenced = waiting()[0].partition()
        fetcher.fence([(topic, fenced)])
        while fetcher.buffered:
            msg = hand_out()
            assert msg is None or msg.partition() != fenced, "a fenced partition's record"
        check("after the fenced partition's records were dropped")
        fetcher.unfence([(topic, fenced)])
        _take(lambda: [consumer.poll(0.2)], seen, 800, "every record")
        _contiguous(seen)
        check("all read")
    finally:
        consumer.close()
