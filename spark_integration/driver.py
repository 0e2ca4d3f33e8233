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
* ``commit(end)`` (Spark's "batch is durable", one batch late) does the same bookkeeping
  and serves the member again.
* ``plan(start, end)`` turns a logged batch into offset ranges. A range whose partition
  this process does not own (a replay after restart, or a revocation while the batch is
  in flight) starts no earlier than the group's committed offset, so progress another
  member committed is not read again.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from types import FrameType
from typing import Any

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaException, TopicPartition

from consumer_sdk import GroupMember, MemberState
from spark_integration.offsets import (
    EARLIEST,
    LATEST,
    DataLossError,
    OffsetRange,
    Partition,
    SourceOffset,
    rate_limit,
    split_ranges,
)
from spark_integration.options import SourceOptions

__all__ = ["GroupReader", "close_all_readers", "reader_for"]

log = logging.getLogger("spark_integration")
_KAFKA_LOG = logging.getLogger("spark_integration.librdkafka")

_EMITTED_MEMORY = 64
_CLOSE_TIMEOUT_S = 10.0
_EXIT_WATCHDOG_S = 20.0


def _tps(parts: Iterable[Partition]) -> list[TopicPartition]:
    return [TopicPartition(t, p) for t, p in sorted(parts)]


def _parts(tps: Iterable[TopicPartition]) -> list[Partition]:
    return sorted((tp.topic, tp.partition) for tp in tps)


def _committed(member: Any, parts: Iterable[Partition], attempts: int = 3) -> dict[Partition, int]:
    """The group's committed offsets (absent where none), retrying transient failures."""
    for attempt in range(1, attempts + 1):
        try:
            return {
                (tp.topic, tp.partition): tp.offset
                for tp in member.committed(_tps(parts), timeout=10.0)
                if tp.offset >= 0
            }
        except KafkaException as exc:
            if attempt == attempts or exc.args[0].fatal():
                raise
            log.warning("kip848: fetching committed offsets failed (%s); retrying", exc)
            time.sleep(0.2 * attempt)
    raise AssertionError("unreachable")


class GroupReader:
    """The query's ``GroupMember`` plus the offset bookkeeping of the source.

    Created lazily; the member joins on first use. Not thread-safe: the stream-reader
    process calls it from one thread.
    """

    def __init__(
        self,
        options: SourceOptions,
        member_factory: Callable[[dict[str, Any]], GroupMember] = GroupMember,
    ) -> None:
        self.options = options
        self._member_factory = member_factory
        self._member: GroupMember | None = None
        self._watermark_client: KafkaConsumer | None = None
        self._owned: set[Partition] = set()
        self._durable: dict[Partition, int] = {}  # owned: what the sink durably holds
        self._pending: dict[Partition, int] = {}  # assigned since the last emitted offset
        self._hints: dict[Partition, int] = {}  # sink (or group) holds each partition up to
        self._kafka_committed: dict[Partition, int] = {}
        self._emitted: OrderedDict[str, None] = OrderedDict()
        self._initial: dict[str, Any] | None = None
        self._available_now: dict[Partition, int] | None = None
        self._latest: dict[Partition, int] = {}
        self._closed = False
        self._joined = False
        self._event_log = options.event_log
        self.events: list[dict[str, Any]] = []
        self._event("start", [], pid=os.getpid())

    # -- membership -------------------------------------------------------------------------

    @property
    def member(self) -> GroupMember | None:
        return self._member

    @property
    def owned(self) -> set[Partition]:
        return set(self._owned)

    def _ensure_member(self, wait: bool) -> GroupMember:
        if self._closed:
            raise RuntimeError("the kip848 source reader is closed")
        if self._member is None:
            member = self._member_factory(self.options.member_config())
            member.subscribe(
                self.options.subscription,
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
            self._member = member
            log.info("kip848: joining group %s for %s", self.options.group_id,
                     self.options.subscription)  # fmt: skip
            self._joined = False
        if wait and not self._joined:
            self._wait_stable(self._member)
            self._joined = True
        return self._member

    def _wait_stable(self, member: GroupMember) -> None:
        """Poll until the member has reconciled its first assignment (bounded)."""
        deadline = time.monotonic() + self.options.join_timeout_ms / 1000
        while True:
            self._poll(member, 0.1)
            if member.state is MemberState.STABLE and member.member_epoch > 0:
                return
            if time.monotonic() >= deadline:
                log.warning(
                    "kip848: group %s: not stable after %d ms (state %s); continuing with %s",
                    self.options.group_id, self.options.join_timeout_ms, member.state.name,
                    sorted(self._owned),
                )  # fmt: skip
                return

    def _poll(self, member: GroupMember, timeout: float = 0.0) -> None:
        """Serve the member: run the rebalance callbacks its heartbeat thread queued.

        Called once per Spark call (latestOffset, commit), so callbacks never run while a
        Spark call is half done; no waiting here (the heartbeat thread runs on its own).
        """
        try:
            member.poll(timeout)
        except KafkaException as exc:
            error = exc.args[0]
            if error.fatal():
                raise
            log.warning("kip848: group %s: %s", self.options.group_id, error.str())

    def _on_assign(self, member: Any, tps: list[TopicPartition]) -> None:
        parts = _parts(tps)
        if not parts:
            return
        committed = _committed(member, parts)
        fresh = [p for p in parts if p not in committed and p not in self._hints]
        starting = self._starting_offsets(fresh)
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
        if self._available_now is not None:
            self._available_now.update(self._watermarks(parts, high_only=True)[1])
        self._event("assign", parts, starts={f"{t}:{p}": self._pending[(t, p)] for t, p in parts},
                    epoch=member.member_epoch)  # fmt: skip

    def _on_revoke(self, member: Any, tps: list[TopicPartition]) -> None:
        parts = _parts(tps)
        if not parts:
            return
        offsets = {p: self._durable[p] for p in parts if p in self._durable}
        committed: dict[Partition, int] = {}
        if offsets:
            # Before the revocation is acknowledged: the next owner starts where this query's
            # sink durably stops. A failure here only means that owner re-reads some records.
            try:
                member.commit(
                    offsets=[TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())],
                    asynchronous=False,
                )
                committed = offsets
                self._kafka_committed.update(offsets)
            except (KafkaException, ValueError) as exc:
                log.warning("kip848: commit on revoke of %s failed: %s", parts, exc)
        self._drop(parts)
        self._event("revoke", parts, committed={f"{t}:{p}": o for (t, p), o in committed.items()},
                    epoch=member.member_epoch)  # fmt: skip

    def _on_lost(self, member: Any, tps: list[TopicPartition]) -> None:
        parts = _parts(tps)
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
        if self._initial is None:
            member = self._ensure_member(wait=True)
            offset = SourceOffset(
                positions=dict(self._pending), epoch=member.member_epoch,
                member_id=member.member_id,
            )  # fmt: skip
            self._pending.clear()
            self._remember(offset)
            self._initial = offset.to_json()
        return self._initial

    def latest_offset(
        self, start: Mapping[str, Any] | None, max_rows: int | None = None, min_rows: int = 0
    ) -> dict[str, Any]:
        """The end of the next batch (``start`` itself when there is nothing new)."""
        begin = SourceOffset.from_json(start)
        self._learn(begin)
        member = self._ensure_member(wait=True)
        self._mark_durable(begin)
        self._commit_durable(member)
        self._poll(member)
        froms: dict[Partition, int] = {}
        for p in sorted(self._owned):
            if p in self._pending:
                froms[p] = self._pending[p]
            elif p in begin.positions:
                froms[p] = begin.positions[p]
            else:  # owned but never started (should not happen): start it now
                froms[p] = self._starting_offsets([p])[p]
        low, high = self._watermarks(froms)
        for p, frm in list(froms.items()):
            if frm < low[p] or frm > high[p]:
                self._data_loss(p, frm, low[p], high[p])
                froms[p] = low[p]
        latest = dict(high)
        if self._available_now is not None:
            latest = {p: min(o, self._available_now.get(p, o)) for p, o in latest.items()}
        latest = {p: max(o, froms[p]) for p, o in latest.items()}
        self._latest = latest
        ends = rate_limit(max_rows, froms, latest) if max_rows else latest
        starts = {p: o for p, o in froms.items() if begin.positions.get(p) != o}
        if not starts and ends == begin.positions:
            return dict(start or {})
        backlog = sum(ends[p] - froms[p] for p in ends)
        if min_rows > 0 and backlog < min_rows and not starts and set(ends) == set(begin.positions):
            return dict(start or {})  # ReadMinRows: wait for more data
        offset = SourceOffset(ends, starts, member.member_epoch, member.member_id)
        self._pending.clear()
        self._remember(offset)
        return offset.to_json()

    def report_latest_offset(self) -> dict[str, Any] | None:
        """Latest offsets seen by the last ``latest_offset`` (for progress reports)."""
        if not self._latest:
            return None
        return SourceOffset(positions=dict(self._latest)).to_json()

    def prepare_for_trigger_available_now(self) -> None:
        """Bound this run to the data available now (high watermarks of owned partitions)."""
        self._ensure_member(wait=True)
        self._available_now = self._watermarks(self._owned, high_only=True)[1]

    def plan(self, start: Mapping[str, Any] | None, end: Mapping[str, Any]) -> list[OffsetRange]:
        """Offset ranges of the batch ``(start, end]`` (deterministic from the two offsets)."""
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
        mine = finish.key() in self._emitted
        check = [r for r in ranges if not mine or r.tp not in self._owned]
        if check:
            # Not ours now (replay after a restart, or revoked in flight): skip what the group
            # already committed past this range's start (another member's progress).
            member = self._ensure_member(wait=False)
            committed = _committed(member, {r.tp for r in check})
            adjusted = []
            for r in ranges:
                c = committed.get(r.tp, -1)
                if r in check and c > r.from_offset:
                    r = OffsetRange(r.topic, r.partition, min(c, r.until_offset), r.until_offset)
                adjusted.append(r)
            ranges = adjusted
        return split_ranges(ranges, self.options.min_partitions)

    def commit(self, end: Mapping[str, Any]) -> None:
        """Spark made the batch ending at ``end`` durable: commit it to Kafka."""
        offset = SourceOffset.from_json(end)
        self._learn(offset)
        member = self._ensure_member(wait=True)
        self._mark_durable(offset)
        self._poll(member)
        self._commit_durable(member)

    def close(self, timeout: float = _CLOSE_TIMEOUT_S) -> None:
        """Leave the group (revoke callbacks commit durable offsets first). Idempotent."""
        if self._closed:
            return
        self._closed = True
        member, self._member = self._member, None
        if member is not None:
            try:
                member.close(timeout=timeout)
            except Exception as exc:  # closing is best-effort; the session timeout cleans up
                log.warning("kip848: closing the group member failed: %s", exc)
            self._event("left", [], member_id=member.member_id)
        client, self._watermark_client = self._watermark_client, None
        if client is not None:
            closer = threading.Thread(target=client.close, daemon=True)
            closer.start()
            closer.join(5.0)
        self._event("close", sorted(self._owned))
        log.info("kip848: left group %s", self.options.group_id)

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
            if pos > self._hints.get(p, -1):
                self._hints[p] = pos
            if p in self._pending and pos > self._pending[p]:
                self._pending[p] = pos
                self._durable[p] = max(self._durable.get(p, -1), pos)

    def _mark_durable(self, offset: SourceOffset) -> None:
        """The batch ending at ``offset`` is in the sink (and the checkpoint)."""
        for p, pos in offset.positions.items():
            if pos > self._hints.get(p, -1):
                self._hints[p] = pos
            if p in self._owned and pos > self._durable.get(p, -1):
                self._durable[p] = pos
            if p in self._pending and pos > self._pending[p]:
                self._pending[p] = pos  # (re)assigned while this batch was in flight

    def _commit_durable(self, member: GroupMember) -> None:
        todo = {
            p: o
            for p, o in self._durable.items()
            if p in self._owned and self._kafka_committed.get(p) != o
        }
        if not todo or member.member_epoch <= 0:
            return
        for attempt in (1, 2):
            try:
                member.commit(
                    offsets=[TopicPartition(t, p, o) for (t, p), o in sorted(todo.items())],
                    asynchronous=False,
                )
                self._kafka_committed.update(todo)
                self._event("commit", sorted(todo),
                            offsets={f"{t}:{p}": o for (t, p), o in todo.items()},
                            epoch=member.member_epoch)  # fmt: skip
                return
            except KafkaException as exc:  # e.g. STALE_MEMBER_EPOCH mid-rebalance
                if attempt == 2:
                    log.warning("kip848: committing %s failed: %s (retried next batch)", todo,
                                exc.args[0].str())  # fmt: skip
                else:
                    self._poll(member, 0.1)
                    todo = {p: o for p, o in todo.items() if p in self._owned}
                    if not todo:
                        return

    def _data_loss(self, p: Partition, frm: int, low: int, high: int) -> None:
        text = (
            f"{p[0]}[{p[1]}]: offset {frm} is outside the available range [{low}, {high}]: "
            "some data may have been lost (retention, deleted or recreated topic)"
        )
        if self.options.fail_on_data_loss:
            raise DataLossError(text + "; set failOnDataLoss=false to continue from the earliest")
        log.warning("kip848: %s; continuing from %d", text, low)

    # -- offsets from the cluster -------------------------------------------------------------

    def _client(self) -> KafkaConsumer:
        if self._watermark_client is None:
            self._watermark_client = KafkaConsumer(
                {**self.options.fetch_config("driver"), "logger": _KAFKA_LOG}
            )
        return self._watermark_client

    def _watermarks(
        self, parts: Iterable[Partition], high_only: bool = False
    ) -> tuple[dict[Partition, int], dict[Partition, int]]:
        low: dict[Partition, int] = {}
        high: dict[Partition, int] = {}
        client = self._client()
        for t, p in sorted(parts):
            lo, hi = client.get_watermark_offsets(TopicPartition(t, p), timeout=10.0, cached=False)
            low[(t, p)], high[(t, p)] = int(lo), int(hi)
        return low, high

    def _starting_offsets(self, parts: list[Partition]) -> dict[Partition, int]:
        """``startingTimestamp`` / ``startingOffsets`` for partitions the group never committed."""
        if not parts:
            return {}
        low, high = self._watermarks(parts)
        o = self.options
        if o.starting_timestamp is not None:
            found = self._client().offsets_for_times(
                [TopicPartition(t, p, o.starting_timestamp) for t, p in parts], timeout=10.0
            )
            return {
                (tp.topic, tp.partition): tp.offset
                if tp.offset >= 0
                else high[(tp.topic, tp.partition)]
                for tp in found
            }
        out: dict[Partition, int] = {}
        for p in parts:
            spec = o.starting_offsets
            wanted = spec.get(p, EARLIEST) if isinstance(spec, dict) else (
                EARLIEST if spec == "earliest" else LATEST
            )  # fmt: skip
            out[p] = low[p] if wanted == EARLIEST else high[p] if wanted == LATEST else wanted
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


# -- one reader per query run, and a clean exit ------------------------------------------------

_registry: dict[str, GroupReader] = {}
_registry_lock = threading.RLock()
_handlers_installed = False


def reader_for(reader_id: str, options: SourceOptions) -> GroupReader:
    """The process's ``GroupReader`` for a stream reader id (created on first use)."""
    with _registry_lock:
        reader = _registry.get(reader_id)
        if reader is None:
            reader = GroupReader(options)
            _registry[reader_id] = reader
            _install_exit_handlers()
        return reader


def close_reader(reader_id: str) -> None:
    with _registry_lock:
        reader = _registry.pop(reader_id, None)
    if reader is not None:
        reader.close()


def close_all_readers() -> None:
    """Close every reader of this process: each member leaves its group."""
    with _registry_lock:
        readers = list(_registry.values())
        _registry.clear()
    for reader in readers:
        with contextlib.suppress(Exception):
            reader.close()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Spark stops the stream-reader process with SIGTERM and rarely calls stop(). Unwind
    # instead of closing here (the signal may arrive inside the member's own poll): the
    # runner's ``finally: reader.stop()`` and atexit then leave the group. Repeated signals
    # are ignored, and a watchdog ends the process if the clean exit hangs.
    global _terminating
    if _terminating:
        return
    _terminating = True
    log.info("kip848: SIGTERM: leaving the group")
    watchdog = threading.Timer(_EXIT_WATCHDOG_S, os._exit, args=(128 + signum,))
    watchdog.daemon = True
    watchdog.start()
    if callable(_previous_sigterm):
        _previous_sigterm(signum, frame)
    raise SystemExit(128 + signum)


_previous_sigterm: Any = None
_terminating = False


def _install_exit_handlers() -> None:
    global _handlers_installed, _previous_sigterm
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(close_all_readers)
    if threading.current_thread() is threading.main_thread():
        try:
            previous = signal.getsignal(signal.SIGTERM)
            _previous_sigterm = previous if callable(previous) else None
            signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError) as exc:
            log.debug("kip848: no SIGTERM handler: %s", exc)
