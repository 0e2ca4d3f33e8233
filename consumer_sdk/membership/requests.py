"""Sans-IO request managers besides the heartbeat: coordinator discovery, metadata, commits,
and the one contract every request manager of a member follows.

The contract (`RequestManager`, Java's ``RequestManager.poll`` shape): the host calls
``poll(now_ms)`` and gets a `RequestPoll`, the requests to send now (`Outbound` values, in
order) and how long it may wait before polling again; it reports each request's outcome once,
as a value, with ``on_response`` or ``on_failure``. Nothing here does I/O or reads a clock.
The host of one member (`consumer_sdk.runtime.driver.MemberDriver`) polls its managers in a
fixed order and waits for the smallest of their waits. The managers below hold the policies
(the Java client's ``CoordinatorRequestManager``, ``CommitRequestManager``, ...) and take
the member's context as arguments (``poll(now_ms, needed)``, ...); the driver's request
managers bind each to one member and implement the contract over it.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from consumer_sdk.backoff import Backoff
from consumer_sdk.domain import (
    ClusterMetadata,
    Coordinator,
    OffsetCommitPartition,
    OffsetCommitRequest,
    PartitionResult,
)
from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.membership.heartbeat import Failure, FailureKind

__all__ = [
    "COMMIT_RETRIABLE",
    "TOPIC_GONE",
    "Api",
    "CommitKind",
    "CommitRequestManager",
    "CommitResult",
    "CoordinatorManager",
    "FindCoordinatorSend",
    "MetadataManager",
    "MetadataSend",
    "OffsetCommitSend",
    "Outbound",
    "RequestManager",
    "RequestPoll",
]

log = logging.getLogger("consumer_sdk.membership")

E = ErrorCode
Partition = tuple[str, int]

#: Errors after which a commit may be retried (the coordinator may also need rediscovery).
COMMIT_RETRIABLE = frozenset(
    {
        E.UNKNOWN_TOPIC_OR_PARTITION,
        E.LEADER_NOT_AVAILABLE,
        E.NOT_LEADER_OR_FOLLOWER,
        E.REQUEST_TIMED_OUT,
        E.NETWORK_EXCEPTION,
        E.COORDINATOR_LOAD_IN_PROGRESS,
        E.COORDINATOR_NOT_AVAILABLE,
        E.NOT_COORDINATOR,
        E.UNSTABLE_OFFSET_COMMIT,
        E.UNKNOWN_TOPIC_ID,
        E.UNKNOWN_LEADER_EPOCH,
        E.FENCED_LEADER_EPOCH,
    }
)
_REDISCOVER = frozenset({E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE, E.REQUEST_TIMED_OUT})
#: Partition errors that say the topic no longer exists. For a partition the member is
#: releasing (the broker took it out of the assignment) they are not retried: the topic was
#: deleted, and retrying would hold the revocation until the commit's deadline.
TOPIC_GONE = frozenset({E.UNKNOWN_TOPIC_OR_PARTITION, E.UNKNOWN_TOPIC_ID})
# An episode of retriable failures is logged at INFO when it starts and once at WARNING if it
# lasts this many attempts (a coordinator still loading is normal for a few hundred ms).
_WARN_AFTER = 5


# --------------------------------------------------------------------------------------------
# The request-manager contract
# --------------------------------------------------------------------------------------------


class Api(enum.Enum):
    """The requests a member sends."""

    HEARTBEAT = "ConsumerGroupHeartbeat"
    FIND_COORDINATOR = "FindCoordinator"
    METADATA = "Metadata"
    OFFSET_COMMIT = "OffsetCommit"
    OFFSET_FETCH = "OffsetFetch"
    #: DescribeConfigs of the group's session timeout (payload: the group id)
    GROUP_SESSION_TIMEOUT = "DescribeConfigs"


@dataclass(frozen=True, slots=True, eq=False)
class Outbound:
    """One request for the transport. ``coordinator``: send it to the group coordinator at
    that address; None: to any broker (the transport picks a bootstrap server). ``payload``
    by `api`: the `HeartbeatRequest`, the group id (FindCoordinator), the topics or None for
    all (Metadata), the `OffsetCommitRequest`, the `OffsetFetchRequest`. ``tag``: the commit
    or fetch id the outcome belongs to."""

    api: Api
    payload: Any
    coordinator: Coordinator | None
    timeout_ms: int
    tag: int = 0


#: What `RequestManager.poll` returns: ``(requests to send now, in order; ms until the
#: manager wants to be polled again)``. A plain tuple: it is built on every run.
RequestPoll = tuple[tuple[Outbound, ...], int]


class RequestManager(Protocol):
    """One kind of a member's requests, sans I/O (see the module docstring)."""

    def poll(self, now_ms: int) -> RequestPoll:
        """The requests to send now and the ms until the next poll is due."""
        ...

    def on_response(self, now_ms: int, request: Outbound, response: Any) -> None:
        """``request`` (one this manager returned) was answered with ``response``."""
        ...

    def on_failure(self, now_ms: int, request: Outbound, failure: Failure) -> None:
        """``request`` got no answer (``failure``: the host's error boundary's value)."""
        ...


def _failure_code(failure: Failure) -> int:
    if failure.kind is FailureKind.TIMEOUT:
        return int(E.REQUEST_TIMED_OUT)
    if failure.kind is FailureKind.DISCONNECTED:
        return int(E.NETWORK_EXCEPTION)
    if failure.kind is FailureKind.UNSUPPORTED_VERSION_CLIENT:
        return int(E.UNSUPPORTED_VERSION)
    if failure.kind is FailureKind.AUTHENTICATION:
        return int(E.SASL_AUTHENTICATION_FAILED)
    return int(E.UNKNOWN_SERVER_ERROR)


class _Episode:
    """Retries with backoff; logs an episode once when it starts and once if it persists."""

    __slots__ = ("_backoff", "_what", "failures", "retry_at_ms")

    def __init__(self, what: str, backoff: Backoff) -> None:
        self._what = what
        self._backoff = backoff
        self.failures = 0
        self.retry_at_ms = 0

    def failed(self, now_ms: int, reason: str) -> int:
        delay = self._backoff.backoff_ms(self.failures)
        self.failures += 1
        self.retry_at_ms = now_ms + delay
        if self.failures == 1:
            log.info("%s failed (%s); retrying in %d ms", self._what, reason, delay)
        elif self.failures == _WARN_AFTER:
            log.warning(
                "%s still failing after %d attempts (%s); retrying with backoff",
                self._what,
                self.failures,
                reason,
            )
        else:
            log.debug("%s failed (%s); retrying in %d ms", self._what, reason, delay)
        return delay

    def succeeded(self) -> None:
        if self.failures:
            log.info("%s succeeded after %d failed attempts", self._what, self.failures)
        self.failures = 0
        self.retry_at_ms = 0

    def paced(self, now_ms: int) -> None:
        """After a success: the next attempt waits one backoff step (retry.backoff.ms)."""
        self.retry_at_ms = now_ms + self._backoff.backoff_ms(0)

    def remaining(self, now_ms: int) -> int:
        return max(0, self.retry_at_ms - now_ms)


# --------------------------------------------------------------------------------------------
# Coordinator discovery
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FindCoordinatorSend:
    """Send FindCoordinator (key type GROUP) for ``group_id`` to any broker."""

    group_id: str


class CoordinatorManager:
    """Finds the group coordinator: one FindCoordinator at a time, only while it is unknown
    and wanted, with exponential backoff and jitter between failed attempts and, as the Java
    client's ``CoordinatorRequestManager``, one backoff step (retry.backoff.ms) after an
    answer: a coordinator refusing heartbeats with NOT_COORDINATOR while it takes the group
    over is asked again at that pace, not at once."""

    __slots__ = ("_episode", "_in_flight", "coordinator", "group_id", "last_error")

    def __init__(self, group_id: str, backoff: Backoff) -> None:
        self.group_id = group_id
        self.coordinator: Coordinator | None = None
        self._in_flight = False
        self._episode = _Episode(f"FindCoordinator for group {group_id!r}", backoff)
        self.last_error: tuple[int, str] | None = None

    @property
    def in_flight(self) -> bool:
        return self._in_flight

    @property
    def failures(self) -> int:
        """Failed attempts in the current episode (0 once the coordinator is found)."""
        return self._episode.failures

    def poll(self, now_ms: int, needed: bool) -> FindCoordinatorSend | None:
        if self.coordinator is not None or not needed or self._in_flight:
            return None
        if self._episode.remaining(now_ms) > 0:
            return None
        self._in_flight = True
        return FindCoordinatorSend(self.group_id)

    def time_until_next_poll(self, now_ms: int, needed: bool, idle_ms: int) -> int:
        if self.coordinator is not None or not needed or self._in_flight:
            return idle_ms
        return self._episode.remaining(now_ms)

    def on_response(self, now_ms: int, coordinator: Coordinator) -> tuple[int, str] | None:
        """Apply the answer; return ``(code, message)`` for an error the application must
        hear about (authorization), else None. Every error is retried with backoff."""
        self._in_flight = False
        if coordinator.error_code == E.NONE:
            self._episode.succeeded()
            self._episode.paced(now_ms)
            self.coordinator = coordinator
            self.last_error = None
            return None
        name = E.name_of(coordinator.error_code)
        detail = f"{name}: {coordinator.error_message}" if coordinator.error_message else name
        self._episode.failed(now_ms, detail)
        self.last_error = (coordinator.error_code, detail)
        if coordinator.error_code == E.GROUP_AUTHORIZATION_FAILED:
            return (
                coordinator.error_code,
                f"FindCoordinator for group {self.group_id!r}: {detail}",
            )
        return None

    def on_failure(self, now_ms: int, failure: Failure) -> tuple[int, str] | None:
        """No answer; authentication and TLS failures are returned for the application."""
        self._in_flight = False
        self._episode.failed(now_ms, f"{failure.kind.value}: {failure.message}")
        code = _failure_code(failure)
        self.last_error = (code, failure.message)
        if failure.kind is FailureKind.AUTHENTICATION:
            return (code, f"cannot connect to the cluster: {failure.message}")
        return None

    def adopt(self, coordinator: Coordinator) -> None:
        """Take a coordinator another member of the same group just found (no request)."""
        if not self._in_flight and coordinator.error_code == E.NONE:
            self._episode.succeeded()
            self.coordinator = coordinator
            self.last_error = None

    def mark_unknown(self, reason: str) -> None:
        if self.coordinator is not None:
            log.info(
                "group %s: coordinator %d marked unknown: %s",
                self.group_id,
                self.coordinator.node_id,
                reason,
            )
        self.coordinator = None


# --------------------------------------------------------------------------------------------
# Metadata
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MetadataSend:
    """Send Metadata for ``topics`` (None: every topic) to any broker."""

    topics: tuple[str, ...] | None


class MetadataManager:
    """Topic id -> name view for the membership: fetches metadata when asked, one request at a
    time, with backoff after failures. Requests made while one is in flight are merged."""

    __slots__ = ("_episode", "_in_flight", "_want_any", "_wanted", "topic_names", "version")

    def __init__(self, backoff: Backoff) -> None:
        self._wanted: set[str] | None = set()  # None: everything
        self._want_any = False
        self._in_flight: MetadataSend | None = None
        self._episode = _Episode("Metadata request", backoff)
        self.topic_names: dict[uuid.UUID, str] = {}
        self.version = 0  # bumped whenever topic_names changes

    def request(self, topics: Iterable[str] | None) -> None:
        """Ask for ``topics`` (None: the whole cluster) on the next poll."""
        if topics is None:
            self._wanted = None
        elif self._wanted is not None:
            self._wanted.update(topics)
        self._want_any = True

    @property
    def pending(self) -> bool:
        return self._want_any or self._in_flight is not None

    def poll(self, now_ms: int) -> MetadataSend | None:
        if not self._want_any or self._in_flight is not None:
            return None
        if self._episode.remaining(now_ms) > 0:
            return None
        send = MetadataSend(None if self._wanted is None else tuple(sorted(self._wanted)))
        self._wanted, self._want_any = set(), False
        self._in_flight = send
        return send

    def time_until_next_poll(self, now_ms: int, idle_ms: int) -> int:
        if not self._want_any or self._in_flight is not None:
            return idle_ms
        return self._episode.remaining(now_ms)

    def on_response(self, now_ms: int, metadata: ClusterMetadata) -> None:
        self._in_flight = None
        self._episode.succeeded()
        changed = False
        for t in metadata.topics:
            known = t.error_code == E.NONE and t.topic_id.int != 0
            if known and self.topic_names.get(t.topic_id) != t.name:
                self.topic_names[t.topic_id] = t.name
                changed = True
        if changed:
            self.version += 1

    def on_failure(self, now_ms: int, failure: Failure) -> None:
        sent, self._in_flight = self._in_flight, None
        self._episode.failed(now_ms, f"{failure.kind.value}: {failure.message}")
        if sent is not None:  # ask again for what the failed request carried
            self.request(None if sent.topics is None else sent.topics)


# --------------------------------------------------------------------------------------------
# Commits
# --------------------------------------------------------------------------------------------


class OffsetLike(Protocol):
    @property
    def offset(self) -> int: ...

    @property
    def leader_epoch(self) -> int: ...

    @property
    def metadata(self) -> str | None: ...


class CommitKind(enum.Enum):
    """Who asked, which sets the retry policy (see each value)."""

    SYNC = "SYNC"  # commit(asynchronous=False): retries retriable errors until its deadline
    ASYNC = "ASYNC"  # commit(): never retries a rejected request
    AUTO = "AUTO"  # enable.auto.commit: one in flight, never retried, failures logged
    REBALANCE = "REBALANCE"  # before revoking/leaving: like SYNC, and STALE_MEMBER_EPOCH retries


@dataclass(frozen=True, slots=True)
class CommitResult:
    """A finished commit: what was committed, and the error if any partition failed."""

    commit_id: int
    kind: CommitKind
    committed: Mapping[Partition, int]
    error_code: int = 0
    #: ``"commit failed: <ERROR NAME>: <detail>"`` (empty when it succeeded).
    error_message: str = ""
    #: Partitions being released whose topic is gone (error code per partition): not
    #: committed and not retried.
    dropped: Mapping[Partition, int] = field(default_factory=dict)
    #: What failed, without the prefix: e.g. ``"t[0]=STALE_MEMBER_EPOCH"``.
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.error_code == 0


@dataclass(frozen=True, slots=True)
class OffsetCommitSend:
    """Send ``request`` to the group coordinator and report the outcome with ``commit_id``."""

    commit_id: int
    request: OffsetCommitRequest


@dataclass(slots=True)
class _Pending:
    commit_id: int
    kind: CommitKind
    offsets: dict[Partition, OffsetLike]
    deadline_ms: int
    committed: dict[Partition, int] = field(default_factory=dict)
    attempts: int = 0
    retry_at_ms: int = 0
    in_flight: bool = False
    epoch: int = -1  # the member epoch when the commit was made (used once the member left)
    releasing: frozenset[Partition] = frozenset()
    dropped: dict[Partition, int] = field(default_factory=dict)
    sent_epoch: int = -1  # the member epoch the last attempt carried
    # A SYNC commit refused with STALE_MEMBER_EPOCH at this epoch: it goes out again only
    # under a newer epoch and only while every partition in it is still owned, else fails.
    refused_epoch: int | None = None
    refused_at_ms: int = 0
    refused_detail: str = ""


class CommitRequestManager:
    """Queues OffsetCommits and applies the reference client's retry policy.

    Offsets carry the member id and epoch read at send time (-1 outside the group). A commit
    below what this member already committed for a partition is skipped, so committed offsets
    never go backwards through this member.
    """

    __slots__ = (
        "_auto_interval",
        "_backoff",
        "_completed",
        "_default_timeout",
        "_last_committed",
        "_next_auto_ms",
        "_next_id",
        "_queue",
        "group_id",
        "instance_id",
        "queue",
    )

    def __init__(
        self,
        group_id: str,
        instance_id: str | None,
        backoff: Backoff,
        *,
        auto_commit_interval_ms: int = 0,
        default_timeout_ms: int = 60_000,
    ) -> None:
        self.group_id = group_id
        self.instance_id = instance_id
        self._backoff = backoff
        self._auto_interval = auto_commit_interval_ms
        self._default_timeout = default_timeout_ms
        self._queue: list[_Pending] = []
        #: The same list, read-only: empty when no commit is queued or in flight (a host's
        #: per-heartbeat test, without `pending`'s call).
        self.queue: Sequence[object] = self._queue
        self._completed: list[CommitResult] = []
        self._last_committed: dict[Partition, int] = {}
        self._next_id = 1
        self._next_auto_ms: int | None = None

    # -- queueing ------------------------------------------------------------------------

    def commit(
        self,
        now_ms: int,
        offsets: Mapping[Partition, OffsetLike],
        kind: CommitKind,
        timeout_ms: int | None = None,
        epoch: int = -1,
        releasing: Iterable[Partition] = (),
        commit_id: int | None = None,
    ) -> int:
        """Queue a commit; returns its id (its `CommitResult` carries the same id): the host's
        ``commit_id`` if given (the host then gives every commit one, unique), else the next.

        ``epoch`` is the member epoch the commit was made under: it is sent with the epoch
        current at send time, or with ``epoch`` if the member has left the group since (an
        asynchronous commit made in the revoke callback of a close that ends up sent after
        the leave heartbeat still carries the epoch the offsets were consumed under).
        ``releasing``: partitions the member is giving up; a `TOPIC_GONE` error for one of
        them drops it from the commit (`CommitResult.dropped`) instead of retrying it."""
        if commit_id is None:
            commit_id = self._next_id
            self._next_id += 1
        todo = {
            p: o
            for p, o in offsets.items()
            if o.offset >= 0 and o.offset > self._last_committed.get(p, -1)
        }
        deadline = now_ms + (self._default_timeout if timeout_ms is None else max(timeout_ms, 0))
        pending = _Pending(
            commit_id, kind, todo, deadline, epoch=epoch, releasing=frozenset(releasing)
        )
        if not todo:
            self._completed.append(CommitResult(commit_id, kind, {}))
        else:
            self._queue.append(pending)
        if kind is CommitKind.AUTO:
            self._next_auto_ms = now_ms + self._auto_interval
        return commit_id

    def auto_commit_due(self, now_ms: int) -> bool:
        """Whether the host should queue an auto-commit now (interval elapsed, none pending)."""
        if self._auto_interval <= 0:
            return False
        if self._next_auto_ms is None:
            self._next_auto_ms = now_ms + self._auto_interval
            return False
        if now_ms < self._next_auto_ms:
            return False
        if any(p.kind is CommitKind.AUTO for p in self._queue):
            self._next_auto_ms = now_ms + self._auto_interval
            return False
        return True

    def skip_auto_commit(self, now_ms: int) -> None:
        """Nothing to auto-commit now (e.g. not in the group): wait for the next interval."""
        self._next_auto_ms = now_ms + self._auto_interval

    def forget(self, partitions: Iterable[Partition]) -> None:
        """Drop the no-regression memory of partitions this member no longer owns."""
        for p in partitions:
            self._last_committed.pop(p, None)

    def last_committed(self) -> dict[Partition, int]:
        return dict(self._last_committed)

    def observe_committed(self, offsets: Mapping[Partition, int]) -> None:
        """Offsets the group is known to have committed (an OffsetFetch answer): later
        commits below them are skipped."""
        for p, offset in offsets.items():
            if offset > self._last_committed.get(p, -1):
                self._last_committed[p] = offset

    @property
    def pending(self) -> int:
        """Commits queued or in flight."""
        return len(self._queue)

    @property
    def coordinator_needed(self) -> bool:
        return bool(self._queue)

    @property
    def awaiting_epoch(self) -> bool:
        """A commit refused as stale waits for a newer member epoch (any heartbeat answer
        should run the host)."""
        queue = self._queue
        return bool(queue) and any(p.refused_epoch is not None for p in queue)

    def drain_completed(self) -> list[CommitResult]:
        out, self._completed = self._completed, []
        return out

    # -- network side --------------------------------------------------------------------

    def poll(
        self,
        now_ms: int,
        member_id: str,
        member_epoch: int,
        coordinator_known: bool,
        *,
        owned: Callable[[], Collection[Partition]] | None = None,
        epoch_wait_ms: int = 0,
    ) -> list[OffsetCommitSend]:
        """The commits to send now. ``owned``: the partitions the member holds and is not
        revoking (asked only for a refused commit, see `_Pending.refused_epoch`);
        ``epoch_wait_ms``: how long such a commit waits for a newer epoch before it fails."""
        self._expire(now_ms)
        if not coordinator_known:
            return []
        sends = []
        for p in list(self._queue):
            if p.in_flight or now_ms < p.retry_at_ms:
                continue
            if p.refused_epoch is not None and not self._retry_refused(
                p, now_ms, member_epoch, owned, epoch_wait_ms
            ):
                continue
            epoch = member_epoch if member_epoch > 0 else (p.epoch if p.epoch > 0 else -1)
            p.sent_epoch = epoch
            p.in_flight = True
            p.attempts += 1
            request = OffsetCommitRequest(
                group_id=self.group_id,
                member_id=member_id,
                member_epoch=epoch,
                instance_id=self.instance_id,
                offsets=tuple(
                    OffsetCommitPartition(t, n, o.offset, o.leader_epoch, o.metadata)
                    for (t, n), o in sorted(p.offsets.items())
                ),
            )
            sends.append(OffsetCommitSend(p.commit_id, request))
        return sends

    def time_until_next_poll(self, now_ms: int, coordinator_known: bool, idle_ms: int) -> int:
        wait = idle_ms
        if self._auto_interval > 0 and self._next_auto_ms is not None:
            wait = min(wait, max(0, self._next_auto_ms - now_ms))
        for p in self._queue:
            wait = min(wait, max(0, p.deadline_ms - now_ms))
            if p.refused_epoch is not None:  # waits for a newer epoch: a heartbeat answer
                continue
            if not p.in_flight and coordinator_known:
                wait = min(wait, max(0, p.retry_at_ms - now_ms))
        return wait

    def _retry_refused(
        self,
        p: _Pending,
        now_ms: int,
        member_epoch: int,
        owned: Callable[[], Collection[Partition]] | None,
        epoch_wait_ms: int,
    ) -> bool:
        """Whether a commit refused as stale goes out again now; fails it where it cannot.

        The broker refused the epoch because it has given the member a newer one (a new
        assignment on its way). Under that epoch the same offsets are still this member's to
        commit as long as it holds every partition and is not revoking any: a revocation is
        acknowledged only after it, so no other member can own them yet. Nothing of that
        holds once a partition is being given up, so such a commit fails, as it would at
        once in the Java client."""
        assert p.refused_epoch is not None
        if member_epoch <= p.refused_epoch:
            if now_ms - p.refused_at_ms < epoch_wait_ms:
                return False  # the heartbeat answer that brings the newer epoch runs us again
            self._finish(
                p,
                int(E.STALE_MEMBER_EPOCH),
                f"{p.refused_detail} (no newer member epoch came within {epoch_wait_ms} ms)",
            )
            return False
        held = owned() if owned is not None else ()
        if not all(key in held for key in p.offsets):
            self._finish(
                p,
                int(E.STALE_MEMBER_EPOCH),
                f"{p.refused_detail} (not retried: a partition is no longer this member's)",
            )
            return False
        log.debug(
            "group %s: commit %d refused at epoch %d; retrying at epoch %d",
            self.group_id,
            p.commit_id,
            p.refused_epoch,
            member_epoch,
        )
        p.refused_epoch = None
        return True

    def _find(self, commit_id: int) -> _Pending | None:
        for p in self._queue:
            if p.commit_id == commit_id:
                return p
        return None

    def on_response(self, now_ms: int, commit_id: int, results: Iterable[PartitionResult]) -> bool:
        """Apply an OffsetCommit response; True if the coordinator must be rediscovered."""
        p = self._find(commit_id)
        if p is None:
            return False
        p.in_flight = False
        failed: list[PartitionResult] = []
        for r in results:
            key = (r.topic, r.partition)
            if key not in p.offsets:
                continue
            if r.error_code == E.NONE:
                offset = p.offsets.pop(key).offset
                p.committed[key] = offset
                if offset > self._last_committed.get(key, -1):
                    self._last_committed[key] = offset
            elif r.error_code in TOPIC_GONE and key in p.releasing:
                del p.offsets[key]
                p.dropped[key] = r.error_code
            else:
                failed.append(r)
        rediscover = any(r.error_code in _REDISCOVER for r in failed)
        if not failed and not p.offsets:
            if p.dropped:
                code = next(iter(p.dropped.values()))
                gone = ", ".join(f"{t}[{n}]" for t, n in sorted(p.dropped))
                self._finish(p, code, f"{gone}: the topic no longer exists; not retried")
            else:
                self._finish(p, 0, "")
            return rediscover
        if not failed:  # the broker left partitions out of its answer
            self._finish(p, int(E.UNKNOWN_SERVER_ERROR), "partitions missing from the response")
            return rediscover
        code = failed[0].error_code
        detail = ", ".join(f"{r.topic}[{r.partition}]={E.name_of(r.error_code)}" for r in failed)
        self._retry_or_fail(now_ms, p, code, detail)
        return rediscover

    def on_failure(self, now_ms: int, commit_id: int, failure: Failure) -> bool:
        """The OffsetCommit got no answer; True if the coordinator must be rediscovered."""
        p = self._find(commit_id)
        if p is None:
            return False
        p.in_flight = False
        code = _failure_code(failure)
        retriable = failure.kind.retriable
        if retriable:
            self._retry_or_fail(now_ms, p, code, f"{failure.kind.value}: {failure.message}")
        else:
            self._finish(p, code, failure.message)
        return failure.kind in (FailureKind.DISCONNECTED, FailureKind.TIMEOUT)

    def _retry_or_fail(self, now_ms: int, p: _Pending, code: int, detail: str) -> None:
        if p.kind is CommitKind.SYNC and code == E.STALE_MEMBER_EPOCH and p.sent_epoch > 0:
            p.refused_epoch, p.refused_at_ms, p.refused_detail = p.sent_epoch, now_ms, detail
            return
        retriable = code in COMMIT_RETRIABLE or (
            p.kind is CommitKind.REBALANCE and code == E.STALE_MEMBER_EPOCH
        )
        if not retriable or p.kind in (CommitKind.ASYNC, CommitKind.AUTO):
            self._finish(p, code, detail)
            return
        delay = self._backoff.backoff_ms(p.attempts - 1)
        if now_ms + delay >= p.deadline_ms:
            self._finish(p, code, f"{detail} (gave up at the commit timeout)")
            return
        p.retry_at_ms = now_ms + delay
        log.debug(
            "group %s: commit %d failed (%s); retrying in %d ms",
            self.group_id,
            p.commit_id,
            detail,
            delay,
        )

    def _expire(self, now_ms: int) -> None:
        for p in list(self._queue):
            if not p.in_flight and now_ms >= p.deadline_ms:
                if p.refused_epoch is not None:
                    self._finish(
                        p,
                        int(E.STALE_MEMBER_EPOCH),
                        f"{p.refused_detail} (no newer member epoch before the commit timeout)",
                    )
                    continue
                self._finish(
                    p,
                    int(E.REQUEST_TIMED_OUT),
                    "the commit timed out before it could be sent (no coordinator)",
                )

    def _finish(self, p: _Pending, code: int, detail: str) -> None:
        self._queue.remove(p)
        message = ""
        if code:
            message = f"commit failed: {E.name_of(code)}: {detail}".rstrip(": ")
            # A deleted topic's dropped offsets: the caller reports them (once).
            quiet = p.kind is CommitKind.SYNC or (p.dropped and code in TOPIC_GONE)
            level = logging.DEBUG if quiet else logging.WARNING
            log.log(level, "group %s: %s commit %s", self.group_id, p.kind.value.lower(), message)
        self._completed.append(
            CommitResult(
                p.commit_id, p.kind, dict(p.committed), code, message, dict(p.dropped), detail
            )
        )
