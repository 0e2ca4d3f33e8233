"""A sans-IO model of the broker side of KIP-848 consumer groups (Kafka's group coordinator).

`GroupCoordinator` answers ConsumerGroupHeartbeat requests with the group coordinator's
rules — validation and error codes, group / assignment / member epochs, target assignment via
`consumer_sdk.assignors`, revoke-before-reassign reconciliation, session and rebalance
timeouts, static membership — and validates OffsetCommit member epochs. Time is passed in:

    from consumer_sdk.coordinator import GroupCoordinator

    coordinator = GroupCoordinator(topics={"orders": 6})
    response = coordinator.heartbeat(now_ms, request)   # a domain.HeartbeatRequest
    coordinator.tick(now_ms)                             # expire sessions / rebalance timeouts

It is what the deterministic simulator (`consumer_sdk.simulation`) runs the real member
cores against, and a reference for tests.

Imports: `consumer_sdk.assignors`, `consumer_sdk.domain` and `consumer_sdk.error_codes` only.
Never the member's side (`consumer_sdk.membership`, ``runtime``, ``protocol``), so that the
simulator checks the member against an independent model, and no I/O, threads or clocks
(``tests/test_import_contract.py`` checks it).

Threads: it runs on whoever calls it and never blocks; it is not thread-safe (the simulator
drives it from its one thread).
"""

from __future__ import annotations

from consumer_sdk.coordinator.coordinator import GroupCoordinator
from consumer_sdk.coordinator.model import (
    INITIAL_GROUP_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    CoordinatorConfig,
    CoordinatorEvent,
    EventKind,
    GroupDescription,
    GroupState,
    MemberDescription,
)
from consumer_sdk.coordinator.reconcile import (
    IdPartition,
    MemberAssignment,
    MemberAssignmentState,
    reconcile,
)
from consumer_sdk.coordinator.topics import Topic, TopicRegistry

__all__ = [
    "INITIAL_GROUP_EPOCH",
    "LEAVE_EPOCH",
    "STATIC_LEAVE_EPOCH",
    "CoordinatorConfig",
    "CoordinatorEvent",
    "EventKind",
    "GroupCoordinator",
    "GroupDescription",
    "GroupState",
    "IdPartition",
    "MemberAssignment",
    "MemberAssignmentState",
    "MemberDescription",
    "Topic",
    "TopicRegistry",
    "reconcile",
]
