"""Shared types and input handling for the server-side assignors."""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate, chain, repeat
from operator import attrgetter
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
    kinds = set(map(type, items))
    if kinds == {uuid.UUID}:
        # Same order as UUID.__lt__, without a Python-level comparison per step.
        return sorted(items, key=_UUID_INT)
    try:
        if len(kinds) == 1:
            return cast("list[T]", sorted(cast("list[Any]", items)))
        return sorted(items, key=_natural_key)
    except TypeError:
        return sorted(items, key=_text_key)


_UUID_INT = attrgetter("int")


def check_partition_counts(topics: Iterable[T], partitions: Mapping[T, int]) -> None:
    """Raise `AssignorError` if a subscribed topic has an invalid partition count."""
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
    """Raise a clear error if ``members`` does not map member ids to `Subscription`."""
    if set(map(type, members.values())) <= {Subscription}:
        return
    for member_id, sub in members.items():
        if not isinstance(sub, Subscription):
            raise AssignorError(
                f"member {member_id!r}: expected a Subscription, got {type(sub).__name__}"
            )


class TopicIndex(Generic[T]):
    """Topic key -> position in the sorted topic list.

    Lookups go by identity first: topic keys are usually the very objects of the topic
    list, and this avoids a (possibly Python-level, e.g. ``uuid.UUID``) ``__hash__`` call
    per lookup. Safe because the list keeps its objects alive, so no other live object can
    have the same id. Equal keys that are other objects fall back to a normal lookup.
    """

    __slots__ = ("_by_key", "by_id", "topics")

    def __init__(self, topics: Sequence[T]) -> None:
        self.topics = topics
        self.by_id = {id(t): i for i, t in enumerate(topics)}
        """id(topic) -> index, for the topic objects of the list."""
        self._by_key: dict[T, int] | None = None

    def get(self, topic: T) -> int | None:
        ti = self.by_id.get(id(topic))
        if ti is None:
            if self._by_key is None:
                self._by_key = {t: i for i, t in enumerate(self.topics)}
            ti = self._by_key.get(topic)
        return ti

    def rank(self, topic: T) -> int:
        """Like `get` for a topic known to be in the list."""
        ti = self.get(topic)
        if ti is None:
            raise KeyError(topic)
        return ti


@dataclass(slots=True)
class Retained(Generic[T]):
    """The previous target, cleaned up for the current members and topics."""

    held: list[dict[T, frozenset[int]]]
    """Per member (by index): the partitions it keeps for now, of topics it still
    subscribes to and that still exist. Fresh dicts, owned by the caller."""
    sizes: list[int]
    """Number of partitions in ``held[i]``."""
    unclaimed: list[Sequence[int]]
    """Per topic index: the partitions nobody holds, ascending."""


def _retain_all(
    present: list[int],
    olds: list[Mapping[T, Iterable[int]] | None],
    member_masks: Sequence[bytes] | None,
    index: TopicIndex[T],
    held: list[dict[T, frozenset[int]]],
    sizes: list[int],
    claims: list[list[frozenset[int]]],
) -> bool:
    """Fast path of `retain_previous` when every previous entry is kept as is.

    All checks and copies loop in C over the flattened entries of all members. Returns
    False, changing nothing, when some entry needs a closer look.
    """
    dicts = [olds[mi] for mi in present]
    if set(map(type, dicts)) != {dict}:
        return not dicts
    entries = cast("list[dict[T, frozenset[int]]]", dicts)
    per_member = list(map(len, entries))
    found = list(map(index.by_id.get, map(id, chain.from_iterable(entries))))
    if None in found:
        return False
    tis = cast("list[int]", found)
    values = list(chain.from_iterable(map(dict.values, entries)))
    if set(map(type, values)) != {frozenset}:
        return False
    lengths = list(map(len, values))
    if 0 in lengths:
        return False
    if member_masks is not None:
        masks = chain.from_iterable(map(repeat, map(member_masks.__getitem__, present), per_member))
        if not all(map(bytes.__getitem__, masks, tis)):
            return False
    for mi, copy in zip(present, map(dict, entries), strict=True):
        held[mi] = copy
    ends = list(accumulate(per_member))
    prefix = [0, *accumulate(lengths)]
    start = 0
    for mi, end in zip(present, ends, strict=True):
        sizes[mi] = prefix[end] - prefix[start]
        start = end
    # claims[ti].append(s) for each entry, looping in C.
    deque(map(list.append, map(claims.__getitem__, tis), values), maxlen=0)
    return True


def retain_previous(
    member_ids: Sequence[str],
    member_masks: Sequence[bytes] | None,
    index: TopicIndex[T],
    counts: Sequence[int],
    previous: PreviousAssignment[T],
) -> Retained[T]:
    """Clean up ``previous`` (see `Retained`).

    ``member_masks[i][t]`` is true when member ``i`` subscribes to ``index.topics[t]``;
    ``None`` means every member subscribes to every topic. Partitions outside
    ``[0, count)`` are dropped; a partition held by several members stays with the first
    of them in ``member_ids`` order.
    """
    n = len(member_ids)
    held: list[dict[T, frozenset[int]]] = [{} for _ in range(n)]
    sizes = [0] * n
    claims: list[list[frozenset[int]]] = [[] for _ in counts]
    claims_of = claims.__getitem__
    append = list.append
    by_id = index.by_id.get
    olds = list(map(previous.get, member_ids))
    present = [mi for mi, old in enumerate(olds) if old]
    if _retain_all(present, olds, member_masks, index, held, sizes, claims):
        present = []
    for mi in present:
        member_id = member_ids[mi]
        old = olds[mi]
        assert old is not None
        mask = member_masks[mi] if member_masks is not None else None
        if type(old) is dict:
            # Fast path: every entry a non-empty frozenset of a subscribed topic, so the
            # member's dict can be copied (which reuses the stored key hashes).
            found = list(map(by_id, map(id, old)))
            values = list(old.values())
            lengths = list(map(len, values)) if set(map(type, values)) == {frozenset} else [0]
            if (
                None not in found
                and 0 not in lengths
                and (mask is None or all(map(mask.__getitem__, cast("list[int]", found))))
            ):
                held[mi] = dict(old)
                sizes[mi] = sum(lengths)
                # claims[ti].append(s) for each entry, looping in C.
                deque(map(append, map(claims_of, cast("list[int]", found)), values), maxlen=0)
                continue
        mine = held[mi]
        for topic, parts in old.items():
            ti = index.get(topic)
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
                mine[topic] = s
                sizes[mi] += len(s)
                claims[ti].append(s)

    unclaimed: list[Sequence[int]] = []
    for ti, count in enumerate(counts):
        sets = claims[ti]
        if not sets:
            unclaimed.append(range(count))
            continue
        union: frozenset[int] | set[int] = sets[0] if len(sets) == 1 else set().union(*sets)
        clean = len(union) == sum(map(len, sets))
        if clean:
            try:
                clean = min(union) >= 0 and max(union) < count
            except TypeError:
                clean = False
        if not clean:
            union = _dedupe(index.topics[ti], count, held, sizes)
        if len(union) == count:
            unclaimed.append(())
        elif union:
            unclaimed.append(sorted(set(range(count)).difference(union)))
        else:
            unclaimed.append(range(count))
    return Retained(held, sizes, unclaimed)


def _dedupe(
    topic: T,
    count: int,
    held: list[dict[T, frozenset[int]]],
    sizes: list[int],
) -> set[int]:
    """Slow path of `retain_previous`: drop invalid and doubly-held partitions of
    ``topic``, first holder (in member order) wins."""
    seen: set[int] = set()
    for mi, mine in enumerate(held):
        s = mine.get(topic)
        if s is None:
            continue
        good = frozenset(
            p
            for p in s
            if isinstance(p, int) and not isinstance(p, bool) and 0 <= p < count and p not in seen
        )
        seen.update(good)
        if len(good) != len(s):
            sizes[mi] -= len(s) - len(good)
            if good:
                mine[topic] = good
            else:
                del mine[topic]
    return seen
