"""``Consumer``: a KIP-848 group member with a confluent-kafka data plane."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import (
    OFFSET_INVALID,
    OFFSET_STORED,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)
from confluent_kafka.admin._metadata import ClusterMetadata

from consumer_sdk.membership import CloseOption, MemberState
from consumer_sdk.membership.requests import CommitKind, OffsetLike
from consumer_sdk.observability.client_metrics import fill_consumer_lag
from consumer_sdk.runtime._librdkafka import write_group_metadata
from consumer_sdk.runtime.driver import MemberSnapshot
from consumer_sdk.runtime.fetcher import Fetcher
from consumer_sdk.runtime.group_member import (
    GroupMember,
    Partition,
    RebalanceCallback,
    _wait_seconds,
)
from consumer_sdk.runtime.member_network import _REBALANCE_POLL_GAP_S
from consumer_sdk.runtime.offsets import OffsetAndMetadata

__all__ = ["Consumer"]

log = logging.getLogger("consumer_sdk.runtime")

# The longest the application thread waits inside librdkafka before it looks for work the
# network loop queued (callbacks, commit results); around heartbeat answers it waits in
# rebalance slices (`Consumer._slice`). Used when the fetcher cannot be woken.
_FETCH_SLICE_S = 0.02
# The same when the network loop ends the wait as it queues work (`Fetcher.wake`): a safety
# bound only. Below 200 ms: confluent-kafka splits longer waits into chunks and goes on
# waiting after a wake-up ends one.
_WOKEN_SLICE_S = 0.1
# While a rebalance is under way, wait on the fetcher in short slices so that callbacks the
# the network loop asks for run promptly (each rebalance step is an application-thread hop).
_REBALANCE_SLICE_S = 0.005
# librdkafka's statistics interval when the application sets none: the SDK reads fetch
# counters and end offsets from them.
_STATISTICS_INTERVAL_MS = 1000
_monotonic = time.monotonic
_REBALANCING = frozenset(
    {
        MemberState.JOINING,
        MemberState.RECONCILING,
        MemberState.ACKNOWLEDGING,
        MemberState.PREPARE_LEAVING,
        MemberState.FENCED,
        MemberState.STALE,
    }
)


def _error(code: int, message: str) -> KafkaException:
    return KafkaException(KafkaError(code, message))


class Consumer(GroupMember):
    """A drop-in familiar consumer: ``subscribe``, ``poll``/``consume``, ``commit``, ``close``.

    Membership is this SDK's KIP-848 core; records come from a ``confluent_kafka.Consumer``
    in assign-only mode that follows the reconciled assignment. Revoked partitions are
    unassigned from the fetcher, and their buffered records dropped, before ``on_revoke``
    returns; assigned partitions start at the group's committed offset, else
    ``auto.offset.reset``.

    Instead of ``subscribe``, partitions can be assigned manually (``assign``,
    ``incremental_assign``): the consumer then joins no group and sends no heartbeats, and
    commits under ``group.id`` with generation -1, as confluent-kafka does.
    """

    _ERRORS_AS_EVENTS = True

    def __init__(self, config: Mapping[str, Any]) -> None:
        # Set before the network side starts (the loop thread reads _manual).
        # Manual assignment (assign/incremental_assign): partition -> offset as given.
        # Replaced whole, never changed in place: the loop thread reads it.
        self._manual: Mapping[Partition, int] = {}
        self._subscribed = False
        # Set while on_assign runs: start offsets of the partitions being assigned, which
        # seek() and incremental_assign() inside the callback override.
        self._assigning: dict[Partition, int | None] | None = None
        self._next_post_poll = 0.0
        # Set while on_revoke / on_lost runs: the partitions being released.
        self._releasing: set[Partition] | None = None
        super().__init__(config)
        try:
            fetcher_config = self._config.fetcher_config()
            self._read_committed = (
                str(fetcher_config.get("isolation.level", "read_committed")) == "read_committed"
            )
            interval = int(fetcher_config.get("statistics.interval.ms", 0) or 0)
            # librdkafka calls stats_cb only with an interval; the SDK reads the statistics
            # either way (fetch counters and end offsets for metrics).
            self._user_stats_cb = fetcher_config.get("stats_cb") if interval > 0 else None
            if interval <= 0:
                fetcher_config["statistics.interval.ms"] = _STATISTICS_INTERVAL_MS
            fetcher_config["stats_cb"] = self._on_statistics
            # The network loop reads the fetcher's publication only for auto-commits.
            self._fetcher = Fetcher(fetcher_config, publish_batches=self._config.enable_auto_commit)
        except BaseException:
            super().close(timeout=1.0)
            raise
        if self._fetcher.wakeable:
            self._net.app_waker = self._fetcher.wake
        self._fetcher.set_gate(self._handout_until)
        self._store_lock = threading.Lock()
        # Offsets stored with store_offsets() (enable.auto.offset.store=false): what
        # auto-commit and commit() without arguments commit. Replaced whole under
        # _store_lock, never changed in place: the loop thread reads it without the lock.
        self._stored: Mapping[Partition, OffsetAndMetadata] = {}

    # -- records ----------------------------------------------------------------------------

    def _handout_until(self) -> float:
        """(application thread) Until when (monotonic s) the fetcher may hand records out:
        one session after the last confirmed heartbeat (`consumer_sdk.membership.stall`)."""
        deadline = self._net.snapshot.handout_deadline_ms
        return math.inf if deadline is None else deadline / 1000

    def poll(self, timeout: float | None = None) -> Message | None:
        """One record or error event within ``timeout`` seconds, else None.

        ``None`` (the default) or a negative timeout blocks until a record or an error event,
        as confluent-kafka. Rebalance callbacks, ``on_commit`` and ``error_cb`` run here.
        Group errors come back as error events (a ``Message`` whose ``error()`` is set: the
        group or a topic not authorized, ``_MAX_POLL_EXCEEDED``, ``_FATAL``), client errors
        (transport, authentication) go to ``error_cb``, as in confluent-kafka; exceptions
        raised by callbacks are raised here, and so is a fatal error on later calls.
        """
        # The record path in one frame (`_begin_read`, `Fetcher.poll` and
        # `Fetcher.next_buffered` inlined): a record is buffered and checked (fetchable), no
        # error event, callback or background event waits, the consumer is usable, its poll
        # was noted lately (`_post_poll_limited`) and the gate is open. Anything else takes
        # the path below.
        fetcher = self._fetcher
        batch = fetcher._cursor
        taken = batch.taken
        msgs = batch.msgs
        if (
            taken < len(msgs)
            and fetcher._checked
            and not (self._error_events or self._app_callbacks or self._closed)
        ):
            net = self._net
            if not net.background_events and net.failure is None and self._fatal is None:
                now = _monotonic()
                if now < self._next_post_poll and now <= fetcher._open_until:
                    batch.taken = taken + 1
                    return msgs[taken]
        if self._error_events and not self._closed:
            return self._error_events.popleft()
        now = self._begin_read()
        dispatched = bool(self._net.background_events or self._app_callbacks)
        if dispatched:  # callbacks may run: `now` gets old
            self._dispatch_background_events()
            if self._error_events:
                return self._error_events.popleft()
        # A record already buffered, else one batch taken without a wait.
        msg = fetcher.poll(0, None if dispatched else now)
        if msg is not None:
            return msg
        deadline = now + _wait_seconds(timeout)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            # The fetcher's wait blocks in librdkafka (no busy loop); the slice bounds how
            # late this thread notices callbacks the network loop queued.
            msg = self._fetcher.poll(min(remaining, self._slice()))
            if msg is not None:
                return msg
            self._net.note_poll()
            if self._net.background_events or self._app_callbacks or self._net.failure:
                self._dispatch_background_events()
                if self._error_events:
                    return self._error_events.popleft()

    def _begin_read(self, num_messages: int = 1) -> float:
        """(application thread) What every read (``poll``/``consume``, sync or async) starts
        with once no error event is waiting: the consumer must be usable and ``num_messages``
        at least 1; the poll is noted for the member. Returns the monotonic time."""
        if self._closed or self._fatal is not None or self._net.failure is not None:
            self._ensure_usable()
        if num_messages < 1:
            raise ValueError(f"num_messages must be >= 1, got {num_messages}")
        now = time.monotonic()
        if now >= self._next_post_poll:
            self._post_poll_limited(now)
        return now

    def _post_poll_limited(self, now: float) -> None:
        # note_poll posts at most once per _REBALANCE_POLL_GAP_S; asking it more often
        # only costs time on the per-record path (reading the member state).
        self._next_post_poll = now + _REBALANCE_POLL_GAP_S
        self._net.note_poll()

    def consume(self, num_messages: int = 1, timeout: float | None = None) -> list[Message]:
        """Up to ``num_messages`` records (and error events, as ``poll()``) within
        ``timeout`` seconds; ``None`` (the default) or a negative timeout blocks until at
        least one."""
        if self._error_events and not self._closed:
            return self._take_error_events()
        now = self._begin_read(num_messages)
        wait = _wait_seconds(timeout)
        deadline = now + wait
        while True:
            if self._net.background_events or self._app_callbacks or self._net.failure:
                self._dispatch_background_events()
                if self._error_events:
                    return self._take_error_events()
            # librdkafka waits to fill the batch: at most a fetch slice, so records that are
            # there go out soon (see docs/migration.md), even when a waker would allow longer.
            slice_s = min(self._slice(), _FETCH_SLICE_S)
            msgs = self._fetcher.consume(num_messages, max(min(wait, slice_s), 0))
            if msgs:
                return msgs
            now = time.monotonic()
            wait = deadline - now
            if wait <= 0:
                return msgs
            self._net.note_poll()

    def _take_error_events(self) -> list[Message]:
        events = list(self._error_events)
        self._error_events.clear()
        return events

    def store_offsets(
        self,
        message: Message | None = None,
        offsets: Sequence[TopicPartition] | None = None,
    ) -> None:
        """Store the offset to commit next: ``message``'s offset + 1, or each of ``offsets``
        as given. Needs ``enable.auto.offset.store=false``; auto-commit and ``commit()``
        without arguments then commit only stored offsets.

        Raises ``KafkaException`` with ``_INVALID_ARG`` when automatic storing is on and
        ``_STATE`` for a partition this member is not assigned, as confluent-kafka.
        """
        self._ensure_usable()
        if (message is None) == (offsets is None):
            raise ValueError("store_offsets() takes either message or offsets")
        if self._config.enable_auto_offset_store:
            raise KafkaException(
                KafkaError(
                    KafkaError._INVALID_ARG,
                    "StoreOffsets failed: store_offsets() needs enable.auto.offset.store=false",
                )
            )
        todo: dict[Partition, OffsetAndMetadata] = {}
        if message is not None:
            topic, partition, offset = message.topic(), message.partition(), message.offset()
            if message.error() is not None or topic is None or partition is None or offset is None:
                raise ValueError("cannot store the offset of a message that carries an error")
            epoch = message.leader_epoch()
            todo[(topic, partition)] = OffsetAndMetadata(offset + 1, -1 if epoch is None else epoch)
        else:
            assert offsets is not None
            for tp in offsets:
                todo[(tp.topic, tp.partition)] = OffsetAndMetadata(
                    tp.offset, -1 if tp.leader_epoch is None else tp.leader_epoch, tp.metadata
                )
        with self._store_lock:
            owned = self._fetcher.assigned() | set(self._revoking)
            missing = sorted(p for p in todo if p not in owned)
            if missing:
                raise KafkaException(
                    KafkaError(
                        KafkaError._STATE,
                        "StoreOffsets failed: not assigned to this consumer: "
                        + ", ".join(f"{t}[{p}]" for t, p in missing),
                    )
                )
            self._stored = {**self._stored, **todo}
            # Stored from inside on_revoke: commit it on revoke.
            revoking = {p: o for p, o in todo.items() if p in self._revoking}
            if revoking:
                self._revoking = {**self._revoking, **revoking}

    def _on_statistics(self, stats_json: str) -> None:
        """(application thread, inside the fetcher's poll) librdkafka's statistics JSON: its
        fetch counters go to the metrics; the user's ``stats_cb`` gets it with the ``cgrp``
        block and the partitions' committed offsets and lag filled in from this member."""
        try:
            stats = json.loads(stats_json)
        except ValueError:
            stats = {}
        try:
            self._client_metrics.absorb_statistics(stats, time.monotonic(), self._read_committed)
        except (TypeError, ValueError, AttributeError) as exc:  # never fail poll() over metrics
            log.debug("statistics not understood: %s", exc)
        callback = self._user_stats_cb
        if callback is None:
            return
        stats["cgrp"] = self.group_stats()
        fill_consumer_lag(
            stats, self._committed_offsets(), self._monitor_stored(), self._read_committed
        )
        callback(json.dumps(stats))

    def _committed_offsets(self) -> dict[Partition, int]:
        """The offsets the group committed for this member's partitions, as far as it knows
        (its own commits and the OffsetFetch answers at assignment)."""
        return self._net.call(lambda d: d.commits.last_committed())

    def _monitor_stored(self) -> dict[Partition, int]:
        """What a commit without arguments would commit, per partition, for monitoring."""
        if self._config.enable_auto_offset_store:
            return self._fetcher.monitor_positions(self._client_metrics.app_offsets())
        with self._store_lock:
            return {p: o.offset for p, o in self._stored.items()}

    def lag(self) -> dict[Partition, int]:
        """``records-lag`` per assigned partition: the end offset (high watermark; the last
        stable offset under ``isolation.level=read_committed``) minus the position (the
        offset of the next record to hand out, else the committed offset it starts from).

        End offsets come from librdkafka's statistics of the fetcher, which arrive inside
        ``poll()``/``consume()`` every ``statistics.interval.ms`` (1 s when not set), so
        they are that old at most while the application polls. Partitions whose end offset
        or position is not known yet are left out; empty after ``close()``. Any thread;
        sends no request.

        confluent-kafka has no such method (its statistics carry ``consumer_lag``, to the
        committed offset, which this consumer's ``stats_cb`` carries too)."""
        if self._closed:
            return {}
        fetcher = self._fetcher
        assigned = fetcher.assigned()
        ends = self._client_metrics.end_offsets()
        positions = fetcher.monitor_positions(self._client_metrics.app_offsets())
        committed = self._committed_offsets()
        out: dict[Partition, int] = {}
        for key in sorted(assigned):
            end = ends.get(key)
            position = positions.get(key, committed.get(key))
            if end is not None and position is not None and position >= 0:
                out[key] = max(end - position, 0)
        self._client_metrics.record_lag(time.monotonic(), out)
        return out

    def _slice(self, snap: MemberSnapshot | None = None) -> float:
        """How long to wait inside librdkafka before looking for work the network loop
        queued. When the loop cannot end the wait itself: rebalance work comes from heartbeat
        answers, so short waits while one is awaited, and a wait that ends just after the
        next one is due (``snap``: the member snapshot to go by, else the latest)."""
        net = self._net
        if net.background_events:
            return _REBALANCE_SLICE_S
        if net.app_waker is not None:
            return _WOKEN_SLICE_S
        if snap is None:
            snap = net.snapshot
        if snap.state in _REBALANCING or snap.heartbeat_in_flight:
            return _REBALANCE_SLICE_S
        until = max(snap.heartbeat_due_ms / 1000 - time.monotonic(), 0.0)
        return min(_FETCH_SLICE_S, until + _REBALANCE_SLICE_S)

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
        """What auto-commit and commit() without arguments commit: the positions (offset of
        the last record handed out + 1) or, with enable.auto.offset.store=false, the offsets
        stored with store_offsets()."""
        if self._config.enable_auto_offset_store:
            offsets = {
                p: OffsetAndMetadata(o, epoch)
                for p, (o, epoch) in self._fetcher.committable().items()
            }
        else:
            with self._store_lock:
                assigned = self._fetcher.assigned()
                offsets = {p: o for p, o in self._stored.items() if p in assigned}
        offsets.update(self._revoking)
        return offsets

    def _stored_or_positions(self, parts: list[Partition]) -> dict[Partition, OffsetAndMetadata]:
        if not self._config.enable_auto_offset_store:
            with self._store_lock:
                return {p: self._stored[p] for p in parts if p in self._stored}
        positions = self._fetcher.committable()
        return {p: OffsetAndMetadata(*positions[p]) for p in parts if p in positions}

    def _fence(self, parts: set[Partition]) -> None:
        if parts:
            self._fetcher.fence(parts)

    def _before_revoke(self, parts: list[Partition], lost: bool = False) -> None:
        self._releasing = set(parts)
        if not parts:
            return
        self._fetcher.fence(parts)
        if not lost:
            # Positions (or stored offsets) stay committable from inside on_revoke.
            self._revoking = self._stored_or_positions(parts)
        self._fetcher.unassign(parts)

    def _before_assign(self, parts: list[Partition]) -> None:
        # Also pick up partitions whose earlier ASSIGNED callback failed: the core retries
        # with only the newly added ones, but the fetcher must start every owned partition.
        owned = self._net.snapshot.assigned
        parts = sorted(set(parts) | (owned - self._fetcher.assigned()))
        # None: start at the committed offset, looked up after on_assign (as librdkafka and
        # the Java client do: the callback does not wait for the OffsetFetch, which a broker
        # may hold until its pending group writes are replicated); seek() or
        # incremental_assign() inside on_assign put an offset here instead.
        self._assigning = dict.fromkeys(parts)

    def _after_assign(self) -> None:
        starts = self._take_assign_starts()
        need = [p for p, offset in starts.items() if offset is None]
        # A failure here fails the callback: the core calls on_assign again.
        committed = self._fetch_committed(need, self._request_timeout() * 5) if need else {}
        self._start_assigned(starts, committed)

    def _take_assign_starts(self) -> dict[Partition, int | None]:
        """The start offsets on_assign left (None: the committed offset, to look up)."""
        starts, self._assigning = self._assigning or {}, None
        return starts

    def _start_assigned(
        self,
        starts: dict[Partition, int | None],
        committed: Mapping[Partition, OffsetAndMetadata | None],
    ) -> None:
        """Start fetching the assigned partitions, at ``committed`` where none was chosen."""
        for p, offset in starts.items():
            if offset is None:
                found = committed.get(p)
                starts[p] = None if found is None else found.offset
        self._drop_stored(starts)
        self._fetcher.assign(starts)
        # A pass that fenced partitions for revocation may end up keeping some of them; but
        # partitions lost (fenced) while on_assign ran stay fenced, new ones included.
        snap = self._net.snapshot
        pending = set(snap.pending_revocation)
        keep = set(snap.assigned) - pending
        self._fetcher.fence(pending)
        self._fetcher.unfence(keep)

    def _assign_failed(self) -> None:
        # A failed on_assign is retried by the core; until then nothing is being assigned.
        self._assigning = None

    def _after_revoke(self, parts: list[Partition]) -> None:
        self._releasing = None
        self._drop_stored(parts)
        super()._after_revoke(parts)

    def _drop_stored(self, parts: Iterable[Partition]) -> None:
        """Forget the offsets stored for ``parts`` (assigned anew or released)."""
        drop = set(parts)
        with self._store_lock:
            if not drop.isdisjoint(self._stored):
                self._stored = {p: o for p, o in self._stored.items() if p not in drop}

    def _close_data_plane(self, timeout: float) -> None:
        if getattr(self, "_fetcher", None) is None:  # construction failed before the fetcher
            return
        closer = threading.Thread(target=self._fetcher.close, daemon=True)
        closer.start()
        closer.join(timeout)

    # -- drop-in API: manual assignment, seek, metadata ---------------------------------------

    def _state_error(self, message: str) -> KafkaException:
        return _error(KafkaError._STATE, message)

    def subscribe(
        self,
        topics: Sequence[str] | str,
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """Subscribe to topic names, or to a regex given as a string starting with ``^``
        (or a one-element list holding one). The group is joined on the next ``poll()``.

        Raises ``KafkaException`` (_STATE) while partitions are assigned manually."""
        self._ensure_usable()
        if self._manual:
            raise self._state_error(
                "subscribe() on a consumer with a manual assignment: subscribing and "
                "assign()/incremental_assign() are mutually exclusive; call unassign() first"
            )
        super().subscribe(topics, on_assign, on_revoke, on_lost)
        self._subscribed = True

    def unsubscribe(self, timeout: float = 30.0) -> None:
        """Release the assignment (revoke callback) and leave the group; with a manual
        assignment, drop it (as ``unassign()``)."""
        self._ensure_usable()
        if self._manual:
            self.unassign()
            return
        super().unsubscribe(timeout)
        self._subscribed = False

    def assignment(self) -> list[TopicPartition]:
        """Partitions this consumer owns: the manual assignment, else the group's."""
        if self._manual:
            return [TopicPartition(t, p) for t, p in sorted(self._manual)]
        return super().assignment()

    def _check_manual(self, method: str) -> None:
        self._ensure_usable()
        if self._subscribed:
            raise self._state_error(
                f"{method}() on a subscribed consumer: the group assigns its partitions "
                "(KIP-848, incremental); use incremental_assign(partitions) inside on_assign "
                "to choose start offsets, or unsubscribe() before assigning manually"
            )

    @staticmethod
    def _keys(partitions: Sequence[TopicPartition], method: str) -> list[Partition]:
        if isinstance(partitions, TopicPartition) or not isinstance(partitions, Sequence):
            raise TypeError(f"{method}() takes a list of TopicPartition")
        keys: list[Partition] = []
        seen: set[Partition] = set()
        for tp in partitions:
            if not isinstance(tp, TopicPartition):
                raise TypeError(f"{method}() takes a list of TopicPartition, got {tp!r}")
            key = (tp.topic, tp.partition)
            if key in seen:
                raise _error(
                    KafkaError._INVALID_ARG, f"Duplicate {tp.topic} [{tp.partition}] in input list"
                )
            seen.add(key)
            keys.append(key)
        return keys

    def _start_manual(self, partitions: Sequence[TopicPartition]) -> None:
        """Start fetching manually assigned partitions: an explicit offset (absolute or
        logical) as given, else the group's committed offset, else auto.offset.reset."""
        given = {(tp.topic, tp.partition): tp.offset for tp in partitions}
        need = sorted(p for p, o in given.items() if o in (OFFSET_INVALID, OFFSET_STORED))
        committed = self._fetch_committed(need, self._request_timeout() * 5) if need else {}
        starts: dict[Partition, int | None] = {}
        for p, offset in given.items():
            if offset in (OFFSET_INVALID, OFFSET_STORED):
                found = committed.get(p)
                starts[p] = found.offset if found is not None else None
            else:
                starts[p] = offset
        self._drop_stored(given)
        self._fetcher.assign(starts)
        self._manual = {**self._manual, **given}
        self._net.forget_committed(set(given))

    def _stop_manual(self, parts: list[Partition]) -> None:
        """Stop fetching manually assigned partitions; with auto-commit, commit what was
        consumed from them first (in the background, as librdkafka does on unassign)."""
        if self._config.enable_auto_commit:
            consumed = {p: o for p, o in self._consumed_offsets().items() if p in set(parts)}
            if consumed:
                self._net.commit(consumed, CommitKind.ASYNC)
        self._fetcher.unassign(parts)
        gone = set(parts)
        self._manual = {p: o for p, o in self._manual.items() if p not in gone}
        self._drop_stored(gone)
        self._net.forget_committed(gone)

    def assign(self, partitions: Sequence[TopicPartition]) -> None:
        """Replace the assignment with ``partitions`` (manual assignment, no group
        membership) and start consuming.

        Each partition starts at its ``offset`` if set (absolute, OFFSET_BEGINNING,
        OFFSET_END or OFFSET_TAIL(n)), else at the group's committed offset, else
        ``auto.offset.reset``. Raises ``KafkaException`` (_STATE) on a subscribed consumer.
        """
        self._ensure_usable()
        keys = self._keys(partitions, "assign")
        self._check_manual("assign")
        wanted = set(keys)
        gone = [p for p in self._manual if p not in wanted]
        if gone:
            self._stop_manual(gone)
        # Partitions assigned again restart at the offsets given now.
        again = {p for p in keys if p in self._manual}
        if again:
            self._fetcher.unassign(again)
            self._manual = {p: o for p, o in self._manual.items() if p not in again}
        self._start_manual(partitions)

    def unassign(self) -> None:
        """Remove the manual assignment and stop consuming."""
        self._check_manual("unassign")
        if self._manual:
            self._stop_manual(list(self._manual))

    def incremental_assign(self, partitions: Sequence[TopicPartition]) -> None:
        """Add ``partitions`` to the assignment, starting at their offsets as in
        ``assign()``.

        Inside ``on_assign`` of a subscribed consumer, the offsets set here choose where
        the partitions being assigned start (the SDK assigns them after the callback
        either way). Raises ``KafkaException``: _CONFLICT for a partition already
        assigned, _STATE on a subscribed consumer outside ``on_assign``."""
        self._ensure_usable()
        keys = self._keys(partitions, "incremental_assign")
        if self._assigning is not None:
            extra = [p for p in keys if p not in self._assigning]
            if extra:
                raise self._state_error(
                    f"incremental_assign() inside on_assign with partitions not being "
                    f"assigned: {sorted(extra)}"
                )
            for tp in partitions:
                if tp.offset not in (OFFSET_INVALID, OFFSET_STORED):
                    self._assigning[(tp.topic, tp.partition)] = tp.offset
            return
        self._check_manual("incremental_assign")
        for t, p in keys:
            if (t, p) in self._manual:
                raise _error(
                    KafkaError._CONFLICT, f"{t} [{p}] is already part of the current assignment"
                )
        self._start_manual(partitions)

    def incremental_unassign(self, partitions: Sequence[TopicPartition]) -> None:
        """Remove ``partitions`` from the assignment (offsets are ignored).

        Inside ``on_revoke`` / ``on_lost`` of a subscribed consumer it accepts the
        partitions being revoked (the SDK releases them either way). Raises
        ``KafkaException``: _INVALID_ARG for a partition not assigned, _STATE on a
        subscribed consumer outside those callbacks."""
        self._ensure_usable()
        keys = self._keys(partitions, "incremental_unassign")
        if self._releasing is not None:
            extra = [p for p in keys if p not in self._releasing]
            if extra:
                raise self._state_error(
                    f"incremental_unassign() inside on_revoke/on_lost with partitions not "
                    f"being revoked: {sorted(extra)}"
                )
            return
        self._check_manual("incremental_unassign")
        if keys and not self._manual:
            raise _error(KafkaError._INVALID_ARG, "Can't subtract from empty assignment")
        for t, p in keys:
            if (t, p) not in self._manual:
                raise _error(
                    KafkaError._INVALID_ARG,
                    f"{t} [{p}] can't be unassigned since it is not in the current assignment",
                )
        self._stop_manual(keys)

    def seek(self, partition: TopicPartition) -> None:
        """Fetch ``partition`` from its ``offset`` next: absolute, OFFSET_BEGINNING,
        OFFSET_END or OFFSET_TAIL(n).

        Works on assigned partitions, inside ``on_assign`` (the partitions being assigned
        start there instead of the committed offset) and before their first fetch.
        Buffered records of the partition are dropped; ``position()`` is unknown until
        the next record; later commits of the partition may go below what was committed.
        Raises ``KafkaException`` (_STATE) for a partition that is not assigned,
        (_INVALID_ARG) for OFFSET_STORED / OFFSET_INVALID."""
        self._ensure_usable()
        if not isinstance(partition, TopicPartition):
            raise TypeError(f"seek() takes a TopicPartition, got {partition!r}")
        key = (partition.topic, partition.partition)
        offset = partition.offset
        if offset in (OFFSET_INVALID, OFFSET_STORED):
            raise _error(
                KafkaError._INVALID_ARG,
                f"cannot seek {key[0]} [{key[1]}] to offset {offset}: give an absolute "
                "or a logical offset (OFFSET_BEGINNING, OFFSET_END, OFFSET_TAIL(n))",
            )
        if self._assigning is not None and key in self._assigning:
            self._assigning[key] = offset
            return
        self._fetcher.seek(key, offset)
        # A seek is a deliberate rewind (or skip): commits from the new position on are sent
        # even below what was committed before (the no-regression floor is reset).
        self._net.forget_committed({key})

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int] | None:
        """Low and high offsets of ``partition`` (high = last offset + 1), or None on
        timeout; ``cached`` uses the values learned while fetching. Answered by the
        fetcher's ``confluent_kafka.Consumer``, with its semantics."""
        self._ensure_usable()
        args: dict[str, Any] = {"cached": cached}
        if timeout is not None:
            args["timeout"] = timeout
        result: tuple[int, int] | None = self._fetcher.consumer.get_watermark_offsets(
            partition, **args
        )
        return result

    def offsets_for_times(
        self, partitions: Sequence[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        """Per partition, the earliest offset whose timestamp is >= the timestamp (ms) in
        its ``offset`` field (-1 past the last record). Answered by the fetcher's
        ``confluent_kafka.Consumer``."""
        self._ensure_usable()
        args: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        result: list[TopicPartition] = self._fetcher.consumer.offsets_for_times(
            list(partitions), **args
        )
        return result

    def list_topics(self, topic: str | None = None, timeout: float = -1) -> ClusterMetadata:
        """Cluster metadata (brokers, topics, partitions) as confluent-kafka's
        ``ClusterMetadata``, requested through the fetcher's ``confluent_kafka.Consumer``."""
        self._ensure_usable()
        metadata: ClusterMetadata = self._fetcher.consumer.list_topics(topic, timeout)
        return metadata

    def cluster_id(self, timeout: float = -1) -> str | None:
        """The cluster id (KIP-78), from the fetcher's ``confluent_kafka.Consumer``."""
        self._ensure_usable()
        fetcher = self._fetcher.consumer
        if hasattr(fetcher, "cluster_id"):
            cluster: str | None = fetcher.cluster_id(timeout)
            return cluster
        # confluent-kafka < 2.16 has no Consumer.cluster_id: the Metadata response carries it
        # (and a broker that cannot be reached raises KafkaException, as cluster_id() does).
        found: str | None = fetcher.list_topics(timeout=timeout).cluster_id
        return found

    def memberid(self) -> str:
        """This member's id. With the consumer group protocol the client generates it at
        construction (as librdkafka does), so it is set before joining too."""
        self._ensure_usable()
        return self.member_id

    def consumer_group_metadata(self) -> bytes:
        """The group metadata to pass to ``confluent_kafka.Producer.send_offsets_to_transaction``:
        group id, member epoch (-1 outside the group, e.g. with manual assignment), member id
        and group instance id, serialized by librdkafka as confluent-kafka's own
        ``consumer_group_metadata()`` is. The broker refuses transactional offsets under an
        epoch that is no longer the member's (zombie fencing)."""
        self._ensure_usable()
        snap = self._net.snapshot
        epoch, member_id = snap.member_epoch, snap.member_id
        return write_group_metadata(
            self.group_id, epoch if epoch > 0 else -1, member_id, self._config.group_instance_id
        )

    def set_sasl_credentials(self, username: str, password: str) -> None:
        """Replace the SASL PLAIN/SCRAM username and password, for the group connections and
        the fetcher's. They are used the next time a connection authenticates; established
        connections are not dropped (as confluent-kafka)."""
        super().set_sasl_credentials(username, password)
        self._fetcher.consumer.set_sasl_credentials(username, password)

    def _on_loop_committable(
        self,
    ) -> tuple[Mapping[Partition, OffsetLike], frozenset[Partition] | None]:
        """(loop thread; never waits, takes no lock) What an auto-commit commits, as the
        application side published it: the fetcher's positions of what it handed out (or the
        offsets stored with store_offsets()) and those of partitions being revoked; with a
        manual assignment, its partitions (committed under generation -1, as
        confluent-kafka does).

        Each value read is replaced whole by the application thread, never changed in
        place. The fetcher's publication is read first: a revocation publishes the
        partitions' offsets in ``_revoking`` before the fetcher drops them."""
        fetcher: Fetcher | None = getattr(self, "_fetcher", None)
        if fetcher is None:
            return {}, None
        published = fetcher.publication
        revoking, manual = self._revoking, self._manual
        offsets: dict[Partition, OffsetLike]
        if self._config.enable_auto_offset_store:
            offsets = {p: OffsetAndMetadata(o, e) for p, (o, e) in published.positions().items()}
        else:
            assigned = published.assigned
            offsets = {p: o for p, o in self._stored.items() if p in assigned}
        offsets.update(revoking)
        return offsets, frozenset(manual) or None

    def close(self, timeout: float = 10.0, option: CloseOption = CloseOption.DEFAULT) -> None:
        """Commit (auto-commit), release the assignment, leave the group and stop.

        With a manual assignment there is no group to leave: consumed offsets are committed
        (auto-commit) and fetching stops. Always returns within ``timeout`` seconds."""
        if not self._closed and self._manual and self._fatal is None:
            if self._config.enable_auto_commit:
                manual = set(self._manual)
                offsets = {p: o for p, o in self._consumed_offsets().items() if p in manual}
                with contextlib.suppress(Exception):
                    self._commit_with_retries(
                        offsets, time.monotonic() + max(timeout, 0.0) * 0.4, retry_stale=False
                    )
            self._manual = {}
        super().close(timeout, option)
