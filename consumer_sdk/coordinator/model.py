"""Configuration, views and events of the coordinator model."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from consumer_sdk.assignors import ASSIGNORS
from consumer_sdk.coordinator.reconcile import IdPartition, MemberAssignmentState

LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2
INITIAL_GROUP_EPOCH = 1


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    """Broker settings of the model (``group.consumer.*``).

    ``assignors`` lists ``group.consumer.assignors``; the first is the default.
    ``assignment_interval_ms`` batches target recomputation (KIP-1263): the target is recomputed
    at most once per interval (0 recomputes on every heartbeat that needs it).
    ``static_rejoin_in_place`` models apache/kafka#23542 (not in the 4.3 baseline): a static
    member rejoining with epoch 0 and its *own* member id gets its state back instead of
    UNRELEASED_INSTANCE_ID.
    """

    session_timeout_ms: int = 45_000
    heartbeat_interval_ms: int = 5_000
    assignors: tuple[str, ...] = ("uniform", "range")
    assignment_interval_ms: int = 1_000
    max_group_size: int = 2**31 - 1
    static_rejoin_in_place: bool = False

    def __post_init__(self) -> None:
        if self.session_timeout_ms <= 0 or self.heartbeat_interval_ms <= 0:
            raise ValueError("session timeout and heartbeat interval must be positive")
        if not self.assignors:
            raise ValueError("at least one assignor is needed")
        for name in self.assignors:
            if name not in ASSIGNORS:
                raise ValueError(f"unknown assignor {name!r}; known: {', '.join(ASSIGNORS)}")
        if self.assignment_interval_ms < 0:
            raise ValueError("assignment_interval_ms must not be negative")


class GroupState(enum.Enum):
    """ConsumerGroupDescribe's GroupState."""

    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class MemberDescription:
    """One member as ``describe`` reports it (partitions by topic id)."""

    member_id: str
    instance_id: str | None
    rack_id: str | None
    member_epoch: int
    previous_epoch: int
    state: MemberAssignmentState
    subscribed_topic_names: frozenset[str]
    subscribed_topic_regex: str
    server_assignor: str | None
    assigned: frozenset[IdPartition]
    pending_revocation: frozenset[IdPartition]
    target: frozenset[IdPartition]
    session_deadline_ms: int
    rebalance_deadline_ms: int | None

    @property
    def holds(self) -> frozenset[IdPartition]:
        """What nobody else may be given: assigned plus pending revocation."""
        return self.assigned | self.pending_revocation


@dataclass(frozen=True, slots=True)
class GroupDescription:
    """ConsumerGroupDescribe for one group."""

    group_id: str
    state: GroupState
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: tuple[MemberDescription, ...]

    def member(self, member_id: str) -> MemberDescription | None:
        for m in self.members:
            if m.member_id == member_id:
                return m
        return None


class EventKind(enum.Enum):
    """What a `CoordinatorEvent` reports."""

    MEMBER_JOINED = "MEMBER_JOINED"
    MEMBER_LEFT = "MEMBER_LEFT"
    STATIC_MEMBER_LEFT = "STATIC_MEMBER_LEFT"
    STATIC_MEMBER_REPLACED = "STATIC_MEMBER_REPLACED"
    SESSION_EXPIRED = "SESSION_EXPIRED"
    REBALANCE_TIMEOUT = "REBALANCE_TIMEOUT"
    GROUP_EPOCH_BUMPED = "GROUP_EPOCH_BUMPED"
    TARGET_COMPUTED = "TARGET_COMPUTED"
    GROUP_STATE_CHANGED = "GROUP_STATE_CHANGED"


@dataclass(frozen=True, slots=True)
class CoordinatorEvent:
    """Something that happened to a group (for tracing and the simulator's statistics)."""

    time_ms: int
    group_id: str
    kind: EventKind
    member_id: str | None = None
    detail: str = ""
    epoch: int = -1
