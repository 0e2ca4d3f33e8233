"""Shared types and input handling for the server-side assignors."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeAlias, TypeVar, cast

T = TypeVar("T", bound=Hashable)
"""A topic key. Opaque and hashable: ``uuid.UUID`` in production, ``str`` in tests."""

Assignment: TypeAlias = dict[str, dict[T, frozenset[int]]]
"""A target assignment: member id -> topic key -> partitions."""

PreviousAssignment: TypeAlias = Mapping[str, Mapping[T, Iterable[int]]]
"""A previous target assignment as accepted on input (any iterables of partition ids)."""


class AssignorError(ValueError):
    """An assignor cannot be found, or its input is invalid."""


@dataclass(frozen=True, slots=True, init=False)
class Subscription(Generic[T]):
    """One member's subscription as the assignor sees it.

    ``topics`` accepts any iterable of topic keys and is stored as a frozenset.
    """

    topics: frozenset[T]
    rack: str | None
    instance_id: str | None

    def __init__(
        self,
        topics: Iterable[T] = frozenset(),
        rack: str | None = None,
        instance_id: str | None = None,
    ) -> None:
        if isinstance(topics, str | bytes):
            raise TypeError("Subscription.topics must be an iterable of topic keys, not a string")
        object.__setattr__(
            self, "topics", topics if type(topics) is frozenset else frozenset(topics)
        )
        object.__setattr__(self, "rack", rack)
        object.__setattr__(self, "instance_id", instance_id)


def _natural_key(key: Hashable) -> tuple[str, Any]:
    return (type(key).__qualname__, key)


def _text_key(key: Hashable) -> tuple[str, str, str]:
    return (type(key).__module__, type(key).__qualname__, str(key))


def sort_keys(keys: Iterable[T]) -> list[T]:
    """Sort topic keys deterministically.

    Keys of one type are compared naturally (``str``, ``uuid.UUID``, ``int``); keys of
    different types are grouped by type name. Keys that cannot be compared fall back to
    their string form.
    """
    items = list(keys)
    try:
        return sorted(items, key=_natural_key)
    except TypeError:
        return sorted(items, key=_text_key)


def check_partition_counts(topics: Iterable[T], partitions: Mapping[T, int]) -> None:
    """Raise :class:`AssignorError` if a subscribed topic has an invalid partition count."""
    for topic in topics:
        count = partitions[topic]
        if type(count) is not int and (not isinstance(count, int) or isinstance(count, bool)):
            raise AssignorError(
                f"partition count of topic {topic!r} must be an int, got {type(count).__name__}"
            )
        if count < 0:
            raise AssignorError(
                f"partition count of topic {topic!r} is negative ({count}); "
                "leave unknown topics out of `partitions` instead"
            )


def check_members(members: Mapping[str, Subscription[T]]) -> None:
    """Raise a clear error if ``members`` does not map member ids to :class:`Subscription`."""
    for member_id, sub in members.items():
        if not isinstance(sub, Subscription):
            raise AssignorError(
                f"member {member_id!r}: expected a Subscription, got {type(sub).__name__}"
            )


@dataclass(slots=True)
class Retained:
    """The previous target, cleaned up for the current members and topics.

    ``held[i]`` maps topic *index* -> partitions that member ``i`` keeps for now (topics it
    still subscribes to, that still exist). ``pristine[i]`` is the member's previous dict
    itself when it was kept whole (every entry a non-empty frozenset of a subscribed topic),
    so it can be copied to the output without re-hashing topic keys. ``unclaimed[t]`` lists
    the partitions of topic ``t`` nobody held, ascending.
    """

    held: list[dict[int, frozenset[int]]]
    pristine: list[Mapping[Any, frozenset[int]] | None]
    unclaimed: list[Sequence[int]]
    sizes: list[int]
    """Number of partitions in ``held[i]``."""


def retain_previous(
    member_ids: Sequence[str],
    member_masks: Sequence[bytes] | None,
    topics: Sequence[T],
    counts: Sequence[int],
    previous: PreviousAssignment[T],
) -> Retained:
    """Clean up ``previous`` (see :class:`Retained`).

    ``member_masks[i][t]`` is true when member ``i`` subscribes to ``topics[t]``; ``None``
    means every member subscribes to every topic. Partitions outside ``[0, count)`` are
    dropped; a partition held by several members stays with the first of them in
    ``member_ids`` order.
    """
    n = len(member_ids)
    held: list[dict[int, frozenset[int]]] = [{} for _ in range(n)]
    pristine: list[Mapping[Any, frozenset[int]] | None] = [None] * n
    sizes = [0] * n
    topic_index = {t: i for i, t in enumerate(topics)}
    # Topic keys are usually the very objects of `topics`; looking them up by identity
    # avoids calling a (possibly Python-level, e.g. uuid.UUID) __hash__ per entry. Safe:
    # `topics` keeps its objects alive, so no other live object can share their ids.
    index_by_id = {id(t): i for i, t in enumerate(topics)}
    by_id = index_by_id.get
    get_previous = previous.get
    flat_tis: list[int] = []
    flat_sets: list[frozenset[int]] = []
    flat_mis: list[int] = []
    for mi, member_id in enumerate(member_ids):
        old = get_previous(member_id)
        if not old:
            continue
        mask = member_masks[mi] if member_masks is not None else None
        if type(old) is dict:
            # Fast path: every entry a non-empty frozenset of a subscribed topic.
            found = list(map(by_id, map(id, old)))
            values = list(old.values())
            lengths = list(map(len, values)) if set(map(type, values)) == {frozenset} else [0]
            if (
                None not in found
                and 0 not in lengths
                and (mask is None or all(map(mask.__getitem__, cast("list[int]", found))))
            ):
                tis = cast("list[int]", found)
                held[mi] = dict(zip(tis, values, strict=True))
                pristine[mi] = old
                sizes[mi] = sum(lengths)
                flat_tis += tis
                flat_sets += values
                flat_mis += [mi] * len(tis)
                continue
        mine = held[mi]
        for topic, parts in old.items():
            ti = topic_index.get(topic)
            if ti is None or (mask is not None and not mask[ti]):
                continue
            if type(parts) is frozenset:
                s: frozenset[int] = parts
            else:
                try:
                    s = frozenset(parts)
                except TypeError:
                    raise AssignorError(
                        f"previous[{member_id!r}][{topic!r}] is not an iterable of partition ids"
                    ) from None
            if s:
                mine[ti] = s
                sizes[mi] += len(s)
                flat_tis.append(ti)
                flat_sets.append(s)
                flat_mis.append(mi)

    # Group the claims by topic (stable, so in member order within a topic).
    order = sorted(range(len(flat_tis)), key=flat_tis.__getitem__)
    sorted_tis = list(map(flat_tis.__getitem__, order))
    sorted_sets = list(map(flat_sets.__getitem__, order))
    unclaimed: list[Sequence[int]] = []
    lo = 0
    for ti, count in enumerate(counts):
        hi = bisect_right(sorted_tis, ti, lo)
        if lo == hi:
            unclaimed.append(range(count))
            continue
        sets = sorted_sets[lo:hi]
        union: frozenset[int] | set[int] = sets[0] if len(sets) == 1 else set().union(*sets)
        clean = len(union) == sum(map(len, sets))
        if clean:
            try:
                clean = min(union) >= 0 and max(union) < count
            except TypeError:
                clean = False
        if not clean:
            claimers = [flat_mis[i] for i in order[lo:hi]]
            union = _dedupe(ti, count, claimers, sets, held, pristine, sizes)
        lo = hi
        if len(union) == count:
            unclaimed.append(())
        elif union:
            unclaimed.append(sorted(set(range(count)).difference(union)))
        else:
            unclaimed.append(range(count))
    return Retained(held, pristine, unclaimed, sizes)


def _dedupe(
    ti: int,
    count: int,
    claimers: list[int],
    sets: list[frozenset[int]],
    held: list[dict[int, frozenset[int]]],
    pristine: list[Mapping[Any, frozenset[int]] | None],
    sizes: list[int],
) -> set[int]:
    """Slow path of :func:`retain_previous`: drop invalid and doubly-held partitions."""
    seen: set[int] = set()
    for mi, s in zip(claimers, sets, strict=True):
        good = frozenset(
            p
            for p in s
            if isinstance(p, int) and not isinstance(p, bool) and 0 <= p < count and p not in seen
        )
        seen.update(good)
        if len(good) != len(s):
            pristine[mi] = None
            sizes[mi] -= len(s) - len(good)
            if good:
                held[mi][ti] = good
            else:
                del held[mi][ti]
    return seen
