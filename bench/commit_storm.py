"""Commit storm: a group that scales every second while each member commits after every batch.

SDK members and confluent-kafka ``group.protocol=consumer`` members share one group on one
cluster. Every ``--interval`` seconds the controller either starts a member or closes the
oldest one (alternating, so the group keeps rebalancing), while a producer writes without
pause. Each member reads a batch, records what it read, and commits it synchronously. Every
commit failure the application sees is counted, per client.

The group's committed offsets are set to 0 before the storm and ``auto.offset.reset`` is
``latest``: a member that answered a stale-epoch OffsetFetch by falling back to
``auto.offset.reset`` would jump to the end of a partition and skip records, so "nothing
lost" (every produced record read by some member) is also the check that no stale-epoch
answer ever moved a position.

    python -m bench.commit_storm --broker real --seconds 60        # KAFKA_HOME
    python -m bench.commit_storm --broker embedded --seconds 20
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

KINDS = ("sdk", "confluent")


# -- one member (a child process) -----------------------------------------------------------------


def member(kind: str, bootstrap: str, group: str, topic: str, log_path: str) -> None:
    """Read batches, log each record's (partition, offset), commit after each batch; one JSON
    line per commit outcome on stdout. Closes when stdin closes."""
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "latest",
        "enable.auto.commit": False,
    }
    if kind == "sdk":
        from consumer_sdk import Consumer

        consumer: Any = Consumer(conf)
    else:
        import confluent_kafka

        consumer = confluent_kafka.Consumer({**conf, "group.protocol": "consumer"})
    from confluent_kafka import KafkaException

    def emit(event: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()

    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    consumer.subscribe([topic])
    emit({"ev": "ready"})
    with open(log_path, "a", buffering=1) as log:
        while not stop.is_set():
            batch = [m for m in consumer.consume(200, 0.1) if m.error() is None]
            if not batch:
                continue
            log.write("".join(f"{m.partition()} {m.offset()}\n" for m in batch))
            log.flush()
            try:
                consumer.commit(asynchronous=False)
                emit({"ev": "commit", "ok": True})
            except KafkaException as exc:
                emit({"ev": "commit", "ok": False, "error": exc.args[0].name()})
    consumer.close()
    emit({"ev": "closed"})


# -- the controller -------------------------------------------------------------------------------


@dataclass
class Member:
    kind: str
    popen: subprocess.Popen[str]
    commits: int = 0
    failures: collections.Counter[str] = field(default_factory=collections.Counter)
    ready: threading.Event = field(default_factory=threading.Event)
    closed: threading.Event = field(default_factory=threading.Event)

    def read(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            event = json.loads(line)
            if event["ev"] == "ready":
                self.ready.set()
            elif event["ev"] == "closed":
                self.closed.set()
            elif event["ok"]:
                self.commits += 1
            else:
                self.commits += 1
                self.failures[event["error"]] += 1

    def stop(self, timeout: float = 30.0) -> None:
        assert self.popen.stdin is not None
        with contextlib.suppress(OSError):
            self.popen.stdin.close()
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait()


@dataclass
class StormResult:
    seconds: float
    produced: int
    read: int
    lost: int
    lost_sample: list[tuple[int, int]]
    scale_steps: int
    commits: dict[str, int]
    failures: dict[str, dict[str, int]]

    def failures_total(self, kind: str) -> int:
        return sum(self.failures[kind].values())

    def as_dict(self) -> dict[str, Any]:
        return {
            "seconds": self.seconds,
            "produced": self.produced,
            "read": self.read,
            "lost": self.lost,
            "scale_steps": self.scale_steps,
            "commits": self.commits,
            "failures": self.failures,
        }


def _spawn(kind: str, bootstrap: str, group: str, topic: str, log_dir: Path) -> Member:
    log_path = log_dir / f"{kind}-{uuid.uuid4().hex[:8]}.log"
    popen = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bench.commit_storm",
            "member",
            kind,
            bootstrap,
            group,
            topic,
            str(log_path),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
    )
    m = Member(kind, popen)
    threading.Thread(target=m.read, daemon=True).start()
    return m


def _read_logs(log_dir: Path) -> set[tuple[int, int]]:
    seen: set[tuple[int, int]] = set()
    for path in log_dir.glob("*.log"):
        for line in path.read_text().splitlines():
            p, o = line.split()
            seen.add((int(p), int(o)))
    return seen


class Cluster(Protocol):
    """What the storm needs of a cluster (`KafkaCluster`, `EmbeddedKafka`)."""

    @property
    def bootstrap_servers(self) -> str: ...

    def create_topic(self, topic: str, partitions: int = 1) -> None: ...


def storm(
    cluster: Cluster,
    *,
    seconds: float,
    members_per_kind: int = 2,
    interval: float = 1.0,
    partitions: int = 12,
    rate: int = 2000,
    work_dir: Path,
) -> StormResult:
    """Run one storm on the cluster at ``bootstrap``; see the module docstring."""
    from confluent_kafka import Consumer as CkConsumer
    from confluent_kafka import Producer, TopicPartition

    bootstrap = cluster.bootstrap_servers
    topic = f"storm-{uuid.uuid4().hex[:8]}"
    group = f"storm-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, partitions=partitions)
    # The group starts committed at 0 everywhere (see the module docstring).
    seed = CkConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    deadline = time.monotonic() + 30
    while True:
        try:
            seed.commit(
                offsets=[TopicPartition(topic, p, 0) for p in range(partitions)],
                asynchronous=False,
            )
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    seed.close()

    delivered: set[tuple[int, int]] = set()
    producing = threading.Event()
    producing.set()

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            delivered.add((msg.partition(), msg.offset()))

    def produce() -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        i = 0
        while producing.is_set():
            for _ in range(max(rate // 20, 1)):
                producer.produce(
                    topic, b"x" * 100, partition=i % partitions, on_delivery=on_delivery
                )
                i += 1
            producer.poll(0)
            time.sleep(0.05)
        producer.flush(30)

    log_dir = work_dir / group
    log_dir.mkdir(parents=True)
    live: list[Member] = []
    gone: list[Member] = []
    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    for _ in range(members_per_kind):
        for kind in KINDS:
            live.append(_spawn(kind, bootstrap, group, topic, log_dir))
    for m in live:
        if not m.ready.wait(60):
            raise RuntimeError(f"a {m.kind} member did not start")
    started = time.monotonic()
    steps = 0
    next_kind = 0
    try:
        while time.monotonic() - started < seconds:
            time.sleep(interval)
            if steps % 2 == 0:  # scale out
                kind = KINDS[next_kind % len(KINDS)]
                next_kind += 1
                live.append(_spawn(kind, bootstrap, group, topic, log_dir))
            else:  # scale in: the oldest member leaves
                leaving = live.pop(0)
                threading.Thread(target=leaving.stop, daemon=True).start()
                gone.append(leaving)
            steps += 1
        elapsed = time.monotonic() - started
    finally:
        producing.clear()
        producer.join(60)
    # The members left read what remains; nothing produced may stay unread.
    total = len(delivered)
    deadline = time.monotonic() + 90
    seen = _read_logs(log_dir)
    while not delivered <= seen and time.monotonic() < deadline:
        time.sleep(0.5)
        seen = _read_logs(log_dir)
    for m in live:
        m.stop()
    for m in gone:
        m.popen.wait(60)
    seen = _read_logs(log_dir)
    missing = sorted(delivered - seen)
    everyone = live + gone
    return StormResult(
        seconds=elapsed,
        produced=total,
        read=len(seen),
        lost=len(missing),
        lost_sample=missing[:10],
        scale_steps=steps,
        commits={k: sum(m.commits for m in everyone if m.kind == k) for k in KINDS},
        failures={
            k: dict(sum((m.failures for m in everyone if m.kind == k), collections.Counter()))
            for k in KINDS
        },
    )


@contextlib.contextmanager
def _cluster(broker: str) -> Iterator[Cluster]:
    if broker == "real":
        from consumer_sdk.testing import KafkaCluster

        with KafkaCluster(heartbeat_interval_ms=500, session_timeout_ms=6000) as cluster:
            yield cluster
    else:
        from consumer_sdk.testing import EmbeddedKafka

        with EmbeddedKafka(heartbeat_interval_ms=500, session_timeout_ms=6000) as kafka:
            yield kafka


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] == "member":
        member(*args[1:6])
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.commit_storm", description=__doc__)
    parser.add_argument("--broker", choices=("real", "embedded"), default="real")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--members", type=int, default=2, help="members of each client")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args(args)
    import tempfile

    with _cluster(ns.broker) as cluster, tempfile.TemporaryDirectory() as work:
        result = storm(
            cluster,
            seconds=ns.seconds,
            members_per_kind=ns.members,
            interval=ns.interval,
            work_dir=Path(work),
        )
    if ns.json:
        print(json.dumps(result.as_dict()))
        return 0
    sdk, ck = result.failures_total("sdk"), result.failures_total("confluent")
    print(
        f"commit storm on {ns.broker} broker: {result.seconds:.0f} s, {result.scale_steps} "
        f"scale steps, {result.produced} records produced, {result.lost} lost"
    )
    for kind in KINDS:
        print(
            f"  {kind:9s} commits {result.commits[kind]:6d}  surfaced failures "
            f"{result.failures_total(kind):4d}  {result.failures[kind]}"
        )
    ratio = "n/a (confluent-kafka had none)" if ck == 0 else f"{sdk / ck:.2f}"
    print(f"  surfaced failures SDK / confluent-kafka: {ratio} (goal: SDK <= confluent-kafka)")
    return 0 if result.lost == 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
