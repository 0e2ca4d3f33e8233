"""The ``logger`` configuration key: one consumer's log records go to the application's logger.

confluent-kafka sends a client's librdkafka log lines to the ``logging.Logger`` given as
``logger``. The SDK does the same for its own records: everything the consumer's background
thread logs (connections, authentication, heartbeats, rebalances, commits) is handed to that
logger instead of the ``consumer_sdk.*`` loggers. Records are matched by emitting thread, so
two consumers in one process each keep their own logger. On the shared network loop, whose
thread runs many members, a member's work runs inside `routed_logs` (the records of shared
connections, which belong to no one member, stay with the ``consumer_sdk`` loggers).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator

__all__ = [
    "LIBRDKAFKA_LOGGER",
    "enable_routing",
    "route_thread_logs",
    "routed_logs",
    "unroute_thread_logs",
]

#: Where the fetcher's librdkafka log lines go when no ``logger`` is configured (librdkafka
#: would print them to stderr); confluent-kafka maps their syslog levels to logging's.
LIBRDKAFKA_LOGGER = logging.getLogger("consumer_sdk.librdkafka")

_SDK_LOGGERS = (
    "consumer_sdk",
    "consumer_sdk.runtime",
    "consumer_sdk.protocol",
    "consumer_sdk.membership",
)


_Target = logging.Logger | logging.LoggerAdapter[logging.Logger]


class _ThreadRouter(logging.Filter):
    """A filter on the SDK's loggers: a routed thread's record goes to its target logger and
    is not emitted through the ``consumer_sdk`` hierarchy."""

    def __init__(self) -> None:
        super().__init__()
        self.routes: dict[threading.Thread, _Target] = {}
        self._local = threading.local()

    def filter(self, record: logging.LogRecord) -> bool:
        target = getattr(self._local, "target", None) or self.routes.get(threading.current_thread())
        if target is None or getattr(self._local, "busy", False):
            return True
        logger = target.logger if isinstance(target, logging.LoggerAdapter) else target
        self._local.busy = True  # a target inside consumer_sdk.* must not loop back here
        try:
            if logger.isEnabledFor(record.levelno):
                logger.handle(record)
        finally:
            self._local.busy = False
        return False


_router = _ThreadRouter()
_lock = threading.Lock()


def _install() -> None:
    names = set(_SDK_LOGGERS) | {
        name for name in logging.root.manager.loggerDict if name.startswith("consumer_sdk.")
    }
    for name in names:
        sdk_logger = logging.getLogger(name)
        if _router not in sdk_logger.filters:
            sdk_logger.addFilter(_router)


def route_thread_logs(
    thread: threading.Thread, logger: logging.Logger | logging.LoggerAdapter[logging.Logger]
) -> None:
    """Send the SDK's records emitted on ``thread`` to ``logger`` (until unrouted)."""
    with _lock:
        _install()
        _router.routes[thread] = logger


def enable_routing() -> None:
    """Install the router on the SDK's loggers (for `routed_logs`)."""
    with _lock:
        _install()


@contextlib.contextmanager
def routed_logs(logger: _Target | None) -> Iterator[None]:
    """Send the SDK's records emitted by this thread inside the block to ``logger`` (None:
    no routing; call `enable_routing` once first). Used by the shared network loop around
    one member's work."""
    if logger is None:
        yield
        return
    local = _router._local
    previous = getattr(local, "target", None)
    local.target = logger
    try:
        yield
    finally:
        local.target = previous


def unroute_thread_logs(thread: threading.Thread) -> None:
    with _lock:
        _router.routes.pop(thread, None)
