"""Data plane: records fetched by a ``confluent_kafka.Consumer`` in assign-only mode.

The fetcher never subscribes, never commits and never stores offsets; the membership
runtime drives it with ``incremental_assign`` / ``incremental_unassign``. Records of a
partition that is no longer fetchable are dropped, including ones librdkafka already
buffered, so a revoked partition's record can never reach the application.
"""

from __future__ import annotations

import logging
import threading
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


class Fetcher:
    """Assign-only record fetcher with per-partition positions."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self._consumer = Consumer(dict(config))
        self._lock = threading.Lock()
        self._fetchable: set[Partition] = set()
        self._assigned: set[Partition] = set()
        self._positions: dict[Partition, int] = {}
        self._last: dict[Partition, Message] = {}
        self._paused: set[Partition] = set()
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
            for tp in new:
                key = (tp.topic, tp.partition)
                self._assigned.add(key)
                self._fetchable.add(key)
                if tp.offset >= 0:
                    self._positions[key] = tp.offset
        log.debug("fetcher assigned %s", sorted((tp.topic, tp.partition) for tp in new))

    def unassign(self, partitions: Iterable[Partition]) -> None:
        """Stop fetching and drop every buffered record of ``partitions``."""
        with self._lock:
            gone = [p for p in partitions if p in self._assigned]
            for p in gone:
                self._assigned.discard(p)
                self._fetchable.discard(p)
                self._positions.pop(p, None)
                self._last.pop(p, None)
                self._paused.discard(p)
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
                self._paused.update((tp.topic, tp.partition) for tp in tps)

    def resume(self, partitions: Iterable[Partition]) -> None:
        with self._lock:
            tps = [TopicPartition(t, p) for t, p in partitions if (t, p) in self._assigned]
            if tps:
                self._consumer.resume(tps)
                self._paused.difference_update((tp.topic, tp.partition) for tp in tps)

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

    # The per-record path avoids locks and copies: the GIL makes these dict/set operations
    # atomic, and the last delivered message per partition gives both position and epoch.
    def poll(self, timeout: float) -> Message | None:
        if self._closed:
            return None
        msg = self._consumer.poll(timeout)
        if msg is None or msg.error() is not None:
            return msg
        key = (msg.topic(), msg.partition())
        if key not in self._fetchable:
            self._note_dropped(key, msg)  # type: ignore[arg-type]
            return None
        self._last[key] = msg
        return msg

    def consume(self, num_messages: int, timeout: float) -> list[Message]:
        if self._closed:
            return []
        msgs = self._consumer.consume(num_messages, timeout)
        if not msgs:
            return msgs
        keys = list(zip(map(_TOPIC, msgs), map(_PARTITION, msgs), strict=True))
        if self._fetchable == self._assigned and not any(map(_ERROR, msgs)):
            # Common case, done in C: nothing fenced, no error events in the batch; the
            # later messages of a partition overwrite earlier ones in ``_last``.
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
        # Assign-only consumers leave no group; close() only stops librdkafka's threads.
        self._consumer.close()
