"""A consumer process for the kill -9 test of ``store_offsets``.

Usage: ``python -m tests.runtime.store_member IMPL BOOTSTRAP GROUP TOPIC STORE_BELOW``
(IMPL: ``sdk`` or ``ck``). Auto-commit is on with ``enable.auto.offset.store=false``; the
offset of every record is printed (one JSON line, flushed) and stored only while it is below
STORE_BELOW, so the group's committed offset stops at STORE_BELOW although later records were
polled. The test kills the process with SIGKILL and starts another one.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main(argv: list[str]) -> None:
    impl, bootstrap, group, topic, store_below = argv
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": True,
        "auto.commit.interval.ms": 200,
        "enable.auto.offset.store": False,
    }
    consumer: Any
    if impl == "ck":
        import confluent_kafka

        consumer = confluent_kafka.Consumer({**conf, "group.protocol": "consumer"})
    else:
        from consumer_sdk import Consumer

        consumer = Consumer(conf)
    consumer.subscribe([topic])
    limit = int(store_below)
    while True:
        msg = consumer.poll(0.2)
        if msg is None or msg.error() is not None:
            continue
        print(json.dumps({"p": msg.partition(), "o": msg.offset()}), flush=True)
        if msg.offset() < limit:
            consumer.store_offsets(msg)


if __name__ == "__main__":
    main(sys.argv[1:])
