"""Small helpers for tests that drive real clients against EmbeddedKafka or a real Kafka."""

from __future__ import annotations

import base64
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

logger = logging.getLogger("consumer_sdk.testing")

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.05,
    description: str = "condition",
) -> T:
    """Poll ``predicate`` until it returns a truthy value (returned), else AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.1f}s waiting for {description}")
        time.sleep(interval)


def close_client(client: Any, timeout: float = 10.0) -> bool:
    """Call ``client.close()`` in a daemon thread; True if it returned within ``timeout``.

    confluent-kafka's ``Consumer.close()`` can block forever (e.g. when the broker stops
    offering ConsumerGroupHeartbeat mid-session), so never call it unguarded in tests.
    """
    errors: list[BaseException] = []

    def run() -> None:
        try:
            client.close()
        except BaseException as exc:  # reported below, never lost in the thread
            errors.append(exc)

    thread = threading.Thread(target=run, name="close-client", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        logger.warning("%r.close() did not return within %.1fs", client, timeout)
        return False
    if errors:
        logger.warning("%r.close() raised %r", client, errors[0])
    return True


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports of 127.0.0.1 that were free a moment ago."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def kafka_uuid() -> str:
    """A random Kafka ``Uuid`` string (URL-safe base64, no padding), e.g. a cluster id.

    Never one starting with ``-`` (as Kafka's own ``Uuid.randomUuid``): the storage tool's
    argument parser would read it as an option (``--cluster-id: expected one argument``).
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text
