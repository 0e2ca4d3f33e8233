"""All of a consumer's output goes through Python ``logging``: without the ``logger`` setting,
the fetcher's librdkafka log lines go to the ``consumer_sdk.librdkafka`` logger, never raw
to stderr (librdkafka's default)."""

from __future__ import annotations

import logging

import pytest

from consumer_sdk import Consumer
from consumer_sdk.observability.log_routing import LIBRDKAFKA_LOGGER
from consumer_sdk.testing import wait_until


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_librdkafka_logs_go_through_logging_not_stderr(capfd: pytest.CaptureFixture[str]) -> None:
    handler = _Records()
    LIBRDKAFKA_LOGGER.addHandler(handler)
    level = LIBRDKAFKA_LOGGER.level
    LIBRDKAFKA_LOGGER.setLevel(logging.DEBUG)
    # Nothing listens on port 1: the fetcher's librdkafka logs the failed connection.
    consumer = Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "logs-g"})
    try:
        consumer.subscribe(["logs-topic"])

        def logged() -> bool:
            consumer.poll(0.1)
            return any("127.0.0.1:1" in r.getMessage() for r in handler.records)

        wait_until(logged, timeout=30, interval=0, description="librdkafka's connect failure")
    finally:
        consumer.close(timeout=1)
        LIBRDKAFKA_LOGGER.removeHandler(handler)
        LIBRDKAFKA_LOGGER.setLevel(level)
    failure = next(r for r in handler.records if "127.0.0.1:1" in r.getMessage())
    assert failure.levelno >= logging.WARNING
    err = capfd.readouterr().err
    raw = [line for line in err.splitlines() if line.startswith("%")]
    assert raw == [], raw
