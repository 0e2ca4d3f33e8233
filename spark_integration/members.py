"""Executor members: N long-lived ``consumer_sdk.Consumer`` group members as Spark tasks.

`run_group_members` starts a barrier stage of N tasks (all scheduled together, or
none). Each task is one member of the group: it consumes, hands records to
``process_batch`` as a ``pyarrow.RecordBatch`` in the Kafka source schema, and commits
what was processed. ``on_revoke`` processes what is buffered and commits synchronously
before the partitions are released, so the next owner starts exactly after this
member's work; only ``on_lost`` (fencing, session expiry) can make another member repeat
records. Delivery is at-least-once: make ``process_batch`` idempotent.

Control channel: a directory (``control_dir``; a temporary one on the driver by
default, which is only visible to executors in local mode: on a cluster pass a path on a
shared filesystem). Members stop when the file ``STOP`` appears in it
(`GroupMembersJob.stop`), after ``stop_after_s`` seconds, or once the members
together processed ``max_records`` records; each member writes ``member-<i>.json``
(progress) and ``member-<i>.events.jsonl`` (its callbacks, batches and commits) there.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

__all__ = ["GroupMembersJob", "MemberReport", "free_task_slots", "run_group_members"]

log = logging.getLogger("spark_integration")

Partition = tuple[str, int]
ProcessBatch = Callable[[pa.RecordBatch], object]

STOP_FILE = "STOP"
_POLL_S = 0.2


@dataclass
class MemberReport:
    """What one member did (returned by `GroupMembersJob.wait`)."""

    index: int
    member_id: str
    records: int = 0
    batches: int = 0
    commits: int = 0
    revocations: int = 0
    lost: int = 0
    stopped_by: str = ""


def free_task_slots(spark: Any) -> int:
    """Task slots not busy with other stages (local mode: the master's thread count)."""
    sc = spark.sparkContext
    conf = sc.getConf()
    slots = int(sc.defaultParallelism)
    cores, instances = conf.get("spark.executor.cores"), conf.get("spark.executor.instances")
    task_cpus = int(conf.get("spark.task.cpus", "1"))
    if cores and instances and not sc.master.startswith("local"):
        slots = int(cores) * int(instances) // max(task_cpus, 1)
    tracker = sc.statusTracker()
    busy = 0
    for stage_id in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            busy += int(info.numActiveTasks)
    return max(slots - busy, 0)


class GroupMembersJob:
    """Handle of a running `run_group_members` stage."""

    def __init__(self, spark: Any, control_dir: Path, members: int, job_group: str) -> None:
        self.control_dir = control_dir
        self.members = members
        self.job_group = job_group
        self._spark = spark
        self._done = threading.Event()
        self._reports: list[MemberReport] = []
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    @property
    def stop_file(self) -> Path:
        return self.control_dir / STOP_FILE

    def _run(self, job: Callable[[], list[str]]) -> None:
        try:
            self._spark.sparkContext.setJobGroup(
                self.job_group, f"kip848 group members ({self.members})", True
            )
            self._reports = [MemberReport(**json.loads(r)) for r in job()]
        except BaseException as exc:  # re-raised by wait()
            self._error = exc
        finally:
            self._done.set()

    def stop(self, timeout: float | None = 60.0) -> list[MemberReport]:
        """Ask every member to flush, commit and leave the group; wait for them."""
        self.stop_file.touch()
        return self.wait(timeout)

    def cancel(self) -> None:
        """Cancel the Spark job (members are killed: no final commit, no clean leave)."""
        self._spark.sparkContext.cancelJobGroup(self.job_group)

    def running(self) -> bool:
        return not self._done.is_set()

    def wait(self, timeout: float | None = None) -> list[MemberReport]:
        """The members' reports once all stopped; raises the job's error, or TimeoutError."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"group members still running after {timeout}s")
        if self._error is not None:
            raise self._error
        return sorted(self._reports, key=lambda r: r.index)

    def progress(self) -> dict[int, dict[str, Any]]:
        """Each member's last progress file (``member-<i>.json``)."""
        out: dict[int, dict[str, Any]] = {}
        for path in self.control_dir.glob("member-*.json"):
            try:
                data = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            out[int(data["index"])] = data
        return out

    def events(self) -> list[dict[str, Any]]:
        """Every member's events, in time order (``member-<i>.events.jsonl``)."""
        out: list[dict[str, Any]] = []
        for path in self.control_dir.glob("member-*.events.jsonl"):
            for line in path.read_text().splitlines():
                if line.strip():
                    out.append(json.loads(line))
        return sorted(out, key=lambda e: (e["t"], e.get("seq", 0)))


def run_group_members(
    spark: Any,
    config: Mapping[str, Any],
    topics: Sequence[str],
    process_batch: ProcessBatch,
    members: int = 1,
    *,
    stop_after_s: float | None = None,
    max_records: int | None = None,
    control_dir: str | os.PathLike[str] | None = None,
    batch_size: int = 1000,
    batch_timeout_s: float = 0.5,
    include_headers: bool = False,
) -> GroupMembersJob:
    """Start ``members`` group members as a Spark barrier stage; return its handle.

    ``config`` is a ``consumer_sdk.Consumer`` config (``bootstrap.servers``, ``group.id``,
    ...; ``enable.auto.commit`` is forced off). ``process_batch(batch)`` runs in the
    executor for up to ``batch_size`` records, or what arrived within
    ``batch_timeout_s``; its records are committed once it returns. Refuses to start
    when ``members`` exceeds the free task slots (a barrier stage would wait forever).
    """
    if members < 1:
        raise ValueError(f"members must be >= 1, got {members}")
    if not topics:
        raise ValueError("topics: subscribe to at least one topic (or one '^regex')")
    for key in ("bootstrap.servers", "group.id"):
        if not config.get(key):
            raise ValueError(f"config: {key} is required")
    slots = free_task_slots(spark)
    if members > slots:
        raise ValueError(
            f"members={members} exceeds the {slots} free task slot(s) of this Spark "
            "application: a barrier stage needs all its tasks running at once and would wait "
            "forever. Use fewer members, or more executor cores (local[N], "
            "spark.executor.cores x spark.executor.instances)"
        )
    if control_dir is None:
        control_dir = tempfile.mkdtemp(prefix="kip848-members-")
    cdir = Path(control_dir)
    cdir.mkdir(parents=True, exist_ok=True)
    (cdir / STOP_FILE).unlink(missing_ok=True)
    settings = _Settings(
        config=dict(config),
        topics=list(topics),
        control_dir=str(cdir),
        stop_after_s=stop_after_s,
        max_records=max_records,
        batch_size=batch_size,
        batch_timeout_s=batch_timeout_s,
        include_headers=include_headers,
    )
    job = GroupMembersJob(spark, cdir, members, f"kip848-members-{uuid.uuid4().hex[:8]}")

    def task(_: Iterator[Any]) -> Iterator[str]:
        from pyspark import BarrierTaskContext

        ctx = BarrierTaskContext.get()
        ctx.barrier()  # start together
        report = _MemberLoop(ctx.partitionId(), settings, process_batch).run()
        yield json.dumps(asdict(report))

    rdd = spark.sparkContext.parallelize(range(members), members).barrier().mapPartitions(task)
    thread = threading.Thread(target=job._run, args=(rdd.collect,), name="kip848-members")
    thread.daemon = True
    job._thread = thread
    thread.start()
    log.info("kip848: started %d group member(s) of %s; control dir %s", members,
             config.get("group.id"), cdir)  # fmt: skip
    return job


@dataclass(frozen=True)
class _Settings:
    config: dict[str, Any]
    topics: list[str]
    control_dir: str
    stop_after_s: float | None
    max_records: int | None
    batch_size: int
    batch_timeout_s: float
    include_headers: bool


class _MemberLoop:
    """One member inside a Spark task: consume, process, commit, react to rebalances."""

    def __init__(self, index: int, settings: _Settings, process_batch: ProcessBatch) -> None:
        self.index = index
        self.s = settings
        self.process_batch = process_batch
        self.dir = Path(settings.control_dir)
        self.buffer: list[Any] = []
        self.buffer_since = 0.0
        self.processed: dict[Partition, int] = {}  # next offset after processed records
        self.committed: dict[Partition, int] = {}
        self.report = MemberReport(index=index, member_id="")
        self._seq = 0
        self._events = open(self.dir / f"member-{index}.events.jsonl", "a", encoding="utf-8")  # noqa: SIM115

    def event(self, kind: str, **extra: Any) -> None:
        self._seq += 1
        record = {"t": time.time(), "seq": self._seq, "member": self.index, "kind": kind}
        record.update(extra)
        self._events.write(json.dumps(record) + "\n")
        self._events.flush()

    def run(self) -> MemberReport:
        from consumer_sdk import Consumer

        consumer = Consumer({**self.s.config, "enable.auto.commit": False})
        self.consumer = consumer
        self.report.member_id = consumer.member_id
        started = time.monotonic()
        try:
            consumer.subscribe(
                self.s.topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )  # fmt: skip
            self.event("start", pid=os.getpid(), member_id=consumer.member_id)
            last_check = 0.0
            while True:
                now = time.monotonic()
                if now - last_check >= _POLL_S:
                    last_check = now
                    self._write_progress()
                    reason = self._should_stop(now - started)
                    if reason:
                        self.report.stopped_by = reason
                        break
                want = max(self.s.batch_size - len(self.buffer), 1)
                msgs = consumer.consume(want, timeout=_POLL_S)
                for msg in msgs:
                    if msg.error() is None:
                        if not self.buffer:
                            self.buffer_since = time.monotonic()
                        self.buffer.append(msg)
                if self.buffer and (
                    len(self.buffer) >= self.s.batch_size
                    or time.monotonic() - self.buffer_since >= self.s.batch_timeout_s
                ):
                    self._flush()
                    self._commit(None, asynchronous=True)
                    if self.s.max_records is not None:
                        last_check = 0.0  # check the record budget after every batch
            self._flush()
            self._commit(None, asynchronous=False)
        finally:
            self.event("closing")
            consumer.close(timeout=10.0)  # revoke callbacks commit first; then leave
            self.event("closed")
            self._write_progress(final=True)
            self._events.close()
        return self.report

    def _should_stop(self, elapsed: float) -> str:
        if (self.dir / STOP_FILE).exists():
            return "stop-file"
        if self.s.stop_after_s is not None and elapsed >= self.s.stop_after_s:
            return "stop_after_s"
        if self.s.max_records is not None:
            total = self.report.records  # plus the others' last published counts
            for path in self.dir.glob("member-*.json"):
                if path.name == f"member-{self.index}.json":
                    continue
                try:
                    total += int(json.loads(path.read_text())["records"])
                except (OSError, ValueError, KeyError):
                    continue
            if total >= self.s.max_records:
                return "max_records"
        return ""

    def _write_progress(self, final: bool = False) -> None:
        data = {**asdict(self.report), "final": final}
        tmp = self.dir / f".member-{self.index}.json.tmp"
        tmp.write_text(json.dumps(data))
        tmp.replace(self.dir / f"member-{self.index}.json")

    def _flush(self) -> None:
        """Process everything buffered (any partition)."""
        if not self.buffer:
            return
        from spark_integration.executor import records_to_batch

        msgs, self.buffer = self.buffer, []
        self.process_batch(records_to_batch(msgs, self.s.include_headers))
        spans: dict[Partition, list[int]] = {}
        for m in msgs:
            p = (m.topic(), m.partition())
            self.processed[p] = max(self.processed.get(p, -1), m.offset() + 1)
            span = spans.setdefault(p, [m.offset(), m.offset()])
            span[0], span[1] = min(span[0], m.offset()), max(span[1], m.offset())
        self.report.records += len(msgs)
        self.report.batches += 1
        self.event("processed", records=len(msgs),
                   spans={f"{t}:{p}": s for (t, p), s in sorted(spans.items())})  # fmt: skip

    def _commit(self, parts: set[Partition] | None, asynchronous: bool) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        todo = {
            p: o
            for p, o in self.processed.items()
            if (parts is None or p in parts) and self.committed.get(p) != o
        }
        if not todo:
            return
        try:
            self.consumer.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in sorted(todo.items())],
                asynchronous=asynchronous,
            )
        except KafkaException as exc:
            log.warning("kip848 member %d: commit failed: %s", self.index, exc)
            self.event("commit-failed", offsets=_keyed(todo), error=str(exc))
            return
        self.committed.update(todo)
        self.report.commits += 1
        self.event("commit", offsets=_keyed(todo), sync=not asynchronous)

    def _on_assign(self, consumer: Any, tps: list[Any]) -> None:
        if tps:
            self.event("assign", partitions=[f"{tp.topic}:{tp.partition}" for tp in tps],
                       epoch=consumer.member_epoch)  # fmt: skip

    def _on_revoke(self, consumer: Any, tps: list[Any]) -> None:
        if not tps:
            return
        parts = {(tp.topic, tp.partition) for tp in tps}
        names = [f"{t}:{p}" for t, p in sorted(parts)]
        self.event("revoke-start", partitions=names)
        self._flush()
        self._commit(parts, asynchronous=False)  # before the partitions are released
        for p in parts:
            self.processed.pop(p, None)
            self.committed.pop(p, None)
        self.report.revocations += 1
        self.event("revoke-done", partitions=names)

    def _on_lost(self, consumer: Any, tps: list[Any]) -> None:
        parts = {(tp.topic, tp.partition) for tp in tps}
        if not parts:
            return
        # Not ours any more: its buffered records are dropped, and nothing is committed.
        self.buffer = [m for m in self.buffer if (m.topic(), m.partition()) not in parts]
        for p in parts:
            self.processed.pop(p, None)
            self.committed.pop(p, None)
        self.report.lost += 1
        self.event("lost", partitions=[f"{t}:{p}" for t, p in sorted(parts)])


def _keyed(offsets: Mapping[Partition, int]) -> dict[str, int]:
    return {f"{t}:{p}": o for (t, p), o in sorted(offsets.items())}
