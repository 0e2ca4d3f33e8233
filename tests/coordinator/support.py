"""A tiny scripted client for driving the coordinator model by hand."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field

from consumer_sdk.coordinator import GroupCoordinator
from consumer_sdk.domain import HeartbeatRequest, HeartbeatResponse, TopicIdPartitions

IdPartition = tuple[uuid.UUID, int]


def wire(partitions: Iterable[IdPartition]) -> tuple[TopicIdPartitions, ...]:
    by_topic: dict[uuid.UUID, list[int]] = {}
    for tid, p in partitions:
        by_topic.setdefault(tid, []).append(p)
    return tuple(TopicIdPartitions(t, tuple(sorted(ps))) for t, ps in sorted(by_topic.items()))


def parts(response: HeartbeatResponse) -> frozenset[IdPartition] | None:
    if response.assignment is None:
        return None
    return frozenset((t.topic_id, p) for t in response.assignment for p in t.partitions)


@dataclass
class Client:
    """Sends heartbeats for one member and remembers its epoch and last assignment."""

    coordinator: GroupCoordinator
    member_id: str
    topics: tuple[str, ...] = ("t",)
    regex: str | None = None
    instance_id: str | None = None
    group_id: str = "g"
    rebalance_timeout_ms: int = 60_000
    assignor: str | None = None
    epoch: int = 0
    assignment: frozenset[IdPartition] = field(default_factory=frozenset)
    last: HeartbeatResponse | None = None
    last_request_epoch: int = 0

    def join(self, now: int) -> HeartbeatResponse:
        self.epoch = 0
        return self.send(
            now,
            HeartbeatRequest(
                self.group_id,
                self.member_id,
                0,
                instance_id=self.instance_id,
                rebalance_timeout_ms=self.rebalance_timeout_ms,
                subscribed_topic_names=() if self.regex else self.topics,
                subscribed_topic_regex=self.regex if self.regex else "",
                server_assignor=self.assignor,
                topic_partitions=(),
            ),
        )

    def hb(
        self, now: int, owned: Iterable[IdPartition] | None = None, epoch: int | None = None
    ) -> HeartbeatResponse:
        """A delta heartbeat; ``owned`` acks (sends TopicPartitions)."""
        return self.send(
            now,
            HeartbeatRequest(
                self.group_id,
                self.member_id,
                self.epoch if epoch is None else epoch,
                instance_id=self.instance_id,
                topic_partitions=wire(owned) if owned is not None else None,
            ),
        )

    def ack(self, now: int) -> HeartbeatResponse:
        """Report the last assignment received as owned."""
        return self.hb(now, owned=self.assignment)

    def full(
        self, now: int, owned: Iterable[IdPartition], epoch: int | None = None
    ) -> HeartbeatResponse:
        return self.send(
            now,
            HeartbeatRequest(
                self.group_id,
                self.member_id,
                self.epoch if epoch is None else epoch,
                instance_id=self.instance_id,
                rebalance_timeout_ms=self.rebalance_timeout_ms,
                subscribed_topic_names=() if self.regex else self.topics,
                subscribed_topic_regex=self.regex if self.regex else "",
                topic_partitions=wire(owned),
            ),
        )

    def leave(self, now: int, epoch: int = -1) -> HeartbeatResponse:
        return self.send(
            now,
            HeartbeatRequest(self.group_id, self.member_id, epoch, instance_id=self.instance_id),
        )

    def send(self, now: int, request: HeartbeatRequest) -> HeartbeatResponse:
        self.last_request_epoch = request.member_epoch
        response = self.coordinator.heartbeat(now, request)
        self.last = response
        if response.error_code == 0 and response.member_epoch >= 0:
            self.epoch = response.member_epoch
            got = parts(response)
            if got is not None:
                self.assignment = got
        return response
