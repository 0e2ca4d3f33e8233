"""Server-side assignors of KIP-848 consumer groups (``uniform`` and ``range``).

Preview the target assignment the broker would compute:

    from consumer_sdk.assignors import Subscription, assign

    target = assign(
        "uniform",
        members={"m1": Subscription(topics={"t1", "t2"}), "m2": Subscription(topics={"t1"})},
        partitions={"t1": 6, "t2": 3},
        previous={"m1": {"t1": {0, 1}}},
    )

Topic keys are opaque (``uuid.UUID`` topic ids on the wire, names in tests and tools).
See ``docs/assignors.md``.

Imports: the standard library only, no other package of the SDK (``tests/test_import_contract.py``
checks it). Threads: every call is a pure computation over its arguments; it never blocks and
may run on any thread, several at once.
"""

from consumer_sdk.assignors._common import (
    Assignment,
    AssignorError,
    PreviousAssignment,
    Subscription,
)
from consumer_sdk.assignors.api import ASSIGNORS, assign, get_assignor
from consumer_sdk.assignors.base import Assignor
from consumer_sdk.assignors.diff import MemberChange, diff, explain, format_partitions
from consumer_sdk.assignors.range import RangeAssignor
from consumer_sdk.assignors.uniform import MAX_BALANCE_PASSES, UniformAssignor

__all__ = [
    "ASSIGNORS",
    "MAX_BALANCE_PASSES",
    "Assignment",
    "Assignor",
    "AssignorError",
    "MemberChange",
    "PreviousAssignment",
    "RangeAssignor",
    "Subscription",
    "UniformAssignor",
    "assign",
    "diff",
    "explain",
    "format_partitions",
    "get_assignor",
]
