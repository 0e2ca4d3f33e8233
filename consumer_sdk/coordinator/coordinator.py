"""``GroupCoordinator``: a sans-IO model of the broker side of KIP-848 consumer groups.

It answers ConsumerGroupHeartbeat (and validates OffsetCommit) the way Kafka's group
coordinator (``GroupMetadataManager``) does: request validation, group / assignment / member
epochs, target assignment through `consumer_sdk.assignors`, per-member reconciliation
(`reconcile`), session and rebalance timeouts, static membership, leaves, subscription and
topic metadata changes.

Nothing here reads a clock: every call takes ``now_ms``, and `GroupCoordinator.tick`
fires the timers that are due.
"""

from __future__ import annotations

import heapq
import logging
import re
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from consumer_sdk.assignors import AssignorError, Subscription, get_assignor
from consumer_sdk.coordinator.model import (
    INITIAL_GROUP_EPOCH,
    LEAVE_EPOCH,
    STATIC_LEAVE_EPOCH,
    CoordinatorConfig,
    CoordinatorEvent,
    EventKind,
    GroupDescription,
    GroupState,
    MemberDescription,
)
from consumer_sdk.coordinator.reconcile import (
    IdPartition,
    MemberAssignment,
    MemberAssignmentState,
    reconcile,
)
from consumer_sdk.coordinator.topics import TopicRegistry
from consumer_sdk.domain import HeartbeatRequest, HeartbeatResponse, TopicIdPartitions
from consumer_sdk.error_codes import ErrorCode

LOG = logging.getLogger("consumer_sdk.coordinator")

E = ErrorCode
MAS = MemberAssignmentState
_EMPTY: frozenset[IdPartition] = frozenset()


class _Reject(Exception):
    """An error response; the group is left unchanged."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(eq=False, slots=True)
class _Member:
    member_id: str
    instance_id: str | None
    rebalance_timeout_ms: int = 300_000
    rack_id: str | None = None
    names: frozenset[str] = frozenset()
    regex: str = ""
    assignor: str | None = None
    state: MemberAssignmentState = MAS.STABLE
    epoch: int = 0
    previous_epoch: int = 0
    assigned: frozenset[IdPartition] = _EMPTY
    pending: frozenset[IdPartition] = _EMPTY
    partition_epochs: dict[IdPartition, int] = field(default_factory=dict)
    session_deadline_ms: int = 0
    # The timer sequence number of the arm that set ``session_deadline_ms``, and of this
    # member's session entry in the timer heap (-1: none); see `GroupCoordinator.tick`.
    session_seq: int = 0
    session_timer_seq: int = -1
    rebalance_deadline_ms: int | None = None
    subscribed: frozenset[uuid.UUID] = frozenset()
    subscribed_version: int = -1
    subscription: Subscription[uuid.UUID] | None = None
    wire: tuple[TopicIdPartitions, ...] | None = None
    plain_response: HeartbeatResponse | None = None
    # The last plain heartbeat (identity fields only) answered without a change: the member
    # sends that very object again while its epoch holds (see `GroupCoordinator.heartbeat`).
    plain_request: HeartbeatRequest | None = None

    def view(self) -> MemberAssignment:
        return MemberAssignment(self.state, self.epoch, self.assigned, self.pending)


@dataclass(eq=False, slots=True)
class _Group:
    group_id: str
    group_epoch: int = INITIAL_GROUP_EPOCH
    assignment_epoch: int = INITIAL_GROUP_EPOCH
    last_assignment_ms: int | None = None
    members: dict[str, _Member] = field(default_factory=dict)
    static: dict[str, str] = field(default_factory=dict)
    holders: dict[IdPartition, str] = field(default_factory=dict)
    targets: dict[str, dict[uuid.UUID, frozenset[int]]] = field(default_factory=dict)
    # Per member: its target as a set of partitions, and the topics it has partitions of.
    target_sets: dict[str, tuple[frozenset[IdPartition], frozenset[uuid.UUID]]] = field(
        default_factory=dict
    )
    assignor: str = "uniform"
    metadata: tuple[tuple[str, int], ...] = ()
    unreconciled: set[str] = field(default_factory=set)
    state: GroupState = GroupState.EMPTY
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)


class GroupCoordinator:
    """The broker side of one or many consumer groups, driven with virtual time.

    ``topics`` seeds the `TopicRegistry` (name -> partition count). ``listener``
    receives `CoordinatorEvent` objects (joins, leaves, expiries, epoch bumps, target
    computations, group state changes).
    """

    def __init__(
        self,
        config: CoordinatorConfig | None = None,
        topics: Mapping[str, int] | None = None,
        *,
        listener: Callable[[CoordinatorEvent], None] | None = None,
    ) -> None:
        self.config = config if config is not None else CoordinatorConfig()
        self.topics = TopicRegistry(topics)
        self._groups: dict[str, _Group] = {}
        self._listener = listener
        self._timers: list[tuple[int, int, int, str, str]] = []
        self._timer_seq = 0
        self._injected: list[list[object]] = []
        self._loaded = True
        self._loading_until_ms = 0
        self._regex_cache: dict[str, tuple[int, frozenset[str]]] = {}
        self._now = 0
        self.heartbeats = 0
        # The plain-heartbeat shortcut (see `heartbeat`); the differential test turns it off
        # in the reference coordinator.
        self._shortcut = True

    # ------------------------------------------------------------------------------------------
    # Views
    # ------------------------------------------------------------------------------------------

    def group_ids(self) -> list[str]:
        return sorted(self._groups)

    def describe(self, group_id: str) -> GroupDescription:
        """ConsumerGroupDescribe: members with epochs, assigned, pending and target partitions."""
        group = self._groups.get(group_id)
        if group is None:
            return GroupDescription(group_id, GroupState.DEAD, -1, -1, "", ())
        members = tuple(
            self._describe_member(group, m)
            for m in sorted(group.members.values(), key=lambda m: m.member_id)
        )
        return GroupDescription(
            group_id,
            group.state,
            group.group_epoch,
            group.assignment_epoch,
            group.assignor,
            members,
        )

    def member(self, group_id: str, member_id: str) -> MemberDescription | None:
        """One member (O(1)), or None if the group or member is unknown."""
        group = self._groups.get(group_id)
        if group is None:
            return None
        m = group.members.get(member_id)
        return self._describe_member(group, m) if m is not None else None

    def member_epoch(self, group_id: str, member_id: str) -> int | None:
        """The member's epoch, or None if unknown (cheaper than `member`)."""
        group = self._groups.get(group_id)
        m = group.members.get(member_id) if group is not None else None
        return m.epoch if m is not None else None

    def member_holds(self, group_id: str, member_id: str) -> frozenset[IdPartition] | None:
        """Assigned plus pending-revocation partitions of a member, or None if unknown."""
        group = self._groups.get(group_id)
        m = group.members.get(member_id) if group is not None else None
        return (m.assigned | m.pending) if m is not None else None

    def holder(self, group_id: str, partition: IdPartition) -> str | None:
        """The member holding ``partition`` (assigned or pending revocation), if any."""
        group = self._groups.get(group_id)
        return group.holders.get(partition) if group is not None else None

    def group_state(self, group_id: str) -> GroupState:
        group = self._groups.get(group_id)
        return group.state if group is not None else GroupState.DEAD

    def group_epoch(self, group_id: str) -> int:
        group = self._groups.get(group_id)
        return group.group_epoch if group is not None else -1

    def assignment_epoch(self, group_id: str) -> int:
        group = self._groups.get(group_id)
        return group.assignment_epoch if group is not None else -1

    def committed(self, group_id: str) -> dict[tuple[str, int], int]:
        group = self._groups.get(group_id)
        return dict(group.offsets) if group is not None else {}

    def check_exclusive(self, group_id: str) -> list[str]:
        """Problems with the "one holder per partition" invariant (O(partitions held))."""
        group = self._groups.get(group_id)
        if group is None:
            return []
        problems = []
        seen: dict[IdPartition, str] = {}
        for m in group.members.values():
            for tp in m.assigned | m.pending:
                other = seen.get(tp)
                if other is not None:
                    problems.append(f"{tp} held by {other} and {m.member_id}")
                seen[tp] = m.member_id
                if group.holders.get(tp) != m.member_id:
                    problems.append(f"holder index of {tp} is {group.holders.get(tp)}")
        if len(seen) != len(group.holders):
            problems.append("holder index has stale entries")
        return problems

    # ------------------------------------------------------------------------------------------
    # Fault hooks
    # ------------------------------------------------------------------------------------------

    def inject_error(
        self, member_id: str | None, code: int, count: int = 1, message: str = "injected"
    ) -> None:
        """Answer the next ``count`` heartbeats of ``member_id`` (None: of anyone) with
        ``code``, without looking at them."""
        self._injected.append([member_id, int(code), count, message])

    def unload(self, now_ms: int) -> None:
        """The coordinator moves away: heartbeats get NOT_COORDINATOR until `load`."""
        self._now = now_ms
        self._loaded = False

    def load(self, now_ms: int, load_ms: int = 0) -> None:
        """A (new) coordinator loads the groups, kept as they were: COORDINATOR_LOAD_IN_PROGRESS
        for ``load_ms``, then session and rebalance timeouts restart from the load time."""
        self._now = now_ms
        self._loaded = True
        ready = now_ms + load_ms
        self._loading_until_ms = ready
        self._timers = []
        for group in self._groups.values():
            for m in group.members.values():
                m.session_timer_seq = -1
                self._arm_session(group, m, ready)
                if m.rebalance_deadline_ms is not None:
                    self._arm_rebalance(group, m, ready)

    @property
    def loaded(self) -> bool:
        return self._loaded

    # ------------------------------------------------------------------------------------------
    # Topics
    # ------------------------------------------------------------------------------------------

    def create_topic(self, now_ms: int, name: str, partitions: int) -> uuid.UUID:
        """Create a topic; groups subscribed to it (by name or regex) get a new epoch."""
        topic = self.topics.create(name, partitions)
        self._on_metadata_change(now_ms)
        return topic.topic_id

    def delete_topic(self, now_ms: int, name: str) -> None:
        self.topics.delete(name)
        self._on_metadata_change(now_ms)

    def add_partitions(self, now_ms: int, name: str, count: int) -> None:
        """Grow a topic by ``count`` partitions; subscribed groups get a new epoch."""
        self.topics.add_partitions(name, count)
        self._on_metadata_change(now_ms)

    def _on_metadata_change(self, now_ms: int) -> None:
        self._now = now_ms
        for group in self._groups.values():
            fingerprint = self._metadata_fingerprint(group)
            if fingerprint != group.metadata:
                group.metadata = fingerprint
                self._bump(group, "topic metadata changed")
            else:
                self._update_state(group)

    def _metadata_fingerprint(self, group: _Group) -> tuple[tuple[str, int], ...]:
        ids: set[uuid.UUID] = set()
        for m in group.members.values():
            ids |= self._subscribed(m)
        out = []
        for tid in ids:
            topic = self.topics.by_id(tid)
            if topic is not None:
                out.append((str(tid), topic.partitions))
        return tuple(sorted(out))

    # ------------------------------------------------------------------------------------------
    # Timers
    # ------------------------------------------------------------------------------------------

    def next_timer_ms(self) -> int | None:
        """When `tick` next has something to do (a deadline; may be stale), or None."""
        return self._timers[0][0] if self._timers else None

    def tick(self, now_ms: int) -> list[tuple[str, str, EventKind]]:
        """Fire due timers: expire sessions, fence members stuck revoking past their rebalance
        timeout. Returns ``(group_id, member_id, kind)`` for each member removed."""
        self._now = now_ms
        removed: list[tuple[str, str, EventKind]] = []
        if not self._loaded or now_ms < self._loading_until_ms:
            return removed
        timers = self._timers
        while timers and timers[0][0] <= now_ms:
            deadline, seq, kind, group_id, member_id = heapq.heappop(timers)
            group = self._groups.get(group_id)
            m = group.members.get(member_id) if group is not None else None
            if group is None or m is None:
                continue
            if kind == 0 and m.session_deadline_ms == deadline:
                LOG.info("[%s] member %s session expired", group_id, member_id)
                self._remove(group, m, EventKind.SESSION_EXPIRED, "session timeout")
                removed.append((group_id, member_id, EventKind.SESSION_EXPIRED))
            elif kind == 0 and seq == m.session_timer_seq:
                # The member's session entry, armed again since: it moves to the latest
                # deadline with the latest arm's sequence number, the very entry an eager
                # push per heartbeat would have left there (so timers fire in the same order).
                m.session_timer_seq = m.session_seq
                heapq.heappush(
                    timers, (m.session_deadline_ms, m.session_seq, 0, group_id, member_id)
                )
            elif kind == 1 and m.rebalance_deadline_ms == deadline:
                LOG.info(
                    "[%s] member %s fenced: still revoking at epoch %d after its rebalance timeout",
                    group_id,
                    member_id,
                    m.epoch,
                )
                self._remove(group, m, EventKind.REBALANCE_TIMEOUT, "rebalance timeout")
                removed.append((group_id, member_id, EventKind.REBALANCE_TIMEOUT))
        return removed

    def _push_timer(self, deadline: int, kind: int, group: _Group, member_id: str) -> None:
        self._timer_seq += 1
        heapq.heappush(self._timers, (deadline, self._timer_seq, kind, group.group_id, member_id))

    def _arm_session(self, group: _Group, m: _Member, now_ms: int) -> None:
        """Restart the member's session timeout. One heap entry per member: every heartbeat
        moves the deadline, and `tick` moves a due entry whose deadline has moved (instead of
        a push per heartbeat and a heap of stale entries)."""
        deadline = now_ms + self.config.session_timeout_ms
        self._timer_seq += 1
        m.session_seq = self._timer_seq
        if m.session_timer_seq >= 0 and deadline >= m.session_deadline_ms:
            m.session_deadline_ms = deadline
            return
        m.session_deadline_ms = deadline
        m.session_timer_seq = self._timer_seq
        heapq.heappush(self._timers, (deadline, self._timer_seq, 0, group.group_id, m.member_id))

    def _arm_rebalance(self, group: _Group, m: _Member, now_ms: int) -> None:
        m.rebalance_deadline_ms = now_ms + m.rebalance_timeout_ms
        self._push_timer(m.rebalance_deadline_ms, 1, group, m.member_id)

    # ------------------------------------------------------------------------------------------
    # ConsumerGroupHeartbeat
    # ------------------------------------------------------------------------------------------

    def heartbeat(self, now_ms: int, request: HeartbeatRequest) -> HeartbeatResponse:
        """Answer one ConsumerGroupHeartbeat at ``now_ms``."""
        self._now = now_ms
        self.heartbeats += 1
        # Most heartbeats are plain (identity fields only) from a member whose epoch is the
        # group's current one, with no fault on: validating such a request and updating the
        # member from it would find nothing to do (a member found by its member id exists, so
        # its ids were valid when it joined; a static member found so owns its instance id),
        # so it goes straight to reconciliation; and a stable member at the assignment epoch
        # only has its session restarted. The member sends again the very request object it
        # last sent while its epoch holds (requests are immutable), which is checked first.
        group = self._groups.get(request.group_id)
        if group is not None and self._shortcut:
            m = group.members.get(request.member_id)
            if (
                m is not None
                and m.epoch == request.member_epoch
                and group.group_epoch == group.assignment_epoch
                and self._loaded
                and not self._injected
                and now_ms >= self._loading_until_ms
                and (
                    request is m.plain_request
                    or (
                        request.member_epoch > 0
                        and request.topic_partitions is None
                        and request.rebalance_timeout_ms == -1
                        and request.subscribed_topic_names is None
                        and request.subscribed_topic_regex is None
                        and request.server_assignor is None
                        and request.rack_id is None
                        and request.instance_id == m.instance_id
                    )
                )
            ):
                if m.state is MAS.STABLE and m.epoch == group.assignment_epoch:
                    self._arm_session(group, m, now_ms)
                    m.plain_request = request
                    return self._plain_response(m)
                return self._reconcile(now_ms, request, group, m, None, False, None)
        try:
            if self._injected:
                self._maybe_injected(request)
            if not self._loaded:
                raise _Reject(E.NOT_COORDINATOR, "This is not the correct coordinator.")
            if now_ms < self._loading_until_ms:
                raise _Reject(E.COORDINATOR_LOAD_IN_PROGRESS, "The coordinator is loading.")
            self._validate(request)
            if request.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
                return self._leave(request)
            return self._heartbeat(now_ms, request)
        except _Reject as reject:
            return HeartbeatResponse(
                error_code=int(reject.code),
                member_epoch=-1,
                heartbeat_interval_ms=0,
                error_message=reject.message,
            )

    def _maybe_injected(self, request: HeartbeatRequest) -> None:
        for i, entry in enumerate(self._injected):
            member_id, code, count, message = entry
            if member_id is None or member_id == request.member_id:
                assert isinstance(count, int) and isinstance(code, int)
                if count <= 1:
                    del self._injected[i]
                else:
                    entry[2] = count - 1
                raise _Reject(code, str(message))

    def _validate(self, req: HeartbeatRequest) -> None:
        epoch = req.member_epoch
        if not req.group_id:
            raise _Reject(E.INVALID_REQUEST, "GroupId can't be empty.")
        if not req.member_id:
            raise _Reject(E.INVALID_REQUEST, "MemberId can't be empty.")
        if req.instance_id is not None and not req.instance_id:
            raise _Reject(E.INVALID_REQUEST, "InstanceId can't be empty.")
        if epoch < STATIC_LEAVE_EPOCH:
            raise _Reject(E.INVALID_REQUEST, f"MemberEpoch {epoch} is invalid.")
        if epoch == STATIC_LEAVE_EPOCH and req.instance_id is None:
            raise _Reject(E.INVALID_REQUEST, "InstanceId can't be null with MemberEpoch -2.")
        if epoch == 0:
            if req.rebalance_timeout_ms == -1:
                raise _Reject(E.INVALID_REQUEST, "RebalanceTimeoutMs must be provided on join.")
            if req.topic_partitions is None or req.topic_partitions:
                raise _Reject(E.INVALID_REQUEST, "TopicPartitions must be empty when joining.")
            if req.subscribed_topic_names is None and req.subscribed_topic_regex is None:
                raise _Reject(
                    E.INVALID_REQUEST,
                    "SubscribedTopicNames or SubscribedTopicRegex must be set on join.",
                )
        if req.server_assignor is not None and req.server_assignor not in self.config.assignors:
            raise _Reject(
                E.UNSUPPORTED_ASSIGNOR,
                f"ServerAssignor {req.server_assignor} is not supported. Supported assignors: "
                f"{', '.join(self.config.assignors)}.",
            )
        if req.subscribed_topic_regex:
            try:
                re.compile(req.subscribed_topic_regex)
            except re.error as exc:
                raise _Reject(
                    E.INVALID_REGULAR_EXPRESSION,
                    f"SubscribedTopicRegex `{req.subscribed_topic_regex}` is invalid: {exc}",
                ) from None

    def _leave(self, req: HeartbeatRequest) -> HeartbeatResponse:
        group = self._groups.get(req.group_id)
        if group is None:
            raise _Reject(E.GROUP_ID_NOT_FOUND, f"Group {req.group_id} not found.")
        if req.instance_id is None:
            m = group.members.get(req.member_id)
            if m is None:
                raise _Reject(E.UNKNOWN_MEMBER_ID, f"Member {req.member_id} is not in the group.")
            self._remove(group, m, EventKind.MEMBER_LEFT, "left the group")
        else:
            m = self._static_member(group, req.instance_id)
            if m.member_id != req.member_id:
                raise _Reject(
                    E.FENCED_INSTANCE_ID,
                    f"Instance {req.instance_id} is owned by member {m.member_id}.",
                )
            if req.member_epoch == STATIC_LEAVE_EPOCH:
                self._set_member(group, m, m.state, STATIC_LEAVE_EPOCH, m.assigned, _EMPTY)
                m.rebalance_deadline_ms = None
                self._emit(group, EventKind.STATIC_MEMBER_LEFT, m.member_id, "epoch -2")
                self._update_state(group)
            else:
                self._remove(group, m, EventKind.MEMBER_LEFT, "static member left for good")
        return HeartbeatResponse(
            error_code=0,
            member_epoch=req.member_epoch,
            heartbeat_interval_ms=0,
            member_id=req.member_id,
        )

    def _static_member(self, group: _Group, instance_id: str) -> _Member:
        member_id = group.static.get(instance_id)
        m = group.members.get(member_id) if member_id is not None else None
        if m is None:
            raise _Reject(E.UNKNOWN_MEMBER_ID, f"Instance id {instance_id} is unknown.")
        return m

    def _heartbeat(self, now_ms: int, req: HeartbeatRequest) -> HeartbeatResponse:
        epoch = req.member_epoch
        owned = _owned(req.topic_partitions)
        group = self._groups.get(req.group_id)
        if group is None and epoch != 0:
            raise _Reject(E.GROUP_ID_NOT_FOUND, f"Group {req.group_id} not found.")

        # 1. Find, create or replace the member (validation first: errors change nothing).
        existing = group.members.get(req.member_id) if group is not None else None
        replaced: _Member | None = None
        if req.instance_id is None:
            if existing is None and epoch != 0:
                raise _Reject(E.UNKNOWN_MEMBER_ID, f"Member {req.member_id} is not in the group.")
            if existing is not None and epoch != 0:
                _check_epoch(existing, epoch, owned)
        else:
            static_id = group.static.get(req.instance_id) if group is not None else None
            static = group.members.get(static_id) if group and static_id is not None else None
            if epoch == 0:
                if static is not None and static.epoch != STATIC_LEAVE_EPOCH:
                    if not (self.config.static_rejoin_in_place and static is existing):
                        raise _Reject(
                            E.UNRELEASED_INSTANCE_ID,
                            f"Static member {req.member_id} with instance id {req.instance_id} "
                            f"cannot join the group because the instance id is owned by "
                            f"{static.member_id}.",
                        )
                elif static is not None:
                    replaced = static
            else:
                if static is None:
                    raise _Reject(E.UNKNOWN_MEMBER_ID, f"Instance {req.instance_id} is unknown.")
                if static.member_id != req.member_id:
                    raise _Reject(
                        E.FENCED_INSTANCE_ID,
                        f"Instance {req.instance_id} is owned by member {static.member_id}.",
                    )
                _check_epoch(static, epoch, owned)
                existing = static
        if group is None:
            group = _Group(req.group_id, assignor=self.config.assignors[0])
            self._groups[req.group_id] = group
        if (
            existing is None
            and replaced is None
            and len(group.members) >= self.config.max_group_size
        ):
            raise _Reject(
                E.GROUP_MAX_SIZE_REACHED, "The consumer group has reached its maximum size."
            )

        created = False
        if replaced is not None:
            m = self._replace_static(group, replaced, req.member_id)
        elif existing is not None:
            m = existing
        else:
            m = _Member(req.member_id, req.instance_id)
            group.members[m.member_id] = m
            if req.instance_id is not None:
                group.static[req.instance_id] = m.member_id
            group.unreconciled.add(m.member_id)
            created = True
            self._emit(group, EventKind.MEMBER_JOINED, m.member_id)

        # 2. Update the member's fields; bump the group epoch if its subscription changed.
        changed = created
        if req.rebalance_timeout_ms != -1:
            m.rebalance_timeout_ms = req.rebalance_timeout_ms
        if req.rack_id is not None:
            m.rack_id = req.rack_id
        subscription_changed = False
        if req.subscribed_topic_names is not None:
            names = frozenset(req.subscribed_topic_names)
            if names != m.names:
                m.names = names
                subscription_changed = True
        if req.subscribed_topic_regex is not None and req.subscribed_topic_regex != m.regex:
            m.regex = req.subscribed_topic_regex
            subscription_changed = True
        if req.server_assignor is not None and req.server_assignor != m.assignor:
            m.assignor = req.server_assignor
            changed = True
        if subscription_changed:
            m.subscribed_version = -1
            m.subscription = None
        if subscription_changed or changed:
            self._bump(group, f"member {m.member_id} joined or changed its subscription")

        # 3. Recompute the target if the group epoch moved past it.
        if group.group_epoch > group.assignment_epoch:
            interval = self.config.assignment_interval_ms
            last = group.last_assignment_ms
            if last is None or interval == 0 or now_ms - last >= interval:
                self._compute_target(group, now_ms)

        return self._reconcile(now_ms, req, group, m, owned, subscription_changed, replaced)

    def _reconcile(
        self,
        now_ms: int,
        req: HeartbeatRequest,
        group: _Group,
        m: _Member,
        owned: frozenset[IdPartition] | None,
        subscription_changed: bool,
        replaced: _Member | None,
    ) -> HeartbeatResponse:
        """Steps 4 and 5 of a heartbeat: reconcile the member towards its target, restart its
        session and answer."""
        epoch = req.member_epoch
        # 4. Reconcile the member towards its target.
        before = m.assigned
        state = m.state
        if state is MAS.STABLE and m.epoch == group.assignment_epoch and not subscription_changed:
            pass
        elif (
            state is MAS.STABLE
            and not m.pending
            and not subscription_changed
            and self._shortcut
            and self._unchanged_target(group, m)
        ):
            # Most members across a rebalance: `reconcile` would move the member to the
            # assignment epoch with the partitions it has (nothing to revoke or add).
            m.previous_epoch = m.epoch
            m.epoch = group.assignment_epoch
            m.rebalance_deadline_ms = None
            group.unreconciled.discard(m.member_id)
            self._update_state(group)
        else:
            view = m.view()
            target, target_topics = self._target_entry(group, m.member_id)
            subscribed = self._subscribed(m)
            result = reconcile(
                view,
                target_epoch=group.assignment_epoch,
                target=target,
                owned=owned,
                subscribed=subscribed,
                held_by_other=_held_by_other(group.holders, m.member_id),
                target_subscribed=target_topics <= subscribed,
            )
            if result is not view and result != view:
                self._set_member(
                    group, m, result.state, result.epoch, result.assigned, result.pending_revocation
                )
                if result.state is MAS.UNREVOKED_PARTITIONS:
                    self._arm_rebalance(group, m, now_ms)
                else:
                    m.rebalance_deadline_ms = None
                self._update_state(group)
        self._arm_session(group, m, now_ms)

        full = (
            req.rebalance_timeout_ms != -1
            and (req.subscribed_topic_names is not None or req.subscribed_topic_regex is not None)
            and req.topic_partitions is not None
        )
        interval = self.config.heartbeat_interval_ms
        changed_assignment = m.assigned is not before and m.assigned != before
        if epoch == 0 or full or changed_assignment or replaced is not None:
            if m.wire is None:
                m.wire = _to_wire(m.assigned)
            return HeartbeatResponse(
                error_code=0,
                member_epoch=m.epoch,
                heartbeat_interval_ms=interval,
                member_id=m.member_id,
                assignment=m.wire,
            )
        if (
            epoch > 0
            and req.rebalance_timeout_ms == -1
            and req.rack_id is None
            and req.subscribed_topic_names is None
            and req.subscribed_topic_regex is None
            and req.server_assignor is None
            and req.topic_partitions is None
        ):
            m.plain_request = req
        return self._plain_response(m)

    def _unchanged_target(self, group: _Group, m: _Member) -> bool:
        """Whether the member's target (all of it subscribed) is what it is assigned."""
        target, topics = self._target_entry(group, m.member_id)
        return target == m.assigned and topics <= self._subscribed(m)

    def _plain_response(self, m: _Member) -> HeartbeatResponse:
        """No assignment to send: the answer of most heartbeats, reused (responses are
        immutable)."""
        interval = self.config.heartbeat_interval_ms
        plain = m.plain_response
        if (
            plain is None
            or plain.member_epoch != m.epoch
            or plain.heartbeat_interval_ms != interval
        ):
            plain = m.plain_response = HeartbeatResponse(
                error_code=0,
                member_epoch=m.epoch,
                heartbeat_interval_ms=interval,
                member_id=m.member_id,
            )
        return plain

    # ------------------------------------------------------------------------------------------
    # Group bookkeeping
    # ------------------------------------------------------------------------------------------

    def _replace_static(self, group: _Group, old: _Member, member_id: str) -> _Member:
        """A static member comes back (old one left with -2): the new id adopts its state."""
        for tp in old.assigned | old.pending:
            group.holders.pop(tp, None)
        del group.members[old.member_id]
        group.unreconciled.discard(old.member_id)
        m = _Member(
            member_id,
            old.instance_id,
            rebalance_timeout_ms=old.rebalance_timeout_ms,
            rack_id=old.rack_id,
            names=old.names,
            regex=old.regex,
            assignor=old.assignor,
            state=old.state,
            epoch=0,
            previous_epoch=0,
            assigned=old.assigned,
            pending=old.pending,
            partition_epochs=dict(old.partition_epochs),
        )
        for tp in m.assigned | m.pending:
            group.holders[tp] = member_id
        group.members[member_id] = m
        group.unreconciled.add(member_id)
        assert m.instance_id is not None
        group.static[m.instance_id] = member_id
        if old.member_id in group.targets:
            group.targets[member_id] = group.targets.pop(old.member_id)
        group.target_sets.pop(old.member_id, None)
        self._emit(group, EventKind.STATIC_MEMBER_REPLACED, member_id, f"replaces {old.member_id}")
        return m

    def _set_member(
        self,
        group: _Group,
        m: _Member,
        state: MemberAssignmentState,
        epoch: int,
        assigned: frozenset[IdPartition],
        pending: frozenset[IdPartition],
    ) -> None:
        holders = group.holders
        old_holds = m.assigned | m.pending
        new_holds = assigned | pending
        if old_holds != new_holds:
            member_id = m.member_id
            for tp in old_holds - new_holds:
                if holders.get(tp) == member_id:
                    del holders[tp]
            for tp in new_holds - old_holds:
                holder = holders.get(tp)
                if holder is not None and holder != member_id:  # pragma: no cover - invariant
                    raise AssertionError(f"{tp} given to {member_id} while {holder} holds it")
                holders[tp] = member_id
        if assigned != m.assigned:
            epochs = m.partition_epochs
            for tp in m.assigned - assigned:
                epochs.pop(tp, None)
            for tp in assigned - m.assigned:
                epochs[tp] = epoch
            m.wire = None
        if epoch != m.epoch:
            m.previous_epoch = m.epoch
        m.state = state
        m.epoch = epoch
        m.assigned = assigned
        m.pending = pending
        if state is MAS.STABLE and epoch == group.assignment_epoch:
            group.unreconciled.discard(m.member_id)
        else:
            group.unreconciled.add(m.member_id)

    def _remove(self, group: _Group, m: _Member, kind: EventKind, why: str) -> None:
        for tp in m.assigned | m.pending:
            if group.holders.get(tp) == m.member_id:
                del group.holders[tp]
        del group.members[m.member_id]
        group.unreconciled.discard(m.member_id)
        if m.instance_id is not None and group.static.get(m.instance_id) == m.member_id:
            del group.static[m.instance_id]
        group.targets.pop(m.member_id, None)
        group.target_sets.pop(m.member_id, None)
        m.rebalance_deadline_ms = None
        self._emit(group, kind, m.member_id, why)
        self._bump(group, f"member {m.member_id} removed ({why})")

    def _bump(self, group: _Group, why: str) -> None:
        group.group_epoch += 1
        LOG.debug("[%s] group epoch %d: %s", group.group_id, group.group_epoch, why)
        self._emit(group, EventKind.GROUP_EPOCH_BUMPED, None, why, group.group_epoch)
        self._update_state(group)

    def _update_state(self, group: _Group) -> None:
        if not group.members:
            state = GroupState.EMPTY
        elif group.group_epoch > group.assignment_epoch:
            state = GroupState.ASSIGNING
        elif group.unreconciled:
            state = GroupState.RECONCILING
        else:
            state = GroupState.STABLE
        if state is not group.state:
            old = group.state
            group.state = state
            self._emit(
                group, EventKind.GROUP_STATE_CHANGED, None, f"{old} -> {state}", group.group_epoch
            )

    def _emit(
        self,
        group: _Group,
        kind: EventKind,
        member_id: str | None,
        detail: str = "",
        epoch: int = -1,
    ) -> None:
        if self._listener is not None:
            self._listener(
                CoordinatorEvent(self._now, group.group_id, kind, member_id, detail, epoch)
            )

    # ------------------------------------------------------------------------------------------
    # Subscriptions and the target assignment
    # ------------------------------------------------------------------------------------------

    def _resolve_regex(self, regex: str) -> frozenset[str]:
        version = self.topics.version
        cached = self._regex_cache.get(regex)
        if cached is not None and cached[0] == version:
            return cached[1]
        pattern = re.compile(regex)
        names = frozenset(n for n in self.topics.names() if pattern.fullmatch(n))
        self._regex_cache[regex] = (version, names)
        return names

    def _subscribed(self, m: _Member) -> frozenset[uuid.UUID]:
        """Topic ids the member subscribes to (names that exist, plus the regex's matches)."""
        version = self.topics.version
        if m.subscribed_version == version:
            return m.subscribed
        names = m.names | self._resolve_regex(m.regex) if m.regex else m.names
        ids = frozenset(tid for tid in (self.topics.topic_id(n) for n in names) if tid is not None)
        if ids != m.subscribed:
            m.subscription = None
        m.subscribed = ids
        m.subscribed_version = version
        return ids

    def _subscription(self, m: _Member) -> Subscription[uuid.UUID]:
        topics = self._subscribed(m)
        if m.subscription is None:
            m.subscription = Subscription(topics, rack=m.rack_id, instance_id=m.instance_id)
        return m.subscription

    def _preferred_assignor(self, group: _Group) -> str:
        counts = Counter(m.assignor for m in group.members.values() if m.assignor is not None)
        if not counts:
            return self.config.assignors[0]
        best = max(counts.values())
        return min(name for name, n in counts.items() if n == best)

    def _compute_target(self, group: _Group, now_ms: int) -> None:
        name = self._preferred_assignor(group)
        members = {mid: self._subscription(m) for mid, m in group.members.items()}
        partitions: dict[uuid.UUID, int] = {}
        # Members mostly share a few subscriptions: each distinct topic set is walked once
        # (a frozenset caches its hash; a topic id's hash is Python code), in the same order.
        seen: set[frozenset[uuid.UUID]] = set()
        for sub in members.values():
            if sub.topics in seen:
                continue
            seen.add(sub.topics)
            for tid in sub.topics:
                if tid not in partitions:
                    topic = self.topics.by_id(tid)
                    if topic is not None:
                        partitions[tid] = topic.partitions
        try:
            targets = get_assignor(name).assign(members, partitions, group.targets)
        except AssignorError as exc:
            LOG.error("[%s] assignor %s failed: %s", group.group_id, name, exc)
            raise _Reject(
                E.UNKNOWN_SERVER_ERROR,
                f"Failed to compute a new target assignment for epoch {group.group_epoch}: {exc}",
            ) from None
        # A member's target set stays while its target does (most members' across a
        # rebalance): building it hashes every partition's topic id, which is Python code.
        previous, group.targets = group.targets, targets
        group.target_sets = {
            mid: entry
            for mid, entry in group.target_sets.items()
            if targets.get(mid) == previous.get(mid)
        }
        group.metadata = self._metadata_fingerprint(group)
        group.assignor = name
        group.assignment_epoch = group.group_epoch
        group.last_assignment_ms = now_ms
        unreconciled = group.unreconciled
        epoch = group.assignment_epoch
        for mid, m in group.members.items():
            if m.state is MAS.STABLE and m.epoch == epoch:
                unreconciled.discard(mid)
            else:
                unreconciled.add(mid)
        self._emit(group, EventKind.TARGET_COMPUTED, None, name, epoch)
        self._update_state(group)

    def _target(self, group: _Group, member_id: str) -> frozenset[IdPartition]:
        return self._target_entry(group, member_id)[0]

    def _target_entry(
        self, group: _Group, member_id: str
    ) -> tuple[frozenset[IdPartition], frozenset[uuid.UUID]]:
        """The member's target partitions, and the topics they belong to."""
        cached = group.target_sets.get(member_id)
        if cached is None:
            per_topic = group.targets.get(member_id, {})
            cached = (
                frozenset((tid, p) for tid, parts in per_topic.items() for p in parts),
                frozenset(tid for tid, parts in per_topic.items() if parts),
            )
            group.target_sets[member_id] = cached
        return cached

    def _describe_member(self, group: _Group, m: _Member) -> MemberDescription:
        return MemberDescription(
            member_id=m.member_id,
            instance_id=m.instance_id,
            rack_id=m.rack_id,
            member_epoch=m.epoch,
            previous_epoch=m.previous_epoch,
            state=m.state,
            subscribed_topic_names=m.names,
            subscribed_topic_regex=m.regex,
            server_assignor=m.assignor,
            assigned=m.assigned,
            pending_revocation=m.pending,
            target=self._target(group, m.member_id),
            session_deadline_ms=m.session_deadline_ms,
            rebalance_deadline_ms=m.rebalance_deadline_ms,
        )

    # ------------------------------------------------------------------------------------------
    # OffsetCommit
    # ------------------------------------------------------------------------------------------

    def offset_commit(
        self,
        now_ms: int,
        group_id: str,
        member_id: str,
        member_epoch: int,
        offsets: Mapping[tuple[str, int], int],
        *,
        instance_id: str | None = None,
        api_version: int = 9,
    ) -> dict[tuple[str, int], int]:
        """Validate and store an OffsetCommit (member epoch checks); an error code per partition."""
        self._now = now_ms
        result: dict[tuple[str, int], int] = {}

        def every(code: ErrorCode) -> dict[tuple[str, int], int]:
            return {tp: int(code) for tp in offsets}

        if not self._loaded:
            return every(E.NOT_COORDINATOR)
        if now_ms < self._loading_until_ms:
            return every(E.COORDINATOR_LOAD_IN_PROGRESS)
        group = self._groups.get(group_id)
        if group is None:
            if member_epoch >= 0:
                return every(E.GROUP_ID_NOT_FOUND)
            group = _Group(group_id, assignor=self.config.assignors[0])
            self._groups[group_id] = group
        m: _Member | None = None
        if member_epoch < 0 or not member_id:
            if group.members:
                return every(E.UNKNOWN_MEMBER_ID)
        else:
            m = group.members.get(member_id)
            if m is None:
                return every(E.UNKNOWN_MEMBER_ID)
            if api_version < 9:
                return every(E.UNSUPPORTED_VERSION)
            if instance_id is not None and m.instance_id != instance_id:
                return every(E.FENCED_INSTANCE_ID)
            if member_epoch > m.epoch:
                return every(E.STALE_MEMBER_EPOCH)
        for (topic, partition), offset in offsets.items():
            topic_id = self.topics.topic_id(topic)
            if topic_id is None:
                result[(topic, partition)] = int(E.UNKNOWN_TOPIC_OR_PARTITION)
                continue
            if m is not None and member_epoch < m.epoch:
                # KIP-1251: an older epoch is fine for partitions it already had then.
                since = m.partition_epochs.get((topic_id, partition))
                if since is None or since > member_epoch:
                    result[(topic, partition)] = int(E.STALE_MEMBER_EPOCH)
                    continue
            group.offsets[(topic, partition)] = offset
            result[(topic, partition)] = 0
        return result


def _owned(topics: tuple[TopicIdPartitions, ...] | None) -> frozenset[IdPartition] | None:
    if topics is None:
        return None
    return frozenset((t.topic_id, p) for t in topics for p in t.partitions)


def _to_wire(partitions: Iterable[IdPartition]) -> tuple[TopicIdPartitions, ...]:
    by_topic: dict[uuid.UUID, list[int]] = {}
    for tid, p in partitions:
        by_topic.setdefault(tid, []).append(p)
    return tuple(
        TopicIdPartitions(tid, tuple(sorted(parts)))
        for tid, parts in sorted(by_topic.items(), key=lambda kv: str(kv[0]))
    )


def _check_epoch(m: _Member, epoch: int, owned: frozenset[IdPartition] | None) -> None:
    """FENCED_MEMBER_EPOCH unless the epoch is current, or the previous one with owned ⊆
    assigned (the response that moved the member on was lost)."""
    if epoch > m.epoch:
        raise _Reject(
            E.FENCED_MEMBER_EPOCH,
            f"The member has a greater epoch ({epoch}) than the coordinator's ({m.epoch}).",
        )
    if epoch < m.epoch and not (
        epoch == m.previous_epoch and owned is not None and owned <= m.assigned
    ):
        raise _Reject(
            E.FENCED_MEMBER_EPOCH,
            f"The member has a smaller epoch ({epoch}) than the coordinator's ({m.epoch}).",
        )


def _held_by_other(
    holders: dict[IdPartition, str], member_id: str
) -> Callable[[IdPartition], bool]:
    get = holders.get

    def held(tp: IdPartition) -> bool:
        holder = get(tp)
        return holder is not None and holder != member_id

    return held
