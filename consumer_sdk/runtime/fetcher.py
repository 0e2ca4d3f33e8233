"""Data plane: records fetched by a ``confluent_kafka.Consumer`` in assign-only mode.

The fetcher never subscribes, never commits and never stores offsets; the membership
runtime drives it with ``incremental_assign`` / ``incremental_unassign``. Records of a
partition that is no longer fetchable are dropped, including ones librdkafka already
buffered, so a revoked partition's record can never reach the application.

Positions. A partition's position is the offset after the last record handed to the
application, or an explicit one (assignment, seek, rewind after unfencing); commits carry
the leader epoch of that last record. It is kept in one of two ways:

* *native* partitions (``_native``): librdkafka's application position, which librdkafka
  moves past every record it returns (with the record's leader epoch) and resets to
  OFFSET_INVALID on assign, unassign and seek; ``_positions`` holds the explicit position,
  which stands while librdkafka's is invalid, or the last one known (see below). It is
  exact while librdkafka returned no record of the partition that was not handed on: none
  dropped (fenced, unassigned, sought) and none set aside in ``poll()``'s buffer.
* the others: the last record handed out (``_last``, and ``poll()``'s buffer: records are
  handed out of it by moving its ``taken`` on, and its handed-out records are folded into
  ``_last`` per batch, not per record: see `_Batch`), else ``_positions``/``_epochs``.

Why this is exact: a native partition is moved to the second kind, at librdkafka's
position, before any record of it can be dropped or buffered: ``poll()`` does so for every
native partition before it takes a batch; ``consume()`` for native partitions fenced before
the call. The network loop thread may fence a partition while a ``consume()`` call is inside
librdkafka: that batch's records of it are dropped and its position becomes its first record
there, where it stood before the batch (only offsets without a deliverable record can lie
between), with that record's leader epoch (the one case where the epoch is not that of the
last record delivered: that record is not known any more). A partition becomes native
again with an explicit position (assign, seek, rewind), or when ``consume()``, before a
call, finds librdkafka's position equal to its own while it is fetchable and nothing of it
is buffered.

librdkafka moves its position while it returns a batch, before the fetcher has decided
which records of it to hand out: ``_flight`` is held by the application thread across every
librdkafka call that returns records and the handling of its batch, and by every reader of
librdkafka's positions on the application side (`Fetcher.committable`). Positions kept here
need no ``_flight``.

What crosses to the network loop thread: the loop's auto-commit never reads librdkafka and
never takes ``_flight`` or ``_lock`` (the application thread may hold them across a whole
wait in librdkafka, and the loop serves every member of the process). It reads
`Fetcher.publication`, which the application thread replaces whole after assign, unassign,
seek, rewind and the moves between the two kinds (with one read of librdkafka's positions
for the native partitions) and extends as it hands records out: each ``consume()`` batch
that holds native partitions' records is appended to its ``pending`` before it is handed
out (every ``_PENDING_RECORDS`` records a new publication replaces them with one read of
librdkafka's positions), and the records of the other partitions are its ``handed``
(`_Handed`: ``_last`` and the handed-out part of ``poll()``'s buffer). The loop thread's
only other calls are `Fetcher.fence` (no lock) and `Fetcher.wake`. Without auto-commit
nothing reads the publication: such a consumer's fetcher (``publish_batches=False``) leaves
``consume()`` batches out of it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from consumer_sdk.runtime._librdkafka import LibrdkafkaError, QueueWaker, consumer_queue_waker
from consumer_sdk.runtime.netloop import check_threads, on_loop_thread

log = logging.getLogger("consumer_sdk.runtime")

Partition = tuple[str, int]

_monotonic = time.monotonic
_TOPIC = Message.topic
_PARTITION = Message.partition
_ERROR = Message.error

#: Records taken from librdkafka in one call when ``poll()`` finds the local buffer empty:
#: one ``consume`` call creates them all, so ``poll()`` pays librdkafka's per-call cost
#: (a queue wait, a GIL release) once per batch instead of once per record.
POLL_BATCH = 256

#: Batches of librdkafka's own (native) partitions are published as they are (a reader
#: takes positions from their records: the loop's auto-commit, about 1 us per record) until
#: this many records are pending; then one read of librdkafka's positions replaces them
#: (about 15 us: once per ``consume(500)`` batch, a few percent of the application thread's
#: time per record).
_PENDING_RECORDS = 128

#: How soon the gate is asked again while it sets no bound (see `Fetcher.set_gate`).
_GATE_RECHECK_S = 0.1


def _epoch(msg: Message) -> int:
    epoch = msg.leader_epoch()
    return -1 if epoch is None else epoch


def _records(msgs: list[Message]) -> list[Message]:
    """``msgs`` without their error events."""
    return [m for m in msgs if m.error() is None] if any(map(_ERROR, msgs)) else msgs


# Per batch, not per record: each of these is a pass in C over the batch (about 45-90 ns
# per record on the benchmark machine each; a tuple key per record costs 250-330 ns).


def _plain_topic(msgs: list[Message]) -> str | None:
    """The topic of every message of ``msgs`` if they are records (no error event) of one
    topic, else None."""
    if any(map(_ERROR, msgs)):
        return None
    topics = set(map(_TOPIC, msgs))
    return topics.pop() if len(topics) == 1 else None


def _keys(msgs: list[Message], topic: str | None) -> set[Partition]:
    """The partitions of the records of ``msgs`` (``topic``: `_plain_topic`)."""
    if topic is not None:  # no tuple per record: a set of partition numbers
        return {(topic, p) for p in set(map(_PARTITION, msgs))}  # type: ignore[misc]
    records = _records(msgs)
    return set(zip(map(_TOPIC, records), map(_PARTITION, records), strict=True))  # type: ignore[arg-type]


def _lasts(msgs: list[Message], topic: str | None) -> dict[Partition, Message]:
    """The last record per partition of ``msgs`` (``topic``: `_plain_topic`)."""
    if topic is not None:
        last = dict(zip(map(_PARTITION, msgs), msgs, strict=True))
        return {(topic, p): m for p, m in last.items()}  # type: ignore[misc]
    records = _records(msgs)
    keys = zip(map(_TOPIC, records), map(_PARTITION, records), strict=True)
    return dict(zip(keys, records, strict=True))  # type: ignore[arg-type]


class _Batch:
    """Records ``poll()`` took from librdkafka in one call: ``msgs[:taken]`` are handed out
    (``taken`` only grows), the rest are waiting (of fetchable partitions while the
    fetcher's ``_checked`` holds). ``topic``: `_plain_topic` of ``msgs``; ``lasts``: if
    known, the last record of ``msgs`` per partition number (one topic). ``msgs`` is never
    changed. Application thread; the network loop reads ``taken`` once (`Published`)."""

    __slots__ = ("lasts", "msgs", "taken", "topic")

    def __init__(
        self, msgs: list[Message], topic: str | None, lasts: dict[int, Message] | None = None
    ) -> None:
        self.msgs = msgs
        self.taken = 0
        self.topic = topic
        self.lasts = lasts


class _Handed:
    """The records handed out under one publication, besides ``consume()`` batches of
    librdkafka's own partitions: ``last`` (the last one per partition, of earlier batches)
    and the handed-out part of ``batch``. ``last`` only gains entries (a batch is folded in
    before ``batch`` is replaced); anything that drops one makes a new `_Handed`."""

    __slots__ = ("batch", "last")

    def __init__(self, last: dict[Partition, Message], batch: _Batch) -> None:
        self.last = last
        self.batch = batch

    def positions(self) -> dict[Partition, tuple[int, int]]:
        """Position and leader epoch per partition from the records handed out. Read from
        another thread the parts may be from two instants (``batch`` read first): the
        higher offset of a partition wins, so a batch folded into ``last`` meanwhile counts
        once, and nothing not handed out counts."""
        batch = self.batch
        msgs = batch.msgs[: batch.taken]  # one step each: slices and list() copy in C
        out: dict[Partition, tuple[int, int]] = {}
        for key, msg in list(self.last.items()):
            offset = msg.offset()
            if offset is not None:
                out[key] = (offset + 1, _epoch(msg))
        if msgs:
            for key, msg in _lasts(msgs, batch.topic).items():
                offset = msg.offset()
                if offset is not None:
                    known = out.get(key)
                    if known is None or known[0] <= offset:
                        out[key] = (offset + 1, _epoch(msg))
        return out


@dataclass(frozen=True, slots=True)
class Published:
    """What the application side has handed out, for readers on other threads (the network
    loop's auto-commit): read without a lock, a wait or a call into librdkafka.

    The application thread replaces the fetcher's publication whole (one reference
    assignment) whenever positions move other than by handing out records, or partitions
    come or go. ``known`` is never changed once published; ``pending`` (batches of
    librdkafka's own partitions handed out since) and ``handed`` (the records handed out of
    the other partitions: see `_Handed`) only gain entries while the publication is
    current, so a copy of each is the handed-out state at one instant."""

    known: Mapping[Partition, tuple[int, int]]
    pending: Sequence[tuple[Message, ...]]
    handed: _Handed
    #: The partitions assigned to the fetcher.
    assigned: frozenset[Partition]

    def positions(self) -> dict[Partition, tuple[int, int]]:
        """Position and leader epoch per partition that has one: the offset after the last
        record handed out, else a position set explicitly (assignment, rewind)."""
        out = dict(self.known)
        for batch in list(self.pending):  # one step: list() copies in C
            for msg in batch:
                offset = msg.offset()
                if offset is not None and msg.error() is None:
                    out[(msg.topic(), msg.partition())] = (offset + 1, _epoch(msg))  # type: ignore[index]
        out.update(self.handed.positions())
        return out


class _Lock(Protocol):
    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...
    def release(self) -> None: ...
    def __enter__(self) -> bool: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None: ...


class _NotOnLoop:
    """A data-plane lock that refuses the network loop thread (with
    ``CONSUMER_SDK_CHECK_THREADS=1``): the application thread may hold it across a wait in
    librdkafka, and the loop serves every member of the process."""

    __slots__ = ("_lock",)

    def __init__(self, lock: _Lock) -> None:
        self._lock = lock

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if on_loop_thread():
            raise AssertionError("the network loop thread takes no data-plane lock")
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
        /,
    ) -> None:
        self._lock.release()


def _data_plane_lock(lock: _Lock) -> _Lock:
    return _NotOnLoop(lock) if check_threads else lock


class Fetcher:
    """Assign-only record fetcher with per-partition positions."""

    def __init__(self, config: Mapping[str, Any], publish_batches: bool = True) -> None:
        """``publish_batches``: whether ``consume()`` publishes each batch of librdkafka's
        own partitions (`publication`); without a reader of the publication (no
        auto-commit) it need not, and the batch's only per-batch work is the gate check."""
        self._consumer = Consumer(dict(config))
        self._publish_batches = publish_batches
        self._waker: QueueWaker | None = None
        try:
            self._waker = consumer_queue_waker(
                self._consumer, str(config.get("client.id", "rdkafka"))
            )
        except LibrdkafkaError as exc:
            log.debug("fetcher: no wake-up for waits in librdkafka (%s)", exc)
        # Neither is ever taken on the network loop thread (see `fence` and `publication`).
        self._lock = _data_plane_lock(threading.Lock())
        # See the module docstring: held across librdkafka calls that return records (and
        # the handling of their batch) and by readers of librdkafka's positions.
        self._flight = _data_plane_lock(threading.RLock())
        self._fetchable: set[Partition] = set()
        self._assigned: set[Partition] = set()
        self._native: set[Partition] = set()
        # Every assigned partition fetchable and native: consume() hands batches on as they
        # are. Written under _lock, and set False by fence() (either thread, no lock), so
        # consume() checks the fetchable partitions again before it relies on it.
        self._fast = False
        # Explicit positions (assignment, rewind) and the last known ones of native
        # partitions (read after a batch); _last wins over them.
        self._positions: dict[Partition, int] = {}
        self._epochs: dict[Partition, int] = {}  # leader epoch of a _positions entry
        # The last record handed out per partition, but for those of ``_cursor`` (folded in
        # by `_fold`). Only gains entries (it is the current publication's ``handed.last``):
        # anything that drops one makes a new dict and `_Handed`, and publishes.
        self._last: dict[Partition, Message] = {}
        # The records poll() took from librdkafka and hands out one by one (its buffer):
        # handing one out moves ``taken`` on, nothing per partition (see `_Batch`).
        self._cursor = _Batch([], None)
        self._handed = _Handed(self._last, self._cursor)
        # Every record of ``_cursor`` not handed out yet is an error event or of a fetchable
        # partition. Set True by the application thread before it reads ``_fetchable`` to
        # check them, and False by anything that takes partitions out of ``_fetchable``
        # after doing so (fence() from either thread): a hand-out that finds it False
        # checks the records first (`_recheck`).
        self._checked = True
        # Batches of native partitions handed out since the last publication (its
        # `pending`), and how many records they hold.
        self._pending: list[tuple[Message, ...]] = []
        self._pending_records = 0
        self._published = Published({}, self._pending, self._handed, frozenset())
        self._native_seen: frozenset[Partition] = frozenset()
        self._native_tps: list[TopicPartition] = []
        self._paused: set[Partition] = set()
        # Records poll() took of paused partitions, set aside until they resume. Only the
        # application thread reads and writes it and ``_cursor`` (poll, consume and the
        # callbacks that run there).
        self._held: dict[Partition, list[Message]] = {}
        self._closed = False
        self.reset = str(config.get("auto.offset.reset", "latest"))
        # The zombie-record gate (see `set_gate`): records may be handed out until
        # `_open_until` (monotonic s); `_gate_fenced` are the partitions it fenced.
        self._gate: Callable[[], float] | None = None
        self._open_until = math.inf
        self._gate_fenced: set[Partition] = set()

    @property
    def consumer(self) -> Consumer:
        return self._consumer

    @property
    def wakeable(self) -> bool:
        """Whether `wake` ends a wait in `poll`/`consume` (else waits run their course)."""
        return self._waker is not None

    def wake(self) -> None:
        """End the current (or else the next) wait of `poll`/`consume` now; any thread."""
        waker = self._waker
        if waker is not None:
            waker.wake()

    def set_gate(self, gate: Callable[[], float]) -> None:
        """Hand records out only until ``gate()`` (monotonic seconds; ``math.inf``: no
        bound), asked again whenever that time has passed. Past it every fetchable partition
        is fenced (records dropped, positions kept); when the gate opens again they are
        unfenced (rewound to their positions) before the next hand-out."""
        self._gate = gate
        self._open_until = -math.inf

    def _check_gate(self, reopen: bool) -> None:
        """(application thread, before handing records out) Ask the gate; close it (fence
        every fetchable partition) or, with ``reopen``, open it again."""
        gate = self._gate
        if gate is None:
            return
        now = _monotonic()
        until = gate()
        # No bound now (not in a group yet): ask again soon, the member may join.
        self._open_until = min(until, now + _GATE_RECHECK_S)
        if now <= until:
            if reopen and self._gate_fenced:
                with self._lock:
                    back = self._gate_fenced & self._assigned
                    self._gate_fenced = set()
                log.info("fetcher: membership confirmed, handing out records again")
                self.unfence(back)
            return
        with self._lock:
            closing = set(self._fetchable)
            if closing:
                self._gate_fenced |= closing
                # Partitions fence() took out since the copy (it takes no lock) stay out of
                # the gate's: a reopening must not make them fetchable again.
                self._gate_fenced -= closing - self._fetchable
                self._fetchable.clear()
                self._fast = False
                self._checked = False
        if closing:
            log.info(
                "fetcher: no heartbeat confirmed the membership for a session timeout "
                "(%.1f s past); records of %d partition(s) held back until one does",
                now - until,
                len(closing),
            )

    def _refresh_fast(self) -> None:
        """(_lock held)"""
        assigned = self._assigned
        self._fast = bool(assigned) and self._native == assigned and self._fetchable == assigned

    def assign(self, starts: Mapping[Partition, int | None]) -> None:
        """Start fetching ``starts`` (partition -> next offset; None = auto.offset.reset).

        Logical offsets (OFFSET_BEGINNING, OFFSET_END, OFFSET_TAIL(n)) are librdkafka's;
        OFFSET_STORED and OFFSET_INVALID mean auto.offset.reset, like None. With
        ``auto.offset.reset=error`` such a partition is handed to librdkafka at
        OFFSET_INVALID: it finds no committed offset either and delivers
        ``_AUTO_OFFSET_RESET`` as an error message from poll/consume, exactly as
        confluent-kafka does (a ``seek()`` then starts the partition)."""
        if not starts:
            return
        tps = []
        for (topic, partition), offset in starts.items():
            if offset is None or offset in (OFFSET_INVALID, OFFSET_STORED):
                if self.reset == "error":
                    offset = OFFSET_INVALID
                else:
                    offset = OFFSET_BEGINNING if self.reset == "earliest" else OFFSET_END
            tps.append(TopicPartition(topic, partition, offset))
        with self._flight, self._lock:
            new = [tp for tp in tps if (tp.topic, tp.partition) not in self._assigned]
            if not new:
                return
            self._consumer.incremental_assign(new)
            self._forget_handed({(tp.topic, tp.partition) for tp in new})
            self._purge({(tp.topic, tp.partition) for tp in new})
            for tp in new:
                key = (tp.topic, tp.partition)
                self._assigned.add(key)
                self._fetchable.add(key)
                # librdkafka's position is invalid until it returns a record of it.
                self._native.add(key)
                self._epochs.pop(key, None)
                if tp.offset >= 0:
                    self._positions[key] = tp.offset
                else:
                    self._positions.pop(key, None)
            self._refresh_fast()
            self._publish()
        log.debug("fetcher assigned %s", sorted((tp.topic, tp.partition) for tp in new))

    def unassign(self, partitions: Iterable[Partition]) -> None:
        """Stop fetching and drop every buffered record of ``partitions``."""
        with self._flight, self._lock:
            gone = [p for p in partitions if p in self._assigned]
            self._forget_handed(set(gone))
            self._purge(set(gone))
            for p in gone:
                self._assigned.discard(p)
                self._gate_fenced.discard(p)
                self._fetchable.discard(p)
                self._native.discard(p)
                self._positions.pop(p, None)
                self._epochs.pop(p, None)
                self._paused.discard(p)
            self._refresh_fast()
            self._publish()
            if gone and not self._closed:
                self._consumer.incremental_unassign([TopicPartition(t, p) for t, p in gone])
        if gone:
            log.debug("fetcher unassigned %s", sorted(gone))

    def fence(self, partitions: Iterable[Partition]) -> None:
        """Mark partitions pending revocation: their records are dropped from now on.
        Either thread (the network loop fences lost partitions): takes no lock, each step
        is one operation on a set (atomic), and a hand-out decides with the sets as they are
        then (`consume` checks them again before it trusts ``_fast``)."""
        partitions = set(partitions)
        before = len(self._fetchable)
        self._fetchable.difference_update(partitions)
        if len(self._fetchable) != before:
            self._fast = False
            self._checked = False
        # After _fetchable: see `_check_gate`, which may be closing the gate meanwhile.
        self._gate_fenced.difference_update(partitions)

    def unfence(self, partitions: Iterable[Partition]) -> None:
        """Make fenced partitions that stay assigned fetchable again, from their position.

        Records fetched while they were fenced were dropped, so each is rewound to the
        offset after the last record delivered (or where it started)."""
        rewind: list[tuple[TopicPartition, int]] = []
        with self._flight:
            with self._lock:
                self._fold()  # the records handed out from the buffer count in ``_last``
                for key in partitions:
                    if key in self._assigned and key not in self._fetchable:
                        self._fetchable.add(key)
                        if key in self._native:
                            continue  # nothing of it was dropped: librdkafka's position holds
                        msg = self._last.get(key)
                        offset = msg.offset() if msg is not None else None
                        if offset is not None:
                            position: int | None = offset + 1
                            epoch = _epoch(msg)  # type: ignore[arg-type]
                        else:
                            position = self._positions.get(key)
                            epoch = self._epochs.get(key, -1)
                        if position is not None:
                            rewind.append((TopicPartition(key[0], key[1], position), epoch))
                # Records buffered before the fence would come again after the rewind.
                self._purge({(tp.topic, tp.partition) for tp, _ in rewind})
                self._refresh_fast()
            for tp, _ in rewind:
                self._consumer.seek(tp)
            with self._lock:
                # After the seek librdkafka's position is invalid: the rewind position
                # stands, with the epoch of the last record delivered before it.
                for tp, epoch in rewind:
                    key = (tp.topic, tp.partition)
                    self._positions[key] = tp.offset
                    self._epochs[key] = epoch
                    if key in self._fetchable:
                        self._native.add(key)
                self._forget_handed({(tp.topic, tp.partition) for tp, _ in rewind})
                self._refresh_fast()
                if rewind:
                    self._publish()
        if rewind:
            log.debug("fetcher unfenced %s", sorted((tp.topic, tp.partition) for tp, _ in rewind))

    def assigned(self) -> set[Partition]:
        with self._lock:
            return set(self._assigned)

    def pause(self, partitions: Iterable[Partition]) -> None:
        with self._lock:
            tps = [TopicPartition(t, p) for t, p in partitions if (t, p) in self._assigned]
            if tps:
                self._consumer.pause(tps)
                keys = {(tp.topic, tp.partition) for tp in tps}
                self._paused.update(keys)
                # librdkafka resumes after the records it handed over: keep the buffered
                # ones of these partitions until they resume, in order.
                if self.buffered:
                    self._fold()
                    kept: list[Message] = []
                    for msg in self._cursor.msgs:
                        key = (msg.topic(), msg.partition())
                        if msg.error() is None and key in keys:
                            self._held.setdefault(key, []).append(msg)
                        else:
                            kept.append(msg)
                    self._install(kept, self._cursor.topic)

    def resume(self, partitions: Iterable[Partition]) -> None:
        with self._lock:
            tps = [TopicPartition(t, p) for t, p in partitions if (t, p) in self._assigned]
            if tps:
                self._consumer.resume(tps)
                keys = [(tp.topic, tp.partition) for tp in tps]
                self._paused.difference_update(keys)
                back: list[Message] = []
                for key in keys:
                    back += self._held.pop(key, ())
                if back:  # before anything fetched after the resume
                    self._fold()
                    msgs = back + self._cursor.msgs
                    self._install(msgs, _plain_topic(msgs))
                    self._checked = False  # fenced while paused?

    def seek(self, partition: Partition, offset: int) -> None:
        """Fetch ``partition`` from ``offset`` next (absolute or logical), dropping what was
        buffered. Its position is unknown until the next record, as in librdkafka.

        librdkafka refuses to seek a partition whose fetch has not started yet (its start
        offset is still being applied); such a partition is restarted at ``offset``
        instead, so a seek right after an assignment wins over the committed offset."""
        topic, number = partition
        tp = TopicPartition(topic, number, offset)
        with self._flight, self._lock:
            if partition not in self._assigned:
                raise KafkaException(
                    KafkaError(
                        KafkaError._STATE,
                        f"cannot seek {topic} [{number}]: it is not assigned to this consumer",
                    )
                )
            self._forget_handed({partition})
            self._purge({partition})
            self._positions.pop(partition, None)
            self._epochs.pop(partition, None)
            # Either way librdkafka's position is invalid now and nothing of the partition
            # is buffered: librdkafka's position is its own again (unless it is fenced: its
            # records are dropped until it is unfenced).
            self._native.discard(partition)
            self._publish()
            try:
                self._consumer.seek(tp)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._STATE:
                    self._refresh_fast()
                    raise
                self._consumer.incremental_unassign([TopicPartition(topic, number)])
                self._consumer.incremental_assign([tp])
                if partition in self._paused:
                    self._consumer.pause([TopicPartition(topic, number)])
                log.debug(
                    "fetcher restarted %s [%d] at %d (seek before its first fetch)",
                    topic,
                    number,
                    offset,
                )
            if partition in self._fetchable:
                self._native.add(partition)
            self._refresh_fast()

    @property
    def publication(self) -> Published:
        """What has been handed out (any thread; never waits): the network loop's
        auto-commit reads it. It can trail `committable` only by positions librdkafka moved
        without handing out a record (past a transaction marker) since the last batch.
        With ``publish_batches=False`` it leaves out ``consume()`` batches of librdkafka's
        own partitions: read `committable` instead."""
        return self._published

    def committable(self) -> dict[Partition, tuple[int, int]]:
        """Position and leader epoch (-1 if unknown) per partition that has a position:
        what a commit of the consumed offsets commits (application side: reading
        librdkafka's own positions waits for a batch being returned on another thread)."""
        with self._lock:
            if not self._native:
                return self._tracked()
        with self._flight:
            with self._lock:
                out = self._tracked()
                native = list(self._native)
                closed = self._closed
            if native and not closed:
                out.update(self._read_native(native))
            return out

    def _tracked(self) -> dict[Partition, tuple[int, int]]:
        """The positions kept here (_lock held): exact for every partition but the native
        ones (their last known position). Consistent without ``_flight``: a partition leaves
        the native set and gets its position here in one ``_lock`` hold. The application
        thread adds to ``_last`` and ``_positions`` without the lock: each is copied in one
        step (list() runs in C)."""
        epochs = self._epochs
        out = {p: (o, epochs.get(p, -1)) for p, o in list(self._positions.items())}
        out.update(self._handed.positions())
        return out

    def positions(self) -> dict[Partition, int]:
        """Next offset to deliver per partition (only partitions that have one)."""
        return {p: o for p, (o, _) in self.committable().items()}

    def monitor_positions(self, librdkafka: Mapping[Partition, int]) -> dict[Partition, int]:
        """Positions for monitoring (lag), from any thread without waiting and without
        calling into librdkafka (confluent-kafka serializes such calls with a running poll):
        the ones kept here, and for the partitions whose position is librdkafka's, the
        application offset ``librdkafka`` reported (its last statistics). Never commit them."""
        with self._lock:
            out = {p: o for p, (o, _) in self._tracked().items()}
            native = set(self._native)
        for key in native:
            found = librdkafka.get(key, -1)
            if found >= 0:
                out[key] = found
        return out

    def leader_epoch(self, partition: Partition) -> int:
        """Leader epoch of the last record delivered from ``partition`` (-1 if unknown)."""
        found = self.committable().get(partition)
        return -1 if found is None else found[1]

    def _read_native(self, keys: Collection[Partition]) -> dict[Partition, tuple[int, int]]:
        """librdkafka's valid positions of ``keys`` (_flight held)."""
        out: dict[Partition, tuple[int, int]] = {}
        for tp in self._consumer.position([TopicPartition(t, p) for t, p in keys]):
            if tp.offset >= 0:
                epoch = tp.leader_epoch
                out[(tp.topic, tp.partition)] = (tp.offset, -1 if epoch is None else epoch)
        return out

    def _materialize(self, keys: Collection[Partition]) -> None:
        """Keep the positions of native ``keys`` ourselves, from librdkafka's (exact: no
        batch is being returned; application thread, _flight held)."""
        found = self._read_native(keys) if not self._closed else {}
        with self._lock:
            for key in keys:
                if key in self._native:
                    self._native.discard(key)
                    if key in found:
                        self._positions[key], self._epochs[key] = found[key]
            self._fast = False
            self._publish()

    def _forget_handed(self, keys: Collection[Partition]) -> None:
        """Drop ``keys`` from the records handed out (application thread; publish after):
        a new dict, as a published one never loses an entry."""
        self._fold()
        if any(key in self._last for key in keys):
            self._last = {k: m for k, m in self._last.items() if k not in keys}
            self._cursor = _Batch(self._cursor.msgs, self._cursor.topic)
            self._handed = _Handed(self._last, self._cursor)

    def _fold(self) -> None:
        """(application thread) Count the records handed out from ``_cursor`` in ``_last``
        and keep only the others in it (a new `_Batch`, after ``_last`` has them: see
        `_Handed.positions`)."""
        batch = self._cursor
        taken = batch.taken
        if taken:
            msgs, topic, lasts = batch.msgs, batch.topic, batch.lasts
            if taken == len(msgs) and lasts is not None and topic is not None:
                self._last.update({(topic, p): m for p, m in lasts.items()})
            else:
                self._last.update(_lasts(msgs[:taken], topic))
            self._install(msgs[taken:], topic)

    def _install(self, msgs: list[Message], topic: str | None) -> None:
        """(application thread) Make ``msgs`` the records to hand out (after `_fold`)."""
        self._cursor = self._handed.batch = _Batch(msgs, topic)

    def _publish(self) -> None:
        """(application thread, _flight held) Publish the positions as they are now (see
        `Published`); pending batches are replaced by one read of librdkafka's positions
        (exact: no batch is being returned, and a partition is native only while
        librdkafka's position is right or invalid)."""
        if self._pending_records:
            if self._native and not self._closed:
                positions, epochs = self._positions, self._epochs
                for key, (offset, epoch) in self._read_native(self._native).items():
                    positions[key] = offset
                    epochs[key] = epoch
            self._pending = []
            self._pending_records = 0
        epochs = self._epochs
        known = {p: (o, epochs.get(p, -1)) for p, o in self._positions.items()}
        self._published = Published(known, self._pending, self._handed, frozenset(self._assigned))

    def _publish_native(self) -> None:
        """(application thread, _flight held, after a batch) `_publish` when only native
        partitions' positions moved: they are read from librdkafka."""
        native = self._native
        tps = self._native_tps
        if native != self._native_seen:  # the partitions to read, built again when changed
            self._native_seen = frozenset(native)
            tps = self._native_tps = [TopicPartition(t, p) for t, p in native]
        found: dict[Partition, tuple[int, int]] = {}
        positions, epochs = self._positions, self._epochs
        for tp in self._consumer.position(tps):
            offset = tp.offset
            if offset >= 0:
                key = (tp.topic, tp.partition)
                epoch = tp.leader_epoch
                found[key] = (offset, -1 if epoch is None else epoch)
                positions[key] = offset
                epochs[key] = found[key][1]
        self._pending = []
        self._pending_records = 0
        published = self._published
        self._published = Published(
            {**published.known, **found}, self._pending, self._handed, published.assigned
        )

    def _settle(self) -> None:
        """Before a ``consume()`` call that may not be fast (application thread, _flight
        held, no batch being returned): native partitions that are fenced keep their
        position here from now on (their records will be dropped); fetchable ones with
        nothing buffered whose position equals librdkafka's become native."""
        with self._lock:
            fenced = self._native - self._fetchable
            candidates = self._fetchable - self._native - self._held.keys()
            if self.buffered:
                batch = self._cursor
                candidates -= _keys(batch.msgs[batch.taken :], batch.topic)
        if fenced:
            self._materialize(fenced)
        settled: set[Partition] = set()
        if candidates and not self._closed:
            found = self._read_native(candidates)
            with self._lock:
                for key in candidates:
                    if key not in self._fetchable or key in self._native:
                        continue
                    msg = self._last.get(key)
                    offset = msg.offset() if msg is not None else None
                    ours = offset + 1 if offset is not None else self._positions.get(key)
                    theirs = found.get(key)
                    if theirs is None and msg is None:
                        self._native.add(key)  # nothing returned since its explicit position
                    elif theirs is not None and theirs[0] == ours:
                        self._native.add(key)
                        self._positions[key], self._epochs[key] = theirs
                        settled.add(key)
                    else:
                        log.debug(
                            "fetcher keeps the position of %s [%d] (%s; librdkafka's %s)",
                            key[0],
                            key[1],
                            ours,
                            theirs,
                        )
        with self._lock:
            if settled:
                self._forget_handed(settled)
                self._publish()
            self._refresh_fast()

    def _purge(self, partitions: set[Partition]) -> None:
        """Drop the buffered records of ``partitions`` (unassigned, sought or rewound)."""
        for key in partitions:
            self._held.pop(key, None)
        if self.buffered and partitions:
            self._fold()
            self._install(
                [
                    m
                    for m in self._cursor.msgs
                    if m.error() is not None or (m.topic(), m.partition()) not in partitions
                ],
                self._cursor.topic,
            )

    def _fill(self, msgs: list[Message]) -> None:
        """(application thread, the buffer handed out) Buffer ``msgs``: per batch, not per
        record, the partitions of its records are checked (fetchable?) and, when the next
        batch comes, the last record of each is kept (`_fold`)."""
        self._fold()
        topic = _plain_topic(msgs)
        keys: set[Partition]
        if topic is not None:  # the usual case: one pass gives partitions and last records
            lasts: dict[int, Message] = dict(zip(map(_PARTITION, msgs), msgs, strict=True))  # type: ignore[arg-type]
            keys = {(topic, p) for p in lasts}
            self._cursor = self._handed.batch = _Batch(msgs, topic, lasts)
        else:
            keys = _keys(msgs, None)
            self._install(msgs, None)
        self._checked = True  # before the read of _fetchable (see __init__)
        if not keys <= self._fetchable:
            self._checked = False

    def _recheck(self) -> None:
        """(application thread) Drop the buffered records of partitions no longer
        fetchable."""
        self._fold()
        self._checked = True  # before the read of _fetchable (see __init__)
        fetchable = self._fetchable
        kept: list[Message] = []
        for msg in self._cursor.msgs:
            if msg.error() is not None:
                kept.append(msg)
                continue
            key = (msg.topic(), msg.partition())
            if key in fetchable:
                kept.append(msg)
            else:
                self._note_dropped(key, msg)  # type: ignore[arg-type]
        self._install(kept, self._cursor.topic)

    # The per-record path takes no lock and does nothing per partition: handing a record out
    # moves the buffer's ``taken`` on (one store, atomic under the GIL); positions are read
    # from the records handed out when asked (`_Handed`).
    def poll(
        self, timeout: float, now: float | None = None, batch: int = POLL_BATCH
    ) -> Message | None:
        """The next record or error event; waits up to ``timeout`` for one if none is
        buffered. Records of partitions no longer fetchable are dropped (None if only
        such records were buffered). ``now``: the caller's `time.monotonic()` reading,
        if it just took one (spares the per-record gate check its own). ``batch``: at most
        this many records are taken from librdkafka into the buffer when it is empty."""
        if (_monotonic() if now is None else now) > self._open_until:
            self._check_gate(reopen=True)
        if not self.buffered:
            if self._closed:
                return None
            with self._flight:
                if self._native:  # their records are about to be buffered
                    self._materialize(set(self._native))
                if timeout <= 0:  # one call into librdkafka
                    msgs = self._consumer.consume(batch, 0)
                    if not msgs:
                        return None
                else:
                    # The wait comes first, so a wake-up (`wake`) ends it: a batch call on
                    # the empty queue would consume the wake-up and return nothing.
                    msg = self._consumer.poll(timeout)
                    if msg is None:
                        return None
                    msgs = self._consumer.consume(batch - 1, 0) if batch > 1 else []
                    msgs.insert(0, msg)
                self._fill(msgs)
            if _monotonic() > self._open_until:  # the member may have stalled in the wait
                self._check_gate(reopen=False)
        return self.next_buffered()

    @property
    def buffered(self) -> bool:
        """Whether `poll` holds records taken from librdkafka and not handed out yet."""
        batch = self._cursor
        return batch.taken < len(batch.msgs)

    @property
    def open_until(self) -> float:
        """Until when (monotonic s) records may be handed out without asking the gate
        (``poll``/``consume`` ask it past this)."""
        return self._open_until

    def next_buffered(self) -> Message | None:
        """The next buffered record of a fetchable partition (its position moves past it) or
        error event; None once the buffer is empty. No wait, no call into librdkafka and no
        gate check: a caller that skips `poll` checks `open_until` itself. `Consumer.poll`
        and `AIOConsumer.__anext__` inline it (with ``_cursor``, ``_checked`` and
        ``_open_until``) on their record paths: a change here goes there too."""
        if not self._checked:
            self._recheck()
        batch = self._cursor
        taken = batch.taken
        if taken < len(batch.msgs):
            batch.taken = taken + 1
            return batch.msgs[taken]
        return None

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        if _monotonic() > self._open_until:
            self._check_gate(reopen=True)
        if self.buffered:  # what poll() buffered goes first
            if not self._checked:
                self._recheck()
            batch = self._cursor
            start = batch.taken
            taken = batch.msgs[start : start + num_messages]
            if taken:
                batch.taken = start + len(taken)
                return taken
            timeout = 0
        if self._closed:
            return []
        with self._flight:
            self._fold()  # before anything else reads or writes ``_last``
            if not self._fast:
                self._settle()
            msgs = self._consumer.consume(num_messages, timeout)
            if not msgs:
                return msgs
            if _monotonic() > self._open_until:  # a stall during the wait
                self._check_gate(reopen=False)
            # Common case: every assigned partition fetchable and native, so librdkafka's
            # positions are right for the whole batch (error events do not move them). The
            # sizes are compared too: the loop thread's fence() sets no lock against a
            # _refresh_fast() that read the sets before it.
            if not (self._fast and len(self._fetchable) == len(self._assigned)):
                msgs = self._sort(msgs)
            # Publish the batch before it is handed out (`Published`).
            if self._native and self._publish_batches:
                self._pending_records += len(msgs)
                if self._pending_records >= _PENDING_RECORDS:
                    self._publish_native()  # librdkafka's positions count this batch
                else:
                    self._pending.append(tuple(msgs))  # a copy: the caller may change its list
            return msgs

    def _sort(self, msgs: list[Message]) -> list[Message]:
        """The records of ``msgs`` to hand out (application thread, _flight held)."""
        keys = list(zip(map(_TOPIC, msgs), map(_PARTITION, msgs), strict=True))
        with self._lock:
            fetchable = set(self._fetchable)  # one decision per batch and partition
            native = self._native
            lost = native - fetchable
        if lost:
            # Fenced by the network loop during the call: librdkafka's position counts
            # this batch's records of them, which are dropped. Their first record here is
            # where they stood before it.
            firsts: dict[Partition, Message] = {}
            for key, msg in zip(keys, msgs, strict=True):
                if key in lost and key not in firsts and msg.error() is None:
                    firsts[key] = msg
            with self._lock:
                for key, msg in firsts.items():
                    offset = msg.offset()
                    if offset is not None:
                        native.discard(key)
                        self._positions[key] = offset
                        self._epochs[key] = _epoch(msg)
                self._forget_handed(firsts.keys())
                self._publish()
        last = self._last
        out = []
        for key, msg in zip(keys, msgs, strict=True):
            if msg.error() is not None:
                out.append(msg)
            elif key in fetchable:
                if key not in native:
                    last[key] = msg
                out.append(msg)
            else:
                self._note_dropped(key, msg)  # type: ignore[arg-type]
        return out

    def _note_dropped(self, key: Partition, msg: Message) -> None:
        """A fenced partition's record was dropped: if nothing was delivered from it yet,
        remember where it starts, so `unfence` can rewind there."""
        if key in self._assigned and key not in self._last and key not in self._positions:
            offset = msg.offset()
            if offset is not None:
                self._positions[key] = offset

    def close(self) -> None:
        with self._flight:
            with self._lock:
                if self._closed:
                    return
                native = set(self._native)
            if native:  # positions stay readable after librdkafka's consumer is gone
                self._materialize(native)
            with self._lock:
                self._closed = True
                self._fold()
                self._install([], None)
                self._held.clear()
        if self._waker is not None:  # its queue reference must go before the consumer
            self._waker.close()
        # Assign-only consumers leave no group; close() only stops librdkafka's threads.
        self._consumer.close()
