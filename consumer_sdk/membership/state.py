"""Member states and the one transition table (the Java client's ``MemberState``).

``TRANSITIONS`` is the single source of truth: every state change in the core goes through
`StateMachine.transition`, which checks it against the table, and the Mermaid diagram in
``docs/state-diagram.md`` is generated from it (``python -m consumer_sdk.membership.diagram``).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from types import MappingProxyType


class MemberState(enum.Enum):
    """The state of this member in relation to its group (``CI/MemberState.java``)."""

    UNSUBSCRIBED = "UNSUBSCRIBED"
    JOINING = "JOINING"
    RECONCILING = "RECONCILING"
    ACKNOWLEDGING = "ACKNOWLEDGING"
    STABLE = "STABLE"
    FENCED = "FENCED"
    PREPARE_LEAVING = "PREPARE_LEAVING"
    LEAVING = "LEAVING"
    STALE = "STALE"
    FATAL = "FATAL"

    def __str__(self) -> str:
        return self.value

    # Members are singletons compared by identity, so hash them by identity too: Enum's own
    # hash is Python code, and state-set checks run several times per heartbeat.
    __hash__ = object.__hash__


S = MemberState

#: ``{to_state: states it may be entered from}``. A self-transition is always allowed.
TRANSITIONS: Mapping[MemberState, frozenset[MemberState]] = MappingProxyType(
    {
        S.JOINING: frozenset({S.FENCED, S.UNSUBSCRIBED, S.STALE}),
        S.RECONCILING: frozenset({S.STABLE, S.JOINING, S.ACKNOWLEDGING, S.RECONCILING}),
        S.ACKNOWLEDGING: frozenset({S.RECONCILING}),
        S.STABLE: frozenset({S.JOINING, S.ACKNOWLEDGING, S.RECONCILING}),
        S.FENCED: frozenset(
            {S.JOINING, S.STABLE, S.RECONCILING, S.ACKNOWLEDGING, S.PREPARE_LEAVING, S.LEAVING}
        ),
        S.PREPARE_LEAVING: frozenset(
            {S.JOINING, S.STABLE, S.RECONCILING, S.ACKNOWLEDGING, S.UNSUBSCRIBED}
        ),
        S.LEAVING: frozenset({S.PREPARE_LEAVING}),
        S.UNSUBSCRIBED: frozenset({S.PREPARE_LEAVING, S.LEAVING, S.FENCED}),
        S.STALE: frozenset({S.LEAVING}),
        # "All except FENCED and STALE"; FATAL itself is covered by the self-transition rule.
        S.FATAL: frozenset(set(MemberState) - {S.FENCED, S.STALE, S.FATAL}),
    }
)

#: What moves a member into each state (documentation; used to label the diagram's edges).
TRIGGERS: Mapping[MemberState, str] = MappingProxyType(
    {
        S.JOINING: "subscribe and poll, lost callback done, poll after stale",
        S.RECONCILING: "target differs from current assignment",
        S.ACKNOWLEDGING: "reconciled, or partial ack",
        S.STABLE: "target equals current assignment",
        S.FENCED: "FENCED_MEMBER_EPOCH or UNKNOWN_MEMBER_ID",
        S.PREPARE_LEAVING: "unsubscribe, close, poll timer expired",
        S.LEAVING: "release callback done",
        S.UNSUBSCRIBED: "leave HB built or skipped, fenced while leaving, unsubscribe while fenced",
        S.STALE: "poll-expiry leave HB built",
        S.FATAL: "fatal error",
    }
)

#: States in which a new assignment from the broker is processed.
ACCEPTS_ASSIGNMENT: frozenset[MemberState] = frozenset(
    {S.STABLE, S.JOINING, S.ACKNOWLEDGING, S.RECONCILING}
)
#: States in which the member is not part of the group and sends no heartbeat.
NOT_IN_GROUP: frozenset[MemberState] = frozenset({S.UNSUBSCRIBED, S.FENCED, S.FATAL, S.STALE})
#: States that heartbeat right away instead of waiting for the interval.
HEARTBEAT_NOW: frozenset[MemberState] = frozenset({S.JOINING, S.ACKNOWLEDGING, S.LEAVING})
#: States of a leave in progress (the poll timer is not checked in them).
LEAVING_STATES: frozenset[MemberState] = frozenset({S.PREPARE_LEAVING, S.LEAVING})


class IllegalTransition(RuntimeError):
    """A state change that the transition table does not allow (a bug in the core)."""

    def __init__(self, old: MemberState, new: MemberState) -> None:
        super().__init__(f"Invalid state transition from {old} to {new}")
        self.old = old
        self.new = new


def is_allowed(old: MemberState, new: MemberState) -> bool:
    """Whether ``old -> new`` is allowed by `TRANSITIONS` (self-transitions always are)."""
    return old is new or old in TRANSITIONS[new]


TransitionListener = Callable[[MemberState, MemberState, str], None]


class StateMachine:
    """Holds the current state; every change is checked against the table and reported.

    ``state`` is a plain attribute (read on every heartbeat); only `transition` sets it.
    """

    __slots__ = ("_listener", "state")

    def __init__(
        self,
        listener: TransitionListener,
        initial: MemberState = MemberState.UNSUBSCRIBED,
    ) -> None:
        self.state = initial
        self._listener = listener

    def transition(self, new: MemberState, reason: str) -> None:
        """Move to ``new`` or raise `IllegalTransition`; the listener sees every move."""
        old = self.state
        if not is_allowed(old, new):
            raise IllegalTransition(old, new)
        self.state = new
        self._listener(old, new, reason)
