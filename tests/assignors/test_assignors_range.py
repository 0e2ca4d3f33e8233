"""Worked examples of the range assignor, written from the documented behaviour."""

from __future__ import annotations

from consumer_sdk.assignors import Subscription, assign

from .support import Group, check_valid


def span(lo: int, hi: int) -> frozenset[int]:
    """Partitions lo..hi inclusive."""
    return frozenset(range(lo, hi + 1))


def test_first_members_get_the_extra_partitions() -> None:
    members = {m: Subscription({"t"}) for m in ("c", "a", "b")}
    target = assign("range", members, {"t": 8})
    assert target == {"a": {"t": span(0, 2)}, "b": {"t": span(3, 5)}, "c": {"t": span(6, 7)}}


def test_static_members_come_first_ordered_by_instance_id() -> None:
    members = {
        "a": Subscription({"t"}),
        "b": Subscription({"t"}, instance_id="zz"),
        "c": Subscription({"t"}, instance_id="aa"),
        "d": Subscription({"t"}),
    }
    target = assign("range", members, {"t": 6})
    # Order: c (instance aa), b (instance zz), then a, d by member id; 6 % 4 = 2 extras.
    assert target == {
        "c": {"t": span(0, 1)},
        "b": {"t": span(2, 3)},
        "a": {"t": span(4, 4)},
        "d": {"t": span(5, 5)},
    }


def test_co_partitioned_topics_get_the_same_ranges() -> None:
    members = {m: Subscription({"orders", "payments", "other"}) for m in ("a", "b", "c")}
    target = assign("range", members, {"orders": 7, "payments": 7, "other": 2})
    for m in members:
        assert target[m]["orders"] == target[m]["payments"]
    assert target["a"]["orders"] == span(0, 2)
    assert target["a"]["other"] == span(0, 0)
    assert "other" not in target["c"]


def test_heterogeneous_subscriptions_split_each_topic_among_its_subscribers() -> None:
    members = {
        "a": Subscription({"t1", "t2"}),
        "b": Subscription({"t2"}),
        "c": Subscription({"t1"}, instance_id="i"),
    }
    partitions = {"t1": 5, "t2": 3}
    target = assign("range", members, partitions)
    check_valid(Group(members, partitions), target)
    # t1 subscribers: c (static) then a; t2 subscribers: a then b.
    assert target == {
        "a": {"t1": span(3, 4), "t2": span(0, 1)},
        "b": {"t2": span(2, 2)},
        "c": {"t1": span(0, 2)},
    }


def test_range_is_not_sticky() -> None:
    members = {m: Subscription({"t"}) for m in ("a", "b")}
    previous = {"a": {"t": span(2, 3)}, "b": {"t": span(0, 1)}}
    target = assign("range", members, {"t": 4}, previous)
    assert target == assign("range", members, {"t": 4})
    assert target == {"a": {"t": span(0, 1)}, "b": {"t": span(2, 3)}}


def test_more_subscribers_than_partitions_leaves_the_last_ones_empty() -> None:
    members = {m: Subscription({"t"}) for m in ("a", "b", "c")}
    assert assign("range", members, {"t": 2}) == {
        "a": {"t": span(0, 0)},
        "b": {"t": span(1, 1)},
        "c": {},
    }
