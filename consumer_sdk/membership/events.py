"""Typed, frozen events exchanged between the application thread and the membership core.

Application events are produced by the application thread and consumed by the core
(`GroupMembership.submit` queues one, `GroupMembership.handle` processes one now).
Background events are produced by the core and drained by the application thread
(`GroupMembership.drain_background_events`), which runs user callbacks for
`CallbacksNeeded`, commits for `CommitNeeded`, raises `ErrorEvent` from
``poll()``, and answers with `CallbackCompleted` / `CommitCompleted`.

Partitions in events are ``(topic_name, partition)`` pairs, sorted.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from consumer_sdk.membership.state import MemberState

TopicPartition = tuple[str, int]


class CloseOption(enum.Enum):
    """What ``close()`` does to the group membership (KIP-1092).

    | option            | dynamic member  | static member   |
    | ----------------- | --------------- | --------------- |
    | `DEFAULT`         | leave, epoch -1 | leave, epoch -2 |
    | `LEAVE_GROUP`     | leave, epoch -1 | leave, epoch -1 |
    | `REMAIN_IN_GROUP` | no leave HB     | leave, epoch -2 |
    """

    DEFAULT = "DEFAULT"
    LEAVE_GROUP = "LEAVE_GROUP"
    REMAIN_IN_GROUP = "REMAIN_IN_GROUP"


class CallbackKind(enum.Enum):
    """Which rebalance listener method the application thread must run."""

    REVOKED = "REVOKED"
    ASSIGNED = "ASSIGNED"
    LOST = "LOST"


# --------------------------------------------------------------------------------------------
# Application events (application thread -> core)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Subscribe:
    """Subscribe to topic names or to a (RE2J, broker-side) regex; joins on the next Poll.

    ``has_listener=False`` means no rebalance listener is registered: the core then completes
    callbacks itself instead of emitting `CallbacksNeeded` (as the Java client does).
    Subscribing to no topic and no pattern is an unsubscribe.
    """

    topics: tuple[str, ...] = ()
    pattern: str | None = None
    has_listener: bool = True

    def __post_init__(self) -> None:
        if self.pattern is not None and self.topics:
            raise ValueError("subscribe to topic names or to a pattern, not both")
        if self.pattern is not None and not self.pattern:
            raise ValueError("the subscription pattern must not be empty")
        if any(not t for t in self.topics):
            raise ValueError("topic names must not be empty")


@dataclass(frozen=True, slots=True)
class Unsubscribe:
    """Release the assignment (revoked or lost callback) and leave the group."""


@dataclass(frozen=True, slots=True)
class Poll:
    """The application entered ``poll()`` at ``now_ms``: resets the poll timer, joins or rejoins
    if needed, and lets reconciliation revoke partitions (the commit-safe pass)."""

    now_ms: int


@dataclass(frozen=True, slots=True)
class CallbackCompleted:
    """The application thread ran the callback ``callback_id``; ``error`` is set if it raised."""

    callback_id: int
    error: str | None = None


@dataclass(frozen=True, slots=True)
class CommitCompleted:
    """The commit asked for by `CommitNeeded` ``commit_id`` finished (or failed)."""

    commit_id: int
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Close:
    """The consumer is closing: commit (auto-commit), release the assignment, leave per
    ``option``. Later application events are ignored."""

    option: CloseOption = CloseOption.DEFAULT


ApplicationEvent = Subscribe | Unsubscribe | Poll | CallbackCompleted | CommitCompleted | Close


# --------------------------------------------------------------------------------------------
# Background events (core -> application thread)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class StateChanged:
    """The member moved from ``old`` to ``new`` (self-transitions included)."""

    old: MemberState
    new: MemberState
    reason: str


@dataclass(frozen=True, slots=True)
class CallbacksNeeded:
    """Run ``onPartitions<kind>(partitions)`` on the application thread, then submit
    ``CallbackCompleted(callback_id, error)``. ASSIGNED may carry no partitions."""

    callback_id: int
    kind: CallbackKind
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class CommitNeeded:
    """Synchronously commit all consumed offsets (member epoch ``member_epoch``) before the
    rebalance step goes on; retry retriable errors until ``deadline_ms``; then submit
    ``CommitCompleted(commit_id, error)``. A failure is logged and does not block."""

    commit_id: int
    deadline_ms: int
    member_epoch: int
    reason: str


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """An error for the application: ``poll()`` raises it. ``fatal`` errors end the member."""

    code: int
    message: str
    fatal: bool


@dataclass(frozen=True, slots=True)
class AssignmentChanged:
    """The member's assigned partitions changed (new ones are not fetchable until their
    ASSIGNED callback completes; see ``GroupMembership.fetchable_partitions``)."""

    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class LeaveCompleted:
    """An ``Unsubscribe`` / ``Close`` finished: the leave HB got an answer or failed
    (``heartbeat_sent=True``), or none was needed or possible (``False``)."""

    heartbeat_sent: bool


BackgroundEvent = (
    StateChanged | CallbacksNeeded | CommitNeeded | ErrorEvent | AssignmentChanged | LeaveCompleted
)
