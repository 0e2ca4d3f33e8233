"""The asyncio face: `AIOGroupMember` and `AIOConsumer` (public as ``consumer_sdk.aio``).

The same application side as `GroupMember` / `Consumer`, run on the event loop's thread
instead of an application thread: each AIO object holds a sync member and calls its
non-blocking steps (event dispatch, callback preparation, commit bookkeeping, the data
plane's ``poll(0)`` / ``consume(n, 0)``) directly, and replaces only its blocking waits by
awaits:

* work the network loop queues for the application (rebalance callbacks, commit results,
  errors) wakes the event loop through the member's ``app_waker``
  (``call_soon_threadsafe``), never a thread per call;
* records wake it through librdkafka's IO event on the fetcher's queue (a byte written to a
  pipe that the event loop watches with ``add_reader``); taking them is a non-blocking call,
  made, after a take found the queue empty, once it holds a batch or 20 ms (``consume``;
  ``async for``: 1 ms) after it first held fewer (`AIOConsumer._hold`: the wait takes
  nothing);
* OffsetCommit and OffsetFetch are `Completion`\\ s of the network loop, bridged to asyncio
  futures and awaited with their deadline.

Cancel safety: records are taken from the data plane and returned with no await in between,
so a cancelled ``poll``/``consume`` has taken nothing (what ``poll`` took in a batch stays in
the fetcher's buffer for the next call), and positions (what auto-commit commits) move only
for records handed out. Rebalance work runs in a task of its own that the caller's
cancellation does not interrupt (the next call waits for it and raises its errors).

Everything here runs on the event loop's thread, except ``_wake_threadsafe`` and
``_LoopWaker.add``.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, Self, TypeVar

from confluent_kafka import OFFSET_INVALID, KafkaError, KafkaException, Message, TopicPartition

from consumer_sdk.errors import (
    BrokerResponseError,
    KafkaTimeoutError,
    KafkaTransportError,
    ProtocolError,
)
from consumer_sdk.membership import (
    CallbackKind,
    CallbacksNeeded,
    Close,
    CloseOption,
    CommitNeeded,
    MemberState,
    StateChanged,
    Unsubscribe,
)
from consumer_sdk.membership.requests import CommitKind
from consumer_sdk.runtime._librdkafka import LibrdkafkaError, QueueIoEvent, consumer_queue_io_event
from consumer_sdk.runtime.completion import Completion
from consumer_sdk.runtime.consumer import Consumer
from consumer_sdk.runtime.group_member import (
    _CLOSE_ATTEMPT_FLOOR_S,
    _POLL_EVENT_INTERVAL_S,
    GroupMember,
    Partition,
    RebalanceCallback,
    _as_kafka_exception,
    _committed_tps,
    _tps,
    _wait_seconds,
)
from consumer_sdk.runtime.member_network import commit_result
from consumer_sdk.runtime.offsets import OffsetAndMetadata, committed_offsets

__all__ = ["AIOConsumer", "AIOGroupMember"]

log = logging.getLogger("consumer_sdk.runtime")

T = TypeVar("T")

# The longest a wait for records goes without looking at the data plane again: a safety
# bound only (records and queued work wake the event loop themselves).
_RECORD_SLICE_S = 0.1
# While records are always there, poll/consume would never suspend: they give the event loop
# a turn (before taking records, so a cancellation there takes nothing) when this long has
# passed since their last suspension.
_YIELD_EVERY_S = 0.0003
# Records taken from librdkafka into the fetcher's buffer per call on the event loop (the
# sync poll takes 256): building a record costs librdkafka and confluent-kafka ~1-2 us here,
# so a fill stays well inside one `_YIELD_EVERY_S` turn (256 took ~0.45 ms: the loop-held
# p99 of a 1 ms ticker was ~1.5 ms, ~1.05 with 96, as a busy loop without the SDK).
_FILL_BATCH = 96
# The longest records queued in librdkafka are left there for more to arrive (see
# `AIOConsumer._hold`): the most latency it adds to a record. ``async for`` (a record at a
# time, as the sync poll that returns at once); ``consume(n)`` as the sync `Consumer.consume`,
# which lets librdkafka fill a batch for up to 20 ms (a fetch slice).
_LINGER_S = 0.001
_CONSUME_LINGER_S = 0.02
# Waits of at least `_SHARED_TIMER_FROM_S` end on a shared grid of `_TIMER_GRAIN_S` slots
# (`_LoopWaker.wake_at`): up to that much late, so that many members' waits share timers.
_SHARED_TIMER_FROM_S = 0.05
_TIMER_GRAIN_S = 0.005
_monotonic = time.monotonic
_FETCH_ERRORS = (BrokerResponseError, KafkaTransportError, KafkaTimeoutError, ProtocolError)


# States in which the core goes on only when the application polls (reconciliation runs
# inside poll, and a stale member rejoins there): entering one wakes the event loop, and its
# waits note a poll this often (a `Poll` event outside STABLE).
_POLL_NEEDED = frozenset({MemberState.RECONCILING, MemberState.STALE})


class _LoopMember(GroupMember):
    """A `GroupMember` whose transitions into `_POLL_NEEDED` wake its application side."""

    def _on_loop_state_change(self, event: StateChanged) -> None:
        super()._on_loop_state_change(event)
        if event.new in _POLL_NEEDED and event.old is not event.new:
            self._net.notify()


class _LoopConsumer(Consumer):
    """`Consumer` with the wake-up of `_LoopMember`."""

    def _on_loop_state_change(self, event: StateChanged) -> None:
        super()._on_loop_state_change(event)
        if event.new in _POLL_NEEDED and event.old is not event.new:
            self._net.notify()


class _LoopWaker:
    """Wakes members on one event loop from other threads with one ``call_soon_threadsafe``
    for all the members woken before the loop gets to it (a join or a rebalance of many
    members on one loop wakes it once per network-loop turn, not once per member); and ends
    their long waits with one timer per `_TIMER_GRAIN_S` slot of the loop's clock rather
    than one per member (see `wake_at`)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Weak: `_wakers` holds this object for as long as the loop lives.
        self._loop = weakref.ref(loop)
        self._lock = threading.Lock()
        self._members: list[AIOGroupMember] = []
        # (event loop thread) Per slot (its end on the loop's clock): its timer and the waits
        # still to end in it (a wait woken before drops out: see `forget`).
        self._slots: dict[float, tuple[asyncio.TimerHandle, set[asyncio.Future[None]]]] = {}

    def wake_at(
        self, loop: asyncio.AbstractEventLoop, delay: float, waiter: asyncio.Future[None]
    ) -> float:
        """(event loop thread) End ``waiter`` (if still pending) at the end of the
        `_TIMER_GRAIN_S` slot in which ``delay`` seconds from now falls: at most that much
        later than asked. One timer per slot serves every member waiting into it, and the
        loop wakes once for all of them (1,000 members polling once a second: ~200 timers a
        second instead of 1,000, and as many fewer turns of the loop). Returns the slot."""
        when = math.ceil((loop.time() + delay) / _TIMER_GRAIN_S) * _TIMER_GRAIN_S
        slot = self._slots.get(when)
        if slot is None:
            slot = self._slots[when] = (loop.call_at(when, self._end_slot, when), set())
        slot[1].add(waiter)
        return when

    def forget(self, when: float, waiter: asyncio.Future[None]) -> None:
        """(event loop thread) ``waiter``'s wait ended (woken, or its slot's end): nothing
        keeps it, and a slot no wait is left in goes with its timer (a member woken by
        records again and again with a long timeout leaves no timers behind)."""
        slot = self._slots.get(when)
        if slot is not None:
            waiters = slot[1]
            waiters.discard(waiter)
            if not waiters:
                slot[0].cancel()
                del self._slots[when]

    def _end_slot(self, when: float) -> None:
        slot = self._slots.pop(when, None)
        if slot is not None:
            for waiter in slot[1]:
                if not waiter.done():
                    waiter.set_result(None)

    def add(self, member: AIOGroupMember) -> None:
        """(any thread) Run ``member._wake()`` on the event loop soon."""
        with self._lock:
            first = not self._members
            self._members.append(member)
        loop = self._loop()
        if first and loop is not None:
            with contextlib.suppress(RuntimeError):  # the event loop is closed
                loop.call_soon_threadsafe(self._run)

    def _run(self) -> None:
        with self._lock:
            members, self._members = self._members, []
        for member in members:
            member._wake()


_wakers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopWaker] = (
    weakref.WeakKeyDictionary()
)


def _loop_waker(loop: asyncio.AbstractEventLoop) -> _LoopWaker:
    """The `_LoopWaker` of ``loop`` (event loop thread)."""
    waker = _wakers.get(loop)
    if waker is None:
        waker = _wakers[loop] = _LoopWaker(loop)
    return waker


async def await_completion(completion: Completion[T]) -> T:
    """Await a network-loop `Completion` on the running event loop, at most until its
    deadline (then it fails with `KafkaTimeoutError`); its value, or raise its error.
    Cancelling the await leaves the completion to its deadline."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[None] = loop.create_future()

    def settle() -> None:
        if not future.done():
            future.set_result(None)

    def done(_: Completion[T]) -> None:  # any thread: the one that completed it
        with contextlib.suppress(RuntimeError):  # the event loop is closed
            loop.call_soon_threadsafe(settle)

    completion.add_done_callback(done)
    expiry = loop.call_later(max(completion.deadline - time.monotonic(), 0.0), completion.expire)
    try:
        await future
    finally:
        expiry.cancel()
    return completion.outcome()


class AIOGroupMember:
    """`GroupMember` for asyncio: the same configuration, semantics and errors, as
    coroutines on the running event loop (create it inside a coroutine).

    Rebalance callbacks (``on_assign``, ``on_revoke``, ``on_lost``) may be plain functions
    or coroutine functions; they get this object and run on the event loop's thread inside
    ``poll()``; a revocation is acknowledged after the callback returns, which must be within
    the rebalance timeout (``max.poll.interval.ms``). ``on_commit`` and ``error_cb`` are plain
    functions.
    """

    def __init__(self, config: Mapping[str, Any]) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError(
                f"{type(self).__name__} must be created inside a coroutine (on the event "
                "loop it is used from)"
            ) from None
        self._sync = self._new_member(config)
        self._waiter: asyncio.Future[None] | None = None
        self._suspended_at = time.monotonic()
        # Until when (monotonic s) `AIOConsumer.__anext__` may hand out buffered records
        # without poll's checks: anything that needs them (queued work, close) sets it to 0.
        self._fast_until = 0.0
        self._woken = False
        self._wake_pending = False
        self._loop_waker = _loop_waker(self._loop)
        self._dispatching: asyncio.Task[bool] | None = None
        self._closing: asyncio.Task[None] | None = None
        self._rebalance_timeout = self._sync._config.max_poll_interval_ms / 1000
        self._sync._net.app_waker = self._wake_threadsafe

    def _new_member(self, config: Mapping[str, Any]) -> GroupMember:
        return _LoopMember(config)

    def __repr__(self) -> str:
        s = self._sync
        return (
            f"{type(self).__name__}(group_id={s.group_id!r}, member_id={s.member_id!r}, "
            f"state={s.state.name})"
        )

    # -- views (as GroupMember) -------------------------------------------------------------

    @property
    def member_id(self) -> str:
        return self._sync.member_id

    @property
    def member_epoch(self) -> int:
        return self._sync.member_epoch

    @property
    def state(self) -> MemberState:
        return self._sync.state

    @property
    def group_id(self) -> str:
        return self._sync.group_id

    def assignment(self) -> list[TopicPartition]:
        """Partitions this member owns (acknowledged or being reconciled)."""
        return self._sync.assignment()

    def metrics(self) -> dict[str, float]:
        """The Java consumer's ``consumer-coordinator-metrics`` by name."""
        return self._sync.metrics()

    def group_stats(self) -> dict[str, Any]:
        """The ``cgrp`` block of librdkafka's statistics JSON for this member."""
        return self._sync.group_stats()

    # -- waking the event loop ----------------------------------------------------------------

    def _wake_threadsafe(self) -> None:
        """(any thread) The network loop queued work for the application: wake the waiter."""
        if self._wake_pending:
            return
        self._wake_pending = True
        self._loop_waker.add(self)

    def _wake(self) -> None:
        self._wake_pending = False
        self._fast_until = 0.0
        self._resume()

    def _resume(self) -> None:
        """End the current wait (or else the next one)."""
        self._woken = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self, timeout: float) -> None:
        """Until woken (since the caller last cleared ``_woken``) or ``timeout`` seconds."""
        if self._woken:
            return
        loop = self._loop
        waiter = self._waiter = loop.create_future()
        timer: asyncio.TimerHandle | None = None
        slot = 0.0
        if timeout >= _SHARED_TIMER_FROM_S:
            slot = self._loop_waker.wake_at(loop, timeout, waiter)
        else:
            timer = loop.call_later(timeout, self._wake_timer, waiter)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            elif self._woken or waiter.cancelled():
                # Ended before its slot (else `_end_slot` took the slot away already).
                self._loop_waker.forget(slot, waiter)
            self._waiter = None
            self._suspended_at = time.monotonic()

    async def _take_turns(self) -> None:
        """Give the event loop a turn if this member's calls have not suspended for a while.

        The turn is a timer due at once, not ``sleep(0)``: asyncio queues the callbacks of
        timers that fell due during this member's turn behind a task that yielded, and a
        task sleeping in ``asyncio.sleep`` runs one loop iteration after its timer; after
        ``sleep(0)`` this member's next turn (a take of records and the caller's work on
        them) would come first. A timer due now is handled after those due earlier, so the
        sleepers' wake-ups are queued ahead of this member's."""
        if _monotonic() - self._suspended_at >= _YIELD_EVERY_S:
            loop = self._loop
            turn = loop.create_future()
            loop.call_at(loop.time(), self._wake_timer, turn)
            await turn
            self._suspended_at = _monotonic()

    @staticmethod
    def _wake_timer(waiter: asyncio.Future[None]) -> None:
        if not waiter.done():
            waiter.set_result(None)

    def _slice(self) -> float:
        """How long a wait goes before noting the next poll (see `note_poll`): work
        for the application wakes it earlier."""
        if self._sync._net.state in _POLL_NEEDED:
            return _POLL_EVENT_INTERVAL_S
        return float(self._sync._net._stable_poll_gap)

    # -- background work (rebalance callbacks, commits, errors) -------------------------------

    def _has_work(self) -> bool:
        s = self._sync
        return bool(
            s._net.background_events
            or s._app_callbacks
            or s._net.failure is not None
            or self._dispatching is not None
        )

    async def _dispatch(self) -> bool:
        """Run the member's queued work; True if user code ran. It runs in a task that a
        cancelled caller does not interrupt: the next call waits for it (and raises what it
        raised)."""
        task = self._dispatching
        if task is None:
            if not self._has_work():
                return False
            task = self._dispatching = self._loop.create_task(self._dispatch_all())
        try:
            return await asyncio.shield(task)
        finally:
            if task.done() and self._dispatching is task:
                self._dispatching = None

    async def _dispatch_all(self) -> bool:
        """`GroupMember._dispatch_background_events`, with the waits awaited."""
        s = self._sync
        s._check_network()
        raised: BaseException | None = None
        ran = False
        for event in s._net.drain_background_events():
            try:
                if isinstance(event, CallbacksNeeded):
                    ran = await self._run_callback(event) or ran
                elif isinstance(event, CommitNeeded):
                    await self._commit_needed(event)
                else:
                    ran = s._dispatch(event) or ran
            except BaseException as exc:  # finish the batch, then raise the first error
                ran = True
                if raised is None:
                    raised = exc
        try:
            ran = s._serve_app_callbacks() or ran
        except BaseException as exc:
            if raised is None:
                raised = exc
        if raised is not None:
            raise raised
        return ran

    async def _run_callback(self, event: CallbacksNeeded) -> bool:
        s = self._sync
        user_exc: BaseException | None = None
        called = False
        try:
            callback = s._callback_begin(event)
            called = await self._call(callback, list(event.partitions))
            if event.kind is CallbackKind.ASSIGNED:
                await self._after_assign()
        except BaseException as exc:
            user_exc = exc
        s._callback_end(event, user_exc)
        return called

    async def _call(self, callback: RebalanceCallback | None, parts: list[Partition]) -> bool:
        if callback is None:
            return False
        result = callback(self, _tps(parts))
        if inspect.isawaitable(result):
            async with asyncio.timeout(self._rebalance_timeout):
                await result
        return True

    async def _after_assign(self) -> None:
        return None

    async def _commit_needed(self, event: CommitNeeded) -> None:
        s = self._sync
        offsets, deadline, pending = s._commit_needed_offsets(event)
        error: KafkaException | None = None
        try:
            await self._commit_with_retries(offsets, deadline, retry_stale=True, releasing=pending)
        except KafkaException as exc:
            error = exc
        finally:
            s._commit_needed_done(event, error)

    # -- subscription and poll ----------------------------------------------------------------

    async def subscribe(
        self,
        topics: Sequence[str] | str,
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """As `GroupMember.subscribe`; callbacks may be coroutine functions."""
        self._sync.subscribe(topics, on_assign, on_revoke, on_lost)

    async def unsubscribe(self, timeout: float = 30.0) -> None:
        """As `GroupMember.unsubscribe` (the revoke callback runs on this event loop)."""
        s = self._sync
        s._ensure_usable()
        s._leave_done.clear()
        s._leave_sent_at = None
        s._net.submit(Unsubscribe())
        first = await self._drive_leave(time.monotonic() + max(timeout, 0.0))
        self._unsubscribed()
        s._serve_app_callbacks()
        if first is not None:
            raise _as_kafka_exception(first)

    def _unsubscribed(self) -> None:
        return None

    async def poll(self, timeout: float | None = None) -> Message | None:
        """As `GroupMember.poll`: run pending callbacks within ``timeout`` seconds (None
        waits until one ran); always returns None."""
        s = self._sync
        net = s._net
        if s._closed or s._fatal is not None or net.failure is not None:
            s._ensure_usable()
        now = _monotonic()
        if now >= s._poll_note_due:  # (else note_poll would do nothing), as GroupMember.poll
            net.note_poll()
        deadline = now + (timeout if timeout is not None and timeout >= 0 else math.inf)
        first = True
        while True:
            self._woken = False
            # `_has_work()`, inline (once per call)
            if (
                net.background_events
                or s._app_callbacks
                or net.failure is not None
                or self._dispatching is not None
            ) and await self._dispatch():
                return None
            remaining = deadline - _monotonic()
            if remaining <= 0:
                return None
            if not first and _monotonic() >= s._poll_note_due:
                net.note_poll()
            first = False
            # `_slice()`, inline
            wait = _POLL_EVENT_INTERVAL_S if net.state in _POLL_NEEDED else net._stable_poll_gap
            if remaining <= wait:
                # The last wait: a timer ends it at the deadline or later (nothing to check
                # again then); anything queued for this member wakes it first (`_resume`).
                await self._wait(remaining)
                if not self._woken:
                    return None
            else:
                await self._wait(wait)

    # -- commits ----------------------------------------------------------------------------

    async def _commit_with_retries(
        self,
        offsets: Mapping[Partition, OffsetAndMetadata],
        deadline: float,
        retry_stale: bool,
        releasing: set[Partition],
    ) -> dict[Partition, int]:
        """`GroupMember._commit_with_retries`, awaited."""
        kind = CommitKind.REBALANCE if retry_stale else CommitKind.SYNC
        timeout = max(deadline - time.monotonic(), 0.05)
        completion = self._sync._net.commit_completion(offsets, timeout, kind, releasing)
        with contextlib.suppress(KafkaException):  # read by commit_result
            await await_completion(completion)
        return self._sync._commit_outcome(offsets, commit_result(completion, kind))

    async def commit(
        self,
        message: Message | None = None,
        offsets: Sequence[TopicPartition] | None = None,
        asynchronous: bool = True,
        timeout: float | None = None,
    ) -> list[TopicPartition] | None:
        """As `GroupMember.commit`; a synchronous commit is awaited (at most ``timeout``,
        default ``socket.timeout.ms``). A cancelled await does not take the commit back."""
        s = self._sync
        s._ensure_usable()
        todo = s._commit_todo(message, offsets, asynchronous)
        if todo is None:
            return None
        if timeout is None:
            timeout = s._config.connection.socket_timeout_ms / 1000
        committed = await self._commit_with_retries(
            todo,
            time.monotonic() + max(timeout, 0.0),
            retry_stale=False,
            releasing=s._commit_releasing(),
        )
        return _committed_tps(committed)

    async def committed(
        self, partitions: Sequence[TopicPartition], timeout: float = 10.0
    ) -> list[TopicPartition]:
        """The group's committed offsets (OFFSET_INVALID where there is none)."""
        self._sync._ensure_usable()
        keys = [(tp.topic, tp.partition) for tp in partitions]
        found = await self._fetch_committed(keys, timeout)
        out = []
        for t, p in keys:
            o = found.get((t, p))
            out.append(TopicPartition(t, p, o.offset if o else OFFSET_INVALID))
        return out

    async def _fetch_committed(
        self, partitions: list[Partition], timeout: float
    ) -> dict[Partition, OffsetAndMetadata | None]:
        """`GroupMember._fetch_committed`, awaited (same retry policy, `_fetch_retry`)."""
        s = self._sync
        if not partitions:
            return {}
        deadline = time.monotonic() + timeout
        backoff = s._config.retry_backoff_ms / 1000
        while True:
            epoch = s.member_epoch
            request = s._offset_fetch_request(
                partitions, s.member_id if epoch > 0 else None, epoch if epoch > 0 else -1
            )
            completion = s._net.fetch_offsets_completion(
                request, max(deadline - time.monotonic(), 0.05)
            )
            try:
                return committed_offsets(await await_completion(completion))
            except _FETCH_ERRORS as exc:
                await asyncio.sleep(s._fetch_retry(exc, epoch, deadline, backoff))
                backoff = min(backoff * 2, s._config.retry_backoff_max_ms / 1000)

    # -- close ------------------------------------------------------------------------------

    async def _drive_leave(self, deadline: float) -> BaseException | None:
        """`GroupMember._drive_leave` on the event loop."""
        s = self._sync
        first: BaseException | None = None
        while not s._leave_done.is_set():
            self._woken = False
            try:
                await self._dispatch()
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # keep leaving; raised by the caller afterwards
                if first is None:
                    first = exc
                if s._net.failure is not None:
                    break
                continue
            if s._leave_done.is_set() or s._net.failure is not None:
                break
            if s._leave_wait_over(deadline):
                break
            await self._wait(_POLL_EVENT_INTERVAL_S)
        return first

    async def close(self, timeout: float = 10.0, option: CloseOption = CloseOption.DEFAULT) -> None:
        """As `GroupMember.close`, on the event loop (it never blocks it): commit, release the
        assignment (the callbacks run here), send the leave, stop. The network part takes at
        most ``timeout`` seconds; a cancelled close goes on to the end in the background."""
        if self._closing is None:
            if self._sync._closed:
                return
            self._fast_until = 0.0
            self._closing = self._loop.create_task(self._close(timeout, option))
            self._resume()  # a waiting `async for` step ends (see AIOConsumer._poll)
        await asyncio.shield(self._closing)

    async def _close(self, timeout: float, option: CloseOption) -> None:
        s = self._sync
        deadline = time.monotonic() + max(timeout, 0.0)
        s._close_deadline = deadline
        first: BaseException | None = None
        if s._fatal is None and s._net.failure is None:
            s._leave_done.clear()
            s._leave_sent_at = None
            s._net.submit(Close(option))
            first = await self._drive_leave(deadline)
            flush_until = max(deadline, time.monotonic() + _CLOSE_ATTEMPT_FLOOR_S)
            while (pending := s._net.pending_commits) and s._net.failure is None:
                if time.monotonic() >= flush_until:
                    log.info(
                        "group %s: %d asynchronous commit(s) not answered before close",
                        s.group_id,
                        pending,
                    )
                    break
                await asyncio.sleep(0.005)
        s._closed = True
        s._poll_note_due = 0.0
        s._net.app_waker = None
        s._net.stop()
        await self._close_data_plane(max(deadline - time.monotonic(), 0.05))
        try:
            s._serve_app_callbacks()  # on_commit of the close commits
        except BaseException as exc:
            if first is None:
                first = exc
        if first is not None:
            raise _as_kafka_exception(first)

    async def _close_data_plane(self, timeout: float) -> None:
        return None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AIOConsumer(AIOGroupMember):
    """`Consumer` for asyncio: ``await subscribe/poll/consume/commit/committed/close``,
    ``async for msg in consumer``, ``async with``; ``store_offsets``, ``seek``, ``pause``,
    ``resume``, ``position`` and ``assignment`` are plain methods. Same configuration,
    semantics and errors as `Consumer` (manual assignment is not offered: subscribe).

    Cancel-safe: a cancelled ``poll``/``consume``/``async for`` step has taken no record, so
    none is lost and auto-commit (positions, or offsets stored with ``store_offsets``)
    counts only records that were handed out.
    """

    _sync: Consumer

    def __init__(self, config: Mapping[str, Any]) -> None:
        super().__init__(config)
        self._fetcher = self._sync._fetcher
        self._io: QueueIoEvent | None = None
        # End of the current wait for a short queue to fill (`_hold`; 0: none), and whether
        # the last take found librdkafka's queue empty (only then is the wait made).
        self._linger_until = 0.0
        self._linger_step = _LINGER_S
        self._drained = False
        self._pipe: tuple[int, int] | None = None
        fetcher = self._sync._fetcher
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        os.set_blocking(write_fd, False)
        self._pipe = (read_fd, write_fd)
        try:
            client_id = str(self._sync._config.fetcher_config().get("client.id", "rdkafka"))
            self._io = consumer_queue_io_event(fetcher.consumer, client_id, write_fd)
        except LibrdkafkaError as exc:
            # Records are then noticed by the wait's safety bound only (slower, still right).
            log.warning("AIOConsumer: no IO event on the fetcher's queue (%s)", exc)
        self._loop.add_reader(read_fd, self._records_ready)

    def _new_member(self, config: Mapping[str, Any]) -> Consumer:
        return _LoopConsumer(config)

    def _records_ready(self) -> None:
        assert self._pipe is not None
        with contextlib.suppress(BlockingIOError):
            while os.read(self._pipe[0], 4096):
                pass
        self._resume()  # records in librdkafka: no need to end __anext__'s fast window

    def _slice(self) -> float:
        return min(super()._slice(), _RECORD_SLICE_S)

    def _hold(self, wanted: int, deadline: float, linger: float) -> float:
        """How long to leave the records queued in librdkafka before taking them (0: take
        now). After a take found the queue empty (the IO event woke the loop), fewer than
        ``wanted`` queued and the fetcher's buffer empty: librdkafka is likely still putting
        a fetch response on the queue, and taking at once would wake the event loop for a
        few records each time (measured: thousands of wake-ups of a few records in a
        200,000-record read). So up to ``linger`` from the first such look, bounded by
        ``deadline``, as librdkafka's own batch call waits for a batch (`Consumer.consume`).
        While takes keep finding records, no wait (it would idle the loop); nothing queued:
        take now (the empty take re-arms the IO event)."""
        io = self._io
        if io is None or not self._drained or self._sync._fetcher.buffered:
            return 0.0
        queued = io.length()
        now = _monotonic()
        if queued == 0 or queued >= wanted or now >= deadline:
            self._linger_until = 0.0
            return 0.0
        until = self._linger_until
        if not until:
            until = self._linger_until = min(now + linger, deadline)
            self._linger_step = _LINGER_S
        if now >= until:
            self._linger_until = 0.0
            return 0.0
        # No IO event comes while records wait in the queue (it is not served): look at its
        # length again after 1, 3, 7, 15 ... ms, not only at the end.
        step = self._linger_step
        self._linger_step = step * 2
        return min(until - now, step)

    # -- records ----------------------------------------------------------------------------

    async def poll(self, timeout: float | None = None) -> Message | None:
        """As `Consumer.poll`: one record or error event within ``timeout`` seconds, else
        None; ``None`` waits until there is one. Group errors come as error events, callback
        exceptions are raised."""
        return await self._poll(timeout, until_close=False)

    async def _poll(self, timeout: float | None, until_close: bool) -> Message | None:
        """`poll`; with ``until_close`` (an ``async for`` step) it also ends, with None,
        when a close starts while it waits."""
        s = self._sync
        if s._error_events and not s._closed:
            return s._error_events.popleft()
        deadline = s._begin_read() + _wait_seconds(timeout)
        fetcher = s._fetcher
        await self._take_turns()
        while True:
            self._woken = False
            if self._has_work():
                await self._dispatch()
                if s._error_events:
                    return s._error_events.popleft()
            # An `async for` step lets a short queue fill (`_hold`); `poll` takes at once.
            hold = self._hold(_FILL_BATCH, deadline, _LINGER_S) if until_close else 0.0
            if hold <= 0:
                msg = fetcher.poll(0, None, _FILL_BATCH)
                if msg is not None:
                    self._drained = False
                    return msg
                self._drained = True
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (until_close and (self._closing is not None or s._closed)):
                return None
            s._net.note_poll()
            await self._wait(min(remaining, hold if hold > 0 else self._slice()))

    async def consume(self, num_messages: int = 1, timeout: float | None = None) -> list[Message]:
        """As `Consumer.consume`: up to ``num_messages`` records (and error events, as
        `poll`) within ``timeout`` seconds (fewer than ``num_messages`` go out at most 20 ms
        after they are there, as with `Consumer.consume`: see `_hold`); ``None`` waits until
        at least one."""
        s = self._sync
        if s._error_events and not s._closed:
            return s._take_error_events()
        deadline = s._begin_read(num_messages) + _wait_seconds(timeout)
        fetcher = s._fetcher
        await self._take_turns()
        while True:
            self._woken = False
            if self._has_work():
                await self._dispatch()
                if s._error_events:
                    return s._take_error_events()
            hold = self._hold(num_messages, deadline, _CONSUME_LINGER_S)
            if hold <= 0:
                msgs = fetcher.consume(num_messages, 0)
                if msgs:
                    self._drained = False
                    return msgs
                self._drained = True
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return fetcher.consume(num_messages, 0) if hold > 0 else []
            s._net.note_poll()
            await self._wait(min(remaining, hold if hold > 0 else self._slice()))

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Message:
        """The next record or error event; ends when the consumer is closed."""
        # Fast path, inside the window `_arm_fast` opened (nothing needs poll's checks): the
        # fetcher's buffered batch (filled by one librdkafka call) handed out record by
        # record, with no await before the return (cancel-safe); `Fetcher.next_buffered`
        # inlined (``_cursor``, ``_checked``: a change there goes here too). A batch handed
        # out, the next is taken here too.
        now = _monotonic()
        if now < self._fast_until:
            fetcher = self._fetcher
            batch = fetcher._cursor
            i = batch.taken
            if i < len(batch.msgs) and fetcher._checked:
                batch.taken = i + 1
                msg: Message = batch.msgs[i]
                return msg
            taken = fetcher.poll(0, now, _FILL_BATCH)
            if taken is not None:
                return taken
            self._drained = True
        s = self._sync
        while True:
            if s._closed or self._closing is not None:
                raise StopAsyncIteration
            polled = await self._poll(None, until_close=True)
            if polled is not None:
                self._arm_fast()
                return polled

    def _arm_fast(self) -> None:
        """After a `poll` that returned a record: let `__anext__` skip poll's checks until
        the event loop's next turn is due, the member's next poll note, or the fetcher's
        gate must be asked again, whichever is first; not while errors or work wait.
        Queued work and close end the window early (`_wake`, `close`)."""
        s = self._sync
        if s._error_events or self._has_work() or self._closing is not None or s._closed:
            self._fast_until = 0.0
        else:
            self._fast_until = min(
                self._suspended_at + _YIELD_EVERY_S, s._next_post_poll, s._fetcher.open_until
            )

    # -- plain methods (non-blocking, as Consumer) --------------------------------------------

    def store_offsets(
        self, message: Message | None = None, offsets: Sequence[TopicPartition] | None = None
    ) -> None:
        """As `Consumer.store_offsets`."""
        self._sync.store_offsets(message, offsets)

    def seek(self, partition: TopicPartition) -> None:
        """As `Consumer.seek` (inside ``on_assign`` too)."""
        self._sync.seek(partition)

    def pause(self, partitions: Sequence[TopicPartition]) -> None:
        self._sync.pause(partitions)

    def resume(self, partitions: Sequence[TopicPartition]) -> None:
        self._sync.resume(partitions)

    def position(self, partitions: Sequence[TopicPartition]) -> list[TopicPartition]:
        """Next offset to be returned per partition (OFFSET_INVALID if unknown)."""
        return self._sync.position(partitions)

    def incremental_assign(self, partitions: Sequence[TopicPartition]) -> None:
        """Inside ``on_assign``: choose start offsets of the partitions being assigned."""
        self._inside_callback("incremental_assign", self._sync._assigning is not None)
        self._sync.incremental_assign(partitions)

    def incremental_unassign(self, partitions: Sequence[TopicPartition]) -> None:
        """Inside ``on_revoke`` / ``on_lost``: accept the partitions being released."""
        self._inside_callback("incremental_unassign", self._sync._releasing is not None)
        self._sync.incremental_unassign(partitions)

    def _inside_callback(self, method: str, inside: bool) -> None:
        if not inside:
            raise KafkaException(
                KafkaError(
                    KafkaError._STATE,
                    f"{method}() outside a rebalance callback: AIOConsumer has no manual "
                    "assignment (subscribe instead)",
                )
            )

    def memberid(self) -> str:
        return self._sync.memberid()

    def consumer_group_metadata(self) -> bytes:
        return self._sync.consumer_group_metadata()

    # -- hooks ------------------------------------------------------------------------------

    async def _after_assign(self) -> None:
        """`Consumer._after_assign` with the committed offsets awaited."""
        s = self._sync
        starts = s._take_assign_starts()
        need = [p for p, offset in starts.items() if offset is None]
        committed = await self._fetch_committed(need, s._request_timeout() * 5) if need else {}
        s._start_assigned(starts, committed)

    def _unsubscribed(self) -> None:
        self._sync._subscribed = False

    async def _close_data_plane(self, timeout: float) -> None:
        """Stop watching the queue, then close librdkafka's consumer on a thread of its own
        (it blocks), awaited for at most ``timeout``."""
        if self._pipe is not None:
            self._loop.remove_reader(self._pipe[0])
        if self._io is not None:
            self._io.close()
            self._io = None
        done: Completion[None] = Completion(time.monotonic() + timeout, "closing the fetcher")

        def close_fetcher() -> None:
            try:
                self._sync._fetcher.close()
                done.complete(None)
            except BaseException as exc:
                done.fail(exc)

        threading.Thread(target=close_fetcher, name="aio-fetcher-close", daemon=True).start()
        try:
            await await_completion(done)
        except KafkaTimeoutError:
            log.info("group %s: the fetcher did not close in time", self.group_id)
        if self._pipe is not None and done.done():
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None
