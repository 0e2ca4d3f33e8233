"""An asyncio service consuming with consumer_sdk.aio: start, consume, commit after
processing, and a graceful shutdown on SIGTERM (the last offsets committed, the leave sent).

python examples/asyncio_service.py                  # EmbeddedKafka with 500 records
python examples/asyncio_service.py HOST:PORT TOPIC  # a real Kafka 4.x cluster; stop with SIGTERM
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator
from typing import Any

from consumer_sdk import KafkaException, TopicPartition
from consumer_sdk.aio import AIOConsumer


class Service:
    """The consuming part of a service: processes records and commits what it processed."""

    def __init__(self, consumer: AIOConsumer) -> None:
        self.consumer = consumer
        self.processed = 0
        self.stopping = asyncio.Event()

    async def process(self, value: bytes) -> None:
        await asyncio.sleep(0)  # the service's own async work (a database write, a request)

    async def on_revoke(self, consumer: AIOConsumer, partitions: list[TopicPartition]) -> None:
        # Runs on the event loop; the partitions move only after this returns.
        with contextlib.suppress(KafkaException):  # nothing processed since the last commit
            await consumer.commit(asynchronous=False)
        print(f"revoked {[p.partition for p in partitions]}", flush=True)

    async def run(self) -> None:
        while not self.stopping.is_set():
            batch = await self.consumer.consume(500, timeout=0.5)
            for msg in batch:
                if msg.error() is not None:
                    print(f"error: {msg.error()}", flush=True)
                    continue
                await self.process(msg.value() or b"")
                self.processed += 1
                # enable.auto.offset.store=false: only processed records are committed
                self.consumer.store_offsets(msg)
            if batch:
                await self.consumer.commit(asynchronous=True)
                print(f"processed {self.processed} records", flush=True)


@contextlib.asynccontextmanager
async def lifespan(bootstrap: str, topic: str) -> AsyncIterator[Service]:
    """Start the consumer and its task; on exit stop it, commit and leave the group."""
    config: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": "example-asyncio-service",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
    }
    consumer = AIOConsumer(config)
    service = Service(consumer)
    await consumer.subscribe([topic], on_revoke=service.on_revoke)
    task = asyncio.create_task(service.run())
    try:
        yield service
    finally:
        service.stopping.set()
        await task  # the batch in hand is processed and committed
        await consumer.close()  # on_revoke commits, then the leave heartbeat is sent
        print(f"closed: member {consumer.state.name.lower()} after the leave", flush=True)


async def main(bootstrap: str, topic: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    async with lifespan(bootstrap, topic) as service:
        print("service started", flush=True)
        await stop.wait()
        print(f"SIGTERM: shutting down after {service.processed} records", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 2:
        asyncio.run(main(sys.argv[1], sys.argv[2]))
    else:
        from consumer_sdk.testing import EmbeddedKafka

        with EmbeddedKafka(brokers=1, heartbeat_interval_ms=500) as kafka:
            kafka.create_topic("orders", partitions=3)
            kafka.produce("orders", [f"order-{i}".encode() for i in range(500)])
            print(f"EmbeddedKafka at {kafka.bootstrap_servers}; stop with SIGTERM", flush=True)
            asyncio.run(main(kafka.bootstrap_servers, "orders"))
