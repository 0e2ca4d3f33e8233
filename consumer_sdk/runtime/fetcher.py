"""Data plane: records fetched by a ``confluent_kafka.Consumer`` in assign-only mode.

The fetcher never subscribes, never commits and never stores offsets; the membership
runtime drives it with ``incremental_assign`` / ``incremental_unassign``. Records of a
partition that is no longer fetchable are dropped, including ones librdkafka already
buffered, so a revoked partition's record can never reach the application.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

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

log = logging.getLogger("consumer_sdk.runtime")

Partition = tuple[str, int]

_TOPIC = Message.topic
_PARTITION = Message.partition
_ERROR = Message.error

#: Records taken from librdkafka in one call when ``poll()`` finds the local buffer empty:
#: one ``consume`` call creates them all, so ``poll()`` pays librdkafka's per-call cost
#: (a queue wait, a GIL release) once per batch instead of once per record.
POLL_BATCH = 256

# A buffered record: its partition (None for an error event) and the message.
_Entry = tuple[Partition | None, Message]


def _only_topic(partitions: set[Partition]) -> str | None:
    topics = {topic for topic, _ in partitions}
    return topics.pop() if len(topics) == 1 else None


class Fetcher:
    """Assign-only record fetcher with per-partition positions."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._consumer = Consumer(dict(config))
        self._lock = threading.Lock()
        self._fetchable: set[Partition] = set()
        self._assigned: set[Partition] = set()
        self._topic: str | None = None  # the topic of every assigned partition, if only one
        self._positions: dict[Partition, int] = {}
        self._last: dict[Partition, Message] = {}
        self._paused: set[Partition] = set()
        # Records librdkafka handed over for poll() and not delivered yet, in order; and
        # those of paused partitions, set aside until they resume. Only the application
        # thread reads and writes them (poll, consume and the callbacks that run there).
        self._buffer: deque[_Entry] = deque()
        self._held: dict[Partition, list[_Entry]] = {}
        self._closed = False
        self.reset = str(config.get("auto.offset.reset", "latest"))

    @property
    def consumer(self) -> Consumer:
        return self._consumer

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
        with self._lock:
            new = [tp for tp in tps if (tp.topic, tp.partition) not in self._assigned]
            if not new:
                return
            self._consumer.incremental_assign(new)
            self._purge({(tp.topic, tp.partition) for tp in new})
            for tp in new:
                key = (tp.topic, tp.partition)
                self._assigned.add(key)
                self._fetchable.add(key)
                if tp.offset >= 0:
                    self._positions[key] = tp.offset
            self._topic = _only_topic(self._assigned)
        log.debug("fetcher assigned %s", sorted((tp.topic, tp.partition) for tp in new))

    def unassign(self, partitions: Iterable[Partition]) -> None:
        """Stop fetching and drop every buffered record of ``partitions``."""
        with self._lock:
            gone = [p for p in partitions if p in self._assigned]
            self._purge(set(gone))
            for p in gone:
                self._assigned.discard(p)
                self._fetchable.discard(p)
                self._positions.pop(p, None)
                self._last.pop(p, None)
                self._paused.discard(p)
            self._topic = _only_topic(self._assigned)
            if gone and not self._closed:
                self._consumer.incremental_unassign([TopicPartition(t, p) for t, p in gone])
        if gone:
            log.debug("fetcher unassigned %s", sorted(gone))

    def fence(self, partitions: Iterable[Partition]) -> None:
        """Mark partitions pending revocation: their records are dropped from now on."""
        with self._lock:
            for p in partitions:
                self._fetchable.discard(p)

    def unfence(self, partitions: Iterable[Partition]) -> None:
        """Make fenced partitions that stay assigned fetchable again, from their position.

        Records fetched while they were fenced were dropped, so each is rewound to the
        offset after the last record delivered (or where it started)."""
        rewind = []
        with self._lock:
            for key in partitions:
                if key in self._assigned and key not in self._fetchable:
                    msg = self._last.get(key)
                    offset = msg.offset() if msg is not None else None
                    position = offset + 1 if offset is not None else self._positions.get(key)
                    self._fetchable.add(key)
                    if position is not None:
                        rewind.append(TopicPartition(key[0], key[1], position))
            # Records buffered before the fence would come again after the rewind.
            self._purge({(tp.topic, tp.partition) for tp in rewind})
        for tp in rewind:
            self._consumer.seek(tp)
        if rewind:
            log.debug("fetcher unfenced %s", sorted((tp.topic, tp.partition) for tp in rewind))

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
                if self._buffer:
                    kept: deque[_Entry] = deque()
                    for entry in self._buffer:
                        if entry[0] in keys:
                            self._held.setdefault(entry[0], []).append(entry)
                        else:
                            kept.append(entry)
                    self._buffer = kept

    def resume(self, partitions: Iterable[Partition]) -> None:
        with self._lock:
            tps = [TopicPartition(t, p) for t, p in partitions if (t, p) in self._assigned]
            if tps:
                self._consumer.resume(tps)
                keys = [(tp.topic, tp.partition) for tp in tps]
                self._paused.difference_update(keys)
                for key in keys:
                    held = self._held.pop(key, None)
                    if held:  # before anything fetched after the resume
                        self._buffer.extendleft(reversed(held))

    def seek(self, partition: Partition, offset: int) -> None:
        """Fetch ``partition`` from ``offset`` next (absolute or logical), dropping what was
        buffered. Its position is unknown until the next record, as in librdkafka.

        librdkafka refuses to seek a partition whose fetch has not started yet (its start
        offset is still being applied); such a partition is restarted at ``offset``
        instead, so a seek right after an assignment wins over the committed offset."""
        topic, number = partition
        tp = TopicPartition(topic, number, offset)
        with self._lock:
            if partition not in self._assigned:
                raise KafkaException(
                    KafkaError(
                        KafkaError._STATE,
                        f"cannot seek {topic} [{number}]: it is not assigned to this consumer",
                    )
                )
            self._last.pop(partition, None)
            self._positions.pop(partition, None)
            self._purge({partition})
            try:
                self._consumer.seek(tp)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._STATE:
                    raise
                self._consumer.incremental_unassign([TopicPartition(topic, number)])
                self._consumer.incremental_assign([tp])
                if partition in self._paused:
                    self._consumer.pause([TopicPartition(topic, number)])
                log.debug("fetcher restarted %s [%d] at %d (seek before its first fetch)",
                          topic, number, offset)  # fmt: skip

    def positions(self) -> dict[Partition, int]:
        """Next offset to deliver per partition (only partitions that have one)."""
        with self._lock:
            positions = dict(self._positions)
            last = dict(self._last)
        for key, msg in last.items():
            offset = msg.offset()
            if offset is not None:
                positions[key] = offset + 1
        return positions

    def leader_epoch(self, partition: Partition) -> int:
        msg = self._last.get(partition)
        epoch = msg.leader_epoch() if msg is not None else None
        return -1 if epoch is None else epoch

    def _purge(self, partitions: set[Partition]) -> None:
        """Drop the buffered records of ``partitions`` (unassigned, sought or rewound)."""
        for key in partitions:
            self._held.pop(key, None)
        if self._buffer:
            self._buffer = deque(e for e in self._buffer if e[0] not in partitions)

    def _fill(self, msgs: list[Message]) -> None:
        if any(map(_ERROR, msgs)):
            self._buffer.extend(
                (None if m.error() is not None else (m.topic(), m.partition()), m)  # type: ignore[misc]
                for m in msgs
            )
        else:  # done in C: no error events in the batch
            keys = zip(map(_TOPIC, msgs), map(_PARTITION, msgs), strict=True)
            self._buffer.extend(zip(keys, msgs, strict=True))  # type: ignore[arg-type]

    # The per-record path avoids locks and copies: the GIL makes these dict/set operations
    # atomic, and the last delivered message per partition gives both position and epoch.
    def poll(self, timeout: float) -> Message | None:
        """The next record or error event; waits up to ``timeout`` for one if none is
        buffered. Records of partitions no longer fetchable are dropped (None if only
        such records were buffered)."""
        buffer = self._buffer
        if not buffer:
            if self._closed:
                return None
            msgs = self._consumer.consume(POLL_BATCH, 0)
            if not msgs:
                msg = self._consumer.poll(timeout)
                if msg is None:
                    return None
                msgs = [msg]
            self._fill(msgs)
            buffer = self._buffer
        fetchable = self._fetchable
        while buffer:
            key, msg = buffer.popleft()
            if key is None:
                return msg
            if key in fetchable:
                self._last[key] = msg
                return msg
            self._note_dropped(key, msg)
        return None

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        if self._buffer:  # what poll() buffered goes first
            taken: list[Message] = []
            buffer, fetchable, last = self._buffer, self._fetchable, self._last
            while buffer and len(taken) < num_messages:
                entry, record = buffer.popleft()
                if entry is None:
                    taken.append(record)
                elif entry in fetchable:
                    last[entry] = record
                    taken.append(record)
                else:
                    self._note_dropped(entry, record)
            if taken:
                return taken
            timeout = 0
        if self._closed:
            return []
        msgs = self._consumer.consume(num_messages, timeout)
        if not msgs:
            return msgs
        topic = self._topic
        if topic is not None and self._fetchable == self._assigned:
            # Common case: one topic, nothing fenced. Only the last message per partition
            # matters for the position, so the per-record work is a dict built in C; an
            # error event that is the last of its partition sends the batch the slow way.
            newest = dict(zip(map(_PARTITION, msgs), msgs, strict=True))
            if all(m.error() is None and m.topic() == topic for m in newest.values()):
                last = self._last
                for partition, msg in newest.items():
                    last[(topic, partition)] = msg  # type: ignore[index]
                return msgs
        keys = list(zip(map(_TOPIC, msgs), map(_PARTITION, msgs), strict=True))
        if self._fetchable == self._assigned and not any(map(_ERROR, msgs)):
            # Several topics, nothing fenced, no error events in the batch; the later
            # messages of a partition overwrite earlier ones in ``_last``.
            self._last.update(zip(keys, msgs, strict=True))  # type: ignore[arg-type]
            return msgs
        fetchable, last = self._fetchable, self._last
        out = []
        for key, msg in zip(keys, msgs, strict=True):
            if msg.error() is not None:
                out.append(msg)
            elif key in fetchable:
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
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._buffer.clear()
            self._held.clear()
        # Assign-only consumers leave no group; close() only stops librdkafka's threads.
        self._consumer.close()
