"""Small frozen domain types shared by the wire layer and the sans-IO membership core.

The wire layer (``consumer_sdk.protocol``) converts these to and from ``kio`` entities;
nothing outside ``protocol/`` sees a ``kio`` type.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

ZERO_UUID = uuid.UUID(int=0)


@dataclass(frozen=True, slots=True)
class TopicIdPartitions:
    """Partitions of one topic, keyed by topic id (as in ConsumerGroupHeartbeat)."""

    topic_id: uuid.UUID
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    """ConsumerGroupHeartbeat request. ``None`` / ``-1`` mean "unchanged since the last one"."""

    group_id: str
    member_id: str
    member_epoch: int
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    subscribed_topic_names: tuple[str, ...] | None = None
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    topic_partitions: tuple[TopicIdPartitions, ...] | None = None


@dataclass(frozen=True, slots=True)
class HeartbeatResponse:
    """ConsumerGroupHeartbeat response."""

    error_code: int
    member_epoch: int
    heartbeat_interval_ms: int
    member_id: str | None = None
    error_message: str | None = None
    assignment: tuple[TopicIdPartitions, ...] | None = None
    throttle_time_ms: int = 0


@dataclass(frozen=True, slots=True)
class Broker:
    node_id: int
    host: str
    port: int
    rack: str | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class PartitionMetadata:
    partition: int
    leader: int
    error_code: int = 0


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    topic_id: uuid.UUID
    partitions: tuple[PartitionMetadata, ...]
    error_code: int = 0

    @property
    def partition_count(self) -> int:
        return len(self.partitions)


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    """A Metadata response: brokers and topics, with topic id <-> name lookups both ways."""

    brokers: tuple[Broker, ...]
    topics: tuple[TopicMetadata, ...]
    controller_id: int = -1
    cluster_id: str | None = None
    _by_name: dict[str, TopicMetadata] = field(init=False, repr=False, compare=False)
    _by_id: dict[uuid.UUID, TopicMetadata] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_by_name", {t.name: t for t in self.topics})
        object.__setattr__(
            self, "_by_id", {t.topic_id: t for t in self.topics if t.topic_id != ZERO_UUID}
        )

    def topic(self, name: str) -> TopicMetadata | None:
        return self._by_name.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicMetadata | None:
        return self._by_id.get(topic_id)

    def topic_id(self, name: str) -> uuid.UUID | None:
        t = self._by_name.get(name)
        return t.topic_id if t is not None and t.topic_id != ZERO_UUID else None

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        t = self._by_id.get(topic_id)
        return t.name if t is not None else None

    def broker(self, node_id: int) -> Broker | None:
        for b in self.brokers:
            if b.node_id == node_id:
                return b
        return None


@dataclass(frozen=True, slots=True)
class Coordinator:
    """Result of FindCoordinator for one key."""

    key: str
    node_id: int
    host: str
    port: int
    error_code: int = 0
    error_message: str | None = None


@dataclass(frozen=True, slots=True)
class OffsetCommitPartition:
    topic: str
    partition: int
    offset: int
    leader_epoch: int = -1
    metadata: str | None = None


@dataclass(frozen=True, slots=True)
class OffsetCommitRequest:
    group_id: str
    member_id: str
    member_epoch: int
    offsets: tuple[OffsetCommitPartition, ...]
    instance_id: str | None = None


@dataclass(frozen=True, slots=True)
class PartitionResult:
    """Per-partition outcome of an offset commit or fetch."""

    topic: str
    partition: int
    error_code: int = 0
    offset: int = -1
    leader_epoch: int = -1
    metadata: str | None = None


@dataclass(frozen=True, slots=True)
class OffsetFetchRequest:
    group_id: str
    #: None: every partition the group has committed offsets for.
    partitions: tuple[tuple[str, int], ...] | None
    member_id: str | None = None
    member_epoch: int = -1
    require_stable: bool = True


@dataclass(frozen=True, slots=True)
class OffsetFetchResponse:
    error_code: int
    partitions: tuple[PartitionResult, ...]
