"""Executor members: N long-lived ``consumer_sdk.Consumer`` group members as Spark tasks.

`run_group_members` runs each member as its own single-task Spark job, supervised by
a driver thread. Each task is one member of the group: it consumes, hands records to
``process_batch`` as a ``pyarrow.RecordBatch`` in the Kafka source schema, and commits
what was processed. ``on_revoke`` processes what is buffered and commits synchronously
before the partitions are released, so the next owner starts exactly after this
member's work; only ``on_lost`` (fencing, session expiry) or a member's death can make
another member repeat records. Delivery is at-least-once: make ``process_batch``
idempotent.

A member whose task dies (its Python worker killed, an executor lost, ``process_batch``
raising) is restarted by its supervisor with exponential backoff while the other members
keep their partitions and go on; the job ends only when the user stops it (or at
``stop_after_s`` / ``max_records``).

Control channel: a directory (``control_dir``; a temporary one on the driver by
default, which is only visible to executors in local mode: on a cluster pass a path on a
shared filesystem). Members stop when the file ``STOP`` appears in it
(`GroupMembersJob.stop`), after ``stop_after_s`` seconds, or once the members
together processed ``max_records`` records; each member writes ``member-<i>.json``
(progress, cumulative over restarts) and ``member-<i>.events.jsonl`` (its callbacks,
batches and commits) there.
"""

from __future__ import annotations

import contextlib
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
    restarts: int = 0


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
    """Handle of running `run_group_members` members (one supervised job each)."""

    def __init__(
        self,
        spark: Any,
        control_dir: Path,
        members: int,
        job_group: str,
        backoff_s: tuple[float, float] = (1.0, 30.0),
        max_restarts: int | None = None,
    ) -> None:
        self.control_dir = control_dir
        self.members = members
        self.job_group = job_group
        self._spark = spark
        self._backoff = backoff_s
        self._max_restarts = max_restarts
        self._stopping = threading.Event()
        self._reports: dict[int, MemberReport] = {}
        self._restarts: dict[int, int] = dict.fromkeys(range(members), 0)
        self._errors: dict[int, BaseException] = {}
        self._threads: list[threading.Thread] = []

    @property
    def stop_file(self) -> Path:
        return self.control_dir / STOP_FILE

    @property
    def restarts(self) -> dict[int, int]:
        """How many times each member was restarted after its task died."""
        return dict(self._restarts)

    def _supervise(self, index: int, job: Callable[[int], list[str]]) -> None:
        """Run member ``index`` until it stops by itself; restart it when its task dies."""
        failures = 0
        while True:
            began = time.monotonic()
            try:
                self._spark.sparkContext.setJobGroup(
                    f"{self.job_group}-{index}", f"kip848 group member {index}", True
                )
                (report,) = job(index)
                self._reports[index] = MemberReport(**json.loads(report))
                return
            except BaseException as exc:
                if self.stop_file.exists():
                    return  # stopped while it was failing: nothing to restart
                if self._stopping.is_set():  # cancelled
                    self._errors.setdefault(index, exc)
                    return
                if self._max_restarts is not None and self._restarts[index] >= self._max_restarts:
                    self._errors[index] = exc
                    return
                failures = 1 if time.monotonic() - began > self._backoff[1] else failures + 1
                delay = min(self._backoff[0] * 2 ** (failures - 1), self._backoff[1])
                self._restarts[index] += 1
                log.warning(
                    "kip848: group member %d died (%s); restarting it in %.1f s (restart %d)",
                    index,
                    str(exc).splitlines()[0][:300],
                    delay,
                    self._restarts[index],
                )
                if self._stopping.wait(delay):
                    return

    def stop(self, timeout: float | None = 60.0) -> list[MemberReport]:
        """Ask every member to flush, commit and leave the group; wait for them."""
        self.stop_file.touch()
        return self.wait(timeout)

    def cancel(self) -> None:
        """Cancel the Spark jobs (members are killed: no final commit, no clean leave)."""
        self._stopping.set()
        for index in range(self.members):
            self._spark.sparkContext.cancelJobGroup(f"{self.job_group}-{index}")

    def running(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def wait(self, timeout: float | None = None) -> list[MemberReport]:
        """The members' reports once all stopped; raises a member's error, or TimeoutError."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            thread.join(None if deadline is None else max(deadline - time.monotonic(), 0))
            if thread.is_alive():
                raise TimeoutError(f"group members still running after {timeout}s")
        self._stopping.set()
        if self._errors:
            raise next(iter(self._errors.values()))
        reports = sorted(self._reports.values(), key=lambda r: r.index)
        for r in reports:
            r.restarts = self._restarts[r.index]
        return reports

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
                    with contextlib.suppress(ValueError):  # a line cut by a kill
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
    restart_backoff_s: tuple[float, float] = (1.0, 30.0),
    max_restarts: int | None = None,
) -> GroupMembersJob:
    """Start ``members`` supervised group members, each a long-running Spark task.

    ``config`` is a ``consumer_sdk.Consumer`` config (``bootstrap.servers``, ``group.id``,
    ...; ``enable.auto.commit`` is forced off). ``process_batch(batch)`` runs in the
    executor for up to ``batch_size`` records, or what arrived within
    ``batch_timeout_s``; its records are committed once it returns. A member whose task
    dies is restarted after ``restart_backoff_s`` (initial, maximum; doubling), without
    limit unless ``max_restarts`` is set. Refuses to start when ``members`` exceeds the
    free task slots (a member would wait for a slot forever).
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
            "application: every member is a task that runs until stopped, so the others "
            "would wait forever. Use fewer members, or more executor cores (local[N], "
            "spark.executor.cores x spark.executor.instances)"
        )
    if control_dir is None:
        control_dir = tempfile.mkdtemp(prefix="kip848-members-")
    cdir = Path(control_dir)
    cdir.mkdir(parents=True, exist_ok=True)
    (cdir / STOP_FILE).unlink(missing_ok=True)
    for stale in cdir.glob("member-*.json"):
        stale.unlink(missing_ok=True)
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
    job = GroupMembersJob(
        spark,
        cdir,
        members,
        f"kip848-members-{uuid.uuid4().hex[:8]}",
        restart_backoff_s,
        max_restarts,
    )

    def task(indexes: Iterator[int]) -> Iterator[str]:
        for index in indexes:
            report = _MemberLoop(index, settings, process_batch).run()
            yield json.dumps(asdict(report))

    sc = spark.sparkContext

    def one(index: int) -> list[str]:
        return list(sc.parallelize([index], 1).mapPartitions(task).collect())

    for index in range(members):
        thread = threading.Thread(
            target=job._supervise, args=(index, one), name=f"kip848-member-{index}", daemon=True
        )
        job._threads.append(thread)
        thread.start()
    log.info(
        "kip848: started %d group member(s) of %s; control dir %s",
        members,
        config.get("group.id"),
        cdir,
    )
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
        self.committed: dict[Partition, int] = {}  # confirmed by a synchronous commit
        # sent asynchronously, not confirmed: a synchronous commit (revoke, stop) sends them
        # again, as an asynchronous commit can fail (a rebalance's stale epoch) unseen
        self.sent_async: dict[Partition, int] = {}
        self.report = MemberReport(index=index, member_id="")
        self._carry_over()
        self._seq = 0
        self._events = open(self.dir / f"member-{index}.events.jsonl", "a", encoding="utf-8")  # noqa: SIM115

    def _carry_over(self) -> None:
        """A restarted member continues the counters of its previous run."""
        try:
            data = json.loads((self.dir / f"member-{self.index}.json").read_text())
        except (OSError, ValueError):
            return
        for key in ("records", "batches", "commits", "revocations", "lost"):
            setattr(self.report, key, int(data.get(key, 0)))

    def event(self, kind: str, **extra: Any) -> None:
        self._seq += 1
        record = {
            "t": time.time(),
            "seq": self._seq,
            "member": self.index,
            "kind": kind,
            "pid": os.getpid(),
        }
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
                self.s.topics,
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
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
        self.event(
            "processed",
            records=len(msgs),
            spans={f"{t}:{p}": s for (t, p), s in sorted(spans.items())},
        )

    def _commit(self, parts: set[Partition] | None, asynchronous: bool) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        todo = {
            p: o
            for p, o in self.processed.items()
            if (parts is None or p in parts)
            and self.committed.get(p) != o
            and not (asynchronous and self.sent_async.get(p) == o)
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
        (self.sent_async if asynchronous else self.committed).update(todo)
        self.report.commits += 1
        self.event("commit", offsets=_keyed(todo), sync=not asynchronous)

    def _on_assign(self, consumer: Any, tps: list[Any]) -> None:
        if tps:
            self.event(
                "assign",
                partitions=[f"{tp.topic}:{tp.partition}" for tp in tps],
                epoch=consumer.member_epoch,
            )

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
            self.sent_async.pop(p, None)
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
            self.sent_async.pop(p, None)
        self.report.lost += 1
        self.event("lost", partitions=[f"{t}:{p}" for t, p in sorted(parts)])


def _keyed(offsets: Mapping[Partition, int]) -> dict[str, int]:
    return {f"{t}:{p}": o for (t, p), o in sorted(offsets.items())}
