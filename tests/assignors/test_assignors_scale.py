"""Seeded scenarios at a moderate size, with uuid.UUID topic keys as in production."""

from __future__ import annotations

import math
import random
import uuid
from typing import Any

import pytest

from consumer_sdk.assignors import ASSIGNORS, Assignment, Subscription, assign

from .support import Group, check_valid, moved, sizes


def bucketed(
    members: int, ratio: int, topics: int, buckets: int, seed: int
) -> tuple[dict[str, Subscription[uuid.UUID]], dict[uuid.UUID, int], list[uuid.UUID]]:
    """Like the JMH setup: contiguous member buckets, each on a contiguous slice of topics."""
    rng = random.Random(seed)
    ids = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(topics)]
    partitions = dict.fromkeys(ids, members * ratio // topics)
    buckets = min(buckets, members)
    per_topic = math.ceil(topics / buckets)
    per_member = math.ceil(members / buckets)
    subs: dict[str, Subscription[uuid.UUID]] = {}
    for b in range(buckets):
        sub = Subscription(frozenset(ids[b * per_topic : (b + 1) * per_topic]))
        for i in range(b * per_member, min((b + 1) * per_member, members)):
            subs[f"member{i}"] = sub
    return subs, partitions, ids


def spread(target: Assignment[Any], member_ids: Any) -> int:
    got = sizes(target)
    values = [got[m] for m in member_ids]
    return max(values) - min(values)


@pytest.mark.parametrize("buckets", [1, 5])
@pytest.mark.parametrize("name", ASSIGNORS)
def test_bucketed_full_and_incremental(name: str, buckets: int) -> None:
    members, partitions, _ = bucketed(199, 10, 20, buckets, seed=buckets)
    full = assign(name, members, partitions)
    check_valid(Group(members, partitions), full)  # type: ignore[arg-type]
    # Incremental: one more member joins the last bucket.
    joined = {**members, "newMember": members["member198"]}
    incremental = assign(name, joined, partitions, full)
    check_valid(Group(joined, partitions), incremental)  # type: ignore[arg-type]
    if name == "uniform":
        bucket_of: dict[frozenset[uuid.UUID], list[str]] = {}
        for m, s in joined.items():
            bucket_of.setdefault(s.topics, []).append(m)
        for mids in bucket_of.values():
            assert spread(incremental, mids) <= 1
        assert moved(full, incremental) <= sizes(incremental)["newMember"]
        assert assign(name, joined, partitions, incremental) == incremental


@pytest.mark.parametrize("seed", range(6))
def test_churn_keeps_uniform_valid_balanced_and_sticky(seed: int) -> None:
    """Rounds of joins, leaves, subscription and partition-count changes."""
    rng = random.Random(seed)
    topics = [uuid.UUID(int=rng.getrandbits(128)) for _ in range(12)]
    partitions = {t: rng.randint(0, 40) for t in topics}
    homogeneous = seed % 2 == 0
    everything = frozenset(topics)

    def subscription() -> Subscription[uuid.UUID]:
        if homogeneous:
            return Subscription(everything)
        return Subscription(rng.sample(topics, rng.randint(1, 6)))

    members = {f"m{i}": subscription() for i in range(rng.randint(5, 40))}
    target: Assignment[uuid.UUID] = {}
    for round_ in range(12):
        action = rng.choice(["join", "leave", "resubscribe", "grow"])
        if action == "join" or len(members) < 2:
            members[f"j{round_}"] = subscription()
        elif action == "leave":
            del members[rng.choice(sorted(members))]
        elif action == "resubscribe" and not homogeneous:
            members[rng.choice(sorted(members))] = subscription()
        else:
            t = rng.choice(topics)
            partitions[t] += rng.randint(1, 10)
        previous = target
        target = assign("uniform", members, partitions, previous)
        check_valid(Group(members, partitions), target)  # type: ignore[arg-type]
        if homogeneous:
            assert spread(target, members) <= 1
            if action == "leave":
                for m in members:
                    for t, parts in previous[m].items():
                        assert parts <= target[m][t]
        # Stable once computed.
        assert assign("uniform", members, partitions, target) == target


@pytest.mark.parametrize("homogeneous", [True, False])
def test_equal_but_distinct_topic_key_objects_give_the_same_result(homogeneous: bool) -> None:
    members, partitions, ids = bucketed(50, 5, 10, 1 if homogeneous else 5, seed=3)
    start = assign("uniform", members, partitions)
    members = {**members, "joiner": next(iter(members.values()))}
    # The previous target keyed by copies of the topic ids (same value, other objects).
    copies = {t: uuid.UUID(str(t)) for t in ids}
    previous = {m: {copies[t]: set(p) for t, p in tps.items()} for m, tps in start.items()}
    assert assign("uniform", members, partitions, start) == assign(
        "uniform", members, partitions, previous
    )
