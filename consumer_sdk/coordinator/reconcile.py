"""Server-side reconciliation of one member towards its target (Kafka's CurrentAssignmentBuilder).

This is the coordinator's half of the guarantee that a partition is never given to a new owner
before the old owner acknowledged its revocation:

- ``kept = assigned ∩ target`` (only topics the member still subscribes to);
- the rest of ``assigned`` must be revoked first, at the *same* epoch (UNREVOKED_PARTITIONS);
- only once the member reports (TopicPartitions) that it no longer owns them does it move on to
  the target epoch, and then only partitions that no other member holds — assigned or pending
  revocation — are added (UNRELEASED_PARTITIONS while some are still held elsewhere).
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Set
from dataclasses import dataclass

IdPartition = tuple[uuid.UUID, int]


class MemberAssignmentState(enum.Enum):
    """Where a member is in its reconciliation, as the coordinator sees it."""

    STABLE = "STABLE"
    UNREVOKED_PARTITIONS = "UNREVOKED_PARTITIONS"
    UNRELEASED_PARTITIONS = "UNRELEASED_PARTITIONS"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class MemberAssignment:
    """A member's epoch, state and current assignment (assigned plus pending revocation)."""

    state: MemberAssignmentState
    epoch: int
    assigned: frozenset[IdPartition]
    pending_revocation: frozenset[IdPartition]


MAS = MemberAssignmentState


def _owns_any(owned: Set[IdPartition] | None, partitions: Set[IdPartition]) -> bool:
    """Whether the member may still own any of ``partitions`` (unknown owned: assume so)."""
    if owned is None:
        return True
    return not owned.isdisjoint(partitions)


def reconcile(
    current: MemberAssignment,
    *,
    target_epoch: int,
    target: frozenset[IdPartition],
    owned: Set[IdPartition] | None,
    subscribed: Set[uuid.UUID] | None,
    held_by_other: Callable[[IdPartition], bool],
    target_subscribed: bool = False,
) -> MemberAssignment:
    """The member's next assignment state (``current`` itself when nothing changes).

    ``owned`` is the TopicPartitions of the request (None when not sent); ``subscribed`` the
    topic ids the member subscribes to (None: an unresolved regex); ``held_by_other(p)`` tells
    whether another member holds ``p`` (assigned or pending revocation).
    ``target_subscribed`` says the caller knows every topic of ``target`` is subscribed (the
    target is then used as it is, not filtered by ``subscribed``).
    """
    state = current.state
    kept_topics = None if target_subscribed else subscribed
    if state is MAS.STABLE:
        if current.epoch != target_epoch:
            return _next(
                current, current.epoch, target_epoch, target, owned, kept_topics, held_by_other
            )
        return _drop_unsubscribed(current, subscribed)
    if state is MAS.UNREVOKED_PARTITIONS:
        if _owns_any(owned, current.pending_revocation):
            return _drop_unsubscribed(current, subscribed)
        epoch = min(current.epoch + 1, target_epoch)
        return _next(current, epoch, target_epoch, target, owned, kept_topics, held_by_other)
    return _next(current, current.epoch, target_epoch, target, owned, kept_topics, held_by_other)


def _drop_unsubscribed(
    current: MemberAssignment, subscribed: Set[uuid.UUID] | None
) -> MemberAssignment:
    """Move partitions of topics the member no longer subscribes to into pending revocation."""
    if subscribed is None:
        return current
    dropped = frozenset(tp for tp in current.assigned if tp[0] not in subscribed)
    if not dropped:
        return current
    return MemberAssignment(
        MAS.UNREVOKED_PARTITIONS,
        current.epoch,
        current.assigned - dropped,
        current.pending_revocation | dropped,
    )


def _next(
    current: MemberAssignment,
    epoch: int,
    target_epoch: int,
    target: frozenset[IdPartition],
    owned: Set[IdPartition] | None,
    subscribed: Set[uuid.UUID] | None,
    held_by_other: Callable[[IdPartition], bool],
) -> MemberAssignment:
    if subscribed is not None:
        target = frozenset(tp for tp in target if tp[0] in subscribed)
    assigned = current.assigned
    kept = assigned & target
    revoke = assigned - kept
    if revoke and _owns_any(owned, revoke):
        return MemberAssignment(MAS.UNREVOKED_PARTITIONS, epoch, kept, revoke)
    wanted = target - kept
    free = frozenset(tp for tp in wanted if not held_by_other(tp)) if wanted else wanted
    state = MAS.UNRELEASED_PARTITIONS if len(free) != len(wanted) else MAS.STABLE
    return MemberAssignment(state, target_epoch, kept | free, frozenset())
