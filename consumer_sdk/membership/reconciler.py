"""Assignment bookkeeping for reconciliation (target, current, local epoch, topic names).

The reconciler holds the data; `MembershipManager`
drives a pass through its steps (commit, revoke, assign, apply) because each step waits for the
application thread.

- ``target``: the last assignment received, with a local epoch bumped on every change.
- ``current``: the last assignment reconciled (what the member acks).
- ``owned``: the named partitions the member holds now (the subscription state's assignment),
  which is what callbacks and fetching work on.
- ``names_cache``: topic names of assigned topics, which outlives metadata updates so revoked
  partitions can still be named.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from consumer_sdk.domain import TopicIdPartitions

IdPartition = tuple[uuid.UUID, int]


class AssignedPartition(NamedTuple):
    """A partition with both its topic id and its resolved name."""

    topic_id: uuid.UUID
    topic: str
    partition: int

    @property
    def named(self) -> tuple[str, int]:
        return (self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class LocalAssignment:
    """Partitions by topic id with a local epoch; equal only if both epoch and partitions are."""

    local_epoch: int
    partitions: frozenset[IdPartition]

    @property
    def is_none(self) -> bool:
        return self.local_epoch == NONE_EPOCH

    def updated_with(self, partitions: frozenset[IdPartition]) -> LocalAssignment | None:
        """The next target if ``partitions`` differ (or nothing was received yet), else None."""
        if not self.is_none and partitions == self.partitions:
            return None
        return LocalAssignment(self.local_epoch + 1, partitions)

    def to_wire(self) -> tuple[TopicIdPartitions, ...]:
        """As the HB's TopicPartitions field, sorted for stable output."""
        return to_wire(self.partitions)


NONE_EPOCH = -1
NO_ASSIGNMENT = LocalAssignment(NONE_EPOCH, frozenset())


def to_wire(partitions: Iterable[IdPartition]) -> tuple[TopicIdPartitions, ...]:
    by_topic: dict[uuid.UUID, list[int]] = {}
    for topic_id, partition in partitions:
        by_topic.setdefault(topic_id, []).append(partition)
    return tuple(
        TopicIdPartitions(topic_id, tuple(sorted(parts)))
        for topic_id, parts in sorted(by_topic.items(), key=lambda kv: str(kv[0]))
    )


def from_wire(topics: Iterable[TopicIdPartitions]) -> frozenset[IdPartition]:
    return frozenset((t.topic_id, p) for t in topics for p in t.partitions)


def sorted_named(partitions: Iterable[AssignedPartition]) -> tuple[tuple[str, int], ...]:
    return tuple(sorted({p.named for p in partitions}))


class Step(enum.Enum):
    """Where a reconciliation pass is waiting."""

    COMMIT = "COMMIT"
    REVOKE = "REVOKE"
    ASSIGN = "ASSIGN"


@dataclass(slots=True)
class ReconciliationPass:
    """One running reconciliation: the resolved subset of the target and the diff to apply."""

    pass_id: int
    resolved: LocalAssignment
    assigned: frozenset[AssignedPartition]
    added: frozenset[AssignedPartition]
    revoked: frozenset[AssignedPartition]
    step: Step = Step.COMMIT


@dataclass(slots=True)
class Resolution:
    """The part of the target whose topic names are known, and the ids still unknown."""

    resolved: LocalAssignment
    assigned: frozenset[AssignedPartition]
    unresolved: frozenset[uuid.UUID]


@dataclass(slots=True)
class Reconciler:
    """Target, current and owned assignments, the topic-name cache and the running pass."""

    target: LocalAssignment = NO_ASSIGNMENT
    current: LocalAssignment = NO_ASSIGNMENT
    owned: frozenset[AssignedPartition] = frozenset()
    awaiting_callback: frozenset[AssignedPartition] = frozenset()
    pending_revocation: frozenset[AssignedPartition] = frozenset()
    names_cache: dict[uuid.UUID, str] = field(default_factory=dict)
    running: ReconciliationPass | None = None
    rejoined_during_pass: bool = False
    _next_pass_id: int = 1

    # -- target ------------------------------------------------------------------------------

    def update_target(self, partitions: frozenset[IdPartition]) -> bool:
        """Replace the target if it changed (bumping the local epoch); True if it did."""
        updated = self.target.updated_with(partitions)
        if updated is None:
            return False
        self.target = updated
        return True

    def target_reconciled(self) -> bool:
        return self.target == self.current

    def clear_target_and_names(self) -> None:
        """Drop an unreconciled target and the names cache (on join, leave, fatal)."""
        self.target = NO_ASSIGNMENT
        self.names_cache.clear()

    def clear_assignment(self) -> None:
        """Forget everything the member holds (after lost/leave callbacks)."""
        self.owned = frozenset()
        self.awaiting_callback = frozenset()
        self.pending_revocation = frozenset()
        self.current = NO_ASSIGNMENT
        self.clear_target_and_names()

    # -- resolution --------------------------------------------------------------------------

    def resolve(self, metadata: Mapping[uuid.UUID, str]) -> Resolution:
        """Name the target's topics from metadata, then from the local cache of assigned names."""
        assigned: set[AssignedPartition] = set()
        resolved: set[IdPartition] = set()
        unresolved: set[uuid.UUID] = set()
        for topic_id, partition in self.target.partitions:
            name = metadata.get(topic_id)
            if name is not None:
                self.names_cache[topic_id] = name
            else:
                name = self.names_cache.get(topic_id)
            if name is None:
                unresolved.add(topic_id)
                continue
            assigned.add(AssignedPartition(topic_id, name, partition))
            resolved.add((topic_id, partition))
        return Resolution(
            LocalAssignment(self.target.local_epoch, frozenset(resolved)),
            frozenset(assigned),
            frozenset(unresolved),
        )

    def unresolved_topic_ids(self, metadata: Mapping[uuid.UUID, str]) -> frozenset[uuid.UUID]:
        return frozenset(
            tid
            for tid, _ in self.target.partitions
            if tid not in metadata and tid not in self.names_cache
        )

    # -- pass --------------------------------------------------------------------------------

    def start_pass(self, resolution: Resolution) -> ReconciliationPass:
        # Partitions whose ASSIGNED callback failed are held already but are offered to the
        # callback again (Java passes only never-held ones, so a retry would see none).
        added = (resolution.assigned - self.owned) | (self.awaiting_callback & resolution.assigned)
        revoked = self.owned - resolution.assigned
        running = ReconciliationPass(
            self._next_pass_id, resolution.resolved, resolution.assigned, added, revoked
        )
        self._next_pass_id += 1
        self.running = running
        self.rejoined_during_pass = False
        return running

    def end_pass(self) -> None:
        self.running = None
        self.rejoined_during_pass = False

    def mark_pending_revocation(self, partitions: Iterable[AssignedPartition]) -> None:
        self.pending_revocation = (self.pending_revocation | frozenset(partitions)) & self.owned

    def apply_owned(
        self, assigned: frozenset[AssignedPartition], added: frozenset[AssignedPartition]
    ) -> None:
        """Make ``assigned`` the held set; ``added`` stays unfetchable until its callback."""
        self.owned = assigned
        self.awaiting_callback = (self.awaiting_callback & assigned) | added
        self.pending_revocation = self.pending_revocation & assigned
        kept_ids = {p.topic_id for p in assigned}
        for topic_id in [t for t in self.names_cache if t not in kept_ids]:
            del self.names_cache[topic_id]

    def enable_all(self) -> None:
        """The ASSIGNED callback succeeded: every held partition may be fetched."""
        self.awaiting_callback = frozenset()

    @property
    def fetchable(self) -> frozenset[AssignedPartition]:
        return self.owned - self.awaiting_callback - self.pending_revocation
