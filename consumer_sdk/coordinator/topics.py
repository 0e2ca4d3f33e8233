"""The coordinator model's topic registry: names, topic ids and partition counts."""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

_NAMESPACE = uuid.UUID("6f1c3a52-7d0e-4c55-9a55-8d8e1f0c2b11")


@dataclass(frozen=True, slots=True)
class Topic:
    """A topic as the model knows it."""

    name: str
    topic_id: uuid.UUID
    partitions: int


class TopicRegistry:
    """Topic name <-> id, with partition counts.

    Topic ids are derived deterministically from the name and how many times a topic of that
    name was created before, so that a recreated topic gets a new id (as in Kafka) and two runs
    of a simulation see the same ids. ``version`` changes on every mutation.
    """

    def __init__(self, topics: Mapping[str, int] | None = None) -> None:
        self._by_name: dict[str, Topic] = {}
        self._by_id: dict[uuid.UUID, Topic] = {}
        self._incarnations: dict[str, int] = {}
        self.version = 0
        for name, count in (topics or {}).items():
            self.create(name, count)

    def create(self, name: str, partitions: int) -> Topic:
        """Create ``name`` with ``partitions`` partitions (ValueError if it exists)."""
        if not name:
            raise ValueError("topic names must not be empty")
        if partitions < 1:
            raise ValueError("a topic needs at least one partition")
        if name in self._by_name:
            raise ValueError(f"topic {name!r} already exists")
        n = self._incarnations.get(name, 0)
        self._incarnations[name] = n + 1
        topic = Topic(name, uuid.uuid5(_NAMESPACE, f"{name}/{n}"), partitions)
        self._by_name[name] = topic
        self._by_id[topic.topic_id] = topic
        self.version += 1
        return topic

    def delete(self, name: str) -> Topic:
        """Delete ``name`` (KeyError if unknown)."""
        topic = self._by_name.pop(name)
        del self._by_id[topic.topic_id]
        self.version += 1
        return topic

    def add_partitions(self, name: str, count: int) -> Topic:
        """Grow ``name`` by ``count`` partitions (Kafka can only add partitions)."""
        if count < 1:
            raise ValueError("can only add a positive number of partitions")
        old = self._by_name[name]
        topic = Topic(old.name, old.topic_id, old.partitions + count)
        self._by_name[name] = topic
        self._by_id[topic.topic_id] = topic
        self.version += 1
        return topic

    def get(self, name: str) -> Topic | None:
        return self._by_name.get(name)

    def by_id(self, topic_id: uuid.UUID) -> Topic | None:
        return self._by_id.get(topic_id)

    def topic_id(self, name: str) -> uuid.UUID | None:
        topic = self._by_name.get(name)
        return topic.topic_id if topic is not None else None

    def name(self, topic_id: uuid.UUID) -> str | None:
        topic = self._by_id.get(topic_id)
        return topic.name if topic is not None else None

    def names(self) -> list[str]:
        return sorted(self._by_name)

    def names_by_id(self) -> dict[uuid.UUID, str]:
        """The id -> name view a client gets from a Metadata request."""
        return {t.topic_id: t.name for t in self._by_name.values()}

    def __iter__(self) -> Iterator[Topic]:
        return iter(sorted(self._by_name.values(), key=lambda t: t.name))

    def __len__(self) -> int:
        return len(self._by_name)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name
