"""Compare two target assignments: who gains and who loses which partitions."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Generic

from consumer_sdk.assignors._common import PreviousAssignment, T, sort_keys


@dataclass(frozen=True, slots=True)
class MemberChange(Generic[T]):
    """How one member's target changes from ``previous`` to ``target``."""

    member_id: str
    added: dict[T, frozenset[int]]
    """Partitions in the new target that the member did not have."""
    revoked: dict[T, frozenset[int]]
    """Partitions the member had and loses."""
    kept: int
    """Number of partitions in both targets."""

    @property
    def added_count(self) -> int:
        return sum(map(len, self.added.values()))

    @property
    def revoked_count(self) -> int:
        return sum(map(len, self.revoked.values()))

    @property
    def before(self) -> int:
        """Partitions in the previous target."""
        return self.kept + self.revoked_count

    @property
    def after(self) -> int:
        """Partitions in the new target."""
        return self.kept + self.added_count

    @property
    def changed(self) -> bool:
        return bool(self.added or self.revoked)


def diff(
    previous: PreviousAssignment[T] | None,
    target: PreviousAssignment[T],
) -> dict[str, MemberChange[T]]:
    """Per-member added/revoked partitions, for every member in either assignment.

    Members are returned sorted by id, topics sorted within each member; a member missing
    from one side counts as holding nothing there.
    """
    previous = previous or {}
    result: dict[str, MemberChange[T]] = {}
    for member_id in sorted(set(previous) | set(target)):
        old = _normalise(previous.get(member_id, {}))
        new = _normalise(target.get(member_id, {}))
        added: dict[T, frozenset[int]] = {}
        revoked: dict[T, frozenset[int]] = {}
        kept = 0
        for topic in sort_keys(old.keys() | new.keys()):
            before = old.get(topic, frozenset())
            after = new.get(topic, frozenset())
            if gained := after - before:
                added[topic] = gained
            if lost := before - after:
                revoked[topic] = lost
            kept += len(before & after)
        result[member_id] = MemberChange(member_id, added, revoked, kept)
    return result


def explain(
    previous: PreviousAssignment[T] | None,
    target: PreviousAssignment[T],
    *,
    unchanged: bool = False,
) -> str:
    """Human-readable summary of `diff`, one block per changed member.

    With ``unchanged=True`` members whose target does not change are listed too.
    """
    changes = diff(previous, target)
    moved_in = sum(c.added_count for c in changes.values())
    moved_out = sum(c.revoked_count for c in changes.values())
    total = sum(c.after for c in changes.values())
    changed = sum(1 for c in changes.values() if c.changed)
    lines = [
        f"{len(changes)} members, {total} partitions assigned; "
        f"{changed} members change, {moved_in} partitions added, {moved_out} revoked"
    ]
    for change in changes.values():
        if not change.changed and not unchanged:
            continue
        lines.append(
            f"{change.member_id}: {change.before} -> {change.after}"
            f" (+{change.added_count} -{change.revoked_count})"
        )
        for sign, parts in (("+", change.added), ("-", change.revoked)):
            for topic, ps in parts.items():
                lines.append(f"  {sign} {topic}: {format_partitions(ps)}")
    return "\n".join(lines)


def format_partitions(partitions: Iterable[int]) -> str:
    """Format partition ids compactly: ``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    runs: list[str] = []
    ordered = sorted(partitions)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(runs)


def _normalise(assignment: Mapping[T, Iterable[int]]) -> dict[T, frozenset[int]]:
    out: dict[T, frozenset[int]] = {}
    for topic, parts in assignment.items():
        s = parts if type(parts) is frozenset else frozenset(parts)
        if s:
            out[topic] = s
    return out
