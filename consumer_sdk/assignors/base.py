"""The assignor interface."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import ClassVar

from consumer_sdk.assignors._common import Assignment, PreviousAssignment, Subscription, T


class Assignor(ABC):
    """A server-side partition assignor (the broker's ``ConsumerGroupPartitionAssignor``).

    Implementations are stateless: the result depends only on the arguments, never on
    the iteration order of the mappings and sets passed in.
    """

    name: ClassVar[str]
    """The name used in ``group.remote.assignor`` / ``group.consumer.assignors``."""

    @abstractmethod
    def assign(
        self,
        members: Mapping[str, Subscription[T]],
        partitions: Mapping[T, int],
        previous: PreviousAssignment[T] | None = None,
    ) -> Assignment[T]:
        """Compute a target assignment.

        Args:
            members: member id -> subscription.
            partitions: topic key -> partition count. Subscribed topics missing here are
                unknown and skipped.
            previous: the previous target (member id -> topic key -> partitions). Members,
                topics and partitions that no longer exist are ignored.

        Returns:
            member id -> topic key -> partitions, with every member present (possibly
            with an empty dict) and no empty partition sets.

        Raises:
            AssignorError: on invalid input, such as a negative partition count.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"
