"""The assign-only data plane against EmbeddedKafka: fencing drops records, unfencing
rewinds so nothing is lost, unassign stops delivery."""

from __future__ import annotations

from consumer_sdk.runtime.fetcher import Fetcher
from consumer_sdk.testing import EmbeddedKafka
from tests.runtime.harness import fetcher_over, wait_for


def test_fence_drops_then_unfence_rewinds_without_loss(embedded_kafka: EmbeddedKafka) -> None:
    topic = "fetch-fence"
    embedded_kafka.create_topic(topic, partitions=1)
    embedded_kafka.produce(topic, [f"v{i}".encode() for i in range(20)], partition=0)
    fetcher = Fetcher(
        {
            "bootstrap.servers": embedded_kafka.bootstrap_servers,
            "group.id": "fetch-fence-g",
            "auto.offset.reset": "earliest",
        }
    )
    try:
        fetcher.assign({(topic, 0): None})
        got = [wait_for(lambda: fetcher.poll(0.1), what="first record").offset()]
        while len(got) < 5:
            msg = fetcher.poll(0.5)
            if msg is not None:
                got.append(msg.offset())
        assert fetcher.positions() == {(topic, 0): 5}
        fetcher.fence([(topic, 0)])
        dropped = [fetcher.poll(0.1) for _ in range(10)]
        assert all(m is None for m in dropped), "a fenced partition delivers nothing"
        fetcher.unfence([(topic, 0)])
        while len(got) < 20:
            msg = fetcher.poll(0.5)
            if msg is not None:
                got.append(msg.offset())
        assert got == list(range(20)), "unfencing rewinds to the last delivered position"
        fetcher.unassign([(topic, 0)])
        embedded_kafka.produce(topic, [b"late"], partition=0)
        assert all(fetcher.poll(0.1) is None for _ in range(5))
        assert fetcher.positions() == {}
    finally:
        fetcher.close()


def _drain(fetcher: Fetcher, want: int, deadline_s: float = 30.0) -> list[tuple[int, int]]:
    import time

    got: list[tuple[int, int]] = []
    deadline = time.monotonic() + deadline_s
    while len(got) < want:
        assert time.monotonic() < deadline, f"only {len(got)} of {want} records: {got}"
        msg = fetcher.poll(0.2)
        if msg is not None and msg.error() is None:
            got.append((msg.partition(), msg.offset()))  # type: ignore[arg-type]
    return got


def test_poll_buffer_keeps_order_across_pause_seek_and_unassign(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """poll() takes records from librdkafka in batches: what it buffered must follow
    pause/resume (held, then delivered in order), seek (dropped) and unassign (dropped)."""
    topic = "fetch-buffer"
    fetcher = fetcher_over(embedded_kafka, topic, 300)
    try:
        fetcher.assign({(topic, 0): None, (topic, 1): None})
        got = _drain(fetcher, 1)
        while not fetcher.buffered:  # until a poll() took a batch from librdkafka
            got += _drain(fetcher, 1)
            assert len(got) < 600, "poll() never buffered a batch"
        fetcher.pause([(topic, 0)])
        while True:  # only partition 1 is delivered while 0 is paused
            msg = fetcher.poll(0.3)
            if msg is None:
                break
            assert msg.partition() == 1, "a paused partition's buffered record was delivered"
            got.append((1, msg.offset()))  # type: ignore[arg-type]
        fetcher.resume([(topic, 0)])
        got += _drain(fetcher, 600 - len(got))
        for p in (0, 1):
            offsets = [o for q, o in got if q == p]
            assert offsets == list(range(300)), f"partition {p}: gaps, repeats or disorder"
        assert fetcher.positions() == {(topic, 0): 300, (topic, 1): 300}

        fetcher.seek((topic, 0), 10)
        first = _drain(fetcher, 1)
        assert first == [(0, 10)], "records buffered before a seek were delivered after it"
        fetcher.seek((topic, 0), 250)
        assert _drain(fetcher, 50) == [(0, o) for o in range(250, 300)]

        fetcher.seek((topic, 1), 0)
        assert _drain(fetcher, 1) == [(1, 0)]
        fetcher.unassign([(topic, 1)])
        assert all(fetcher.poll(0.1) is None for _ in range(5)), "unassigned, still delivered"
        fetcher.assign({(topic, 1): 290})
        assert _drain(fetcher, 10) == [(1, o) for o in range(290, 300)]
    finally:
        fetcher.close()


def test_gate_holds_records_back_and_hands_them_out_after_it_opens(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """The zombie-record gate (`Fetcher.set_gate`): while it is closed neither poll() nor
    consume() hands out a record, whether fetched before or after it closed; once it opens
    again every record comes, in order, none twice, none lost, and a partition fenced for
    revocation meanwhile stays fenced."""
    import math
    import time

    topic = "fetch-gate"
    embedded_kafka.create_topic(topic, partitions=2)
    for p in (0, 1):
        embedded_kafka.produce(topic, [f"v{i}".encode() for i in range(30)], partition=p)
    fetcher = Fetcher(
        {
            "bootstrap.servers": embedded_kafka.bootstrap_servers,
            "group.id": "fetch-gate-g",
            "auto.offset.reset": "earliest",
        }
    )
    until = [math.inf]
    fetcher.set_gate(lambda: until[0])
    try:
        fetcher.assign({(topic, 0): None, (topic, 1): None})
        got = _drain(fetcher, 10)
        # The last confirmed heartbeat's session runs out in 0.3 s (no answer comes):
        # records until then, none after.
        until[0] = time.monotonic() + 0.3
        while time.monotonic() <= until[0]:
            msg = fetcher.poll(0.01)
            if msg is not None and msg.error() is None:
                got.append((msg.partition(), msg.offset()))  # type: ignore[arg-type]
        for p in (0, 1):  # fetched while the gate is closed
            embedded_kafka.produce(topic, [f"w{i}".encode() for i in range(20)], partition=p)
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            assert fetcher.poll(0.05) is None, "poll() handed out a record past the gate"
            assert not [m for m in fetcher.consume(50, 0.05) if m.error() is None]
        fetcher.fence([(topic, 1)])  # lost/revoked meanwhile: the gate must not reopen it
        until[0] = math.inf  # a heartbeat answer confirmed the membership
        got += _drain(fetcher, 50 - sum(1 for p, _ in got if p == 0))
        assert sorted(o for p, o in got if p == 0) == list(range(50))
        assert len({(p, o) for p, o in got}) == len(got), "a record came twice"
        assert all(fetcher.poll(0.1) is None for _ in range(5)), "the fenced partition stays"
    finally:
        fetcher.close()


def test_a_batch_taken_while_a_partition_is_fenced_hands_none_of_its_records_out(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """poll() checks a batch's partitions once when it takes the batch from librdkafka (not
    per record): records librdkafka returns of a partition fenced before that are dropped,
    the other partitions' come; unfenced, the fenced one starts where it stood (fails
    without the check of the taken batch)."""
    topic = "fetch-fenced-batch"
    fetcher = fetcher_over(embedded_kafka, topic, 300)
    try:
        fetcher.assign({(topic, 0): None, (topic, 1): None})
        fetcher.fence([(topic, 0)])  # before any record of it was taken from librdkafka
        got = _drain(fetcher, 300)
        assert all(p == 1 for p, _ in got), "a fenced partition's record was handed out"
        assert [o for _, o in got] == list(range(300))
        assert all(fetcher.poll(0.1) is None for _ in range(5)), "the fenced partition stays"
        fetcher.unfence([(topic, 0)])
        assert _drain(fetcher, 300) == [(0, o) for o in range(300)]
        assert fetcher.positions() == {(topic, 0): 300, (topic, 1): 300}
    finally:
        fetcher.close()


def test_poll_positions_over_two_topics(embedded_kafka: EmbeddedKafka) -> None:
    """Batches holding records of two topics (partitions known by topic and number, not by
    number alone): every record once, in order, and the positions after the last ones; a
    seek of one topic's partition leaves the other topic's same-numbered partition as it
    is."""
    first, second = "fetch-two-a", "fetch-two-b"
    fetcher = fetcher_over(embedded_kafka, first, 200)
    embedded_kafka.create_topic(second, partitions=2)
    for p in (0, 1):
        embedded_kafka.produce(second, [f"{p}-{i}".encode() for i in range(200)], partition=p)
    try:
        keys = [(t, p) for t in (first, second) for p in (0, 1)]
        fetcher.assign(dict.fromkeys(keys))
        got: dict[tuple[str, int], list[int]] = {}
        while sum(map(len, got.values())) < 800:
            msg = fetcher.poll(0.2)
            if msg is not None and msg.error() is None:
                got.setdefault((msg.topic(), msg.partition()), []).append(msg.offset())  # type: ignore[arg-type]
            if sum(map(len, got.values())) == 100:
                positions = fetcher.positions()
                assert positions == {k: v[-1] + 1 for k, v in got.items()}, positions
        assert got == {k: list(range(200)) for k in keys}
        assert fetcher.positions() == dict.fromkeys(keys, 200)
        fetcher.seek((second, 0), 150)
        assert _drain(fetcher, 50) == [(0, o) for o in range(150, 200)]
        assert fetcher.positions() == dict.fromkeys(keys, 200)
    finally:
        fetcher.close()
