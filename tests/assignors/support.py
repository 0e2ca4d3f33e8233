"""Checks and Hypothesis strategies shared by the assignor tests."""

from __future__ import annotations

import random
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from consumer_sdk.assignors import Assignment, Subscription

Members = dict[str, Subscription[Any]]
Previous = dict[str, dict[Any, frozenset[int]]]


@dataclass
class Group:
    """One assignor input."""

    members: Members
    partitions: dict[str, int]
    previous: Previous = field(default_factory=dict)


def owners(target: Mapping[str, Mapping[Hashable, Iterable[int]]]) -> dict[tuple[Any, int], str]:
    """(topic, partition) -> member, asserting that no partition has two owners."""
    owner: dict[tuple[Any, int], str] = {}
    for member_id, topics in target.items():
        for topic, parts in topics.items():
            for p in parts:
                assert (topic, p) not in owner, f"{topic}-{p} owned twice"
                owner[(topic, p)] = member_id
    return owner


def sizes(target: Assignment[Any]) -> dict[str, int]:
    return {m: sum(map(len, topics.values())) for m, topics in target.items()}


def check_valid(group: Group, target: Assignment[Any]) -> None:
    """Every partition of a subscribed, known topic is assigned exactly once, to a subscriber,
    and nothing else is assigned."""
    assert set(target) == set(group.members)
    owner = owners(target)
    expected = {
        (t, p)
        for t, n in group.partitions.items()
        if any(t in sub.topics for sub in group.members.values())
        for p in range(n)
    }
    assert set(owner) == expected
    for (topic, _), member_id in owner.items():
        assert topic in group.members[member_id].topics
    for topics in target.values():
        for parts in topics.values():
            assert isinstance(parts, frozenset)
            assert parts, "empty partition sets are left out"


def moved(before: Assignment[Any], after: Assignment[Any]) -> int:
    """Partitions present in both whose owner differs."""
    old = owners(before)
    new = owners(after)
    return sum(1 for key, m in new.items() if key in old and old[key] != m)


def effective(group: Group) -> dict[str, frozenset[str]]:
    return {
        m: frozenset(t for t in sub.topics if t in group.partitions)
        for m, sub in group.members.items()
    }


def isolated_groups(group: Group) -> list[list[str]]:
    """Members with identical (known) subscriptions whose topics nobody else subscribes to."""
    eff = effective(group)
    by_sub: dict[frozenset[str], list[str]] = {}
    for m, topics in eff.items():
        by_sub.setdefault(topics, []).append(m)
    result = []
    for topics, mids in by_sub.items():
        if not topics:
            continue
        if all(eff[o].isdisjoint(topics) for o in eff if eff[o] != topics):
            result.append(mids)
    return result


def shuffled(group: Group, seed: int) -> Group:
    """The same group with every dict and set rebuilt in a different insertion order."""
    rng = random.Random(seed)

    def shuffle_items(d: Mapping[Any, Any]) -> list[tuple[Any, Any]]:
        items = list(d.items())
        rng.shuffle(items)
        return items

    members: Members = {}
    for m, sub in shuffle_items(group.members):
        topics = list(sub.topics)
        rng.shuffle(topics)
        members[m] = Subscription(topics, rack=sub.rack, instance_id=sub.instance_id)
    previous: Previous = {}
    for m, topics in shuffle_items(group.previous):
        previous[m] = {}
        for t, parts in shuffle_items(topics):
            ps = list(parts)
            rng.shuffle(ps)
            previous[m][t] = frozenset(ps)
    return Group(members, dict(shuffle_items(group.partitions)), previous)


# --- Hypothesis strategies -------------------------------------------------------------

TOPICS = [f"t{i}" for i in range(6)]


@st.composite
def groups(
    draw: st.DrawFn,
    *,
    homogeneous: bool | None = None,
    max_members: int = 9,
    max_partitions: int = 24,
    previous: bool = True,
) -> Group:
    """A random group. ``homogeneous`` forces equal subscriptions (True) or not (None: any)."""
    n_topics = draw(st.integers(1, len(TOPICS)))
    topics = TOPICS[:n_topics]
    partitions = {t: draw(st.integers(0, max_partitions)) for t in topics}
    # Some subscribed topics may be unknown (missing from `partitions`).
    universe = [*topics, "unknown"]
    n_members = draw(st.integers(1, max_members))
    member_ids = draw(
        st.lists(
            st.text("abcdefgh", min_size=1, max_size=3),
            min_size=n_members,
            max_size=n_members,
            unique=True,
        )
    )
    subsets = st.frozensets(st.sampled_from(universe), min_size=1)
    shared = draw(subsets)
    members: Members = {}
    for m in member_ids:
        if homogeneous is True:
            subs = shared
        elif homogeneous is False:
            subs = draw(subsets)
        else:
            subs = shared if draw(st.booleans()) else draw(subsets)
        instance = draw(st.one_of(st.none(), st.text("xyz", min_size=1, max_size=2)))
        members[m] = Subscription(subs, instance_id=instance)
    prev: Previous = {}
    if previous:
        prev = draw(previous_for(member_ids, universe, partitions))
    return Group(members, partitions, prev)


@st.composite
def previous_for(
    draw: st.DrawFn, member_ids: list[str], universe: list[str], partitions: dict[str, int]
) -> Previous:
    """Arbitrary previous targets, including stale members, topics and partitions and
    partitions claimed twice."""
    ids = [*member_ids, "gone"]
    prev: Previous = {}
    for m in draw(st.lists(st.sampled_from(ids), unique=True)):
        prev[m] = {}
        for t in draw(st.lists(st.sampled_from(universe), unique=True)):
            top = partitions.get(t, 3) + 2
            prev[m][t] = draw(st.frozensets(st.integers(-1, top), max_size=top + 1))
    return prev
