"""The ``uniform`` assignor: balanced and sticky, the broker's default.

Two builders, picked from the members' (known) topic sets:

* homogeneous (every member subscribes to the same topics): balance first, then
  stickiness. Sizes differ by at most one; each member keeps as much of its previous
  target as its quota allows, and a member already holding an extra partition keeps it
  (KAFKA-18688), so a balanced target is returned unchanged.
* heterogeneous: keep everything still subscribed, hand each unassigned partition to the
  least-loaded subscriber of its topic, then rebalance topic by topic from the most to the
  least loaded subscriber (at most `MAX_BALANCE_PASSES` passes).

Implementation notes (speed): loads are counts; partitions are handed out as contiguous
runs of the free partitions, and equal runs share one frozenset; the loops over members
run in C where possible (``map``, ``dict.fromkeys``, slicing); members whose previous
target is kept whole start from a plain copy of their previous dict, which reuses the
stored key hashes (``uuid.UUID`` hashes in Python).
"""

from __future__ import annotations

from bisect import bisect_right, insort
from collections import deque
from collections.abc import Collection, Mapping, Sequence
from heapq import heapify, heappop, heappush
from itertools import accumulate, chain, count, groupby, repeat
from operator import attrgetter, setitem
from typing import cast

from consumer_sdk.assignors._common import (
    Assignment,
    PreviousAssignment,
    Subscription,
    T,
    TopicIndex,
    check_members,
    check_partition_counts,
    retain_previous,
    sort_keys,
)
from consumer_sdk.assignors.base import Assignor

MAX_BALANCE_PASSES = 16
"""Upper bound on the heterogeneous rebalancing passes over all topics."""


class UniformAssignor(Assignor):
    """Balanced, sticky assignment (``group.consumer.assignors`` name ``uniform``)."""

    name = "uniform"

    def assign(
        self,
        members: Mapping[str, Subscription[T]],
        partitions: Mapping[T, int],
        previous: PreviousAssignment[T] | None = None,
    ) -> Assignment[T]:
        check_members(members)
        member_ids = sorted(members)
        if not member_ids:
            return {}
        # Subscribed topics that exist, per distinct subscription (usually shared objects).
        known = partitions.keys()
        topic_sets = list(map(_TOPICS, map(members.__getitem__, member_ids)))
        effective = {
            topics: topics if known >= topics else frozenset(t for t in topics if t in known)
            for topics in set(topic_sets)
        }
        distinct = set(effective.values())
        all_topics: frozenset[T] = frozenset().union(*distinct)
        check_partition_counts(all_topics, partitions)
        if not all_topics:
            return {member_id: {} for member_id in member_ids}
        if len(distinct) == 1:
            return _homogeneous(member_ids, all_topics, partitions, previous or {})
        member_topics = list(map(effective.__getitem__, topic_sets))
        return _heterogeneous(member_ids, member_topics, all_topics, partitions, previous or {})


_TOPICS = attrgetter("topics")


class _Chunks:
    """Frozensets for runs of free partitions, shared when the same run recurs."""

    __slots__ = ("_lists", "_runs")

    def __init__(self) -> None:
        self._runs: dict[tuple[int, int], frozenset[int]] = {}
        self._lists: dict[tuple[int, int, int], list[frozenset[int]]] = {}

    def get(self, free: Sequence[int], start: int, stop: int) -> frozenset[int]:
        """``frozenset(free[start:stop])``."""
        if type(free) is not range:
            return frozenset(free[start:stop])
        key = (free.start + start, free.start + stop)
        fs = self._runs.get(key)
        if fs is None:
            fs = self._runs[key] = frozenset(range(*key))
        return fs

    def split(self, free: Sequence[int], start: int, size: int, count: int) -> list[frozenset[int]]:
        """``count`` consecutive runs of ``size`` partitions of ``free`` from ``start``."""
        if type(free) is not range:
            return [frozenset(free[i : i + size]) for i in range(start, start + size * count, size)]
        key = (free.start + start, size, count)
        runs = self._lists.get(key)
        if runs is None:
            lo = key[0]
            starts = range(lo, lo + size * count, size)
            stops = range(lo + size, lo + size * (count + 1), size)
            runs = self._lists[key] = list(map(frozenset, map(range, starts, stops)))
        return runs


def _single_topic_dicts(topic: T, parts: list[frozenset[int]]) -> list[dict[T, frozenset[int]]]:
    """``[{topic: p} for p in parts]``, hashing ``topic`` once (``dict.fromkeys`` with a dict
    argument reuses its stored hash; ``uuid.UUID`` hashes in Python)."""
    return list(map(dict.fromkeys, repeat({topic: None}), parts))


def _homogeneous(
    member_ids: list[str],
    topic_set: frozenset[T],
    partitions: Mapping[T, int],
    previous: PreviousAssignment[T],
) -> Assignment[T]:
    topics = sort_keys(topic_set)
    counts = [partitions[t] for t in topics]
    n = len(member_ids)
    total = sum(counts)
    min_quota, extra = divmod(total, n)

    if not previous:
        return dict(zip(member_ids, _fill_fresh(topics, counts, n), strict=True))
    index = TopicIndex(topics)
    retained = retain_previous(member_ids, None, index, counts, previous)
    held, unclaimed, sizes = retained.held, retained.unclaimed, retained.sizes

    # Quotas: min_quota each, plus one for `extra` members. Members already above the
    # minimum keep their extra first (in member order), so a balanced target is stable;
    # any extras left go to the least-filled members, who are being filled anyway.
    caps = [min_quota] * n
    if extra:
        above = [mi for mi, size in enumerate(sizes) if size > min_quota]
        for mi in above[:extra]:
            caps[mi] += 1
        left = extra - min(extra, len(above))
        if left:
            rest = [mi for mi, size in enumerate(sizes) if size <= min_quota]
            rest.sort(key=sizes.__getitem__)
            for mi in rest[:left]:
                caps[mi] += 1

    # Trim members above their quota, keeping their lowest topics and partitions.
    released: dict[int, list[int]] = {}
    for mi in [mi for mi, (s, c) in enumerate(zip(sizes, caps, strict=True)) if s > c]:
        mine = held[mi]
        budget = caps[mi]
        for topic in sorted(mine, key=index.rank):
            parts = mine[topic]
            if len(parts) <= budget:
                budget -= len(parts)
                continue
            ordered = sorted(parts)
            released.setdefault(index.rank(topic), []).extend(ordered[budget:])
            if budget:
                mine[topic] = frozenset(ordered[:budget])
                budget = 0
            else:
                del mine[topic]
        sizes[mi] = caps[mi]

    # Fill members below their quota from the free partitions, topic by topic.
    pool: list[tuple[T, Sequence[int]]] = []
    for ti, free in enumerate(unclaimed):
        more = released.get(ti)
        if more:
            free = sorted(chain(free, more))
        if free:
            pool.append((topics[ti], free))
    chunks = _Chunks()
    pi = 0
    offset = 0
    for mi in [mi for mi, (s, c) in enumerate(zip(sizes, caps, strict=True)) if s < c]:
        need = caps[mi] - sizes[mi]
        mine = held[mi]
        while need:
            topic, free = pool[pi]
            avail = len(free) - offset
            if avail <= need:
                fs = chunks.get(free, offset, len(free))
                need -= avail
                pi += 1
                offset = 0
            else:
                fs = chunks.get(free, offset, offset + need)
                offset += need
                need = 0
            old = mine.get(topic) if mine else None
            mine[topic] = fs if old is None else old | fs
    return dict(zip(member_ids, held, strict=True))


def _fill_fresh(topics: list[T], counts: list[int], n: int) -> list[dict[T, frozenset[int]]]:
    """Homogeneous assignment without a previous target, in bulk.

    Same result as the general fill: member ``i`` (in id order) takes the next ``quota``
    (+1 for the first ``total % n`` members) partitions of the topics laid end to end.
    Members whose run lies inside one topic are built with C-level loops; the few that
    straddle a topic boundary one by one.
    """
    total = sum(counts)
    min_quota, extra = divmod(total, n)
    offsets = [0, *accumulate(counts)]
    out: list[dict[T, frozenset[int]] | None] = [None] * n
    chunks = _Chunks()
    # Two phases of equal-sized runs: members [0, extra) take min_quota + 1, the rest
    # min_quota. Member first + k of a phase starts at base + k * size.
    for first, stop, size, base in (
        (0, extra, min_quota + 1, 0),
        (extra, n, min_quota, extra * (min_quota + 1)),
    ):
        if first >= stop:
            continue
        if size == 0:
            out[first:stop] = [{} for _ in range(stop - first)]
            continue
        for ti, topic in enumerate(topics):
            lo, hi = offsets[ti], offsets[ti + 1]
            k_lo = max(0, -((base - lo) // size))  # first run starting at or after lo
            k_hi = min(stop - first, (hi - base) // size)  # runs ending at or before hi
            if k_lo < k_hi:
                runs = chunks.split(range(hi - lo), base + k_lo * size - lo, size, k_hi - k_lo)
                out[first + k_lo : first + k_hi] = _single_topic_dicts(topic, runs)
    for i in [i for i, d in enumerate(out) if d is None]:
        start = i * min_quota + min(i, extra)
        end = start + min_quota + (i < extra)
        mine: dict[T, frozenset[int]] = {}
        ti = bisect_right(offsets, start) - 1
        while start < end:
            cut = min(end, offsets[ti + 1])
            if cut > start:
                mine[topics[ti]] = chunks.get(
                    range(counts[ti]), start - offsets[ti], cut - offsets[ti]
                )
            start = cut
            ti += 1
        out[i] = mine
    return cast("list[dict[T, frozenset[int]]]", out)


class _Signatures:
    """Topics grouped by their exact subscriber set ("signature").

    For each signature the subscribers are kept as *levels*: ascending distinct loads, each
    with its members by ascending index, i.e. ordered by (load, index) as the least-loaded
    rule needs. Levels are updated in place when the signature's own topics are filled and
    rebuilt lazily when a fill of an overlapping signature changed some of its members.
    """

    __slots__ = ("levels", "members", "overlaps")

    def __init__(self, members: list[list[int]], overlaps: list[list[int]]) -> None:
        self.members = members
        self.overlaps = overlaps
        self.levels: list[list[tuple[int, list[int]]] | None] = [None] * len(members)

    def get_levels(self, sig: int, loads: list[int]) -> list[tuple[int, list[int]]]:
        levels = self.levels[sig]
        if levels is None:
            ordered = sorted(self.members[sig], key=loads.__getitem__)
            levels = [(load, list(group)) for load, group in groupby(ordered, loads.__getitem__)]
            self.levels[sig] = levels
        return levels

    def changed(self, sig: int) -> None:
        """Loads of members of ``sig`` changed outside its own level bookkeeping."""
        self.levels[sig] = None
        for other in self.overlaps[sig]:
            self.levels[other] = None


def _heterogeneous(
    member_ids: list[str],
    member_topics: list[frozenset[T]],
    topic_set: frozenset[T],
    partitions: Mapping[T, int],
    previous: PreviousAssignment[T],
) -> Assignment[T]:
    topics = sort_keys(topic_set)
    nt = len(topics)
    counts = [partitions[t] for t in topics]
    index = TopicIndex(topics)

    # Members with equal subscriptions form a group; topics with the same groups of
    # subscribers share a signature.
    # (In order of first member; groups[eff].append(mi) for every member, looping in C.)
    groups: dict[frozenset[T], list[int]] = {eff: [] for eff in dict.fromkeys(member_topics)}
    deque(map(list.append, map(groups.__getitem__, member_topics), count()), maxlen=0)
    group_members = list(groups.values())
    group_topics = [[index.rank(t) for t in eff] for eff in groups]
    topic_groups: list[list[int]] = [[] for _ in range(nt)]
    for gi, tis in enumerate(group_topics):
        for ti in tis:
            topic_groups[ti].append(gi)
    sig_ids: dict[tuple[int, ...], int] = {}
    sig_members: list[list[int]] = []
    topic_sig: list[int] = []
    for tg in topic_groups:
        key = tuple(tg)
        sig = sig_ids.get(key)
        if sig is None:
            sig = sig_ids[key] = len(sig_members)
            sig_members.append(sorted(chain.from_iterable(group_members[g] for g in tg)))
        topic_sig.append(sig)
    group_sigs: list[set[int]] = [{topic_sig[ti] for ti in tis} for tis in group_topics]
    overlaps: list[list[int]] = []
    for key, sig in sig_ids.items():
        near: set[int] = set().union(*(group_sigs[g] for g in key))
        near.discard(sig)
        overlaps.append(sorted(near))
    signatures = _Signatures(sig_members, overlaps)

    held: list[dict[T, frozenset[int]]]
    unclaimed: Sequence[Sequence[int]]
    if previous:
        masks: list[bytes] = []
        for tis in group_topics:
            mask = bytearray(nt)
            for ti in tis:
                mask[ti] = 1
            masks.append(bytes(mask))
        member_masks: list[bytes] = [b""] * len(member_ids)
        for gi, mis in enumerate(group_members):
            for mi in mis:
                member_masks[mi] = masks[gi]
        retained = retain_previous(member_ids, member_masks, index, counts, previous)
        held, unclaimed, loads = retained.held, retained.unclaimed, retained.sizes
    else:
        held = [{} for _ in member_ids]
        unclaimed = [range(c) for c in counts]
        loads = [0] * len(member_ids)

    # Partitions per subscriber descending, then subscriber count, then topic key.
    order = sorted(
        range(nt),
        key=lambda ti: (
            -counts[ti] / len(sig_members[topic_sig[ti]]),
            len(sig_members[topic_sig[ti]]),
            ti,
        ),
    )

    chunks = _Chunks()
    for ti in order:
        free = unclaimed[ti]
        if free:
            sig = topic_sig[ti]
            # A topic nobody held before cannot be merged into an existing entry.
            fresh = type(free) is range and len(free) == counts[ti]
            _fill_least_loaded(topics[ti], free, sig, signatures, loads, held, chunks, fresh)

    _balance(topics, topic_sig, order, signatures, loads, held)
    return dict(zip(member_ids, held, strict=True))


def _fill_least_loaded(
    topic: T,
    free: Sequence[int],
    sig: int,
    signatures: _Signatures,
    loads: list[int],
    held: list[dict[T, frozenset[int]]],
    chunks: _Chunks,
    fresh: bool,
) -> None:
    """Give the ``free`` partitions of ``topic``, one at a time, to the least loaded
    subscriber (ties: lowest member index).

    Done in bulk as water filling: the lowest levels are raised to a common ``level`` and
    the remainder goes one each to the first of them in (load, index) order. Every
    receiver gets a contiguous run of ``free``.
    """
    k = len(free)
    levels = signatures.get_levels(sig, loads)
    cnt = 0
    total = 0
    j = 0
    for load, mis in levels:
        if cnt and cnt * load - total > k:
            break
        cnt += len(mis)
        total += load * len(mis)
        j += 1
    level, rem = divmod(total + k, cnt)

    offset = 0
    pos = 0
    # Members ending at `level` and at `level + 1`, as runs sorted by index.
    at_level: list[list[int]] = []
    above: list[list[int]] = []
    for load, mis in levels[:j]:
        split = min(max(rem - pos, 0), len(mis))
        pos += len(mis)
        for seg, target, bucket in (
            (mis[:split], level + 1, above),
            (mis[split:], level, at_level),
        ):
            if not seg:
                continue
            bucket.append(seg)
            gain = target - load
            if gain > 0:
                fsets = chunks.split(free, offset, gain, len(seg))
                offset += gain * len(seg)
                if fresh:
                    # held[mi][topic] = fs for each receiver, looping in C.
                    deque(map(setitem, map(held.__getitem__, seg), repeat(topic), fsets), maxlen=0)
                else:
                    for mi, fs in zip(seg, fsets, strict=True):
                        mine = held[mi]
                        old = mine.get(topic)
                        mine[topic] = fs if old is None else old | fs
                deque(map(loads.__setitem__, seg, repeat(target)), maxlen=0)
    # New levels: [level] + [level + 1] + untouched higher levels.
    rest = levels[j:]
    new_levels: list[tuple[int, list[int]]] = []
    if at_level:
        new_levels.append((level, _merge_runs(at_level)))
    if rest and rest[0][0] == level + 1:
        above.append(rest[0][1])
        rest = rest[1:]
    if above:
        new_levels.append((level + 1, _merge_runs(above)))
    new_levels.extend(rest)
    signatures.levels[sig] = new_levels
    for other in signatures.overlaps[sig]:
        signatures.levels[other] = None


def _merge_runs(runs: list[list[int]]) -> list[int]:
    """Merge ascending lists of member indexes into one ascending list."""
    return runs[0] if len(runs) == 1 else sorted(chain.from_iterable(runs))


def _balance(
    topics: list[T],
    topic_sig: list[int],
    order: list[int],
    signatures: _Signatures,
    loads: list[int],
    held: list[dict[T, frozenset[int]]],
) -> None:
    """Move partitions from the most to the least loaded subscribers of each topic.

    For each topic (in assignment order), while the most loaded subscriber holding one of
    its partitions has at least two more partitions than the least loaded subscriber, its
    highest partition of the topic moves over. Passes over the topics repeat until one
    moves nothing, at most `MAX_BALANCE_PASSES` times.
    """
    candidates = [ti for ti in order if len(signatures.members[topic_sig[ti]]) >= 2]
    if not candidates:
        return
    spreads: dict[int, int] = {}

    def spread(sig: int) -> int:
        value = spreads.get(sig)
        if value is None:
            levels = signatures.levels[sig]
            if levels is not None:
                value = levels[-1][0] - levels[0][0]
            else:
                sub_loads = list(map(loads.__getitem__, signatures.members[sig]))
                value = max(sub_loads) - min(sub_loads)
            spreads[sig] = value
        return value

    # Partitions of (member, topic) pairs touched while balancing, as sorted lists.
    work: dict[tuple[int, int], list[int]] = {}
    last_moved = -1
    for _ in range(MAX_BALANCE_PASSES):
        for idx, ti in enumerate(candidates):
            if idx == last_moved:
                break
            sig = topic_sig[ti]
            moved = 0
            if spread(sig) > 1:
                moved = _balance_topic(ti, topics[ti], signatures.members[sig], loads, held, work)
                if moved:
                    signatures.changed(sig)
                    spreads.pop(sig, None)
                    for other in signatures.overlaps[sig]:
                        spreads.pop(other, None)
            if moved or last_moved == -1:
                last_moved = idx
        else:
            continue
        break
    for (mi, ti), parts in work.items():
        if parts:
            held[mi][topics[ti]] = frozenset(parts)
        else:
            held[mi].pop(topics[ti], None)


def _balance_topic(
    ti: int,
    topic: T,
    subs: list[int],
    loads: list[int],
    held: list[dict[T, frozenset[int]]],
    work: dict[tuple[int, int], list[int]],
) -> int:
    """Rebalance one topic's subscribers; returns the number of partitions moved."""

    def holding(mi: int) -> Collection[int]:
        parts = work.get((mi, ti))
        if parts is not None:
            return parts
        return held[mi].get(topic, ())

    # Min-heap of (load, index) for receivers; max-heap of (-load, -index) for donors.
    # Entries go stale when loads change; a fresh entry is pushed on every change.
    receivers = [(loads[mi], mi) for mi in subs]
    heapify(receivers)
    donors = [(-loads[mi], -mi) for mi in subs if holding(mi)]
    heapify(donors)
    moved = 0
    while donors:
        neg_load, neg_mi = donors[0]
        x = -neg_mi
        if -neg_load != loads[x] or not holding(x):
            heappop(donors)
            continue
        while receivers[0][0] != loads[receivers[0][1]]:
            heappop(receivers)
        y = receivers[0][1]
        if loads[x] - loads[y] <= 1:
            break
        src = work.get((x, ti))
        if src is None:
            src = work[(x, ti)] = sorted(held[x][topic])
        dst = work.get((y, ti))
        if dst is None:
            dst = work[(y, ti)] = sorted(held[y].get(topic, ()))
        insort(dst, src.pop())
        loads[x] -= 1
        loads[y] += 1
        moved += 1
        heappush(receivers, (loads[x], x))
        heappush(receivers, (loads[y], y))
        if src:
            heappush(donors, (-loads[x], -x))
        heappush(donors, (-loads[y], -y))
    return moved
