"""Property tests of both assignors (Hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from consumer_sdk.assignors import ASSIGNORS, Assignment, Subscription, assign

from .support import (
    Group,
    check_valid,
    effective,
    groups,
    isolated_groups,
    moved,
    owners,
    shuffled,
    sizes,
)

settings.register_profile("assignors", deadline=None, max_examples=150)
settings.load_profile("assignors")


def run(name: str, group: Group, previous: Any = None) -> Assignment[Any]:
    return assign(
        name, group.members, group.partitions, group.previous if previous is None else previous
    )


def spread(values: Any) -> int:
    values = list(values)
    return max(values) - min(values) if values else 0


# --- validity and determinism (both assignors) ------------------------------------------


@given(group=groups(), name=st.sampled_from(ASSIGNORS))
def test_every_subscribed_partition_is_assigned_once_to_a_subscriber(
    group: Group, name: str
) -> None:
    check_valid(group, run(name, group))


@given(group=groups(), name=st.sampled_from(ASSIGNORS), seed=st.integers(0, 2**32))
def test_result_does_not_depend_on_input_iteration_order(
    group: Group, name: str, seed: int
) -> None:
    first = run(name, group)
    second = run(name, shuffled(group, seed))
    assert first == second


# --- uniform, homogeneous ---------------------------------------------------------------


@given(group=groups(homogeneous=True))
def test_uniform_homogeneous_sizes_differ_by_at_most_one(group: Group) -> None:
    target = run("uniform", group)
    check_valid(group, target)
    assert spread(sizes(target).values()) <= 1


@given(group=groups(homogeneous=True, previous=False), data=st.data())
def test_uniform_homogeneous_joiner_moves_at_most_its_own_quota(
    group: Group, data: st.DataObject
) -> None:
    # The previous target may itself come from an arbitrary (messy) earlier target.
    messy = data.draw(groups(homogeneous=True))
    start = assign("uniform", group.members, group.partitions, messy.previous)
    subscription = next(iter(group.members.values()))
    members = {**group.members, "joiner": subscription}
    target = assign("uniform", members, group.partitions, start)
    check_valid(Group(members, group.partitions), target)
    assert moved(start, target) <= sizes(target)["joiner"]


@given(group=groups(homogeneous=True, previous=False), data=st.data())
def test_uniform_homogeneous_leaver_moves_only_its_partitions(
    group: Group, data: st.DataObject
) -> None:
    start = assign("uniform", group.members, group.partitions)
    leaver = data.draw(st.sampled_from(sorted(group.members)))
    members = {m: s for m, s in group.members.items() if m != leaver}
    target = assign("uniform", members, group.partitions, start)
    for m in members:
        for topic, parts in start[m].items():
            assert parts <= target[m].get(topic, frozenset())
    assert moved(start, target) == sizes(start)[leaver] or not members


@given(group=groups(homogeneous=True))
def test_uniform_homogeneous_result_is_a_fixed_point(group: Group) -> None:
    target = run("uniform", group)
    assert run("uniform", group, previous=target) == target


@given(group=groups(homogeneous=True, previous=False), data=st.data())
def test_uniform_homogeneous_any_balanced_previous_is_kept(
    group: Group, data: st.DataObject
) -> None:
    everything = sorted(
        (t, p)
        for t, n in group.partitions.items()
        if t in next(iter(group.members.values())).topics
        for p in range(n)
    )
    shuffled_parts = data.draw(st.permutations(everything))
    order = data.draw(st.permutations(sorted(group.members)))
    quota, extra = divmod(len(everything), len(order))
    previous: dict[str, dict[str, set[int]]] = {m: {} for m in order}
    pos = 0
    for i, m in enumerate(order):
        take = quota + (1 if i < extra else 0)
        for t, p in shuffled_parts[pos : pos + take]:
            previous[m].setdefault(t, set()).add(p)
        pos += take
    expected = {m: {t: frozenset(ps) for t, ps in tps.items()} for m, tps in previous.items()}
    assert run("uniform", group, previous=previous) == expected


# --- uniform, heterogeneous -------------------------------------------------------------


@given(group=groups(homogeneous=False))
def test_uniform_heterogeneous_isolated_equal_subscriptions_are_exactly_balanced(
    group: Group,
) -> None:
    target = run("uniform", group)
    check_valid(group, target)
    got = sizes(target)
    for mids in isolated_groups(group):
        assert spread(got[m] for m in mids) <= 1, mids


@given(group=groups(homogeneous=False))
def test_uniform_heterogeneous_each_topic_is_balanced_among_its_subscribers(
    group: Group,
) -> None:
    """No partition of a topic could move to a subscriber two or more partitions lighter
    than its owner (the per-topic balancing has converged)."""
    target = run("uniform", group)
    check_valid(group, target)
    got = sizes(target)
    eff = effective(group)
    for (topic, _), owner in owners(target).items():
        lightest = min(got[m] for m, topics in eff.items() if topic in topics)
        assert got[owner] - lightest <= 1, topic


@given(group=groups(homogeneous=False))
def test_uniform_heterogeneous_result_is_a_fixed_point(group: Group) -> None:
    target = run("uniform", group)
    assert run("uniform", group, previous=target) == target


@given(group=groups(homogeneous=False, previous=False), data=st.data())
def test_uniform_heterogeneous_unsubscribing_disturbs_only_the_affected_members(
    group: Group, data: st.DataObject
) -> None:
    """A member dropping a topic loses that topic; members that share no topic (even
    indirectly) with it or with the topic's remaining subscribers keep their target."""
    start = run("uniform", group)
    member = data.draw(st.sampled_from(sorted(group.members)))
    topics = sorted(group.members[member].topics)
    dropped = data.draw(st.sampled_from(topics))
    members = dict(group.members)
    members[member] = Subscription(set(topics) - {dropped})
    changed = Group(members, group.partitions)
    target = assign("uniform", members, group.partitions, start)
    check_valid(changed, target)
    assert dropped not in target[member]
    affected = component(changed, member) | {
        m for s in effective(changed).items() if dropped in s[1] for m in component(changed, s[0])
    }
    for m in members:
        if m not in affected:
            assert target[m] == start[m], m


def component(group: Group, member: str) -> set[str]:
    """Members connected to ``member`` through shared known topics."""
    eff = effective(group)
    seen = {member}
    todo = [member]
    while todo:
        m = todo.pop()
        for other, topics in eff.items():
            if other not in seen and not topics.isdisjoint(eff[m]):
                seen.add(other)
                todo.append(other)
    return seen


# --- range ------------------------------------------------------------------------------


def range_order(group: Group, topic: str) -> list[str]:
    subs = [m for m, s in group.members.items() if topic in s.topics]
    static = sorted(
        (s.instance_id, m)
        for m, s in group.members.items()
        if m in subs and s.instance_id is not None
    )
    dynamic = sorted(m for m in subs if group.members[m].instance_id is None)
    return [m for _, m in static] + dynamic


@given(group=groups())
def test_range_gives_contiguous_ranges_in_member_order(group: Group) -> None:
    target = run("range", group)
    check_valid(group, target)
    for topic, count in group.partitions.items():
        order = range_order(group, topic)
        if not order:
            continue
        quota, extra = divmod(count, len(order))
        start = 0
        for i, m in enumerate(order):
            size = quota + (1 if i < extra else 0)
            assert target[m].get(topic, frozenset()) == frozenset(range(start, start + size))
            start += size


@given(group=groups())
def test_range_co_partitions_topics_with_equal_counts_and_subscribers(group: Group) -> None:
    # Give t0 a twin with the same partition count and subscribers, so there is always a
    # co-partitioned pair.
    members = {
        m: Subscription(
            {*s.topics, "t0twin"} if "t0" in s.topics else s.topics, instance_id=s.instance_id
        )
        for m, s in group.members.items()
    }
    group = Group(members, {**group.partitions, "t0twin": group.partitions["t0"]})
    target = run("range", group)
    check_valid(group, target)
    topics = sorted(group.partitions)
    pairs = 0
    for a in topics:
        for b in topics:
            if (
                a < b
                and group.partitions[a] == group.partitions[b]
                and range_order(group, a) == range_order(group, b)
            ):
                pairs += 1
                for m in group.members:
                    assert target[m].get(a) == target[m].get(b)
    assert pairs >= 1


@given(group=groups())
def test_range_ignores_the_previous_target(group: Group) -> None:
    assert run("range", group) == run("range", group, previous={})


@given(group=groups())
def test_range_puts_static_members_first(group: Group) -> None:
    """The first subscriber in range order always gets partition 0 of a non-empty topic."""
    target = run("range", group)
    for topic, count in group.partitions.items():
        order = range_order(group, topic)
        if order and count:
            assert 0 in target[order[0]][topic]
            statics = [m for m in order if group.members[m].instance_id is not None]
            assert order[: len(statics)] == statics


@given(group=groups(previous=False), name=st.sampled_from(ASSIGNORS))
def test_previous_of_departed_members_changes_nothing(group: Group, name: str) -> None:
    """An empty previous target (bulk path) and one that only names departed members
    (general path) give the same result."""
    ghost = {"departed": {t: frozenset(range(n)) for t, n in group.partitions.items()}}
    assert run(name, group, previous={}) == run(name, group, previous=ghost)
