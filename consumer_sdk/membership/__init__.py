"""Sans-IO KIP-848 membership core: member state machine, heartbeats, reconciliation.

Drive `GroupMembership` with virtual time: feed it application events, heartbeat
responses, metadata and coordinator changes; send the heartbeats its ``poll`` returns; run the
callbacks and commits its background events ask for. Nothing here does I/O, reads a clock or
starts a thread.

Imports: the standard library's pure parts, `consumer_sdk.domain` and
`consumer_sdk.error_codes`; never `consumer_sdk.protocol`, ``runtime`` or ``coordinator``,
``kio``, ``confluent_kafka``, sockets, threads or clocks (``tests/test_import_contract.py``
checks it). Randomness (member ids, backoff jitter) comes from a ``random.Random`` the host
may pass in, so a seeded run is reproducible.

Threads: it runs on whoever calls it and never blocks. It is not thread-safe: one host
drives a core at a time, e.g. the runtime's network-loop thread (today under the member's
lock, which the application thread also takes), the simulator's single thread, or a test.
"""

from __future__ import annotations

from consumer_sdk.membership.config import MembershipConfig
from consumer_sdk.membership.events import (
    ApplicationEvent,
    AssignmentChanged,
    BackgroundEvent,
    CallbackCompleted,
    CallbackKind,
    CallbacksNeeded,
    Close,
    CloseOption,
    CommitCompleted,
    CommitNeeded,
    ErrorEvent,
    LeaveCompleted,
    Poll,
    StateChanged,
    Subscribe,
    TopicPartition,
    Unsubscribe,
)
from consumer_sdk.membership.facade import GroupMembership
from consumer_sdk.membership.heartbeat import (
    UNSUPPORTED_VERSION_MESSAGE,
    Failure,
    FailureKind,
    HeartbeatRequestManager,
    PollResult,
)
from consumer_sdk.membership.manager import MembershipManager
from consumer_sdk.membership.metrics import MembershipMetrics
from consumer_sdk.membership.reconciler import LocalAssignment
from consumer_sdk.membership.state import TRANSITIONS, IllegalTransition, MemberState

__all__ = [
    "TRANSITIONS",
    "UNSUPPORTED_VERSION_MESSAGE",
    "ApplicationEvent",
    "AssignmentChanged",
    "BackgroundEvent",
    "CallbackCompleted",
    "CallbackKind",
    "CallbacksNeeded",
    "Close",
    "CloseOption",
    "CommitCompleted",
    "CommitNeeded",
    "ErrorEvent",
    "Failure",
    "FailureKind",
    "GroupMembership",
    "HeartbeatRequestManager",
    "IllegalTransition",
    "LeaveCompleted",
    "LocalAssignment",
    "MemberState",
    "MembershipConfig",
    "MembershipManager",
    "MembershipMetrics",
    "Poll",
    "PollResult",
    "StateChanged",
    "Subscribe",
    "TopicPartition",
    "Unsubscribe",
]
