"""Assignor registry and the `assign` entry point."""

from __future__ import annotations

from collections.abc import Mapping

from consumer_sdk.assignors._common import (
    Assignment,
    AssignorError,
    PreviousAssignment,
    Subscription,
    T,
)
from consumer_sdk.assignors.base import Assignor
from consumer_sdk.assignors.range import RangeAssignor
from consumer_sdk.assignors.uniform import UniformAssignor

_REGISTRY: dict[str, Assignor] = {a.name: a for a in (UniformAssignor(), RangeAssignor())}

ASSIGNORS: tuple[str, ...] = tuple(_REGISTRY)
"""Names of the built-in assignors, the broker's default (``uniform``) first."""


def get_assignor(name: str) -> Assignor:
    """Return the assignor called ``name`` or raise `AssignorError`."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        choices = ", ".join(repr(n) for n in ASSIGNORS)
        raise AssignorError(f"unknown assignor {name!r}; valid choices: {choices}") from None


def assign(
    name: str,
    members: Mapping[str, Subscription[T]],
    partitions: Mapping[T, int],
    previous: PreviousAssignment[T] | None = None,
) -> Assignment[T]:
    """Compute the target assignment the broker's ``name`` assignor would produce.

    Args:
        name: ``"uniform"`` or ``"range"`` (see `ASSIGNORS`).
        members: member id -> `Subscription`.
        partitions: topic key -> partition count; subscribed topics missing here are
            skipped (unknown topics).
        previous: the previous target assignment, for stickiness (``uniform`` only).

    Returns:
        member id -> topic key -> frozenset of partitions, for every member.

    Raises:
        AssignorError: unknown assignor name or invalid input.
    """
    return get_assignor(name).assign(members, partitions, previous)
