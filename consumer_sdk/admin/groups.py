"""List, describe and watch KIP-848 consumer groups of any client (``consumer-sdk groups``).

Built on ListGroups (with the ``consumer`` type filter), ConsumerGroupDescribe, OffsetFetch
and ListOffsets through `consumer_sdk.protocol.client.ClusterClient`, so it shows what
DescribeGroups-based tools cannot: each member's epoch, client id, host, rack, subscription,
and current against target assignment, with the committed offset, end offset and lag of
every partition.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from consumer_sdk.domain import OffsetFetchRequest
from consumer_sdk.protocol.client import ClusterClient

__all__ = [
    "GroupChange",
    "GroupView",
    "MemberView",
    "PartitionView",
    "changes",
    "describe_group",
    "list_groups",
    "watch",
]

Partition = tuple[str, int]


@dataclass(frozen=True)
class MemberView:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    rack_id: str | None
    member_epoch: int
    subscribed_topics: tuple[str, ...]
    subscribed_regex: str | None
    assignment: tuple[Partition, ...]
    target_assignment: tuple[Partition, ...]


@dataclass(frozen=True)
class PartitionView:
    topic: str
    partition: int
    #: Member id owning it now / in the target assignment (None: nobody).
    owner: str | None
    target_owner: str | None
    committed: int | None
    end_offset: int | None
    #: end offset minus committed offset (None while either is unknown).
    lag: int | None


@dataclass(frozen=True)
class GroupView:
    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    members: tuple[MemberView, ...]
    partitions: tuple[PartitionView, ...] = field(default=())

    @property
    def lag_total(self) -> int:
        return sum(p.lag for p in self.partitions if p.lag is not None)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["lag_total"] = self.lag_total
        return out


def list_groups(client: ClusterClient, types: list[str] | None = None) -> list[dict[str, str]]:
    """Groups of every broker, by id (``types``: ``["consumer"]`` by default, KIP-848)."""
    return client.list_groups(["consumer"] if types is None else types)


def _names(parts: dict[Any, tuple[int, ...]], names: dict[Any, str]) -> tuple[Partition, ...]:
    return tuple(
        sorted(
            (names.get(topic_id, str(topic_id)), p) for topic_id, ps in parts.items() for p in ps
        )
    )


def describe_group(client: ClusterClient, group_id: str, timeout_s: float = 10.0) -> GroupView:
    """One group: members (ConsumerGroupDescribe) and per partition owner, target owner,
    committed offset (OffsetFetch), end offset (ListOffsets, the high watermark) and lag."""
    raw = client.describe_group(group_id, timeout_s)
    client.metadata(None, timeout_s)
    names = client.topic_names()
    members = tuple(
        MemberView(
            member_id=m["member_id"],
            instance_id=m["instance_id"],
            client_id=m["client_id"],
            client_host=m["client_host"],
            rack_id=m["rack_id"],
            member_epoch=m["member_epoch"],
            subscribed_topics=tuple(m["subscribed_topic_names"]),
            subscribed_regex=m["subscribed_topic_regex"],
            assignment=_names(m["assignment"], names),
            target_assignment=_names(m["target_assignment"], names),
        )
        for m in sorted(raw["members"], key=lambda m: (m["client_id"], m["member_id"]))
    )
    owner = {p: m.member_id for m in members for p in m.assignment}
    target = {p: m.member_id for m in members for p in m.target_assignment}
    fetched = client.offset_fetch(
        OffsetFetchRequest(group_id, None, require_stable=False), timeout_s
    )
    committed = {
        (r.topic, r.partition): r.offset
        for r in fetched.partitions
        if r.error_code == 0 and r.offset >= 0
    }
    keys = sorted(set(owner) | set(target) | set(committed))
    ends = client.list_offsets(keys, timeout_s=timeout_s)
    partitions = []
    for key in keys:
        done, end = committed.get(key), ends.get(key)
        lag = max(end - done, 0) if done is not None and end is not None else None
        partitions.append(
            PartitionView(key[0], key[1], owner.get(key), target.get(key), done, end, lag)
        )
    return GroupView(
        group_id=raw["group_id"],
        state=raw["state"],
        group_epoch=raw["group_epoch"],
        assignment_epoch=raw["assignment_epoch"],
        assignor=raw["assignor"],
        members=members,
        partitions=tuple(partitions),
    )


@dataclass(frozen=True)
class GroupChange:
    """One change between two views of a group."""

    #: ``joined``, ``left``, ``epoch``, ``gained``, ``lost``, ``target``, ``state``.
    kind: str
    member_id: str | None
    client_id: str | None
    detail: str
    partitions: tuple[Partition, ...] = ()
    at: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def __str__(self) -> str:
        who = f"{self.client_id} {self.member_id}" if self.member_id else "group"
        return f"{who}: {self.kind} {self.detail}".rstrip()


def _fmt(parts: tuple[Partition, ...]) -> str:
    by_topic: dict[str, list[int]] = {}
    for t, p in parts:
        by_topic.setdefault(t, []).append(p)
    return " ".join(f"{t}[{','.join(map(str, ps))}]" for t, ps in sorted(by_topic.items())) or "-"


def changes(before: GroupView | None, after: GroupView, at: float = 0.0) -> list[GroupChange]:
    """What changed from ``before`` to ``after``: members joining and leaving, member epochs,
    partitions gained and lost (current assignment), target assignments, group state."""
    out: list[GroupChange] = []
    old = {m.member_id: m for m in before.members} if before is not None else {}
    new = {m.member_id: m for m in after.members}
    if before is None or before.state != after.state or before.group_epoch != after.group_epoch:
        out.append(
            GroupChange(
                "state",
                None,
                None,
                f"{after.state}, group epoch {after.group_epoch}, "
                f"assignment epoch {after.assignment_epoch}",
                at=at,
            )
        )
    for member_id in sorted(old.keys() - new.keys()):
        m = old[member_id]
        out.append(
            GroupChange("left", member_id, m.client_id, f"(had {_fmt(m.assignment)})", at=at)
        )
    for member_id, m in sorted(new.items()):
        prev = old.get(member_id)
        if prev is None:
            out.append(
                GroupChange(
                    "joined",
                    member_id,
                    m.client_id,
                    f"epoch {m.member_epoch} from {m.client_host}",
                    at=at,
                )
            )
            prev_assigned: set[Partition] = set()
            prev_target: tuple[Partition, ...] = ()
        else:
            if prev.member_epoch != m.member_epoch:
                out.append(
                    GroupChange(
                        "epoch",
                        member_id,
                        m.client_id,
                        f"{prev.member_epoch} -> {m.member_epoch}",
                        at=at,
                    )
                )
            prev_assigned = set(prev.assignment)
            prev_target = prev.target_assignment
        gained = tuple(sorted(set(m.assignment) - prev_assigned))
        lost = tuple(sorted(prev_assigned - set(m.assignment)))
        if gained:
            out.append(GroupChange("gained", member_id, m.client_id, _fmt(gained), gained, at))
        if lost:
            out.append(GroupChange("lost", member_id, m.client_id, _fmt(lost), lost, at))
        if m.target_assignment != prev_target and (prev is not None or m.target_assignment):
            out.append(
                GroupChange(
                    "target",
                    member_id,
                    m.client_id,
                    _fmt(m.target_assignment),
                    m.target_assignment,
                    at,
                )
            )
    return out


def watch(
    client: ClusterClient,
    group_id: str,
    interval_s: float = 0.5,
    *,
    timeout_s: float = 10.0,
    stop: Callable[[], bool] = lambda: False,
    clock: Callable[[], float] = time.time,
) -> Iterator[tuple[GroupView, list[GroupChange]]]:
    """Describe ``group_id`` every ``interval_s`` and yield each view with what changed
    since the previous one (the first view: everything, as joins), until ``stop()``."""
    before: GroupView | None = None
    while not stop():
        view = describe_group(client, group_id, timeout_s)
        found = changes(before, view, clock())
        if found or before is None:
            yield view, found
        before = view
        time.sleep(interval_s)
