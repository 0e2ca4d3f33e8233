"""A consumer process for the kill -9 test of `AIOConsumer`'s auto-commit.

Usage: ``python -m tests.runtime.aio_autocommit_member BOOTSTRAP GROUP TOPIC``. Reads with
``async for`` (auto-commit every 20 ms), prints the offset of every record it was handed
(one line, flushed) and then spends 3 ms on it, so that records taken from
librdkafka wait in the fetcher's buffer across many auto-commits. The test kills it with
SIGKILL mid-stream.
"""

from __future__ import annotations

import asyncio
import sys

from consumer_sdk.aio import AIOConsumer


async def main(bootstrap: str, group: str, topic: str) -> None:
    conf = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": True,
        "auto.commit.interval.ms": 20,
    }
    async with AIOConsumer(conf) as consumer:
        await consumer.subscribe([topic])
        async for msg in consumer:
            if msg.error() is None:
                print(msg.offset(), flush=True)
                await asyncio.sleep(0.003)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:]))
