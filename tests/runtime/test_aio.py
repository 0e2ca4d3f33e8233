"""consumer_sdk.aio on EmbeddedKafka (and, where ``kafka_backend`` is taken, the real broker):
callbacks on the event loop's thread, close from the loop, cancellation at each await point,
and a differential group with the sync Consumer and confluent-kafka's AIOConsumer."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import confluent_kafka
import confluent_kafka.aio
import pytest

from consumer_sdk import Consumer, KafkaException, MemberState, TopicPartition
from consumer_sdk.aio import AIOConsumer, AIOGroupMember
from consumer_sdk.runtime._librdkafka import QueueIoEvent
from consumer_sdk.testing import EmbeddedKafka, KafkaCluster
from tests.runtime.harness import config

T = TypeVar("T")
Record = tuple[str, int, int]


def run(coro: Coroutine[Any, Any, T], timeout: float = 90.0) -> T:
    async def bounded() -> T:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


async def until(
    condition: Callable[[], Any],
    what: str,
    timeout: float = 30.0,
    state: Callable[[], object] = lambda: "",
) -> Any:
    """Poll ``condition`` on the event loop until it holds (bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what} {state()}")
        await asyncio.sleep(0.02)


async def drive(step: Callable[[], Awaitable[Any]], stop: asyncio.Event) -> None:
    """Call ``step`` (a poll) until ``stop`` is set."""
    while not stop.is_set():
        await step()


def key(msg: confluent_kafka.Message) -> Record:
    return (msg.topic(), msg.partition(), msg.offset())  # type: ignore[return-value]


def test_callbacks_run_on_the_loop_thread_and_revoke_waits_for_the_coroutine(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """Coroutine callbacks run on the event loop's thread; a partition moves to the new member
    only after the old owner's on_revoke coroutine (which commits inside) has returned."""
    topic, group = "aio-cb", "aio-cb-g"
    embedded_kafka.create_topic(topic, partitions=2)
    embedded_kafka.produce(topic, [b"x"] * 20)

    async def main() -> None:
        loop_thread = threading.get_ident()
        threads: set[int] = set()
        revoke_done: list[float] = []
        assigned_b: list[float] = []
        committed_in_revoke: list[list[TopicPartition] | None] = []

        async def on_assign_a(c: AIOConsumer, parts: list[TopicPartition]) -> None:
            threads.add(threading.get_ident())

        async def on_revoke_a(c: AIOConsumer, parts: list[TopicPartition]) -> None:
            threads.add(threading.get_ident())
            if not parts:
                return
            await asyncio.sleep(0.3)
            committed_in_revoke.append(await c.commit(asynchronous=False))
            revoke_done.append(time.monotonic())

        def on_assign_b(c: AIOConsumer, parts: list[TopicPartition]) -> None:  # a plain function
            threads.add(threading.get_ident())
            if parts:
                assigned_b.append(time.monotonic())

        cfg = config(embedded_kafka, group, enable_auto_commit=False)
        a = AIOConsumer(cfg)
        got: list[Record] = []
        await a.subscribe([topic], on_assign=on_assign_a, on_revoke=on_revoke_a)
        while len(got) < 20:
            got += [key(m) for m in await a.consume(50, 0.5)]
        b = AIOConsumer(cfg)
        await b.subscribe([topic], on_assign=on_assign_b)
        stop = asyncio.Event()
        tasks = [
            asyncio.create_task(drive(lambda: a.poll(0.1), stop)),
            asyncio.create_task(drive(lambda: b.poll(0.1), stop)),
        ]
        await until(lambda: assigned_b, "a partition moving to the second member")
        stop.set()
        await asyncio.gather(*tasks)
        assert revoke_done and revoke_done[0] <= assigned_b[0]
        assert committed_in_revoke and committed_in_revoke[0] is not None
        assert threads == {loop_thread}
        assert len(a.assignment()) == len(b.assignment()) == 1
        await asyncio.gather(a.close(), b.close())
        assert a.state is MemberState.UNSUBSCRIBED

    run(main())


def test_close_from_the_loop_never_blocks_it(embedded_kafka: EmbeddedKafka) -> None:
    """While close() runs a slow on_revoke coroutine and sends the leave, other tasks on the
    event loop keep running; the leave is sent."""
    topic, group = "aio-close", "aio-close-g"
    embedded_kafka.create_topic(topic, partitions=2)

    async def main() -> None:
        ticks = 0
        closing = False
        ticks_during_close = 0

        async def ticker() -> None:
            nonlocal ticks, ticks_during_close
            while True:
                await asyncio.sleep(0.005)
                ticks += 1
                if closing:
                    ticks_during_close += 1

        async def on_revoke(c: AIOConsumer, parts: list[TopicPartition]) -> None:
            await asyncio.sleep(0.2)

        c = AIOConsumer(config(embedded_kafka, group))
        await c.subscribe([topic], on_revoke=on_revoke)
        while not c.assignment():
            await c.poll(0.1)
        tick = asyncio.create_task(ticker())
        closing = True
        await c.close()
        closing = False
        tick.cancel()
        assert c.state is MemberState.UNSUBSCRIBED
        assert ticks_during_close >= 5, ticks_during_close
        with pytest.raises(KafkaException, match="closed"):
            await c.poll(0)

    run(main())


@pytest.mark.parametrize("mode", ["poll", "consume", "async_for"])
def test_cancelling_record_calls_loses_and_commits_nothing_undelivered(
    embedded_kafka: EmbeddedKafka, mode: str
) -> None:
    """Tasks reading records are cancelled at random moments (in the wait for records and
    while records keep arriving): every record is delivered exactly once, in order, and the
    auto-committed offsets are those of the last delivered record + 1."""
    topic, group = f"aio-cancel-{mode}", f"aio-cancel-{mode}-g"
    partitions, total = 2, 2000
    embedded_kafka.create_topic(topic, partitions=partitions)

    async def main() -> None:
        async with AIOConsumer(config(embedded_kafka, group, auto_commit_interval_ms=50)) as c:
            await c.subscribe([topic])
            delivered: list[Record] = []
            rng = random.Random(7)

            async def read_once() -> None:
                if mode == "poll":
                    msg = await c.poll(0.5)
                    if msg is not None:
                        delivered.append(key(msg))
                elif mode == "consume":
                    delivered.extend(key(m) for m in await c.consume(rng.randint(1, 300), 0.5))
                else:
                    async for msg in c:
                        delivered.append(key(msg))
                        if rng.random() < 0.01:
                            break

            async def producer() -> None:
                for i in range(10):
                    await asyncio.to_thread(
                        embedded_kafka.produce, topic, [f"{i}-{j}".encode() for j in range(200)]
                    )
                    await asyncio.sleep(0.05)

            produce = asyncio.create_task(producer())
            cancelled = 0
            grew_at, seen = time.monotonic(), 0
            while len(delivered) < total:
                if len(delivered) > seen:
                    grew_at, seen = time.monotonic(), len(delivered)
                elif produce.done() and time.monotonic() - grew_at > 5:
                    break  # nothing more is coming: the assertions below say what is missing
                task = asyncio.create_task(read_once())
                await asyncio.sleep(rng.choice([0, 0, 0.0005, 0.002, 0.01]))
                if not task.done():
                    task.cancel()
                    cancelled += 1
                await asyncio.wait([task])
                if not task.cancelled():
                    task.result()  # raises what the call raised
            await produce
            assert cancelled > 10
            assert len(delivered) == len(set(delivered)) == total, "a record lost or repeated"
            for p in range(partitions):
                offsets = [o for t, q, o in delivered if q == p]
                assert offsets == list(range(len(offsets))), f"partition {p} out of order or gaps"
            last = {p: max(o for _, q, o in delivered if q == p) + 1 for p in range(partitions)}
            tps = [TopicPartition(topic, p) for p in range(partitions)]

            async def committed_matches() -> bool:
                found = await c.committed(tps)
                return {tp.partition: tp.offset for tp in found} == last

            deadline = time.monotonic() + 10
            while not await committed_matches():
                assert time.monotonic() < deadline, (
                    "auto-commit did not reach the delivered offsets"
                )
                await c.poll(0.05)

    run(main())


def test_cancelling_poll_during_on_assign_keeps_the_callback_and_records(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """A poll cancelled while its on_assign coroutine awaits: the callback runs to its end
    (the member becomes STABLE), and the next poll gets every record from offset 0."""
    topic, group = "aio-cancel-cb", "aio-cancel-cb-g"
    embedded_kafka.create_topic(topic, partitions=1)
    embedded_kafka.produce(topic, [b"r%d" % i for i in range(10)])

    async def main() -> None:
        entered = asyncio.Event()
        finished: list[bool] = []

        async def on_assign(c: AIOConsumer, parts: list[TopicPartition]) -> None:
            entered.set()
            await asyncio.sleep(0.3)
            finished.append(True)

        c = AIOConsumer(config(embedded_kafka, group))
        await c.subscribe([topic], on_assign=on_assign)
        task = asyncio.create_task(c.poll(10))
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        got: list[int] = []
        while len(got) < 10:
            got += [m.offset() for m in await c.consume(10, 1.0)]  # type: ignore[misc]
        assert finished == [True]
        assert got == list(range(10))
        await c.close()

    run(main())


def test_async_for_ends_at_close_from_another_task(embedded_kafka: EmbeddedKafka) -> None:
    """``async for`` hands buffered records out without poll's checks while nothing needs
    them: a close() started by another task ends the iteration at the next step (at most
    the record of a step already under way comes after it), and the records handed out
    are consecutive from offset 0."""
    topic, group = "aio-for-close", "aio-for-close-g"
    embedded_kafka.create_topic(topic, partitions=1)
    embedded_kafka.produce(topic, [b"x"] * 3000)

    async def main() -> None:
        c = AIOConsumer(config(embedded_kafka, group, enable_auto_commit=False))
        await c.subscribe([topic])
        offsets: list[int] = []
        after_close: list[int] = []
        closing: asyncio.Task[None] | None = None

        async def closer() -> None:
            nonlocal closing
            await until(lambda: len(offsets) >= 1000, "1000 records read")
            closing = asyncio.create_task(c.close())

        close_task = asyncio.create_task(closer())
        async for msg in c:
            (after_close if closing is not None else offsets).append(msg.offset())  # type: ignore[arg-type]
            await asyncio.sleep(0)  # the application awaits between records
        await close_task
        assert closing is not None
        await closing
        assert len(after_close) <= 1, f"{len(after_close)} records after close() was called"
        offsets += after_close
        assert offsets == list(range(len(offsets))) and len(offsets) >= 1000

    run(main())


def test_async_for_fast_path_hands_out_only_what_poll_would(
    embedded_kafka: EmbeddedKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside the window in which ``async for`` skips poll's checks (lengthened here so
    steps surely fall in it): a partition fenced while its records are buffered (as the
    network loop fences a revoked or lost one) gets none of them handed out, a buffered error
    event comes as a message, and once the partition is unfenced its records come again from
    the one after the last handed out: every record once, in order (fails when the
    partition check, the error-event check or the position store is taken off the fast
    path)."""
    from consumer_sdk import KafkaError
    from consumer_sdk.runtime import aio as aio_module
    from consumer_sdk.runtime import consumer as consumer_module
    from consumer_sdk.runtime.error_channel import error_event

    monkeypatch.setattr(aio_module, "_YIELD_EVERY_S", 30.0)
    monkeypatch.setattr(consumer_module, "_REBALANCE_POLL_GAP_S", 30.0)
    topic, group = "aio-for-fast", "aio-for-fast-g"
    embedded_kafka.create_topic(topic, partitions=2)
    total = 2000  # per partition: the read outlasts a short first window
    for p in (0, 1):
        embedded_kafka.produce(topic, [b"x"] * total, partition=p)

    async def main() -> None:
        async with AIOConsumer(config(embedded_kafka, group, enable_auto_commit=False)) as c:
            await c.subscribe([topic])
            fetcher = c._sync._fetcher
            seen: dict[int, list[int]] = {0: [], 1: []}
            errors: list[KafkaError] = []
            fenced: tuple[str, int] | None = None
            window = 0.0  # the fast window open when the partition was fenced
            fast_steps = 0  # steps served in that window (it is not armed again)
            unfenced = asyncio.Event()

            def waiting() -> list[confluent_kafka.Message]:  # buffered, not handed out yet
                batch = fetcher._cursor
                return batch.msgs[batch.taken :]

            def fenced_buffered() -> bool:
                return any((m.topic(), m.partition()) == fenced for m in waiting())

            def unfence() -> None:
                if fenced is not None and not unfenced.is_set():
                    fetcher.unfence([fenced])
                    unfenced.set()

            async def unfence_when_dropped() -> None:
                # For a step left waiting (only the fenced partition's records remain).
                await until(
                    lambda: fenced is not None and not fenced_buffered(),
                    "the drop",
                    state=lambda: (fenced, {k: len(v) for k, v in seen.items()}),
                )
                unfence()

            helper = asyncio.create_task(unfence_when_dropped())
            last_window, last_buffered = 0.0, 0
            async for msg in c:
                # Taken from the buffer by the fast path (not the first of a batch, whose
                # position the fetcher's own hand-out moved), in the window of the last step.
                popped = last_buffered > 0 and c._fast_until == last_window
                last_window, last_buffered = c._fast_until, len(waiting())
                if fenced is not None and not unfenced.is_set() and c._fast_until == window:
                    fast_steps += 1
                if msg.error() is not None:
                    errors.append(msg.error())
                    continue
                p = msg.partition()
                assert p is not None
                if fenced is not None and not unfenced.is_set():
                    assert p != fenced[1], "a fenced partition's buffered record was handed out"
                seen[p].append(msg.offset())  # type: ignore[arg-type]
                if fenced is None:
                    # This partition's next records are buffered and the next steps fall in
                    # the window: fence it (its records are rewound to the position the fast
                    # path moved), with an error event queued behind its records.
                    if (
                        popped
                        and c._fast_until > time.monotonic() + 0.005
                        and any((m.topic(), m.partition()) == (topic, p) for m in waiting())
                    ):
                        fenced, window = (topic, p), c._fast_until
                        fetcher.fence([fenced])
                        fetcher._fold()
                        fetcher._install(
                            [*waiting(), error_event(KafkaError(KafkaError._FAIL, "aio test"))],
                            None,  # not one topic's records only (`_plain_topic`)
                        )
                elif not fenced_buffered():
                    unfence()
                if len(seen[0]) == len(seen[1]) == total:
                    break
            helper.cancel()
            await asyncio.wait([helper])
            assert fenced is not None, "no step found the next records buffered in the window"
            assert fast_steps > 0, "no step after the fence was served in the window"
            assert [e.code() for e in errors] == [KafkaError._FAIL]
            for p in (0, 1):
                assert seen[p] == list(range(total)), f"partition {p}: gaps or repeats"

    run(main(), timeout=60)


def test_async_for_takes_records_from_librdkafka_in_bounded_chunks(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """Each call into librdkafka on the event loop takes at most ``_FILL_BATCH`` records
    (building them holds the loop), fewer than the sync poll's batch: the fetcher's buffer
    never holds more after a step, while still holding batches (not one record a call)."""
    from consumer_sdk.runtime import aio as aio_module
    from consumer_sdk.runtime.fetcher import POLL_BATCH

    topic, group = "aio-for-chunks", "aio-for-chunks-g"
    embedded_kafka.create_topic(topic, partitions=1)
    embedded_kafka.produce(topic, [b"x"] * 2000)
    assert aio_module._FILL_BATCH < POLL_BATCH

    async def main() -> None:
        async with AIOConsumer(config(embedded_kafka, group, enable_auto_commit=False)) as c:
            await c.subscribe([topic])
            buffered: list[int] = []
            offsets: list[int] = []
            async for msg in c:
                offsets.append(msg.offset())  # type: ignore[arg-type]
                batch = c._sync._fetcher._cursor
                buffered.append(len(batch.msgs) - batch.taken)
                if len(offsets) == 2000:
                    break
            assert offsets == list(range(2000))
            assert max(buffered) < aio_module._FILL_BATCH, max(buffered)
            assert max(buffered) >= aio_module._FILL_BATCH // 2, max(buffered)

    run(main(), timeout=60)


def test_a_timer_due_during_a_turn_runs_before_the_next_take(
    embedded_kafka: EmbeddedKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When ``consume`` gives the event loop a turn, a task whose sleep ended during the
    caller's turn runs before the call takes records again (asyncio queues a due timer's
    callback behind a yielding task, and the sleeper runs an iteration after that: with
    ``sleep(0)``, once or twice, the take would come first)."""
    from consumer_sdk.runtime import aio as aio_module

    monkeypatch.setattr(aio_module, "_YIELD_EVERY_S", 0.0)  # every call gives a turn
    topic, group = "aio-turns", "aio-turns-g"
    embedded_kafka.create_topic(topic, partitions=1)
    embedded_kafka.produce(topic, [b"x"] * 200)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        async with AIOConsumer(config(embedded_kafka, group, enable_auto_commit=False)) as c:
            await c.subscribe([topic])
            events: list[str] = []
            fetcher = c._sync._fetcher
            take = fetcher.consume

            def consume(num_messages: int, timeout: float) -> list[confluent_kafka.Message]:
                events.append("take")
                return take(num_messages, timeout)

            monkeypatch.setattr(fetcher, "consume", consume)

            async def sleeper(due: asyncio.Future[None]) -> None:
                await due
                events.append("timer")

            sleepers: list[asyncio.Future[None]] = []
            got = 0
            while got < 200:
                msgs = await c.consume(20, 30.0)
                got += len(msgs)
                if msgs:
                    events.append("turn")
                    # A task sleeping until a time that passed during this turn (as in
                    # asyncio.sleep: a timer ends the wait, the task runs an iteration later).
                    due: asyncio.Future[None] = loop.create_future()
                    loop.call_at(loop.time() - 1, due.set_result, None)
                    sleepers.append(asyncio.ensure_future(sleeper(due)))
            turns = [i for i, e in enumerate(events) if e == "turn"]
            assert len(turns) >= 5, events
            for i in turns[:-1]:
                assert events[i + 1] == "timer", events[i : i + 3]
            await asyncio.gather(*sleepers)

    run(main(), timeout=60)


async def _assigned_with_ten_queued(
    c: AIOConsumer, kafka: EmbeddedKafka, topic: str
) -> QueueIoEvent:
    """Subscribe ``c`` to ``topic`` (one partition), wait for its assignment (reconciliation
    runs inside the calls, none of which may return a record), produce 10 records and wait
    until librdkafka has queued them; returns the consumer's queue IO event."""
    await c.subscribe([topic])
    deadline = time.monotonic() + 30
    while not c.assignment():
        assert time.monotonic() < deadline, "no assignment"
        assert await c.consume(10, 0.1) == []
    await asyncio.to_thread(kafka.produce, topic, [b"x"] * 10)
    io = c._io
    assert io is not None
    # librdkafka's count of queued ops: the 10 records, and ops of fetches a new fetch
    # position outdated (dropped when the queue is served next)
    await until(lambda: io.length() >= 10, "10 records queued in librdkafka")
    return io


@pytest.mark.parametrize("mode", ["consume", "async_for"])
def test_a_short_queue_is_left_to_fill_and_cancelling_that_wait_takes_nothing(
    embedded_kafka: EmbeddedKafka, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With fewer records queued in librdkafka than a ``consume(n)`` (or an ``async for``
    fill) takes, the call waits for more (at most ``_CONSUME_LINGER_S`` / ``_LINGER_S``,
    lengthened here so the wait can be seen) without taking any: cancelled there, it has
    taken nothing (the records are still librdkafka's, no position moved), and the next call
    returns them all."""
    from consumer_sdk.runtime import aio as aio_module

    topic, group = f"aio-linger-{mode}", f"aio-linger-{mode}-g"
    embedded_kafka.create_topic(topic, partitions=1)
    tp = TopicPartition(topic, 0)

    async def main() -> None:
        async with AIOConsumer(config(embedded_kafka, group, enable_auto_commit=False)) as c:
            io = await _assigned_with_ten_queued(c, embedded_kafka, topic)

            async def step() -> list[int]:
                if mode == "consume":
                    return [m.offset() for m in await c.consume(500, 30.0)]  # type: ignore[misc]
                return [(await c.__anext__()).offset()]  # type: ignore[list-item]

            before = c.position([tp])[0].offset
            queued = io.length()
            monkeypatch.setattr(aio_module, "_LINGER_S", 60.0)
            monkeypatch.setattr(aio_module, "_CONSUME_LINGER_S", 60.0)
            task = asyncio.create_task(step())
            await until(lambda: c._linger_until > 0, "the wait for a fuller queue")
            task.cancel()
            await asyncio.wait([task])
            assert task.cancelled()
            assert io.length() == queued, "the cancelled call took records"
            assert not c._sync._fetcher.buffered
            assert c.position([tp])[0].offset == before, "a position moved"
            monkeypatch.setattr(aio_module, "_LINGER_S", 0.001)
            monkeypatch.setattr(aio_module, "_CONSUME_LINGER_S", 0.001)
            c._linger_until = 0.0
            got: list[int] = []
            while len(got) < 10:
                got += await step()
            assert got == list(range(10))

    run(main(), timeout=60)


def test_consume_ends_its_wait_for_a_fuller_queue_once_the_batch_is_there(
    embedded_kafka: EmbeddedKafka, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No IO event comes while records wait in librdkafka's queue, so ``consume(n)``'s wait
    for a fuller queue looks at its length again along the way: once ``n`` records are
    there it returns them, long before the wait's end (here a minute)."""
    from consumer_sdk.runtime import aio as aio_module

    topic, group = "aio-linger-fill", "aio-linger-fill-g"
    embedded_kafka.create_topic(topic, partitions=1)

    async def main() -> None:
        async with AIOConsumer(config(embedded_kafka, group, enable_auto_commit=False)) as c:
            await _assigned_with_ten_queued(c, embedded_kafka, topic)
            monkeypatch.setattr(aio_module, "_CONSUME_LINGER_S", 60.0)
            task = asyncio.create_task(c.consume(20, 50.0))
            await until(lambda: c._linger_until > 0, "the wait for a fuller queue")
            await asyncio.to_thread(embedded_kafka.produce, topic, [b"x"] * 10)
            async with asyncio.timeout(20):
                got = [m.offset() for m in await task]
            assert got, "the wait ended with nothing"
            monkeypatch.setattr(aio_module, "_CONSUME_LINGER_S", 0.001)
            while len(got) < 20:
                got += [m.offset() for m in await c.consume(20, 10.0)]
            assert got == list(range(20))

    run(main(), timeout=60)


def test_async_for_waiting_for_records_ends_at_close(embedded_kafka: EmbeddedKafka) -> None:
    """An ``async for`` step waiting for records (everything read) ends the iteration when
    another task closes the consumer."""
    topic, group = "aio-for-wait-close", "aio-for-wait-close-g"
    embedded_kafka.create_topic(topic, partitions=1)
    embedded_kafka.produce(topic, [b"x"] * 10)

    async def main() -> None:
        c = AIOConsumer(config(embedded_kafka, group, enable_auto_commit=False))
        await c.subscribe([topic])
        got: list[int] = []

        async def closer() -> None:
            await until(lambda: len(got) == 10, "10 records read")
            await asyncio.sleep(0.2)  # the iteration waits for more
            await c.close()

        close_task = asyncio.create_task(closer())
        async for msg in c:
            got.append(msg.offset())  # type: ignore[arg-type]
        await close_task
        assert got == list(range(10))

    run(main(), timeout=30)


def test_members_on_one_loop_share_the_wake_ups_from_the_network_loop(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """Members on one event loop woken by the network loop together (a join of many) cost
    one ``call_soon_threadsafe`` between them: fewer than the members' wake-ups, with a
    wake-up serving several members (fails with one call per member)."""
    from consumer_sdk.runtime import aio as aio_module

    topic, group = "aio-wakes", "aio-wakes-g"
    embedded_kafka.create_topic(topic, partitions=20)
    threadsafe_calls: list[object] = []
    batches: list[int] = []

    class CountingLoop(asyncio.SelectorEventLoop):
        def call_soon_threadsafe(self, callback: Any, *args: Any, context: Any = None) -> Any:
            if threading.get_ident() != getattr(self, "_thread_id", None):
                threadsafe_calls.append(callback)
            return super().call_soon_threadsafe(callback, *args, context=context)

    original_run = aio_module._LoopWaker._run

    def counting_run(waker: Any) -> None:
        batches.append(len(waker._members))
        original_run(waker)

    async def main() -> None:
        members = [AIOGroupMember(config(embedded_kafka, group)) for _ in range(20)]
        stop = asyncio.Event()

        async def drive_member(m: AIOGroupMember) -> None:
            await m.subscribe([topic])
            while not stop.is_set():
                await m.poll(0.5)

        tasks = [asyncio.create_task(drive_member(m)) for m in members]
        await until(
            lambda: all(m.state is MemberState.STABLE and m.assignment() for m in members),
            "20 members stable with a partition each",
            timeout=60,
        )
        stop.set()
        await asyncio.gather(*tasks)
        await asyncio.gather(*(m.close() for m in members))

    aio_module._LoopWaker._run = counting_run  # type: ignore[method-assign]
    try:
        with asyncio.Runner(loop_factory=CountingLoop) as runner:
            runner.run(asyncio.wait_for(main(), 90))
    finally:
        aio_module._LoopWaker._run = original_run  # type: ignore[method-assign]
    woken = sum(batches)
    assert woken >= 20, batches
    assert len(threadsafe_calls) < woken, (len(threadsafe_calls), woken)
    assert max(batches) > 1, batches


def test_long_waits_of_members_on_one_loop_share_timers(embedded_kafka: EmbeddedKafka) -> None:
    """Waits of members on one event loop that end in the same ``_TIMER_GRAIN_S`` slot share
    one loop timer (fails with a timer per member), and none ends before its time."""

    from consumer_sdk.runtime import aio as aio_module

    timers: list[str] = []

    class CountingLoop(asyncio.SelectorEventLoop):
        def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> Any:
            timers.append(getattr(callback, "__name__", ""))
            return super().call_at(when, callback, *args, context=context)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        members = [AIOGroupMember(config(embedded_kafka, "aio-timers-g")) for _ in range(30)]

        async def wait(m: AIOGroupMember) -> float:
            start = loop.time()
            await m.poll(0.3)
            return loop.time() - start

        timers.clear()
        waited = await asyncio.gather(*(wait(m) for m in members))
        wait_timers = [t for t in timers if t in ("_end_slot", "_wake_timer")]
        assert min(waited) >= 0.3, waited
        assert 1 <= len(wait_timers) < len(members) // 2, wait_timers
        # Waits that end before their slot (here cancelled) leave no slot or timer behind.
        slots = aio_module._loop_waker(loop)._slots
        polls = [asyncio.ensure_future(m.poll(30)) for m in members]
        deadline = loop.time() + 10
        while any(m._waiter is None for m in members) and loop.time() < deadline:
            await asyncio.sleep(0.005)  # until every poll waits
        assert slots and all(not p.done() for p in polls)
        for p in polls:
            p.cancel()
        await asyncio.gather(*polls, return_exceptions=True)
        assert slots == {}
        await asyncio.gather(*(m.close() for m in members))

    with asyncio.Runner(loop_factory=CountingLoop) as runner:
        runner.run(asyncio.wait_for(main(), 60))


def test_group_member_poll_runs_work_that_woke_its_last_wait(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """A stable member's ``poll(t)`` whose one wait (``t`` within a slice) is woken by work
    (here an asynchronous commit's ``on_commit``) runs it in that call: only a wait that
    ran to its timer returns without looking for work again, and a woken wait leaves its
    shared timer slot at once (fails when only a cancelled wait does)."""
    from consumer_sdk.runtime import aio as aio_module

    topic, group = "aio-member-wake", "aio-member-wake-g"
    embedded_kafka.create_topic(topic, partitions=1)

    async def main() -> None:
        results: list[object] = []
        m = AIOGroupMember(
            {**config(embedded_kafka, group), "on_commit": lambda err, tps: results.append(tps)}
        )
        await m.subscribe([topic])
        deadline = time.monotonic() + 30
        while not (m.state is MemberState.STABLE and m.assignment()):
            assert time.monotonic() < deadline, "not stable"
            await m.poll(0.05)  # reconciliation runs inside poll
        assert m._slice() >= 0.9
        loop = asyncio.get_running_loop()
        for _ in range(3):
            results.clear()
            poll = asyncio.ensure_future(m.poll(0.9))
            await until(lambda: m._waiter is not None, "poll waiting", 10)
            start = loop.time()
            await m.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=True)
            await poll
            assert len(results) == 1, "on_commit did not run in the poll it woke"
            assert loop.time() - start < 0.9
            # The woken wait left its shared timer slot (and the slot's timer) at once.
            assert aio_module._loop_waker(loop)._slots == {}
        await m.close()

    run(main(), timeout=60)


def test_group_member_polls_keep_it_in_the_group_and_a_stopped_one_leaves(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """max.poll.interval.ms (1 s here) with `AIOGroupMember.poll`'s notes of the poll: a
    member calling ``poll(0.05)`` (each call one wait, the note at its start) and one in a
    long ``poll(5.0)`` (slices of 0.25 s, a note after each) stay in the group for 3 s; a
    member that stops polling goes STALE and its next poll reports the exceeded interval.
    Fails when the call's first note or the notes between slices are skipped."""
    topic, group = "aio-max-poll", "aio-max-poll-g"
    embedded_kafka.create_topic(topic, partitions=3)

    async def main() -> None:
        errors: dict[str, list[Any]] = {"short": [], "long": [], "stops": []}
        members = {
            name: AIOGroupMember(
                {
                    **config(embedded_kafka, group),
                    "max.poll.interval.ms": 1000,
                    "error_cb": errors[name].append,
                }
            )
            for name in errors
        }
        for m in members.values():
            await m.subscribe([topic])
        stable = asyncio.Event()
        stop = asyncio.Event()

        async def keep(m: AIOGroupMember, timeout: float) -> None:
            while not stop.is_set():
                await m.poll(timeout if stable.is_set() else 0.05)

        polling = [
            asyncio.create_task(keep(members["short"], 0.05)),
            asyncio.create_task(keep(members["long"], 5.0)),
        ]
        stopper = members["stops"]
        deadline = time.monotonic() + 30
        while not all(m.state is MemberState.STABLE and m.assignment() for m in members.values()):
            assert time.monotonic() < deadline, [m.state for m in members.values()]
            await stopper.poll(0.05)
        stable.set()
        seen: dict[str, set[MemberState]] = {"short": set(), "long": set()}
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            for name in seen:
                seen[name].add(members[name].state)
            await asyncio.sleep(0.02)
        assert MemberState.STALE not in seen["short"] | seen["long"], seen
        assert errors["short"] == [] and errors["long"] == [], errors
        assert stopper.state is MemberState.STALE, stopper.state
        await stopper.poll(0.5)
        assert [e.code() for e in errors["stops"]][:1] == [
            confluent_kafka.KafkaError._MAX_POLL_EXCEEDED
        ], errors["stops"]
        stop.set()
        await asyncio.gather(*polling)
        await asyncio.gather(*(m.close() for m in members.values()))

    run(main(), timeout=90)


def _read_offsets(out: Any, printed: list[int], enough_at: int, enough: threading.Event) -> None:
    """(a thread) Offsets a member process prints, one a line, into ``printed``; ``enough``
    is set once it holds ``enough_at`` or the process ended."""
    for line in out:
        printed.append(int(line))
        if len(printed) >= enough_at:
            enough.set()
    enough.set()


def test_kill_9_mid_stream_commits_no_record_that_was_not_handed_out(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """``async for`` consumer processes with auto-commit, each killed with SIGKILL at a
    random record while records it took from librdkafka wait in its buffer: the group's
    committed offset is at most one past the records it was handed (the last one printed,
    and one it may have been handed and not printed yet), and auto-commit did commit; the
    next process goes on from there. Two rounds: a commit of the buffered records shows
    unless the kill falls at the end of a buffered batch."""
    topic, group = "aio-kill9", "aio-kill9-g"
    embedded_kafka.create_topic(topic, partitions=1)
    embedded_kafka.produce(topic, [b"x" * 10] * 20_000)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    committed = 0
    for _ in range(2):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.runtime.aio_autocommit_member",
                embedded_kafka.bootstrap_servers,
                group,
                topic,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=root,
            env=env,
        )
        printed: list[int] = []
        kill_after = 200 + random.randrange(100)
        enough = threading.Event()
        reader = threading.Thread(
            target=_read_offsets, args=(proc.stdout, printed, kill_after, enough), daemon=True
        )
        reader.start()
        try:
            # The second process gets the partition once the first one's session expired.
            enough.wait(90)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        reader.join(10)  # the rest of what it printed before the kill
        assert len(printed) >= kill_after, f"the member printed only {len(printed)} offsets"
        assert printed == list(range(committed, committed + len(printed)))
        checker = Consumer(config(embedded_kafka, group))
        try:
            found = checker.committed([TopicPartition(topic, 0)], timeout=10)[0].offset
        finally:
            checker.close()
        assert committed < found <= printed[-1] + 2, (committed, found, printed[-1])
        committed = found


def test_cancelled_sync_commit_and_close_still_complete(embedded_kafka: EmbeddedKafka) -> None:
    """Cancelling an awaited synchronous commit does not take it back; cancelling close()
    leaves it running to the end (the leave is sent)."""
    topic, group = "aio-cancel-commit", "aio-cancel-commit-g"
    embedded_kafka.create_topic(topic, partitions=1)
    embedded_kafka.produce(topic, [b"x"] * 5)

    async def main() -> None:
        c = AIOConsumer(config(embedded_kafka, group, enable_auto_commit=False))
        await c.subscribe([topic])
        msgs: list[confluent_kafka.Message] = []
        while len(msgs) < 5:
            msgs += await c.consume(5, 1.0)
        task = asyncio.create_task(c.commit(msgs[-1], asynchronous=False))
        await asyncio.sleep(0)
        task.cancel()
        tp = [TopicPartition(topic, 0)]
        while (await c.committed(tp))[0].offset != 5:
            await asyncio.sleep(0.05)
        closing = asyncio.create_task(c.close())
        await asyncio.sleep(0.01)
        closing.cancel()
        await c.close()  # waits for the close under way
        assert c.state is MemberState.UNSUBSCRIBED

    run(main())


def test_group_member_and_errors_match_the_sync_consumer(embedded_kafka: EmbeddedKafka) -> None:
    """AIOGroupMember joins and leaves; errors are the sync Consumer's (a callback error
    wrapped as _APPLICATION, STALE_MEMBER_EPOCH from a commit, the closed consumer)."""
    topic, group = "aio-errors", "aio-errors-g"
    embedded_kafka.create_topic(topic, partitions=1)
    embedded_kafka.produce(topic, [b"x"] * 3)

    async def main() -> None:
        m = AIOGroupMember(config(embedded_kafka, group + "-m"))
        await m.subscribe([topic])
        while not m.assignment():
            await m.poll(0.1)
        assert m.member_epoch > 0 and m.metrics()["assigned-partitions"] == 1
        await m.close()
        assert m.state is MemberState.UNSUBSCRIBED

        calls: list[int] = []

        def boom_once(c: AIOConsumer, parts: list[TopicPartition]) -> None:
            calls.append(len(parts))
            if len(calls) == 1:
                raise ValueError("boom")

        async with AIOConsumer(config(embedded_kafka, group, enable_auto_commit=False)) as c:
            await c.subscribe([topic], on_assign=boom_once)
            with pytest.raises(KafkaException, match="on_assigned callback raised ValueError") as e:
                while True:
                    await c.poll(0.1)
            assert e.value.args[0].code() == confluent_kafka.KafkaError._APPLICATION
            msg = None
            while msg is None:
                msg = await c.poll(0.2)
            assert len(calls) == 2  # the core retried on_assign
            embedded_kafka.push_request_errors(8, [113])
            with pytest.raises(KafkaException, match="STALE_MEMBER_EPOCH"):
                await c.commit(msg, asynchronous=False)
            done = await c.commit(msg, asynchronous=False)
            assert done is not None and done[0].offset == msg.offset() + 1  # type: ignore[operator]
        with pytest.raises(KafkaException, match="closed"):
            await c.commit(asynchronous=False)

    run(main())


# -- differential: AIOConsumer, Consumer and confluent-kafka's AIOConsumer in one group --------


class _Owned:
    def __init__(self) -> None:
        self.parts: set[tuple[str, int]] = set()
        self.lost = 0

    def assign(self, c: Any, parts: list[TopicPartition]) -> None:
        self.parts |= {(tp.topic, tp.partition) for tp in parts}

    def revoke(self, c: Any, parts: list[TopicPartition]) -> None:
        self.parts -= {(tp.topic, tp.partition) for tp in parts}

    def on_lost(self, c: Any, parts: list[TopicPartition]) -> None:
        self.lost += 1
        self.revoke(c, parts)

    # confluent-kafka's AIOConsumer takes coroutine callbacks only
    async def assign_async(self, c: Any, parts: list[TopicPartition]) -> None:
        self.assign(c, parts)

    async def revoke_async(self, c: Any, parts: list[TopicPartition]) -> None:
        self.revoke(c, parts)

    async def on_lost_async(self, c: Any, parts: list[TopicPartition]) -> None:
        self.on_lost(c, parts)


def test_differential_group_hand_over_commits_close(
    kafka_backend: EmbeddedKafka | KafkaCluster,
) -> None:
    """The three clients share a topic: partitions are handed over without overlap as each
    joins, each commits what it processed (visible to the others' committed()), and when each
    closes its partitions move to the rest; every record is processed exactly once."""
    topic, group = "aio-diff", "aio-diff-g"
    partitions, per_round = 6, 300
    kafka_backend.create_topic(topic, partitions=partitions)

    async def main() -> None:
        cfg = config(kafka_backend, group, enable_auto_commit=False)
        owned = {"aio": _Owned(), "sync": _Owned(), "ck": _Owned()}
        records: dict[str, list[Record]] = {name: [] for name in owned}

        async def aio_revoke(c: AIOConsumer, parts: list[TopicPartition]) -> None:
            if parts and records["aio"]:
                with _suppress_no_offset():
                    await c.commit(asynchronous=False)
            owned["aio"].revoke(c, parts)

        aio = AIOConsumer(cfg)
        await aio.subscribe([topic], on_assign=owned["aio"].assign, on_revoke=aio_revoke)

        sync = Consumer(cfg)
        sync_lock = threading.Lock()
        sync_thread: asyncio.Task[None] | None = None

        def sync_revoke(c: Consumer, parts: list[TopicPartition]) -> None:
            if parts and records["sync"]:
                with _suppress_no_offset():
                    c.commit(asynchronous=False)
            owned["sync"].revoke(c, parts)

        ck = confluent_kafka.aio.AIOConsumer({**cfg, "group.protocol": "consumer"})

        async def ck_revoke(c: Any, parts: list[TopicPartition]) -> None:
            if parts and records["ck"]:
                with _suppress_no_offset():
                    await c.commit(asynchronous=False)
            owned["ck"].revoke(c, parts)

        stop = {name: threading.Event() for name in owned}

        def state() -> object:
            return {n: (sorted(o.parts), len(records[n])) for n, o in owned.items()}

        async def run_aio() -> None:
            while not stop["aio"].is_set():
                for m in await aio.consume(100, 0.1):
                    if m.error() is None:
                        records["aio"].append(key(m))
            await aio.close()

        def run_sync() -> None:
            with sync_lock:
                sync.subscribe([topic], on_assign=owned["sync"].assign, on_revoke=sync_revoke)
                while not stop["sync"].is_set():
                    for m in sync.consume(100, 0.1):
                        if m.error() is None:
                            records["sync"].append(key(m))
                sync.close()

        async def run_ck() -> None:
            await ck.subscribe(
                [topic], on_assign=owned["ck"].assign_async, on_revoke=ck_revoke, on_lost=ck_revoke
            )
            while not stop["ck"].is_set():
                for m in await ck.consume(100, 0.1):
                    if m.error() is None:
                        records["ck"].append(key(m))
            await ck.close()

        def total() -> int:
            return sum(len(r) for r in records.values())

        def disjoint_cover(names: list[str]) -> bool:
            sets = [owned[n].parts for n in names]
            return sum(map(len, sets)) == partitions and all(sets)

        tasks = [asyncio.create_task(run_aio())]
        produced = 0

        async def produce_round() -> None:
            # Into every partition: an unkeyed batch may land in one (the real broker's sticky
            # partitioner), leaving owned partitions with nothing to check the commit against.
            nonlocal produced
            for p in range(partitions):
                values = [b"r"] * (per_round // partitions)
                await asyncio.to_thread(kafka_backend.produce, topic, values, partition=p)
            produced += per_round // partitions * partitions

        try:
            await produce_round()
            await until(lambda: total() == produced, "the first member consuming", 60, state)
            sync_thread = asyncio.create_task(asyncio.to_thread(run_sync))
            tasks.append(asyncio.create_task(run_ck()))
            await until(
                lambda: disjoint_cover(["aio", "sync", "ck"]), "a three-way split", 60, state
            )
            await produce_round()
            await until(lambda: total() == produced, "all three consuming", 60, state)
            # What the AIOConsumer committed is what it processed.
            await aio.commit(asynchronous=False)
            tps = [TopicPartition(topic, p) for p in range(partitions)]
            found = {tp.partition: tp.offset for tp in await aio.committed(tps)}
            for p in {p for _, p in owned["aio"].parts}:
                assert found[p] == 1 + max(o for _, q, o in records["aio"] if q == p)
            # close, one by one: partitions move to the rest, nothing processed twice
            for leaving, rest in (("ck", ["aio", "sync"]), ("sync", ["aio"])):
                stop[leaving].set()
                if leaving == "sync":
                    await sync_thread
                await until(
                    lambda r=rest: disjoint_cover(r),  # type: ignore[misc]
                    f"{leaving}'s partitions moving",
                    60,
                    state,
                )
                await produce_round()
                await until(lambda: total() == produced, "the rest consuming", 60, state)
        finally:
            for event in stop.values():
                event.set()
            await asyncio.gather(*tasks, return_exceptions=True)
            if sync_thread is not None:
                await asyncio.gather(sync_thread, return_exceptions=True)
        everything = [r for rs in records.values() for r in rs]
        assert len(everything) == len(set(everything)) == produced, "a record processed twice"

    run(main(), timeout=240)


class _suppress_no_offset:
    def __enter__(self) -> None:
        return None

    def __exit__(self, t: Any, exc: BaseException | None, tb: Any) -> bool:
        return (
            isinstance(exc, KafkaException)
            and exc.args[0].code() == confluent_kafka.KafkaError._NO_OFFSET
        )


def test_differential_fencing(embedded_kafka: EmbeddedKafka) -> None:
    """Each of the three clients, fenced by its heartbeat (FENCED_MEMBER_EPOCH), loses its
    partitions (on_lost) and rejoins; the group ends covering the topic again."""
    topic, group = "aio-fence", "aio-fence-g"
    embedded_kafka.create_topic(topic, partitions=3)

    async def main() -> None:
        cfg = config(embedded_kafka, group)
        owned = {"aio": _Owned(), "sync": _Owned(), "ck": _Owned()}
        aio = AIOConsumer(cfg)
        await aio.subscribe(
            [topic],
            on_assign=owned["aio"].assign,
            on_revoke=owned["aio"].revoke,
            on_lost=owned["aio"].on_lost,
        )
        sync = Consumer(cfg)
        sync.subscribe(
            [topic],
            on_assign=owned["sync"].assign,
            on_revoke=owned["sync"].revoke,
            on_lost=owned["sync"].on_lost,
        )
        ck = confluent_kafka.aio.AIOConsumer({**cfg, "group.protocol": "consumer"})
        await ck.subscribe(
            [topic],
            on_assign=owned["ck"].assign_async,
            on_revoke=owned["ck"].revoke_async,
            on_lost=owned["ck"].on_lost_async,
        )
        stop = threading.Event()

        def sync_loop() -> None:
            while not stop.is_set():
                sync.poll(0.05)

        async def aio_loop() -> None:
            while not stop.is_set():
                await aio.poll(0.05)

        async def ck_loop() -> None:
            while not stop.is_set():
                await ck.poll(0.05)

        loops = [
            asyncio.create_task(asyncio.to_thread(sync_loop)),
            asyncio.create_task(aio_loop()),
            asyncio.create_task(ck_loop()),
        ]
        names = list(owned)

        def covered() -> bool:
            return sum(len(o.parts) for o in owned.values()) == 3 and all(
                o.parts for o in owned.values()
            )

        def state() -> object:
            return {n: (sorted(o.parts), o.lost) for n, o in owned.items()}

        try:
            await until(covered, "each client owning a partition", 60, state)
            # The error goes to whichever heartbeat comes next: one at a time until each
            # client has been fenced at least once.
            for _ in range(40):
                if all(owned[n].lost > 0 for n in names):
                    break
                before = sum(o.lost for o in owned.values())
                embedded_kafka.push_request_errors(68, [110])
                await until(
                    lambda b=before: sum(o.lost for o in owned.values()) > b,  # type: ignore[misc]
                    "a client fenced",
                    30,
                    state,
                )
                await until(covered, "the group covering the topic again", 60, state)
            assert all(owned[n].lost > 0 for n in names), state()
            await until(covered, "the group covering the topic again", 60, state)
        finally:
            stop.set()
            await asyncio.gather(*loops, return_exceptions=True)
            await asyncio.gather(
                aio.close(), ck.close(), asyncio.to_thread(sync.close), return_exceptions=True
            )

    run(main(), timeout=150)


def test_the_wake_up_batcher_of_an_event_loop_goes_with_the_loop() -> None:
    """`_LoopWaker` keeps no event loop alive (each ``asyncio.run`` makes a new one)."""
    import gc
    import weakref

    from consumer_sdk.runtime import aio as aio_module

    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def touch() -> None:
        loop = asyncio.get_running_loop()
        aio_module._loop_waker(loop)
        loops.append(weakref.ref(loop))

    for _ in range(3):
        asyncio.run(touch())
    gc.collect()
    assert [ref() for ref in loops] == [None, None, None]
