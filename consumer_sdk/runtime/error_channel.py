"""Which way a group member's error reaches the application, as confluent-kafka's does.

librdkafka hands *consumer errors* (the group or a subscribed topic not authorized, a fatal
group error as ``_FATAL``, ``max.poll.interval.ms`` exceeded) to the application as an event
from ``poll()``/``consume()``: a ``Message`` whose ``error()`` is set, whether or not an
``error_cb`` is configured. *Client errors* (transport, authentication, TLS) go to
``error_cb``, and are only logged when there is none. `tests/realkafka/test_error_channel.py`
checks each case next to confluent-kafka on the real broker.
"""

from __future__ import annotations

import logging
from typing import Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, KafkaError, Message

from consumer_sdk.error_codes import ErrorCode

__all__ = ["client_error", "error_event", "fatal_event", "for_error_cb"]

log = logging.getLogger("consumer_sdk.runtime")

# Errors of the connections themselves: error_cb (else logged), never a poll() event.
_CLIENT_ERRORS = frozenset(
    {
        KafkaError._TRANSPORT,
        KafkaError._AUTHENTICATION,
        KafkaError._SSL,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError._RESOLVE,
        int(ErrorCode.SASL_AUTHENTICATION_FAILED),
    }
)


def client_error(code: int) -> bool:
    """True for an error confluent-kafka gives to ``error_cb``, not to ``poll()``."""
    return code in _CLIENT_ERRORS


def for_error_cb(error: KafkaError) -> KafkaError:
    """``error`` as librdkafka names it for ``error_cb``: a failed SASL handshake is
    ``_AUTHENTICATION`` (the broker's SASL_AUTHENTICATION_FAILED is in the text)."""
    if error.code() == ErrorCode.SASL_AUTHENTICATION_FAILED:
        return KafkaError(KafkaError._AUTHENTICATION, error.str())
    return error


def fatal_event(error: KafkaError) -> KafkaError:
    """The ``_FATAL`` event ``poll()`` returns for a fatal group error (as librdkafka's, the
    event's own ``fatal()`` is false; the cause is in its text)."""
    return KafkaError(KafkaError._FATAL, f"Fatal error: {error.name()}: {error.str()}")


class _ErrorEvent:
    """An error event shaped like ``confluent_kafka.Message``, for confluent-kafka releases
    whose ``Message`` cannot be instantiated (before 2.13)."""

    __slots__ = ("_error",)

    def __init__(self, error: KafkaError) -> None:
        self._error = error

    def error(self) -> KafkaError:
        return self._error

    def topic(self) -> None:
        return None

    def partition(self) -> None:
        return None

    def offset(self) -> None:
        return None

    def key(self) -> None:
        return None

    def value(self) -> None:
        return None

    def headers(self) -> None:
        return None

    def leader_epoch(self) -> None:
        return None

    def latency(self) -> None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (TIMESTAMP_NOT_AVAILABLE, 0)

    def __len__(self) -> int:
        return 0

    def __repr__(self) -> str:
        return f"Message(error={self._error!r})"


def error_event(error: KafkaError) -> Message:
    """A ``Message`` carrying ``error`` (an error event, as ``poll()`` returns them)."""
    try:
        return Message(error=error)
    except TypeError:  # confluent-kafka < 2.13: Message cannot be instantiated
        event: Any = _ErrorEvent(error)
        return event  # type: ignore[no-any-return]
