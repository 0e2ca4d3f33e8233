"""The public interface of consumer_sdk.assignors: names, input handling, diff/explain."""

from __future__ import annotations

import dataclasses
import uuid

import pytest

from consumer_sdk.assignors import (
    ASSIGNORS,
    Assignor,
    AssignorError,
    RangeAssignor,
    Subscription,
    UniformAssignor,
    assign,
    diff,
    explain,
    format_partitions,
    get_assignor,
)

from .support import Group, check_valid, sizes


def test_names_and_registry() -> None:
    assert ASSIGNORS == ("uniform", "range")
    assert isinstance(get_assignor("uniform"), UniformAssignor)
    assert isinstance(get_assignor("range"), RangeAssignor)
    for name in ASSIGNORS:
        assignor = get_assignor(name)
        assert isinstance(assignor, Assignor)
        assert assignor.name == name


def test_unknown_assignor_names_the_choices() -> None:
    with pytest.raises(AssignorError) as info:
        assign("sticky", members={}, partitions={})
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert "'sticky'" in message
    assert "'uniform'" in message and "'range'" in message


def test_subscription_converts_topics_and_is_frozen() -> None:
    sub = Subscription(["a", "b", "a"], rack="r1", instance_id="i1")
    assert sub.topics == frozenset({"a", "b"})
    assert isinstance(sub.topics, frozenset)
    assert (sub.rack, sub.instance_id) == ("r1", "i1")
    assert Subscription({"a", "b"}) == Subscription(frozenset({"b", "a"}))
    assert Subscription().topics == frozenset()
    with pytest.raises(dataclasses.FrozenInstanceError):
        sub.rack = "r2"  # type: ignore[misc]
    with pytest.raises(TypeError):
        Subscription("abc")


def test_example_from_the_issue() -> None:
    members = {
        "m1": Subscription(topics={"t1", "t2"}, rack=None, instance_id=None),
        "m2": Subscription(topics={"t1", "t2"}, rack=None, instance_id=None),
    }
    target = assign(
        "uniform",
        members=members,
        partitions={"t1": 100, "t2": 50},
        previous={"m1": {"t1": {0, 1}}},
    )
    check_valid(Group(members, {"t1": 100, "t2": 50}), target)
    assert sizes(target) == {"m1": 75, "m2": 75}
    assert {0, 1} <= target["m1"]["t1"]


@pytest.mark.parametrize("name", ASSIGNORS)
def test_every_member_is_in_the_output(name: str) -> None:
    members = {
        "a": Subscription({"t"}),
        "b": Subscription({"t"}),
        "c": Subscription({"t"}),
        "idle": Subscription(),
    }
    target = assign(name, members, {"t": 2})
    assert set(target) == set(members)
    assert target["idle"] == {}
    assert sum(len(v.get("t", ())) for v in target.values()) == 2
    assert assign(name, {}, {"t": 2}) == {}


@pytest.mark.parametrize("name", ASSIGNORS)
def test_unknown_and_empty_topics_are_skipped(name: str) -> None:
    members = {"a": Subscription({"known", "missing", "empty"}), "b": Subscription({"known"})}
    target = assign(name, members, {"known": 4, "empty": 0, "other": 9})
    assert target["a"].keys() <= {"known"}
    assert target["b"].keys() <= {"known"}
    assert sum(len(v.get("known", ())) for v in target.values()) == 4
    only_unknown = assign(name, {"a": Subscription({"missing"})}, {"t": 3})
    assert only_unknown == {"a": {}}


@pytest.mark.parametrize("name", ASSIGNORS)
@pytest.mark.parametrize("count", [-1, -5])
def test_negative_partition_count_is_rejected(name: str, count: int) -> None:
    with pytest.raises(AssignorError, match=r"'t'.*negative"):
        assign(name, {"a": Subscription({"t"})}, {"t": count})


@pytest.mark.parametrize("name", ASSIGNORS)
@pytest.mark.parametrize("count", [1.5, "3", True, None])
def test_non_integer_partition_count_is_rejected(name: str, count: object) -> None:
    with pytest.raises(AssignorError, match="must be an int"):
        assign(name, {"a": Subscription({"t"})}, {"t": count})  # type: ignore[dict-item]


def test_bad_counts_of_unsubscribed_topics_are_irrelevant() -> None:
    target = assign("uniform", {"a": Subscription({"t"})}, {"t": 1, "other": -1})
    assert target == {"a": {"t": frozenset({0})}}


@pytest.mark.parametrize("name", ASSIGNORS)
def test_members_must_be_subscriptions(name: str) -> None:
    with pytest.raises(AssignorError, match=r"'a'.*Subscription"):
        assign(name, {"a": {"t"}}, {"t": 1})  # type: ignore[dict-item]


def test_previous_out_of_range_stale_and_duplicate_partitions_are_ignored() -> None:
    members = {"a": Subscription({"t"}), "b": Subscription({"t"})}
    previous = {
        "a": {"t": {0, 1, 7, -1}, "gone-topic": {0}},
        "b": {"t": [1, 2]},  # 1 is also claimed by "a", which comes first
        "gone-member": {"t": {3}},
    }
    target = assign("uniform", members, {"t": 4}, previous)
    check_valid(Group(members, {"t": 4}), target)
    assert target["a"]["t"] >= {0, 1}
    assert 2 in target["b"]["t"]
    assert sorted(map(len, (target["a"]["t"], target["b"]["t"]))) == [2, 2]


def test_previous_that_is_not_iterable_is_a_clear_error() -> None:
    with pytest.raises(AssignorError, match=r"previous\['a'\]\['t'\]"):
        assign("uniform", {"a": Subscription({"t"})}, {"t": 2}, {"a": {"t": 3}})  # type: ignore[dict-item]


def test_previous_with_non_int_partitions_keeps_the_valid_ones() -> None:
    members = {"a": Subscription({"t"})}
    target = assign("uniform", members, {"t": 3}, {"a": {"t": {"0", 1, None}}})  # type: ignore[arg-type]
    assert target == {"a": {"t": frozenset({0, 1, 2})}}


def test_uuid_topic_keys() -> None:
    t1, t2 = uuid.UUID(int=2), uuid.UUID(int=1)
    members = {f"m{i}": Subscription({t1, t2}) for i in range(3)}
    target = assign("uniform", members, {t1: 4, t2: 5})
    check_valid(Group(members, {t1: 4, t2: 5}), target)  # type: ignore[arg-type]
    # Topics are taken in sorted key order, so the first member starts with the lower id.
    assert target["m0"] == {t2: frozenset({0, 1, 2})}


def test_mixed_topic_key_types_are_sorted_deterministically() -> None:
    t_uuid = uuid.UUID(int=7)
    members = {"a": Subscription({"x", 3, t_uuid}), "b": Subscription({"x", 3, t_uuid})}
    partitions = {"x": 1, 3: 1, t_uuid: 1}
    first = assign("uniform", members, partitions)
    again = assign("uniform", dict(reversed(members.items())), dict(reversed(partitions.items())))
    assert first == again
    assert sum(len(v) for v in first.values()) == 3


def test_diff_lists_added_and_revoked_per_member() -> None:
    previous = {"a": {"t": {0, 1, 2}}, "b": {"t": {3}}, "gone": {"u": {0}}}
    target = {"a": {"t": frozenset({0, 1})}, "b": {"t": frozenset({2, 3})}, "new": {}}
    changes = diff(previous, target)
    assert list(changes) == ["a", "b", "gone", "new"]
    assert changes["a"].revoked == {"t": frozenset({2})}
    assert changes["a"].added == {}
    assert (changes["a"].before, changes["a"].after, changes["a"].kept) == (3, 2, 2)
    assert changes["b"].added == {"t": frozenset({2})}
    assert changes["gone"].revoked == {"u": frozenset({0})}
    assert not changes["new"].changed
    assert changes["b"].changed


def test_diff_without_previous_adds_everything() -> None:
    changes = diff(None, {"a": {"t": frozenset({1, 2})}})
    assert changes["a"].added == {"t": frozenset({1, 2})}
    assert changes["a"].added_count == 2


def test_explain_summarises_a_plan() -> None:
    members = {"a": Subscription({"t"}), "b": Subscription({"t"})}
    previous = {"a": {"t": frozenset(range(6))}}
    target = assign("uniform", members, {"t": 6}, previous)
    text = explain(previous, target)
    lines = text.splitlines()
    assert lines[0] == (
        "2 members, 6 partitions assigned; 2 members change, 3 partitions added, 3 revoked"
    )
    assert "a: 6 -> 3 (+0 -3)" in lines
    assert "b: 0 -> 3 (+3 -0)" in lines
    assert "  - t: 3-5" in lines
    assert "  + t: 3-5" in lines
    quiet = explain(target, target)
    assert quiet.splitlines() == [
        "2 members, 6 partitions assigned; 0 members change, 0 partitions added, 0 revoked"
    ]
    assert "a: 3 -> 3 (+0 -0)" in explain(target, target, unchanged=True)


def test_format_partitions() -> None:
    assert format_partitions([5, 0, 1, 2, 9, 8]) == "0-2,5,8-9"
    assert format_partitions([]) == ""
    assert format_partitions({4}) == "4"
