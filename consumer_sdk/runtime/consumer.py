"""``Consumer``: a KIP-848 group member with a confluent-kafka data plane."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import Message, TopicPartition

from consumer_sdk.membership import MemberState
from consumer_sdk.runtime.fetcher import Fetcher
from consumer_sdk.runtime.group_member import GroupMember, Partition
from consumer_sdk.runtime.offsets import OffsetAndMetadata

__all__ = ["Consumer"]

# The longest the application thread waits inside librdkafka before it looks for work the
# background thread queued (callbacks, commits): the latency of noticing a rebalance.
_FETCH_SLICE_S = 0.02
# While a rebalance is under way, wait on the fetcher in short slices so that callbacks the
# background thread asks for run promptly (each rebalance step is an application-thread hop).
_REBALANCE_SLICE_S = 0.005
_REBALANCING = frozenset(
    {MemberState.JOINING, MemberState.RECONCILING, MemberState.ACKNOWLEDGING,
     MemberState.PREPARE_LEAVING, MemberState.FENCED, MemberState.STALE}
)  # fmt: skip


class Consumer(GroupMember):
    """A drop-in familiar consumer: ``subscribe``, ``poll``/``consume``, ``commit``, ``close``.

    Membership is this SDK's KIP-848 core; records come from a ``confluent_kafka.Consumer``
    in assign-only mode that follows the reconciled assignment. Revoked partitions are
    unassigned from the fetcher, and their buffered records dropped, before ``on_revoke``
    returns; assigned partitions start at the group's committed offset, else
    ``auto.offset.reset``.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        fetcher_config = self._config.fetcher_config()
        if "stats_cb" in fetcher_config:
            fetcher_config["stats_cb"] = self._stats_with_group_block
        try:
            self._fetcher = Fetcher(fetcher_config)
        except BaseException:
            super().close(timeout=1.0)
            raise
        self._store_lock = threading.Lock()

    # -- records ----------------------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> Message | None:
        """One record (or error event) within ``timeout`` seconds, else None.

        Rebalance callbacks run here; their exceptions and the member's errors are raised.
        """
        if self._closed or self._fatal is not None:
            self._ensure_usable()
        now = time.monotonic()
        self._post_poll()
        events = self._core.background_events
        if events:
            self._dispatch_background_events()
        # Fast path: a record is already buffered.
        msg = self._fetcher.poll(0)
        if msg is not None:
            return msg
        deadline = now + (0.0 if timeout is None or timeout < 0 else timeout)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            msg = self._fetcher.poll(min(remaining, self._slice()))
            if msg is not None:
                return msg
            self._post_poll()
            if events:
                self._dispatch_background_events()

    def consume(self, num_messages: int = 1, timeout: float | None = None) -> list[Message]:
        """Up to ``num_messages`` records within ``timeout`` seconds."""
        self._ensure_usable()
        if num_messages < 1:
            raise ValueError(f"num_messages must be >= 1, got {num_messages}")
        deadline = time.monotonic() + (0.0 if timeout is None or timeout < 0 else timeout)
        self._post_poll()
        while True:
            if self._core.background_events:
                self._dispatch_background_events()
            remaining = deadline - time.monotonic()
            msgs = self._fetcher.consume(num_messages, max(min(remaining, self._slice()), 0))
            if msgs or time.monotonic() >= deadline:
                return msgs
            self._post_poll()

    def _stats_with_group_block(self, stats_json: str) -> None:
        """librdkafka's statistics JSON (from the fetcher) plus its ``cgrp`` block, filled in
        from this member; then the user's ``stats_cb``."""
        try:
            stats = json.loads(stats_json)
        except ValueError:
            stats = {}
        stats["cgrp"] = self.group_stats()
        self._config.callbacks["stats_cb"](json.dumps(stats))

    def _slice(self) -> float:
        if self._core.background_events or self._core.state in _REBALANCING:
            return _REBALANCE_SLICE_S
        return _FETCH_SLICE_S

    def position(self, partitions: Sequence[TopicPartition]) -> list[TopicPartition]:
        """Next offset to be returned per partition (OFFSET_INVALID if unknown)."""
        self._ensure_usable()
        positions = self._fetcher.positions()
        return [
            TopicPartition(tp.topic, tp.partition, positions.get((tp.topic, tp.partition), -1001))
            for tp in partitions
        ]

    def pause(self, partitions: Sequence[TopicPartition]) -> None:
        self._ensure_usable()
        self._fetcher.pause((tp.topic, tp.partition) for tp in partitions)

    def resume(self, partitions: Sequence[TopicPartition]) -> None:
        self._ensure_usable()
        self._fetcher.resume((tp.topic, tp.partition) for tp in partitions)

    # -- data-plane hooks --------------------------------------------------------------------

    def _consumed_offsets(self) -> dict[Partition, OffsetAndMetadata]:
        offsets = {
            p: OffsetAndMetadata(o, self._fetcher.leader_epoch(p))
            for p, o in self._fetcher.positions().items()
        }
        offsets.update(self._revoking)
        return offsets

    def _fence(self, parts: set[Partition]) -> None:
        if parts:
            self._fetcher.fence(parts)

    def _before_revoke(self, parts: list[Partition], lost: bool = False) -> None:
        if not parts:
            return
        self._fetcher.fence(parts)
        if not lost:
            # Positions stay committable from inside on_revoke (revoke-time commits).
            positions = self._fetcher.positions()
            self._revoking = {
                p: OffsetAndMetadata(positions[p], self._fetcher.leader_epoch(p))
                for p in parts
                if p in positions
            }
        self._fetcher.unassign(parts)

    def _before_assign(self, parts: list[Partition]) -> dict[Partition, int | None]:
        # Also pick up partitions whose earlier ASSIGNED callback failed: the core retries
        # with only the newly added ones, but the fetcher must start every owned partition.
        with self._core_lock:
            owned = set(self._core.assigned_partitions)
        parts = sorted(set(parts) | (owned - self._fetcher.assigned()))
        if not parts:
            return {}
        committed = self._fetch_committed(parts, self._request_timeout() * 5)
        return {p: (o.offset if o is not None else None) for p, o in committed.items()}

    def _after_assign(self, starts: dict[Partition, int | None]) -> None:
        self._fetcher.assign(starts)
        # A pass that fenced partitions for revocation may end up keeping some of them.
        with self._core_lock:
            owned = set(self._core.assigned_partitions)
        self._fetcher.unfence(owned)

    def _close_data_plane(self, timeout: float) -> None:
        closer = threading.Thread(target=self._fetcher.close, daemon=True)
        closer.start()
        closer.join(timeout)
