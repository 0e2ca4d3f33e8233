"""Exactly-once consume-transform-produce on the real broker: the SDK's
``consumer_group_metadata()`` with ``confluent_kafka.Producer.send_offsets_to_transaction``.

A transactional copier in a child process is SIGKILLed mid-transaction (twice, at different
points) and restarted; a read_committed reader of the output then sees each input record
exactly once. The broker also refuses transactional offsets from a zombie (a stale member
epoch, or a member that left the group).
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import confluent_kafka
import pytest
from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from consumer_sdk import Consumer
from consumer_sdk.runtime._librdkafka import read_group_metadata
from consumer_sdk.testing import wait_until

pytestmark = pytest.mark.realkafka

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 3
RECORDS = 600


@pytest.fixture(scope="module")
def servers(real_kafka: Any) -> str:
    return str(getattr(real_kafka, "bootstrap_servers", real_kafka))


def _topic(servers: str, prefix: str, partitions: int = PARTITIONS) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": servers})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(60)
    return name


class Copier:
    """The copier child process; its stdout lines are read by a thread into a queue."""

    def __init__(self, servers: str, src: str, dst: str, group: str, txn_id: str) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.realkafka.eos_copier", servers, src, dst, group, txn_id],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, True), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, False), daemon=True).start()

    def _pump(self, stream: IO[str] | None, out: bool) -> None:
        assert stream is not None
        for line in stream:
            if out:
                self.lines.put(line.strip())
            else:
                self.stderr.append(line)

    def wait_for(self, prefix: str, timeout: float = 120.0) -> str:
        """Block until the copier prints a line starting with ``prefix``."""
        deadline_left = timeout
        while True:
            if self.proc.poll() is not None and self.lines.empty():
                raise AssertionError(
                    f"copier exited ({self.proc.returncode}) before {prefix!r}:\n"
                    + "".join(self.stderr[-30:])
                )
            try:
                line = self.lines.get(timeout=min(deadline_left, 1.0))
            except queue.Empty:
                deadline_left -= 1.0
                if deadline_left <= 0:
                    raise AssertionError(
                        f"copier printed no {prefix!r} in {timeout}s:\n"
                        + "".join(self.stderr[-30:])
                    ) from None
                continue
            if line.startswith(prefix):
                return line

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.fixture
def copiers() -> Iterator[list[Copier]]:
    started: list[Copier] = []
    yield started
    for copier in started:
        copier.stop()


def _read_committed(servers: str, topic: str, expected: int) -> list[bytes]:
    """Every committed record of ``topic`` (read_committed), waiting until ``expected`` were
    seen and then a little longer for any extra one."""
    # An independent reader: confluent-kafka's own consumer.
    reader = confluent_kafka.Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    values: list[bytes] = []
    try:
        reader.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])

        def drained() -> bool:
            for m in reader.consume(100, 0.5):
                if m.error() is None:
                    values.append(m.value() or b"")
            return len(values) >= expected

        wait_until(drained, 180, 0.0, f"{expected} committed records in {topic}")
        # Anything beyond would be a duplicate: read on until the end offsets.
        ends = [
            reader.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
            for p in range(PARTITIONS)
        ]
        assert all(end is not None for end in ends)
        for _ in range(6):
            values.extend(m.value() or b"" for m in reader.consume(100, 0.5) if m.error() is None)
    finally:
        reader.close()
    return values


def test_transactional_copy_survives_kill_9_exactly_once(
    servers: str, copiers: list[Copier]
) -> None:
    src, dst = _topic(servers, "eos-in"), _topic(servers, "eos-out")
    group, txn_id = f"eos-{uuid.uuid4().hex[:8]}", f"eos-tx-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": servers, "linger.ms": 5})
    sent = [f"r{i:04d}".encode() for i in range(RECORDS)]
    for i, value in enumerate(sent):
        producer.produce(src, value, partition=i % PARTITIONS)
    producer.flush(60)

    # 1. Killed with offsets sent but the transaction still open (pending offsets).
    first = Copier(servers, src, dst, group, txn_id)
    copiers.append(first)
    first.wait_for("offsets 3")
    first.kill()
    # 2. Killed with records produced but neither offsets nor commit.
    second = Copier(servers, src, dst, group, txn_id)
    copiers.append(second)
    second.wait_for("committed")
    second.wait_for("open")
    second.kill()
    # 3. Runs to the end (it takes the partitions over once the dead members' sessions end).
    third = Copier(servers, src, dst, group, txn_id)
    copiers.append(third)
    third.wait_for("started")

    values = _read_committed(servers, dst, RECORDS)
    assert sorted(values) == sorted(v.upper() for v in sent), (
        f"{len(values)} records read, {len(set(values))} distinct; expected {RECORDS} once each"
    )
    # The group's committed offsets are the transactional ones: all input consumed.
    checker = Consumer({"bootstrap.servers": servers, "group.id": group})
    try:
        wait_until(
            lambda: (
                sum(
                    tp.offset
                    for tp in checker.committed(
                        [TopicPartition(src, p) for p in range(PARTITIONS)], 30
                    )
                )
                == RECORDS
            ),
            60,
            0.2,
            "the group's committed offsets to cover the input",
        )
    finally:
        checker.close()


def test_broker_fences_zombie_group_metadata(servers: str) -> None:
    topic = _topic(servers, "eos-zombie", partitions=2)
    group = f"zombie-{uuid.uuid4().hex[:8]}"
    conf = {"bootstrap.servers": servers, "group.id": group, "enable.auto.commit": False}
    a, b = Consumer(conf), Consumer(conf)
    producer = Producer({"bootstrap.servers": servers, "transactional.id": f"z-{group}"})
    try:
        producer.init_transactions(60)
        a.subscribe([topic])
        wait_until(
            lambda: a.poll(0.1) is None and len(a.assignment()) == 2,
            60,
            0.0,
            "member a owning both partitions",
        )
        stale = a.consumer_group_metadata()
        stale_epoch = read_group_metadata(stale).generation_id
        assert stale_epoch == a.member_epoch > 0

        b.subscribe([topic])

        def split() -> bool:
            a.poll(0.05)
            b.poll(0.05)
            return (
                len(a.assignment()) == 1
                and len(b.assignment()) == 1
                and (a.member_epoch > stale_epoch)
            )

        wait_until(split, 60, 0.0, "the partitions split between a and b")
        moved = b.assignment()[0].partition
        kept = a.assignment()[0].partition

        def send(partition: int, metadata: bytes) -> None:
            producer.begin_transaction()
            try:
                producer.send_offsets_to_transaction(
                    [TopicPartition(topic, partition, 1)], metadata, 30
                )
            except BaseException:
                producer.abort_transaction(30)
                raise
            producer.commit_transaction(30)

        # The zombie (a's old epoch) committing for the partition that moved to b: refused.
        with pytest.raises(KafkaException) as refused:
            send(moved, stale)
        # (TxnOffsetCommit reports a stale member epoch as ILLEGAL_GENERATION.)
        assert refused.value.args[0].name() == "ILLEGAL_GENERATION", refused.value
        # The current metadata of the owners is accepted.
        send(kept, a.consumer_group_metadata())
        send(moved, b.consumer_group_metadata())
        committed = a.committed([TopicPartition(topic, p) for p in (kept, moved)], 30)
        assert [tp.offset for tp in committed] == [1, 1]

        # a leaves; its metadata (member gone) is refused while b remains.
        left = a.consumer_group_metadata()
        a.close()
        with pytest.raises(KafkaException) as gone:
            send(kept, left)
        assert gone.value.args[0].name() == "UNKNOWN_MEMBER_ID", gone.value
    finally:
        for c in (a, b):
            c.close()
        producer.flush(5)
