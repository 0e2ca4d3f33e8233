"""The ``range`` assignor: contiguous per-topic ranges, co-partitioning friendly."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from itertools import chain
from operator import attrgetter

from consumer_sdk.assignors._common import (
    Assignment,
    PreviousAssignment,
    Subscription,
    T,
    check_members,
    check_partition_counts,
    sort_keys,
)
from consumer_sdk.assignors.base import Assignor

_TOPICS = attrgetter("topics")


class RangeAssignor(Assignor):
    """Contiguous ranges per topic (``group.consumer.assignors`` name ``range``).

    Subscribers of a topic are ordered static members first (by instance id), then the
    others (by member id). With ``n`` partitions and ``s`` subscribers, each gets
    ``n // s`` consecutive partitions and the first ``n % s`` one more. Topics with the
    same subscribers and partition count are therefore co-partitioned. Not sticky: the
    previous target is ignored.
    """

    name = "range"

    def assign(
        self,
        members: Mapping[str, Subscription[T]],
        partitions: Mapping[T, int],
        previous: PreviousAssignment[T] | None = None,
    ) -> Assignment[T]:
        check_members(members)
        static = sorted(
            (sub.instance_id, member_id)
            for member_id, sub in members.items()
            if sub.instance_id is not None
        )
        dynamic = sorted(m for m, sub in members.items() if sub.instance_id is None)
        ordered = [member_id for _, member_id in static] + dynamic
        out: Assignment[T] = {member_id: {} for member_id in sorted(members)}
        if not ordered:
            return out

        known = partitions.keys()
        # Members with the same subscription form a group (rank order kept); the loop
        # groups[topics].append(member_id) runs in C.
        topic_sets = list(map(_TOPICS, map(members.__getitem__, ordered)))
        groups: dict[frozenset[T], list[str]] = {t: [] for t in dict.fromkeys(topic_sets) if t}
        groups[frozenset()] = []
        deque(map(list.append, map(groups.__getitem__, topic_sets), ordered), maxlen=0)
        del groups[frozenset()]
        group_lists = list(groups.values())
        topic_groups: dict[T, list[int]] = {}
        for gi, topics in enumerate(groups):
            for topic in topics:
                if topic in known:
                    topic_groups.setdefault(topic, []).append(gi)
        check_partition_counts(topic_groups, partitions)

        rank = {member_id: i for i, member_id in enumerate(ordered)}
        by_signature: dict[tuple[int, ...], list[str]] = {}
        # (subscribers, partition count) -> topics: one range computation per class.
        classes: dict[tuple[tuple[int, ...], int], list[T]] = {}
        for topic in sort_keys(topic_groups):
            signature = tuple(topic_groups[topic])
            if signature not in by_signature:
                if len(signature) == 1:
                    by_signature[signature] = group_lists[signature[0]]
                else:
                    by_signature[signature] = sorted(
                        chain.from_iterable(group_lists[g] for g in signature),
                        key=rank.__getitem__,
                    )
            classes.setdefault((signature, partitions[topic]), []).append(topic)

        for (signature, count), topics_in_class in classes.items():
            subs = by_signature[signature]
            # A dict as the source of dict.fromkeys reuses its stored hashes, so topic keys
            # with a Python-level __hash__ (uuid.UUID) are hashed once per class, not once
            # per member and topic.
            keys = dict.fromkeys(topics_in_class)
            quota, extra = divmod(count, len(subs))
            start = 0
            for k in range(min(len(subs), count)):
                end = start + quota + (k < extra)
                chunk = frozenset(range(start, end))
                start = end
                target = out[subs[k]]
                if target:
                    target.update(dict.fromkeys(keys, chunk))
                else:
                    out[subs[k]] = dict.fromkeys(keys, chunk)
        return out
