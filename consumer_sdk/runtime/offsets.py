"""Offset commits and fetches for a group member, with the reference client's error policy.

OffsetCommit v9 carries the member id and epoch; OffsetFetch uses v9 (member id/epoch,
RequireStable) where the broker has it and older versions otherwise. Committed offsets
never go backwards: a commit below what this member already committed is skipped.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from consumer_sdk.domain import (
    OffsetCommitPartition,
    OffsetCommitRequest,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.errors import (
    RETRIABLE_CODES,
    BrokerResponseError,
    KafkaException,
    kafka_error,
)
from consumer_sdk.protocol.client import ClusterClient

log = logging.getLogger("consumer_sdk.runtime")

Partition = tuple[str, int]

#: Errors after which a commit may be retried (the coordinator may also need rediscovery).
COMMIT_RETRIABLE = frozenset(RETRIABLE_CODES | {ErrorCode.REQUEST_TIMED_OUT})


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    offset: int
    leader_epoch: int = -1
    metadata: str | None = None


class CommitFailedError(KafkaException):
    """A commit was rejected; ``code`` tells why (e.g. STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID)."""

    def __init__(self, code: int, detail: str, *, retriable: bool = False) -> None:
        super().__init__(
            kafka_error(
                code, f"commit failed: {ErrorCode.name_of(code)}: {detail}", retriable=retriable
            )
        )

    @property
    def code(self) -> int:
        return int(self.args[0].code())

    @property
    def retriable(self) -> bool:
        return bool(self.args[0].retriable())


class OffsetManager:
    """Commits and fetches offsets for one group through the cluster client."""

    def __init__(
        self,
        client: ClusterClient,
        group_id: str,
        instance_id: str | None,
        on_commit: Callable[[int], None] | None = None,
    ) -> None:
        self._client = client
        self.group_id = group_id
        self.instance_id = instance_id
        self._on_commit = on_commit  # latency (ms) of each answered OffsetCommit
        self._lock = threading.Lock()
        self._committed: dict[Partition, int] = {}

    def last_committed(self) -> dict[Partition, int]:
        with self._lock:
            return dict(self._committed)

    def forget(self, partitions: set[Partition]) -> None:
        """Drop the no-regression memory of partitions this member no longer owns."""
        with self._lock:
            for p in partitions:
                self._committed.pop(p, None)

    def commit(
        self,
        offsets: Mapping[Partition, OffsetAndMetadata],
        member_id: str,
        member_epoch: int,
        timeout_s: float,
    ) -> dict[Partition, int]:
        """Commit ``offsets``; return what was committed. Raises CommitFailedError."""
        with self._lock:
            todo = {
                p: o
                for p, o in offsets.items()
                if o.offset >= 0 and o.offset > self._committed.get(p, -1)
            }
        if not todo:
            return {}
        request = OffsetCommitRequest(
            group_id=self.group_id,
            member_id=member_id,
            member_epoch=member_epoch,
            instance_id=self.instance_id,
            offsets=tuple(
                OffsetCommitPartition(t, p, o.offset, o.leader_epoch, o.metadata)
                for (t, p), o in sorted(todo.items())
            ),
        )
        started = time.monotonic()
        results = self._client.offset_commit(request, timeout_s)
        if self._on_commit is not None:
            self._on_commit(round((time.monotonic() - started) * 1000))
        failed = [r for r in results if r.error_code != 0]
        committed = {
            (r.topic, r.partition): todo[(r.topic, r.partition)].offset
            for r in results
            if r.error_code == 0 and (r.topic, r.partition) in todo
        }
        with self._lock:
            for p, offset in committed.items():
                if offset > self._committed.get(p, -1):
                    self._committed[p] = offset
        if failed:
            code = failed[0].error_code
            detail = ", ".join(
                f"{r.topic}[{r.partition}]={ErrorCode.name_of(r.error_code)}" for r in failed
            )
            raise CommitFailedError(code, detail, retriable=code in COMMIT_RETRIABLE)
        return committed

    def fetch(
        self,
        partitions: list[Partition],
        member_id: str | None,
        member_epoch: int,
        timeout_s: float,
    ) -> dict[Partition, OffsetAndMetadata | None]:
        """Committed offsets of ``partitions`` (None where the group has none)."""
        if not partitions:
            return {}
        response = self._client.offset_fetch(
            OffsetFetchRequest(
                group_id=self.group_id,
                partitions=tuple(sorted(partitions)),
                member_id=member_id,
                member_epoch=member_epoch,
                require_stable=True,
            ),
            timeout_s,
        )
        result = committed_offsets(response)
        with self._lock:
            for key, found in result.items():
                if found is not None:
                    self._committed[key] = max(self._committed.get(key, -1), found.offset)
        return result


def committed_offsets(response: OffsetFetchResponse) -> dict[Partition, OffsetAndMetadata | None]:
    """An OffsetFetch answer as committed offsets (None where the group has none);
    ``BrokerResponseError`` for an error in the answer."""
    if response.error_code != 0:
        raise BrokerResponseError.from_code(response.error_code, "OffsetFetch")
    result: dict[Partition, OffsetAndMetadata | None] = {}
    for r in response.partitions:
        if r.error_code != 0:
            raise BrokerResponseError.from_code(
                r.error_code, f"OffsetFetch {r.topic}[{r.partition}]"
            )
        result[(r.topic, r.partition)] = (
            OffsetAndMetadata(r.offset, r.leader_epoch, r.metadata) if r.offset >= 0 else None
        )
    return result
