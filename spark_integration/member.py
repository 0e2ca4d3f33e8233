"""What the stream reader needs of a group member, and the stand-in for ``assign`` queries.

`SourceMember` is the part of ``consumer_sdk.GroupMember`` the driver side of the source
uses; `AssignedPartitions` implements it for fixed partitions without a group. Both run in
the stream-reader process, called from Spark's thread (and the commit-log watcher).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from spark_integration.offsets import Partition
from spark_integration.options import SourceOptions

if TYPE_CHECKING:  # consumer_sdk is imported lazily (see spark_integration.driver)
    from consumer_sdk import MemberState

__all__ = [
    "AssignedPartitions",
    "RebalanceCallback",
    "SourceMember",
    "committed_offsets",
    "partitions_of",
    "topic_partitions",
]

log = logging.getLogger("spark_integration")
_KAFKA_LOG = logging.getLogger("spark_integration.librdkafka")

RebalanceCallback = Callable[[Any, list[TopicPartition]], None]


class SourceMember(Protocol):
    """The group member as the stream reader uses it (``consumer_sdk.GroupMember``)."""

    @property
    def member_id(self) -> str: ...

    @property
    def member_epoch(self) -> int: ...

    @property
    def state(self) -> MemberState: ...

    def subscribe(
        self,
        topics: Sequence[str] | str,
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None: ...

    def poll(self, timeout: float | None = None) -> Any: ...

    def commit(
        self,
        message: Any = None,
        offsets: Sequence[TopicPartition] | None = None,
        asynchronous: bool = True,
        timeout: float | None = None,
    ) -> list[TopicPartition] | None: ...

    def committed(
        self, partitions: Sequence[TopicPartition], timeout: float = 10.0
    ) -> list[TopicPartition]: ...

    def close(self, timeout: float = 10.0) -> None: ...


def topic_partitions(parts: Iterable[Partition]) -> list[TopicPartition]:
    return [TopicPartition(t, p) for t, p in sorted(parts)]


def partitions_of(tps: Iterable[TopicPartition]) -> list[Partition]:
    return sorted((tp.topic, tp.partition) for tp in tps)


def committed_offsets(
    member: SourceMember, parts: Iterable[Partition], attempts: int = 3
) -> dict[Partition, int]:
    """The group's committed offsets (absent where none), retrying transient failures."""
    for attempt in range(1, attempts + 1):
        try:
            return {
                (tp.topic, tp.partition): tp.offset
                for tp in member.committed(topic_partitions(parts), timeout=10.0)
                if tp.offset >= 0
            }
        except KafkaException as exc:
            if attempt == attempts or exc.args[0].fatal():
                raise
            log.warning("kip848: fetching committed offsets failed (%s); retrying", exc)
            time.sleep(0.2 * attempt)
    raise AssertionError("unreachable")


class AssignedPartitions:
    """Stands in for the ``GroupMember`` of an ``assign`` query: fixed partitions, no group.

    Offsets are committed to ``group.id`` (when given) by a non-member client, so lag
    tooling sees them; a broker accepts such commits while no member is in that group.
    """

    member_epoch = 0

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.member_id = "assign-" + uuid.uuid4().hex[:16]
        self._on_assign: RebalanceCallback | None = None
        self._assigned = False
        self._client: KafkaConsumer | None = None
        if options.group_id:
            self._client = KafkaConsumer({**options.commit_config(), "logger": _KAFKA_LOG})

    @property
    def state(self) -> MemberState:
        from consumer_sdk import MemberState

        return MemberState.STABLE

    def subscribe(
        self,
        topics: Sequence[str] | str,
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        self._on_assign = on_assign

    def poll(self, timeout: float | None = None) -> None:
        if not self._assigned:
            self._assigned = True
            if self._on_assign is None:
                return
            try:
                self._on_assign(self, topic_partitions(self.options.assign))
            except Exception as exc:
                raise KafkaException(KafkaError(KafkaError._APPLICATION, str(exc))) from exc

    def committed(
        self, partitions: Sequence[TopicPartition], timeout: float = 10.0
    ) -> list[TopicPartition]:
        if self._client is None:
            return []
        return list(self._client.committed(list(partitions), timeout=timeout))

    def commit(
        self,
        message: Any = None,
        offsets: Sequence[TopicPartition] | None = None,
        asynchronous: bool = True,
        timeout: float | None = None,
    ) -> list[TopicPartition] | None:
        if self._client is not None and offsets:
            self._client.commit(offsets=list(offsets), asynchronous=False)
        return None

    def close(self, timeout: float = 10.0) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()
