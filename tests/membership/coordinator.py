"""A small scripted group coordinator for driving membership cores in tests.

It follows the group coordinator's server rules closely enough to check the client against them:
request validation, epochs (join 0, leave -1, static leave -2, lost-response tolerance),
a deterministic round-robin assignor, and the revoke-before-reassign rule — a partition is
only given to a member once no other member holds it (assigned or pending revocation), and a
member holding partitions to revoke keeps its epoch until it reports them gone.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field

from consumer_sdk.domain import HeartbeatRequest, HeartbeatResponse, TopicIdPartitions
from consumer_sdk.error_codes import ErrorCode

IdPartition = tuple[uuid.UUID, int]


class MockBrokerAbort(AssertionError):
    """The request would make librdkafka's mock broker abort the process."""


@dataclass
class ServerMember:
    member_id: str
    instance_id: str | None
    epoch: int = 0
    previous_epoch: int = -1
    names: tuple[str, ...] = ()
    regex: str = ""
    rebalance_timeout_ms: int = 300_000
    assigned: frozenset[IdPartition] = frozenset()
    pending_revocation: frozenset[IdPartition] = frozenset()
    revocation_deadline_ms: int | None = None
    last_heartbeat_ms: int = 0
    last_sent_assignment: frozenset[IdPartition] | None = None
    reported_owned: frozenset[IdPartition] = frozenset()

    def holds(self) -> frozenset[IdPartition]:
        return self.assigned | self.pending_revocation


@dataclass
class ScriptedCoordinator:
    """Answers ConsumerGroupHeartbeat requests for one group."""

    topics: dict[str, int]
    group_id: str = "group"
    heartbeat_interval_ms: int = 5000
    session_timeout_ms: int = 45_000
    group_epoch: int = 1
    assignment_epoch: int = 1
    members: dict[str, ServerMember] = field(default_factory=dict)
    targets: dict[str, frozenset[IdPartition]] = field(default_factory=dict)
    topic_ids: dict[str, uuid.UUID] = field(default_factory=dict)
    log: list[tuple[HeartbeatRequest, HeartbeatResponse]] = field(default_factory=list)

    def __post_init__(self) -> None:
        for i, name in enumerate(sorted(self.topics)):
            self.topic_ids.setdefault(name, uuid.UUID(int=i + 1))

    # -- views -------------------------------------------------------------------------------

    def metadata(self) -> dict[uuid.UUID, str]:
        return {tid: name for name, tid in self.topic_ids.items()}

    def name(self, topic_id: uuid.UUID) -> str:
        return self.metadata()[topic_id]

    def named(self, partitions: frozenset[IdPartition]) -> frozenset[tuple[str, int]]:
        names = self.metadata()
        return frozenset((names[t], p) for t, p in partitions)

    def holders(self, topic: str, partition: int) -> set[str]:
        key = (self.topic_ids[topic], partition)
        return {mid for mid, m in self.members.items() if key in m.holds()}

    def add_topic(self, name: str, partitions: int) -> uuid.UUID:
        self.topics[name] = partitions
        tid = uuid.UUID(int=len(self.topic_ids) + 1)
        self.topic_ids[name] = tid
        self.group_epoch += 1
        return tid

    # -- time --------------------------------------------------------------------------------

    def tick(self, now_ms: int) -> list[str]:
        """Expire sessions and rebalance timeouts; returns the removed member ids."""
        removed = []
        for mid, m in list(self.members.items()):
            if now_ms - m.last_heartbeat_ms >= self.session_timeout_ms or (
                m.revocation_deadline_ms is not None and now_ms >= m.revocation_deadline_ms
            ):
                self._remove(mid)
                removed.append(mid)
        return removed

    # -- heartbeat ---------------------------------------------------------------------------

    def heartbeat(self, now_ms: int, req: HeartbeatRequest) -> HeartbeatResponse:
        resp = self._heartbeat(now_ms, req)
        self.log.append((req, resp))
        return resp

    def _error(self, code: ErrorCode, message: str = "") -> HeartbeatResponse:
        return HeartbeatResponse(
            error_code=code, member_epoch=-1, heartbeat_interval_ms=0, error_message=message or None
        )

    def _heartbeat(self, now_ms: int, req: HeartbeatRequest) -> HeartbeatResponse:
        if (req.subscribed_topic_names is None) != (req.subscribed_topic_regex is None):
            raise MockBrokerAbort(f"names and regex must be sent together: {req}")
        if req.group_id != self.group_id:
            return self._error(ErrorCode.INVALID_REQUEST, "wrong group")
        if not req.member_id:
            return self._error(ErrorCode.INVALID_REQUEST, "MemberId can't be empty")
        epoch = req.member_epoch
        if epoch == -1:
            if req.member_id not in self.members:
                return self._error(ErrorCode.UNKNOWN_MEMBER_ID)
            self._remove(req.member_id)
            return HeartbeatResponse(
                0, member_epoch=-1, heartbeat_interval_ms=0, member_id=req.member_id
            )
        if epoch == -2:
            if req.instance_id is None:
                return self._error(ErrorCode.INVALID_REQUEST, "InstanceId required")
            member = self.members.get(req.member_id)
            if member is None:
                return self._error(ErrorCode.UNKNOWN_MEMBER_ID)
            member.epoch = -2
            member.pending_revocation = frozenset()
            member.revocation_deadline_ms = None
            return HeartbeatResponse(
                0, member_epoch=-2, heartbeat_interval_ms=0, member_id=req.member_id
            )
        if epoch == 0:
            if (
                req.rebalance_timeout_ms == -1
                or req.topic_partitions is None
                or req.topic_partitions != ()
                or (req.subscribed_topic_names is None and req.subscribed_topic_regex is None)
            ):
                return self._error(ErrorCode.INVALID_REQUEST, "incomplete join")
            member = self._join(req)
            if isinstance(member, HeartbeatResponse):
                return member
        else:
            member = self.members.get(req.member_id)
            if member is None:
                return self._error(ErrorCode.UNKNOWN_MEMBER_ID)
            if epoch > member.epoch:
                return self._error(ErrorCode.FENCED_MEMBER_EPOCH, "epoch ahead")
            if epoch < member.epoch:
                owned = _owned(req)
                if not (
                    epoch == member.previous_epoch
                    and owned is not None
                    and owned <= member.assigned
                ):
                    return self._error(ErrorCode.FENCED_MEMBER_EPOCH, "epoch behind")
        member.last_heartbeat_ms = now_ms
        full = (
            req.rebalance_timeout_ms != -1
            and req.subscribed_topic_names is not None
            and req.topic_partitions is not None
        )
        if req.rebalance_timeout_ms != -1:
            member.rebalance_timeout_ms = req.rebalance_timeout_ms
        if req.subscribed_topic_names is not None and req.subscribed_topic_regex is not None:
            new = (tuple(sorted(req.subscribed_topic_names)), req.subscribed_topic_regex)
            if new != (member.names, member.regex):
                member.names, member.regex = new
                self.group_epoch += 1
        owned = _owned(req)
        if owned is not None:
            member.reported_owned = owned
        if self.assignment_epoch < self.group_epoch:
            self._assign()
        self._reconcile(now_ms, member, owned)
        assignment = None
        if epoch == 0 or full or member.last_sent_assignment != member.assigned:
            assignment = _to_wire(member.assigned)
            member.last_sent_assignment = member.assigned
        return HeartbeatResponse(
            0,
            member_epoch=member.epoch,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
            member_id=member.member_id,
            assignment=assignment,
        )

    def _join(self, req: HeartbeatRequest) -> ServerMember | HeartbeatResponse:
        if req.instance_id is not None:
            for mid, other in list(self.members.items()):
                if other.instance_id != req.instance_id or mid == req.member_id:
                    continue
                if other.epoch != -2:
                    return self._error(ErrorCode.UNRELEASED_INSTANCE_ID)
                # The static member comes back: the new id takes over its assignment.
                del self.members[mid]
                member = ServerMember(req.member_id, req.instance_id, assigned=other.assigned)
                self.members[req.member_id] = member
                self.targets[req.member_id] = self.targets.pop(mid, frozenset())
                member.last_sent_assignment = None
                return member
        member = self.members.get(req.member_id)
        if member is None:
            member = ServerMember(req.member_id, req.instance_id)
            self.members[req.member_id] = member
            self.group_epoch += 1
        member.last_sent_assignment = None
        return member

    def _remove(self, member_id: str) -> None:
        if self.members.pop(member_id, None) is not None:
            self.targets.pop(member_id, None)
            self.group_epoch += 1

    def _subscribed(self, member: ServerMember, topic: str) -> bool:
        if member.regex:
            return re.fullmatch(member.regex, topic) is not None
        return topic in member.names

    def _assign(self) -> None:
        """Round-robin every partition over its subscribers (sorted, deterministic)."""
        ids = sorted(self.members)
        targets: dict[str, set[IdPartition]] = {mid: set() for mid in ids}
        turn = 0
        for topic in sorted(self.topics):
            subscribers = [mid for mid in ids if self._subscribed(self.members[mid], topic)]
            for partition in range(self.topics[topic]):
                if subscribers:
                    owner = subscribers[turn % len(subscribers)]
                    targets[owner].add((self.topic_ids[topic], partition))
                    turn += 1
        self.targets = {mid: frozenset(parts) for mid, parts in targets.items()}
        self.assignment_epoch = self.group_epoch

    def _reconcile(
        self, now_ms: int, member: ServerMember, owned: frozenset[IdPartition] | None
    ) -> None:
        if (
            member.pending_revocation
            and owned is not None
            and not owned & member.pending_revocation
        ):
            member.pending_revocation = frozenset()
            member.revocation_deadline_ms = None
        if member.pending_revocation:
            return  # UNREVOKED_PARTITIONS: epoch held until the revocation is acked
        target = self.targets.get(member.member_id, frozenset())
        kept = member.assigned & target
        revoke = member.assigned - target
        if revoke:
            member.assigned = kept
            member.pending_revocation = revoke
            member.revocation_deadline_ms = now_ms + member.rebalance_timeout_ms
            return
        others = frozenset().union(
            *(m.holds() for mid, m in self.members.items() if mid != member.member_id)
        )
        member.assigned = kept | frozenset(p for p in target - kept if p not in others)
        if member.epoch != self.assignment_epoch:
            member.previous_epoch = member.epoch
            member.epoch = self.assignment_epoch


def _owned(req: HeartbeatRequest) -> frozenset[IdPartition] | None:
    if req.topic_partitions is None:
        return None
    return frozenset((t.topic_id, p) for t in req.topic_partitions for p in t.partitions)


def _to_wire(partitions: frozenset[IdPartition]) -> tuple[TopicIdPartitions, ...]:
    by_topic: dict[uuid.UUID, list[int]] = {}
    for tid, p in partitions:
        by_topic.setdefault(tid, []).append(p)
    return tuple(TopicIdPartitions(tid, tuple(sorted(ps))) for tid, ps in sorted(by_topic.items()))
