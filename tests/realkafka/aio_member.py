"""A member process on an asyncio face: ``aio`` (`consumer_sdk.aio.AIOConsumer`) or ``ckaio``
(confluent-kafka's ``AIOConsumer``, ``group.protocol=consumer``).

``python -m tests.realkafka.aio_member`` takes the arguments of ``python -m consumer_sdk.chaos
member`` and runs the chaos member's consume-log-commit loop as a coroutine, with coroutine
rebalance callbacks (the revoke commits inside ``on_revoke``), writing the same JSON lines
(the SDK's with its heartbeat trace), so the fault tests and the chaos checker read it as
they read the sync members.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Any

from consumer_sdk.chaos.member import ChaosMember, member_main


class AioMember(ChaosMember):
    def _is_sdk(self) -> bool:
        return self.impl == "aio"

    def _make_consumer(self) -> Any:
        if self.impl == "aio":
            from consumer_sdk.aio import AIOConsumer

            consumer = AIOConsumer(self._config())
            self._trace_heartbeats(consumer._sync)
            return consumer
        import confluent_kafka.aio

        return confluent_kafka.aio.AIOConsumer(self._config())

    async def _acommit(self, offsets: dict[int, int]) -> bool:
        from confluent_kafka import KafkaException

        tps, sent = self._commit_started(offsets)
        try:
            await self.consumer.commit(offsets=tps, asynchronous=False)
        except KafkaException as exc:
            return self._commit_failed(offsets, exc)
        return self._commit_done(offsets, sent)

    async def a_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self.on_assign(consumer, partitions)

    async def a_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        parts = self._parts(partitions)
        todo = {p: o for p, o in self.pending.items() if p in parts}
        if todo:
            await self._acommit(todo)
        self._revoked(parts)

    async def a_lost(self, consumer: Any, partitions: list[Any]) -> None:
        self.on_lost(consumer, partitions)

    def run(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop.set())
        return asyncio.run(self._main())

    async def _main(self) -> int:
        from confluent_kafka import KafkaException

        self.consumer = self._make_consumer()
        self._identity()
        self.log.write("start", flush=True, impl=self.impl, pid=os.getpid())
        await self.consumer.subscribe(
            [self.topic], on_assign=self.a_assign, on_revoke=self.a_revoke, on_lost=self.a_lost
        )
        status = 0
        try:
            while not self.stop.is_set():
                try:
                    messages = await self.consumer.consume(200, 0.2)
                except KafkaException as exc:
                    if self._consume_failed(exc):
                        status = 3
                        break
                    continue
                self._identity()
                todo = self._processed(messages)
                if todo is not None:
                    await self._acommit(todo)
        finally:
            self.log.write("closing", flush=True)
            started = time.monotonic()
            try:
                await asyncio.wait_for(self.consumer.close(), self.args.close_timeout)
            except TimeoutError:
                self.log.write("error", flush=True, error="close timed out", fatal=False)
            took = time.monotonic() - started
            self.log.write("closed", flush=True, took=took)
            self.log.write("exit", flush=True, status=status)
            self.log.close()
        return status


if __name__ == "__main__":
    sys.exit(member_main(sys.argv[1:], AioMember, impls=("aio", "ckaio")))
