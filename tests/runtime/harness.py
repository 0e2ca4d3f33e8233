"""Test harness: consumers polled by their own application threads, with a callback timeline."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from consumer_sdk import Consumer, KafkaException, TopicPartition
from consumer_sdk.runtime.fetcher import Fetcher
from consumer_sdk.testing import wait_until

Partition = tuple[str, int]


@dataclass
class Timeline:
    """Every callback of every member, in the order they ran (one process, one clock)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    events: list[tuple[float, str, str, tuple[Partition, ...]]] = field(default_factory=list)

    def record(self, member: str, kind: str, parts: list[TopicPartition]) -> None:
        with self.lock:
            self.events.append(
                (time.monotonic(), member, kind, tuple((p.topic, p.partition) for p in parts))
            )

    def overlaps(self) -> list[str]:
        """Partitions owned by two members at once (assign..revoke/lost intervals)."""
        owner: dict[Partition, str] = {}
        problems = []
        with self.lock:
            events = list(self.events)
        for _, member, kind, parts in events:
            for p in parts:
                if kind == "assign":
                    if p in owner and owner[p] != member:
                        problems.append(f"{p} assigned to {member} while owned by {owner[p]}")
                    owner[p] = member
                elif owner.get(p) == member:
                    del owner[p]
        return problems


class Member:
    """A Consumer polled by a thread; records what it consumed and its callbacks."""

    def __init__(
        self,
        name: str,
        config: dict[str, Any],
        topics: list[str],
        timeline: Timeline,
        on_record: Callable[[Member, Any], None] | None = None,
    ) -> None:
        self.name = name
        self.timeline = timeline
        self.consumer = Consumer(config)
        self.records: list[tuple[str, int, int, bytes | None]] = []
        self.errors: list[BaseException] = []
        self.owned: set[Partition] = set()
        self.lost_count = 0
        self.assign_count = 0
        self._on_record = on_record
        self._stop = threading.Event()
        self._paused = threading.Event()
        self.consumer.subscribe(
            topics, on_assign=self._assign, on_revoke=self._revoke, on_lost=self._lost
        )
        self._thread = threading.Thread(target=self._loop, name=f"app-{name}", daemon=True)
        self._thread.start()

    def _assign(self, consumer: Any, parts: list[TopicPartition]) -> None:
        self.assign_count += 1
        self.owned.update((p.topic, p.partition) for p in parts)
        self.timeline.record(self.name, "assign", parts)

    def _revoke(self, consumer: Any, parts: list[TopicPartition]) -> None:
        self.owned.difference_update((p.topic, p.partition) for p in parts)
        self.timeline.record(self.name, "revoke", parts)

    def _lost(self, consumer: Any, parts: list[TopicPartition]) -> None:
        self.lost_count += 1
        self.owned.difference_update((p.topic, p.partition) for p in parts)
        self.timeline.record(self.name, "lost", parts)

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self._paused.is_set():
                time.sleep(0.05)
                continue
            try:
                msg = self.consumer.poll(0.1)
            except KafkaException as exc:
                self.errors.append(exc)
                if exc.args[0].fatal():
                    return
                continue
            except Exception as exc:  # surfaced to the test through self.errors
                self.errors.append(exc)
                continue
            if msg is None or msg.error() is not None:
                continue
            self.records.append((msg.topic(), msg.partition(), msg.offset(), msg.value()))
            if self._on_record is not None:
                self._on_record(self, msg)

    def pause_polling(self) -> None:
        self._paused.set()

    def resume_polling(self) -> None:
        self._paused.clear()

    def stop(self, close_timeout: float = 10.0, **close_kwargs: Any) -> float:
        """Stop polling and close; returns how long close() took."""
        self._stop.set()
        self._thread.join(5)
        started = time.monotonic()
        self.consumer.close(timeout=close_timeout, **close_kwargs)
        return time.monotonic() - started


def wait_for(condition: Callable[[], Any], timeout: float = 20.0, what: str = "") -> Any:
    return wait_until(condition, timeout, 0.05, what or str(condition))


def config(kafka: Any, group: str, **extra: Any) -> dict[str, Any]:
    base = {
        "bootstrap.servers": kafka.bootstrap_servers,
        "group.id": group,
        "auto.offset.reset": "earliest",
    }
    base.update({k.replace("_", "."): v for k, v in extra.items()})
    return base


def fetcher_over(kafka: Any, topic: str, per_partition: int, partitions: int = 2) -> Fetcher:
    """A new topic of ``partitions`` partitions, each holding ``per_partition`` records
    ``"<partition>-<i>"``, and an unassigned Fetcher (group ``<topic>-g``, from the earliest)."""
    kafka.create_topic(topic, partitions=partitions)
    for p in range(partitions):
        kafka.produce(topic, [f"{p}-{i}".encode() for i in range(per_partition)], partition=p)
    return Fetcher(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": f"{topic}-g",
            "auto.offset.reset": "earliest",
        }
    )
