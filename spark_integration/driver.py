"""Driver side of the ``kip848`` source: one group member per query run, and its offsets.

`GroupReader` runs in the process that hosts the stream reader (pyspark's
``python_streaming_source_runner``: one long-lived Python process per source per query
run, next to the driver JVM). It is Spark-agnostic so it can be tested on its own; the
``DataSourceStreamReader`` in `spark_integration.source` only delegates to it.

Protocol (see docs/spark.md):

* ``latest_offset(start)`` runs when the batch ending at ``start`` is durable (Spark builds
  batch N+1 only after batch N's commit-log entry). It marks ``start`` durable, commits it
  to Kafka, then polls the member: a revocation commits the revoked partitions' durable
  offsets synchronously inside ``on_revoke``, before the partitions are released; an
  assignment starts a partition at max(group's committed offset, what this query's sink
  already holds), else ``startingOffsets``. The new offset covers owned partitions only
  and records those starts under ``@meta.starts``.
* ``commit(end)`` (Spark's "batch is durable", one batch late, called after the next
  batch was planned) marks ``end`` durable and commits it, but never serves the member:
  a revocation is served only where no batch is in flight, so a partition revoked from
  this query is never read by a batch planned after the revocation was served.
* With ``checkpointLocation``, a watcher thread commits each batch as soon as Spark wrote
  its commit-log entry, and ``close`` reads the commit log before the member leaves, so
  the last batch before a stop (and Trigger.Once's only batch) is committed exactly.
* ``plan(start, end)`` turns a logged batch into offset ranges. A batch replayed after a
  restart reads only the partitions this run owns (from the group's committed offset if
  another member got further); the others are read by their owners.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from typing import Any

from confluent_kafka import KafkaException, TopicPartition

from spark_integration.checkpoint import CommitLog
from spark_integration.lookups import UNKNOWN, ClusterOffsets, Watermarks
from spark_integration.member import (
    AssignedPartitions,
    SourceMember,
    committed_offsets,
    partitions_of,
)
from spark_integration.offsets import (
    DataLossError,
    OffsetRange,
    Partition,
    SourceOffset,
    SourceStartupError,
    rate_limit,
    split_by_size,
    split_ranges,
)
from spark_integration.options import SourceOptions

__all__ = ["GroupReader"]

log = logging.getLogger("spark_integration")
_KAFKA_LOG = logging.getLogger("spark_integration.librdkafka")

_EMITTED_MEMORY = 64
_CLOSE_TIMEOUT_S = 10.0
#: How often the commit-log watcher looks for a newly durable batch.
_WATCH_INTERVAL_S = 0.2
#: Poll slice while the member finishes reconciling its first assignment.
_JOIN_SLICE_S = 0.005
_RECONCILED_SOON = frozenset({"RECONCILING", "ACKNOWLEDGING"})
#: Bound on a synchronous commit's retries (a deleted topic's partitions fail retriably).
_COMMIT_TIMEOUT_S = 5.0


#: The module pyspark runs (``python -m``) as the stream-reader process.
STREAM_READER_MAIN = "pyspark.sql.streaming.python_streaming_source_runner"
_member_import_lock = threading.Lock()
_import_started = threading.Event()


def in_stream_reader_process() -> bool:
    """Whether this is pyspark's stream-reader process (its runner module is ``__main__``)."""
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(main, "name", None) == STREAM_READER_MAIN


def _member_class() -> Callable[[dict[str, Any]], SourceMember]:
    """``consumer_sdk.GroupMember``, imported on first use (a few hundred ms).

    In pyspark's stream-reader process (a new process per query run, hosting only the
    stream readers) it is imported with ``hypothesis`` hidden: ``kio`` registers
    hypothesis strategies for every wire type whenever hypothesis is importable (a test
    dependency, so in development and CI environments), which costs that process 100-200 ms
    of CPU at each query start and serves nothing there. Hidden only during the import.
    """
    with _member_import_lock:
        hide = (
            in_stream_reader_process()
            and "hypothesis" not in sys.modules
            and "kio" not in sys.modules
        )
        if hide:
            sys.modules["hypothesis"] = None  # type: ignore[assignment]
        try:
            from consumer_sdk import GroupMember
        finally:
            if hide and "hypothesis" in sys.modules and sys.modules["hypothesis"] is None:
                del sys.modules["hypothesis"]
    return GroupMember


def _import_sdk() -> None:
    with contextlib.suppress(Exception):  # the member's creation reports any failure
        _member_class()


def start_member_import() -> None:
    """Import ``consumer_sdk`` on a thread of its own, once per process: the stream reader
    starts it when Spark constructs it, so the import overlaps Spark's calls before the
    first one that needs the member (and the broker check in that call)."""
    if not _import_started.is_set():
        _import_started.set()
        threading.Thread(target=_import_sdk, name="kip848-import", daemon=True).start()


def _group_member(config: dict[str, Any]) -> SourceMember:
    return _member_class()(config)


def _close_built(built: Future[SourceMember]) -> None:
    """Close a member created for a reader whose start failed (it leaves its group)."""
    if built.exception() is None:
        with contextlib.suppress(Exception):
            built.result().close(timeout=_CLOSE_TIMEOUT_S)


def _names(parts: Iterable[Partition]) -> str:
    by_topic: dict[str, list[int]] = {}
    for t, p in sorted(parts):
        by_topic.setdefault(t, []).append(p)
    return "; ".join(f"topic {t!r} partitions {ps}" for t, ps in by_topic.items())


class GroupReader:
    """The query's ``GroupMember`` plus the offset bookkeeping of the source.

    Created lazily; the member joins on first use. Spark calls it from one thread (the
    stream-reader process's main thread); the member is served (its rebalance callbacks
    run) only inside ``latest_offset``, where no batch is in flight. A lock serialises
    Spark's calls with the commit-log watcher thread, which only commits.
    """

    def __init__(
        self,
        options: SourceOptions,
        member_factory: Callable[[dict[str, Any]], SourceMember] | None = None,
    ) -> None:
        self.options = options
        self._member_factory = member_factory
        if member_factory is None and options.membership:
            # Import consumer_sdk (a few hundred ms) while the first call waits on the
            # broker (startup check, metadata): librdkafka's waits release the GIL.
            start_member_import()
        self._member: SourceMember | None = None
        self._lookups = ClusterOffsets(options)
        self._lock = threading.RLock()
        self._owned: set[Partition] = set()
        self._durable: dict[Partition, int] = {}  # owned: what the sink durably holds
        self._pending: dict[Partition, int] = {}  # assigned since the last emitted offset
        self._hints: dict[Partition, int] = {}  # sink (or group) holds each partition up to
        self._kafka_committed: dict[Partition, int] = {}
        self._emitted: OrderedDict[str, None] = OrderedDict()
        self._initial: dict[str, Any] | None = None
        self._last_end: SourceOffset | None = None  # the last batch end handed to Spark
        self._durable_keys: set[str] = set()
        self._available_now: dict[Partition, int] | None = None
        self._latest: dict[Partition, int] = {}
        self._behind: dict[Partition, int] = {}  # the last planned end, behind latest
        self._scope: set[Partition] | None = None  # where startingOffsets applies
        self._restarted = False
        self._gone: set[Partition] = set()  # deleted, reported (failOnDataLoss=false)
        self._last_trigger = time.monotonic()  # maxTriggerDelay counts from the start
        self._callback_error: Exception | None = None
        self._waited = False
        self._skipped: dict[Partition, int] = {}  # replayed without it: the sink holds up to
        self._commit_log = CommitLog(options.checkpoint) if options.checkpoint else None
        self._commit_log_batch: int | None = None
        self._warned_unknown_end = False
        self._closed = False
        self._joined = False
        self._watcher: threading.Thread | None = None
        self._stop_watch = threading.Event()  # set by close: also ends a startup check
        self._building: Future[SourceMember] | None = None  # started, not yet handed over
        self._checking: Future[set[Partition]] | None = None
        self._event_log = options.event_log
        self.events: list[dict[str, Any]] = []
        self._event(
            "start",
            [],
            pid=os.getpid(),
            cpu=round(time.process_time(), 3),
            description=options.description,
        )

    # -- membership -------------------------------------------------------------------------

    @property
    def member(self) -> SourceMember | None:
        return self._member

    @property
    def owned(self) -> set[Partition]:
        return set(self._owned)

    def _ensure_member(self, wait: bool) -> SourceMember:
        if self._closed:
            raise RuntimeError("the kip848 source reader is closed")
        if self._member is None:
            member: SourceMember
            if self.options.membership:
                self.start()
                building, checking = self._building, self._checking
                assert building is not None and checking is not None
                self._building = self._checking = None  # handed over: closed here on failure
                try:
                    existing = checking.result()
                except BaseException:
                    building.add_done_callback(_close_built)
                    raise
                self._scope = set() if self._restarted else existing
                try:
                    member = building.result(timeout=self.options.join_timeout_ms / 1000)
                except FutureTimeout:
                    building.add_done_callback(_close_built)
                    raise SourceStartupError(
                        f"kip848: the group member was not created within "
                        f"{self.options.join_timeout_ms} ms (joinTimeoutMs)"
                    ) from None
            else:
                existing = self._await_startup()
                self._scope = set() if self._restarted else existing
                member = AssignedPartitions(self.options)
                self._subscribe(member)
            self._member = member
            log.info(
                "kip848: joining group %s for %s",
                self.options.group_id,
                self.options.subscription or self.options.assign,
            )
            self._joined = False
            self._start_watcher()
        if wait and not self._joined:
            started = time.monotonic()
            self._wait_stable(self._member)
            self._joined = True
            ms = round((time.monotonic() - started) * 1000)
            log.info(
                "kip848: group %s: assignment reconciled in %d ms: %s",
                self.options.group_id,
                ms,
                _names(self._owned),
            )
            self._event(
                "stable",
                sorted(self._owned),
                ms=ms,
                epoch=self._member.member_epoch,
                cpu=round(time.process_time(), 3),
            )
        return self._member

    def start(self) -> None:
        """Start joining now, before the first call that needs the member: the member is
        created and subscribes on one thread (``kip848-join``) while another checks the
        broker and topics (``kip848-check``). Its rebalance callbacks still run only in
        Spark's thread's polls, after the check (they read its result, ``_scope``)."""
        with self._lock:
            if (
                not self.options.membership
                or self._closed
                or self._member is not None
                or self._building is not None
            ):
                return
            self._building = Future()
            self._checking = Future()
            threading.Thread(
                target=self._build_member, args=(self._building,), name="kip848-join", daemon=True
            ).start()
            threading.Thread(
                target=self._check, args=(self._checking,), name="kip848-check", daemon=True
            ).start()

    def _check(self, result: Future[set[Partition]]) -> None:
        """On the ``kip848-check`` thread: `_await_startup`."""
        try:
            existing = self._await_startup()
        except BaseException as exc:
            result.set_exception(exc)
        else:
            result.set_result(existing)

    def _subscribe(self, member: SourceMember) -> None:
        member.subscribe(
            self.options.subscription,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _build_member(self, result: Future[SourceMember]) -> None:
        """On the ``kip848-join`` thread: create the group member and subscribe."""
        try:
            member = (self._member_factory or _group_member)(self.options.member_config())
            self._subscribe(member)
        except BaseException as exc:
            result.set_exception(exc)
        else:
            result.set_result(member)

    def _await_startup(self) -> set[Partition]:
        """Wait (joinTimeoutMs) for a broker and the subscribed topics; else a clear error.

        Returns the partitions that exist now: ``startingOffsets`` applies to them, and
        partitions that appear later start at the earliest offset (Spark's rule).
        """
        o = self.options
        wait_ms = o.join_timeout_ms
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            if self._stop_watch.is_set():
                raise SourceStartupError("kip848: the source was stopped while starting")
            remaining = max(deadline - time.monotonic(), 0.0)
            try:
                md = self._lookups.client().list_topics(timeout=max(min(remaining, 5.0), 0.5))
            except KafkaException as exc:
                if time.monotonic() >= deadline:
                    raise SourceStartupError(
                        f"kip848: no Kafka broker answered at kafka.bootstrap.servers="
                        f"{o.bootstrap_servers} within {wait_ms} ms (joinTimeoutMs): "
                        f"{exc.args[0].str()}"
                    ) from None
                self._stop_watch.wait(min(0.5, remaining))
                continue
            topics = {
                name: sorted(t.partitions)
                for name, t in md.topics.items()
                if t.error is None or t.error.code() not in UNKNOWN
            }
            if o.assign:
                missing = [f"{t}[{p}]" for t, p in o.assign if p not in topics.get(t, ())]
                what = "assigned partition(s)"
            else:
                missing = [t for t in o.topics if t not in topics]
                what = "subscribed topic(s)"
            if not missing:
                return {(t, p) for t, ps in topics.items() if o.matches(t) for p in ps}
            if time.monotonic() >= deadline:
                raise SourceStartupError(
                    f"kip848: {what} {missing} do not exist on {o.bootstrap_servers} (waited "
                    f"{wait_ms} ms, joinTimeoutMs): create them, or fix the "
                    f"{'assign' if o.assign else 'subscribe'} option"
                )
            self._stop_watch.wait(min(0.5, remaining))

    def _wait_stable(self, member: SourceMember) -> None:
        """Poll until the member has reconciled its first assignment (bounded).

        A poll returns as soon as a rebalance callback ran, but the step after it (the
        member acknowledging its assignment: ACKNOWLEDGING, then STABLE) queues no callback:
        once reconciling, poll in short slices so the query does not wait out a long one.
        """
        deadline = time.monotonic() + self.options.join_timeout_ms / 1000
        while True:
            self._poll(member, _JOIN_SLICE_S if member.state.name in _RECONCILED_SOON else 0.1)
            if member.state.name == "STABLE" and (
                member.member_epoch > 0 or not self.options.membership
            ):
                return
            if time.monotonic() >= deadline:
                log.warning(
                    "kip848: group %s: not stable after %d ms (state %s); continuing with %s",
                    self.options.group_id,
                    self.options.join_timeout_ms,
                    member.state.name,
                    sorted(self._owned),
                )
                return

    def _poll(self, member: SourceMember, timeout: float = 0.0) -> None:
        """Serve the member: run the rebalance callbacks its heartbeat thread queued.

        Called once per Spark call (latestOffset, commit), so callbacks never run while a
        Spark call is half done; no waiting here (the heartbeat thread runs on its own).
        """
        try:
            member.poll(timeout)
        except KafkaException as exc:
            failure, self._callback_error = self._callback_error, None
            if failure is not None:  # ours, e.g. a timestamp with no record: the query fails
                raise failure from None
            error = exc.args[0]
            if error.fatal():
                raise
            log.warning("kip848: group %s: %s", self.options.group_id, error.str())

    def _on_assign(self, member: SourceMember, tps: list[TopicPartition]) -> None:
        try:
            self._assign(member, tps)
        except Exception as exc:
            self._callback_error = exc
            raise

    def _assign(self, member: SourceMember, tps: list[TopicPartition]) -> None:
        parts = partitions_of(tps)
        if not parts:
            return
        began = time.monotonic()
        # One watermark lookup for both the starts and the AvailableNow bound, sent while the
        # committed offsets are fetched when it may be needed (an unknown partition may
        # have no committed offset).
        lookup: Future[Watermarks] | None = None
        if self._available_now is not None or any(p not in self._hints for p in parts):
            lookup = Future()
            threading.Thread(
                target=self._watermarks_into, args=(parts, lookup), name="kip848-marks"
            ).start()
        try:
            committed = committed_offsets(member, parts)
        finally:
            if lookup is not None:
                wait_futures([lookup])  # none outlives this call, even if the fetch failed
        fetched = time.monotonic()
        fresh = [p for p in parts if p not in committed and p not in self._hints]
        marks = None
        if fresh or self._available_now is not None:
            marks = lookup.result() if lookup is not None else self._lookups.watermarks(parts)
        starting = self._fresh_starts(fresh, marks)
        looked = time.monotonic()
        for p in parts:
            known = [o for o in (committed.get(p), self._hints.get(p)) if o is not None]
            if known:
                start = max(known)
                self._durable[p] = start
            else:
                start = starting[p]
                self._durable.pop(p, None)
            self._pending[p] = start
            self._owned.add(p)
            self._gone.discard(p)
        if self._available_now is not None and marks is not None:
            self._available_now.update(marks[1])
        self._event(
            "assign",
            parts,
            starts={f"{t}:{p}": self._pending[(t, p)] for t, p in parts},
            epoch=member.member_epoch,
            committed_ms=round((fetched - began) * 1000, 1),
            offsets_ms=round((looked - fetched) * 1000, 1),
        )

    def _watermarks_into(self, parts: list[Partition], result: Future[Watermarks]) -> None:
        """On a ``kip848-marks`` thread: the partitions' watermarks into ``result``."""
        try:
            result.set_result(self._lookups.watermarks(parts))
        except BaseException as exc:
            result.set_exception(exc)

    def _on_revoke(self, member: SourceMember, tps: list[TopicPartition]) -> None:
        parts = partitions_of(tps)
        if not parts:
            return
        offsets = {p: self._durable[p] for p in parts if p in self._durable}
        committed: dict[Partition, int] = {}
        if offsets:
            # Before the revocation is acknowledged: the next owner starts where this query's
            # sink durably stops. A failure here only means that owner re-reads some records.
            try:
                committed = self._commit(member, offsets)
                self._kafka_committed.update(committed)
            except (KafkaException, ValueError) as exc:
                log.warning("kip848: commit on revoke of %s failed: %s", parts, exc)
        self._drop(parts)
        self._event(
            "revoke",
            parts,
            committed={f"{t}:{p}": o for (t, p), o in committed.items()},
            epoch=member.member_epoch,
        )

    def _on_lost(self, member: SourceMember, tps: list[TopicPartition]) -> None:
        parts = partitions_of(tps)
        self._drop(parts)
        self._event("lost", parts)

    def _drop(self, parts: Iterable[Partition]) -> None:
        for p in parts:
            self._owned.discard(p)
            self._durable.pop(p, None)
            self._pending.pop(p, None)
            self._kafka_committed.pop(p, None)

    # -- Spark's calls -------------------------------------------------------------------------

    def initial_offset(self) -> dict[str, Any]:
        """Offsets of the partitions owned once joined (the same dict on every call)."""
        with self._lock:
            if self._initial is None:
                member = self._ensure_member(wait=True)
                offset = SourceOffset(
                    positions=dict(self._pending),
                    epoch=member.member_epoch,
                    member_id=member.member_id,
                )
                self._pending.clear()
                self._remember(offset)
                self._initial = offset.to_json()
            return self._initial

    def latest_offset(
        self,
        start: Mapping[str, Any] | None,
        max_rows: int | None = None,
        min_rows: int = 0,
        all_available: bool = False,
    ) -> dict[str, Any]:
        """The end of the next batch (``start`` itself when there is nothing new).

        ``min_rows`` (ReadMinRows, or minOffsetsPerTrigger) holds the batch back until that
        many records are available or ``maxTriggerDelay`` passed since the last batch;
        ``all_available`` (Trigger.Once, AvailableNow) ignores it.
        """
        with self._lock:
            return self._latest_offset(start, max_rows, min_rows, all_available)

    def _latest_offset(
        self,
        start: Mapping[str, Any] | None,
        max_rows: int | None,
        min_rows: int,
        all_available: bool,
    ) -> dict[str, Any]:
        begin = SourceOffset.from_json(start)
        if self._initial is None and self._member is None:
            self._restarted = True  # resumed from a checkpoint: initialOffset never called
        self._learn(begin)
        member = self._ensure_member(wait=True)
        if begin.positions and not self._owned and not self._waited and self.options.membership:
            # Resumed from a checkpoint while the previous run's member (not left) may hold
            # the partitions until its session expires: wait for an assignment once, or
            # AvailableNow would end at once with nothing read.
            self._waited = True
            deadline = time.monotonic() + self.options.join_timeout_ms / 1000
            while not self._owned and time.monotonic() < deadline:
                self._poll(member, 0.2)
        self._mark_durable(begin)
        self._commit_durable(member, serve=True)
        self._poll(member)
        froms: dict[Partition, int] = {}
        for p in sorted(self._owned - self._gone):
            if p in self._pending:
                froms[p] = self._pending[p]
            elif p in begin.positions:
                froms[p] = begin.positions[p]
            else:  # owned but never started (should not happen): start it now
                froms[p] = self._fresh_starts([p])[p]
        low, high, unknown = self._lookups.watermarks(froms)
        gone = self._deleted(set(unknown) | (set(begin.positions) - self._owned))
        if gone:
            self._report_deleted(gone, begin)
        for p in unknown:
            if p in gone:
                froms.pop(p, None)
            else:  # not deleted: metadata not propagated yet; no new data this time
                low[p] = high[p] = froms[p]
        lost = {
            p: (frm, low[p], high[p]) for p, frm in froms.items() if frm < low[p] or frm > high[p]
        }
        if lost:
            self._data_loss(lost)
            for p in lost:
                froms[p] = low[p]
        latest = {p: high[p] for p in froms}
        if self._available_now is not None:
            latest = {p: min(o, self._available_now.get(p, o)) for p, o in latest.items()}
        latest = {p: max(o, froms[p]) for p, o in latest.items()}
        self._latest = latest
        ends = rate_limit(max_rows, froms, latest) if max_rows else latest
        self._behind = {p: max(high.get(p, o) - o, 0) for p, o in ends.items()}
        starts = {p: o for p, o in froms.items() if begin.positions.get(p) != o}
        if not starts and ends == begin.positions:
            return dict(start or {})
        backlog = sum(ends[p] - froms[p] for p in ends)
        if (
            min_rows > 0
            and not all_available
            and self._available_now is None
            and backlog < min_rows
            and not starts
            and set(ends) == set(begin.positions)
            and time.monotonic() - self._last_trigger < self.options.max_trigger_delay_ms / 1000
        ):
            return dict(start or {})  # minOffsetsPerTrigger: wait for more data or the delay
        self._last_trigger = time.monotonic()
        offset = SourceOffset(ends, starts, member.member_epoch, member.member_id)
        self._pending.clear()
        for p in starts:
            self._skipped.pop(p, None)
        self._remember(offset)
        self._last_end = offset
        return offset.to_json()

    def report_latest_offset(self) -> dict[str, Any] | None:
        """Latest offsets seen by the last ``latest_offset``, plus ``@source``: the
        description and the offsets behind latest (progress's ``sources[].latestOffset``:
        pyspark gives Python sources no ``metrics``)."""
        if not self._latest:
            return None
        report = SourceOffset(positions=dict(self._latest)).to_json()
        report["@source"] = {"description": self.options.description, **self.lag_metrics()}
        return report

    def lag_metrics(self) -> dict[str, str]:
        """Spark's Kafka source metrics for the last planned batch: how far its end is
        behind the partitions' latest offsets (min, max, avg over owned partitions)."""
        behind = list(self._behind.values())
        if not behind:
            return {}
        return {
            "minOffsetsBehindLatest": str(min(behind)),
            "maxOffsetsBehindLatest": str(max(behind)),
            "avgOffsetsBehindLatest": f"{sum(behind) / len(behind):.1f}",
        }

    def prepare_for_trigger_available_now(self) -> None:
        """Bound this run to the data available now (high watermarks of owned partitions)."""
        with self._lock:
            joining = self._member is None
            if joining:
                self._available_now = {}  # the assignment's lookup fills it in
            self._ensure_member(wait=True)
            owned = self._owned - self._gone
            bound = dict(self._available_now) if joining and self._available_now else {}
            todo = owned - set(bound)
            if todo:
                bound.update(self._lookups.watermarks(todo)[1])
            self._available_now = bound

    def plan(self, start: Mapping[str, Any] | None, end: Mapping[str, Any]) -> list[OffsetRange]:
        """Offset ranges of the batch ``(start, end]`` (deterministic from the two offsets)."""
        with self._lock:
            return self._plan(start, end)

    def _plan(self, start: Mapping[str, Any] | None, end: Mapping[str, Any]) -> list[OffsetRange]:
        begin, finish = SourceOffset.from_json(start), SourceOffset.from_json(end)
        self._learn(begin)
        ranges: list[OffsetRange] = []
        for (topic, partition), until in sorted(finish.positions.items()):
            frm = finish.starts.get((topic, partition), begin.positions.get((topic, partition)))
            if frm is None:
                log.warning("kip848: %s[%d] has no start in %s; skipped", topic, partition, start)
                continue
            if frm < until:
                ranges.append(OffsetRange(topic, partition, frm, until))
        if finish.key() not in self._emitted and ranges and self.options.membership:
            ranges = self._replay_ranges(ranges)
        ranges = split_by_size(ranges, self.options.max_records_per_partition)
        return split_ranges(ranges, self.options.min_partitions)

    def _replay_ranges(self, ranges: list[OffsetRange]) -> list[OffsetRange]:
        """A batch of an earlier run, replayed after a restart: read only what is ours.

        Every partition this run does not own now is read by its owner from the group's
        committed offset on, and what lies before that offset is in a sink already: the
        replay skips it, and this run remembers that its sink holds it only up to the
        range's start (should it be assigned again). An owned partition is read from the
        range's start, or from the group's committed offset if another member got further.
        """
        member = self._ensure_member(wait=True)
        owned = [r for r in ranges if r.tp in self._owned]
        for r in ranges:
            if r.tp not in self._owned:
                self._skipped[r.tp] = min(self._skipped.get(r.tp, r.from_offset), r.from_offset)
                self._hints[r.tp] = min(self._hints.get(r.tp, r.from_offset), r.from_offset)
        if len(owned) < len(ranges):
            log.info(
                "kip848: replaying a batch without %s (owned by another member now)",
                _names({r.tp for r in ranges} - {r.tp for r in owned}),
            )
        try:
            committed = committed_offsets(member, {r.tp for r in owned})
        except KafkaException as exc:  # e.g. a deleted topic: the executor reports it
            log.info("kip848: committed offsets for replay planning unavailable: %s", exc)
            committed = {}
        out = []
        for r in owned:
            c = committed.get(r.tp, -1)
            if c > r.from_offset:
                r = OffsetRange(r.topic, r.partition, min(c, r.until_offset), r.until_offset)
            out.append(r)
        return out

    def commit(self, end: Mapping[str, Any]) -> None:
        """Spark made the batch ending at ``end`` durable: commit it to Kafka.

        Does not serve the member: Spark calls this after it planned the next batch, and a
        revocation served here would hand over a partition that batch reads.
        """
        with self._lock:
            offset = SourceOffset.from_json(end)
            self._learn(offset)
            member = self._ensure_member(wait=False)
            self._mark_durable(offset)
            self._commit_durable(member, serve=False)

    def close(self, timeout: float = _CLOSE_TIMEOUT_S) -> None:
        """Leave the group (revoke callbacks commit durable offsets first). Idempotent.

        With ``checkpointLocation``, the commit log says whether the last batch completed,
        so the next owner starts exactly where this query's sink stops.
        """
        self._stop_watch.set()
        with self._lock:
            if self._closed:
                return
            self._sync_commit_log()
            self._warn_unknown_end()
            self._closed = True
            member, self._member = self._member, None
            building, self._building = self._building, None
            checking, self._checking = self._checking, None
            if checking is not None:  # started before Spark's first call, never used
                with contextlib.suppress(Exception):
                    wait_futures([checking], timeout=timeout)
            if building is not None:
                try:
                    member = building.result(timeout=timeout)
                except Exception as exc:
                    log.info("kip848: the group member was not created: %s", exc)
            if member is not None:
                with contextlib.suppress(KafkaException):
                    self._commit_durable(member, serve=False)
                try:
                    member.close(timeout=timeout)
                except Exception as exc:  # closing is best-effort; the session timeout cleans up
                    log.warning("kip848: closing the group member failed: %s", exc)
                self._event("left", [], member_id=member.member_id)
            self._lookups.close()
            self._event("close", sorted(self._owned))
            log.info("kip848: left group %s", self.options.group_id)

    # -- batches made durable, from the query's commit log ----------------------------------

    def _start_watcher(self) -> None:
        if self._watcher is not None or self._commit_log is None:
            return
        self._watcher = threading.Thread(target=self._watch, name="kip848-commits", daemon=True)
        self._watcher.start()

    def _watch(self) -> None:
        """Commit each batch to Kafka as soon as Spark wrote its commit-log entry."""
        while not self._stop_watch.wait(_WATCH_INTERVAL_S):
            try:
                with self._lock:
                    if self._closed or self._member is None:
                        continue
                    if self._sync_commit_log():
                        self._commit_durable(self._member, serve=False)
            except Exception as exc:  # the next batch commits it anyway
                log.info("kip848: committing a batch from the commit log failed: %s", exc)

    def _sync_commit_log(self) -> bool:
        """Mark the latest committed batch durable if this reader built it; True if new."""
        if self._commit_log is None:
            return False
        batch = self._commit_log.latest_committed()
        if batch is None or batch == self._commit_log_batch:
            return False
        self._commit_log_batch = batch
        found = False
        for data in self._commit_log.source_offsets(batch):
            offset = SourceOffset.from_json(data)
            if offset.key() in self._emitted and offset.key() not in self._durable_keys:
                self._mark_durable(offset)
                found = True
        return found

    def _warn_unknown_end(self) -> None:
        """Say once, with the reason, when the last batch's offsets cannot be committed."""
        last = self._last_end
        if last is None or last.key() in self._durable_keys or self._warned_unknown_end:
            return
        behind = {
            p: pos - self._durable.get(p, pos)
            for p, pos in last.positions.items()
            if p in self._owned and pos > self._durable.get(p, pos)
        }
        if not behind:
            return
        self._warned_unknown_end = True
        log.warning(
            "kip848: group %s: stopping before Spark reported the last batch durable (it "
            "calls a Python source only when it plans the next batch); its offsets are not "
            "committed to Kafka, so the next owner of %s re-reads up to %d records%s",
            self.options.group_id,
            _names(behind),
            sum(behind.values()),
            ""
            if self._commit_log is not None
            else ". Set the source option checkpointLocation to the query's checkpoint to "
            "commit exactly on stop",
        )

    # -- bookkeeping --------------------------------------------------------------------------

    def _remember(self, offset: SourceOffset) -> None:
        self._emitted[offset.key()] = None
        while len(self._emitted) > _EMITTED_MEMORY:
            self._emitted.popitem(last=False)

    def _learn(self, offset: SourceOffset) -> None:
        """An offset from the checkpoint, not built here: what the sink already holds."""
        if offset.key() in self._emitted:
            return
        for p, pos in offset.positions.items():
            pos = min(pos, self._skipped.get(p, pos))
            if pos > self._hints.get(p, -1):
                self._hints[p] = pos
            if p in self._pending and pos > self._pending[p]:
                self._pending[p] = pos
                self._durable[p] = max(self._durable.get(p, -1), pos)

    def _mark_durable(self, offset: SourceOffset) -> None:
        """The batch ending at ``offset`` is in the sink (and the checkpoint)."""
        self._durable_keys.add(offset.key())
        if len(self._durable_keys) > _EMITTED_MEMORY:
            self._durable_keys = {k for k in self._durable_keys if k in self._emitted}
        for p, pos in offset.positions.items():
            pos = min(pos, self._skipped.get(p, pos))
            if pos > self._hints.get(p, -1):
                self._hints[p] = pos
            if p in self._owned and pos > self._durable.get(p, -1):
                self._durable[p] = pos
            if p in self._pending and pos > self._pending[p]:
                self._pending[p] = pos  # (re)assigned while this batch was in flight

    def _commit_durable(self, member: SourceMember, serve: bool) -> None:
        """Commit the owned partitions' durable offsets. ``serve`` (only in latestOffset,
        where no batch is in flight) lets a retry serve the member after a stale epoch."""
        todo = {
            p: o
            for p, o in self._durable.items()
            if p in self._owned and p not in self._gone and self._kafka_committed.get(p) != o
        }
        if not todo or (self.options.membership and member.member_epoch <= 0):
            return
        if not self.options.membership and not self.options.group_id:
            return
        for attempt in (1, 2):
            try:
                todo = self._commit(member, todo)
                if not todo:
                    return
                self._kafka_committed.update(todo)
                self._event(
                    "commit",
                    sorted(todo),
                    offsets={f"{t}:{p}": o for (t, p), o in todo.items()},
                    epoch=member.member_epoch,
                )
                return
            except KafkaException as exc:  # e.g. STALE_MEMBER_EPOCH mid-rebalance
                if attempt == 2:
                    log.warning(
                        "kip848: committing %s failed: %s (retried next batch)",
                        todo,
                        exc.args[0].str(),
                    )
                elif serve:
                    self._poll(member, 0.1)
                    todo = {p: o for p, o in todo.items() if p in self._owned}
                else:
                    time.sleep(0.1)  # the next heartbeat brings the new epoch
                    if not todo:
                        return

    def _commit(
        self, member: SourceMember, offsets: Mapping[Partition, int]
    ) -> dict[Partition, int]:
        """Commit synchronously; partitions of a deleted topic are left out (what was
        committed is returned): their loss is reported by the next ``latest_offset``."""
        try:
            member.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())],
                asynchronous=False,
                timeout=_COMMIT_TIMEOUT_S,
            )
            return dict(offsets)
        except KafkaException as exc:
            if exc.args[0].code() not in UNKNOWN:
                raise
            gone = self._deleted(set(offsets))
            if not gone:
                raise
        rest = {p: o for p, o in offsets.items() if p not in gone}
        if rest:
            member.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in sorted(rest.items())],
                asynchronous=False,
                timeout=_COMMIT_TIMEOUT_S,
            )
        return rest

    def _data_loss(self, lost: Mapping[Partition, tuple[int, int, int]]) -> None:
        detail = ", ".join(
            f"{t}[{p}] at offset {frm} (available [{low}, {high}])"
            for (t, p), (frm, low, high) in sorted(lost.items())
        )
        text = (
            f"offsets out of range, records lost (retention, truncation, or a deleted and "
            f"recreated topic): {detail}"
        )
        if self.options.fail_on_data_loss:
            raise DataLossError(
                f"kip848: {text}. Set failOnDataLoss=false to continue from the earliest "
                "available offsets with a warning"
            )
        log.warning(
            "kip848: %s; continuing from the earliest available offsets (failOnDataLoss=false)",
            text,
        )

    def _deleted(self, candidates: set[Partition]) -> set[Partition]:
        """Those of ``candidates`` whose topic (or partition) no longer exists."""
        candidates -= self._gone
        if not candidates:
            return set()
        md = self._lookups.retrying(
            "describing topics", lambda: self._lookups.client().list_topics(timeout=10.0)
        )
        out = set()
        for t, p in candidates:
            meta = md.topics.get(t)
            if (
                meta is None
                or (meta.error is not None and meta.error.code() in UNKNOWN)
                or p not in meta.partitions
            ):
                out.add((t, p))
        return out

    def _report_deleted(self, gone: set[Partition], begin: SourceOffset) -> None:
        unread = []
        for p in sorted(gone):
            at = begin.positions.get(p, self._pending.get(p))
            seen = self._latest.get(p)
            if at is not None and seen is not None and seen > at:
                unread.append(f"{p[0]}[{p[1]}] offsets [{at}, {seen}) ({seen - at} records)")
            elif at is not None:
                unread.append(f"{p[0]}[{p[1]}] from offset {at}")
        text = (
            f"deleted while the query read them: {_names(gone)}. Records not yet read there are "
            f"lost: {', '.join(unread) or 'none known'}"
        )
        if self.options.fail_on_data_loss:
            raise DataLossError(
                f"kip848: {text}. Set failOnDataLoss=false to skip deleted topics with a warning"
            )
        log.warning("kip848: %s; skipped (failOnDataLoss=false)", text)
        self._gone |= gone
        self._event("deleted", sorted(gone))

    def _fresh_starts(
        self, parts: list[Partition], marks: Watermarks | None = None
    ) -> dict[Partition, int]:
        """Where partitions without a committed or checkpointed offset start.

        ``startingOffsets`` / timestamps apply to the partitions that existed when the query
        started; partitions discovered later (a partition increase, a new topic matching
        subscribePattern) and every partition of a query resumed from a checkpoint start at
        the earliest offset, as in Spark's Kafka source.
        """
        if not parts:
            return {}
        scope = self._scope or set()
        initial = [p for p in parts if p in scope]
        new = [p for p in parts if p not in scope]
        out = self._lookups.starting_offsets(initial, marks)
        if new:
            low = (marks or self._lookups.watermarks(new))[0]
            for p in new:
                out[p] = low.get(p, 0)
            starts = {f"{t}[{p}]": out[(t, p)] for t, p in new}
            log.info(
                "kip848: %s: new since the query started; reading from the earliest offsets %s",
                _names(new),
                starts,
            )
        return out

    def _event(self, kind: str, parts: Iterable[Partition], **extra: Any) -> None:
        event = {"t": time.time(), "kind": kind, "partitions": [f"{t}:{p}" for t, p in parts]}
        event.update(extra)
        self.events.append(event)
        if len(self.events) > 10_000:
            del self.events[:5_000]
        if self._event_log:
            try:
                with open(self._event_log, "a", encoding="utf-8") as f:
                    f.write(json.dumps(event) + "\n")
            except OSError as exc:
                log.debug("kip848: cannot write the event log: %s", exc)
