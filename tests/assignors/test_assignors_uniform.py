"""Worked examples of the uniform assignor, written from the documented behaviour."""

from __future__ import annotations

from consumer_sdk.assignors import MAX_BALANCE_PASSES, Subscription, assign

from .support import Group, check_valid, moved, sizes


def fs(*parts: int) -> frozenset[int]:
    return frozenset(parts)


def span(lo: int, hi: int) -> frozenset[int]:
    """Partitions lo..hi inclusive."""
    return frozenset(range(lo, hi + 1))


# --- homogeneous ------------------------------------------------------------------------


def test_first_assignment_fills_members_in_order_topic_by_topic() -> None:
    members = {m: Subscription({"a", "b"}) for m in ("m3", "m1", "m2")}
    target = assign("uniform", members, {"a": 4, "b": 3})
    # 7 partitions over 3 members: quota 2, one member gets 3; members are taken in id order
    # and the free partitions in topic order.
    assert target == {
        "m1": {"a": span(0, 2)},
        "m2": {"a": fs(3), "b": fs(0)},
        "m3": {"b": fs(1, 2)},
    }


def test_balanced_target_is_returned_unchanged_even_when_the_extra_is_held_late() -> None:
    # KAFKA-18688: "m3" holds the extra partition; it keeps it instead of the first member
    # in order grabbing it and reshuffling everyone.
    members = {m: Subscription({"t"}) for m in ("m1", "m2", "m3")}
    previous = {"m1": {"t": fs(0, 1, 2)}, "m2": {"t": fs(3, 4, 5)}, "m3": {"t": span(6, 9)}}
    assert assign("uniform", members, {"t": 10}, previous) == previous


def test_members_above_quota_give_up_their_highest_partitions() -> None:
    members = {m: Subscription({"t"}) for m in ("m1", "m2", "m3")}
    # 9 partitions: quota 3 each and no extra, so m1 and m2 (4 each) give one back.
    previous = {"m1": {"t": span(0, 3)}, "m2": {"t": span(4, 7)}, "m3": {"t": fs(8)}}
    target = assign("uniform", members, {"t": 9}, previous)
    assert target == {
        "m1": {"t": span(0, 2)},
        "m2": {"t": span(4, 6)},
        "m3": {"t": fs(3, 7, 8)},
    }


def test_joining_member_takes_only_what_it_needs() -> None:
    old = {m: Subscription({"t"}) for m in ("a", "b")}
    previous = assign("uniform", old, {"t": 9})
    assert sizes(previous) == {"a": 5, "b": 4}
    members = {**old, "c": Subscription({"t"})}
    target = assign("uniform", members, {"t": 9}, previous)
    assert sizes(target) == {"a": 3, "b": 3, "c": 3}
    assert target["a"]["t"] <= previous["a"]["t"]
    assert target["b"]["t"] <= previous["b"]["t"]
    assert moved(previous, target) == 3


def test_leaving_member_hands_over_only_its_partitions() -> None:
    members = {m: Subscription({"t", "u"}) for m in ("a", "b", "c")}
    previous = assign("uniform", members, {"t": 7, "u": 4})
    del members["b"]
    target = assign("uniform", members, {"t": 7, "u": 4}, previous)
    check_valid(Group(members, {"t": 7, "u": 4}), target)
    for m in members:
        for topic, parts in previous[m].items():
            assert parts <= target[m][topic]
    assert moved(previous, target) == sizes(previous)["b"]


def test_unsubscribed_topic_is_revoked_and_redistributed() -> None:
    members = {m: Subscription({"t"}) for m in ("a", "b")}
    previous = {"a": {"t": fs(0, 1), "gone": fs(0, 1, 2)}, "b": {"t": fs(2, 3)}}
    target = assign("uniform", members, {"t": 4, "gone": 3}, previous)
    assert target == {"a": {"t": fs(0, 1)}, "b": {"t": fs(2, 3)}}


def test_over_quota_member_keeps_its_lowest_topics_and_partitions() -> None:
    members = {m: Subscription({"t", "u"}) for m in ("a", "b")}
    previous = {"a": {"t": span(0, 3), "u": span(0, 3)}}
    target = assign("uniform", members, {"t": 4, "u": 4}, previous)
    assert target == {"a": {"t": span(0, 3)}, "b": {"u": span(0, 3)}}


def test_more_members_than_partitions() -> None:
    members = {m: Subscription({"t"}) for m in ("a", "b", "c", "d")}
    target = assign("uniform", members, {"t": 2})
    assert sizes(target) == {"a": 1, "b": 1, "c": 0, "d": 0}
    # With a previous target the holders keep their partitions.
    target = assign("uniform", members, {"t": 2}, {"c": {"t": fs(0)}, "d": {"t": fs(1)}})
    assert target == {"a": {}, "b": {}, "c": {"t": fs(0)}, "d": {"t": fs(1)}}


def test_partition_count_shrinking_drops_vanished_partitions() -> None:
    members = {m: Subscription({"t"}) for m in ("a", "b")}
    previous = {"a": {"t": span(0, 4)}, "b": {"t": span(5, 9)}}
    target = assign("uniform", members, {"t": 6}, previous)
    # Partitions 6-9 no longer exist; "a" is over its quota of 3 and gives up 3 and 4.
    assert target == {"a": {"t": span(0, 2)}, "b": {"t": span(3, 5)}}


# --- heterogeneous ----------------------------------------------------------------------


def test_each_partition_goes_to_a_subscriber_and_least_loaded_first() -> None:
    members = {"a": Subscription({"t1", "t2"}), "b": Subscription({"t2"})}
    target = assign("uniform", members, {"t1": 4, "t2": 4})
    # t1 (4 partitions per subscriber) is placed before t2 (2 per subscriber): "a" takes all
    # of t1, so "b", now the least loaded, takes all of t2.
    assert target == {"a": {"t1": span(0, 3)}, "b": {"t2": span(0, 3)}}


def test_topics_ordered_by_partitions_per_subscriber() -> None:
    # t_big has 6 partitions for 2 subscribers (3 each) and goes first, then t_small has
    # 2 partitions for 2 subscribers. Ties between the members break by member id.
    members = {
        "a": Subscription({"t_big", "t_small"}),
        "b": Subscription({"t_big", "t_small", "x"}),
    }
    target = assign("uniform", members, {"t_big": 6, "t_small": 2, "x": 0})
    assert target == {
        "a": {"t_big": span(0, 2), "t_small": fs(0)},
        "b": {"t_big": span(3, 5), "t_small": fs(1)},
    }


def test_heterogeneous_keeps_subscribed_topics_and_revokes_only_unsubscribed_ones() -> None:
    members = {
        "a": Subscription({"t1"}),  # unsubscribed from t2
        "b": Subscription({"t1", "t2"}),
        "c": Subscription({"t2", "t3"}),
    }
    partitions = {"t1": 4, "t2": 4, "t3": 2}
    previous = {
        "a": {"t1": fs(0, 1), "t2": fs(0, 1)},
        "b": {"t1": fs(2, 3), "t2": fs(2)},
        "c": {"t2": fs(3), "t3": fs(0, 1)},
    }
    target = assign("uniform", members, partitions, previous)
    check_valid(Group(members, partitions), target)
    # Only a's t2 partitions (0, 1) are revoked at first. All three topics have 2 partitions
    # per subscriber; t3 (one subscriber) comes first, then t1 and t2. t2-0 and t2-1 go one
    # each to b and c (3 partitions each). Balancing t1 then moves b's highest t1 partition
    # to a (4 vs 2); t2 is balanced (4 vs 4) and t3 has a single subscriber.
    assert target == {
        "a": {"t1": fs(0, 1, 3)},
        "b": {"t1": fs(2), "t2": fs(0, 2)},
        "c": {"t2": fs(1, 3), "t3": fs(0, 1)},
    }


def test_rebalance_moves_highest_partitions_from_most_to_least_loaded() -> None:
    members = {"a": Subscription({"t", "only_a"}), "b": Subscription({"t"})}
    partitions = {"t": 6, "only_a": 1}
    previous = {"a": {"t": span(0, 5), "only_a": fs(0)}}
    target = assign("uniform", members, partitions, previous)
    # "a" holds 7 and "b" 0: partitions of t move from "a" (highest first) until the two
    # differ by at most one.
    assert target == {"a": {"t": span(0, 2), "only_a": fs(0)}, "b": {"t": span(3, 5)}}


def test_overlapping_subscriptions_are_only_balanced_per_topic() -> None:
    members = {
        "a": Subscription({"t1"}),
        "b": Subscription({"t1", "t2"}),
        "c": Subscription({"t2"}),
    }
    target = assign("uniform", members, {"t1": 10, "t2": 11})
    check_valid(Group(members, {"t1": 10, "t2": 11}), target)
    # t2 (5.5 per subscriber) first: b 6, c 5. Then t1: a is raised to b's level, the rest
    # is shared: a 8, b 8. Balancing t2 moves one partition from b to c. Each topic's
    # subscribers now differ by at most one (a-b and b-c), but a and c differ by two: the
    # "close" balance of overlapping subscriptions (7/7/7 would need a chain of moves).
    assert target == {
        "a": {"t1": span(0, 7)},
        "b": {"t1": fs(8, 9), "t2": span(0, 4)},
        "c": {"t2": span(5, 10)},
    }


def test_single_subscriber_topic_is_never_moved_to_balance() -> None:
    members = {"a": Subscription({"solo", "shared"}), "b": Subscription({"shared"})}
    target = assign("uniform", members, {"solo": 10, "shared": 2})
    assert target == {"a": {"solo": span(0, 9)}, "b": {"shared": fs(0, 1)}}


def test_disjoint_subscriptions_balance_within_each_group() -> None:
    members = {f"x{i}": Subscription({"x1", "x2"}) for i in range(3)}
    members |= {f"y{i}": Subscription({"y"}) for i in range(2)}
    partitions = {"x1": 5, "x2": 5, "y": 9}
    target = assign("uniform", members, partitions)
    check_valid(Group(members, partitions), target)
    got = sizes(target)
    assert sorted(got[f"x{i}"] for i in range(3)) == [3, 3, 4]
    assert sorted(got[f"y{i}"] for i in range(2)) == [4, 5]


def test_balance_pass_limit_is_16() -> None:
    assert MAX_BALANCE_PASSES == 16
    # A chain of overlapping subscriptions where imbalance has to travel along the chain;
    # the result must stay valid whatever the number of passes needed.
    names = [f"m{i:02d}" for i in range(12)]
    members = {m: Subscription({f"t{i}", f"t{i + 1}"}) for i, m in enumerate(names)}
    partitions = {f"t{i}": 3 for i in range(13)}
    previous = {names[0]: {"t0": span(0, 2), "t1": span(0, 2)}}
    target = assign("uniform", members, partitions, previous)
    check_valid(Group(members, partitions), target)
    assert max(sizes(target).values()) - min(sizes(target).values()) <= 2
