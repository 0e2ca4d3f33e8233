"""One group member in its own process, for the convergence benchmark.

argv: kind (sdk | confluent) bootstrap group topic. Prints JSON lines to stdout:
{"ev": "constructed"} once the consumer exists, {"ev": "ready", "t": ...} after subscribing
(on a "subscribe" line from stdin), {"ev": "owned", "t": ..., "owned": [...]} after every
callback. Exits when stdin closes (graceful close) or when killed (a crash).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

Callback = Callable[[Any, list[Any]], None]


def ownership_callbacks(emit: Callable[[dict[str, Any]], None]) -> tuple[Callback, Callback]:
    """``on_assign`` and ``on_revoke`` (also ``on_lost``) keeping the partitions owned and
    emitting ``{"ev": "owned", "owned": [...]}`` after each."""
    owned: set[int] = set()

    def on_assign(_: Any, parts: list[Any]) -> None:
        owned.update(p.partition for p in parts)
        emit({"ev": "owned", "owned": sorted(owned)})

    def on_revoke(_: Any, parts: list[Any]) -> None:
        owned.difference_update(p.partition for p in parts)
        emit({"ev": "owned", "owned": sorted(owned)})

    return on_assign, on_revoke


def main() -> None:
    kind, bootstrap, group, topic = sys.argv[1:5]
    log_dir = os.environ.get("BENCH_MEMBER_LOG_DIR")
    if log_dir:  # a timestamped trace per member, to see where a scenario's time goes
        logging.basicConfig(
            filename=os.path.join(log_dir, f"{kind}-{os.getpid()}.log"),
            level=logging.DEBUG,
            format="%(created).3f %(threadName)s %(name)s %(levelname)s %(message)s",
        )
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest"}
    lock = threading.Lock()

    def emit(event: dict[str, Any]) -> None:
        event["t"] = time.monotonic()
        logging.getLogger("bench").debug("event %s", event)
        with lock:
            sys.stdout.write(json.dumps(event) + "\n")
            sys.stdout.flush()

    on_assign, on_revoke = ownership_callbacks(emit)
    if kind == "sdk":
        from consumer_sdk import Consumer

        consumer: Any = Consumer(conf)
    else:
        import confluent_kafka

        extra = {"debug": "cgrp", "logger": logging.getLogger("librdkafka")} if log_dir else {}
        consumer = confluent_kafka.Consumer({**conf, "group.protocol": "consumer", **extra})
    # Members started together subscribe together: process start-up (imports) varies by
    # hundreds of ms and would otherwise stagger their joins.
    emit({"ev": "constructed"})
    if sys.stdin.readline().strip() != "subscribe":
        consumer.close()
        return
    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
    emit({"ev": "ready"})
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.is_set():
        consumer.poll(0.05)
    consumer.close()
    emit({"ev": "closed"})


if __name__ == "__main__":
    main()
