"""Exceptions users already know: ``confluent_kafka.KafkaError`` codes inside ``KafkaException``.

Every error the SDK raises is a `KafkaException` (or a subclass) whose ``args[0]`` is a
``KafkaError`` with the broker's code (e.g. ``KafkaError.FENCED_MEMBER_EPOCH``) or a local one
(``_TRANSPORT``, ``_TIMED_OUT``, ``_BAD_MSG``, ...). Errors are mapped here, at the boundary.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from consumer_sdk.error_codes import ErrorCode

__all__ = [
    "BrokerResponseError",
    "ConfigError",
    "KafkaError",
    "KafkaException",
    "KafkaTimeoutError",
    "KafkaTransportError",
    "ProtocolError",
    "UnsupportedBrokerError",
    "kafka_error",
]

# Broker codes the reference clients treat as retriable for group/offset APIs.
RETRIABLE_CODES = frozenset(
    {
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.UNSTABLE_OFFSET_COMMIT,
        ErrorCode.UNKNOWN_TOPIC_ID,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.FENCED_LEADER_EPOCH,
    }
)


def kafka_error(
    code: int, message: str | None = None, *, fatal: bool = False, retriable: bool | None = None
) -> KafkaError:
    """A ``KafkaError`` for ``code``; the broker's own name is prefixed to ``message``."""
    if retriable is None:
        retriable = code in RETRIABLE_CODES
    text = message if message else ErrorCode.name_of(code)
    return KafkaError(code, text, fatal=fatal, retriable=retriable)


class BrokerResponseError(KafkaException):
    """The broker answered with a non-zero error code."""

    @classmethod
    def from_code(
        cls, code: int, message: str | None = None, *, fatal: bool = False
    ) -> BrokerResponseError:
        name = ErrorCode.name_of(code)
        text = f"{name}: {message}" if message else name
        return cls(kafka_error(code, text, fatal=fatal))

    @property
    def code(self) -> int:
        return int(self.args[0].code())


class KafkaTransportError(KafkaException):
    """The connection failed or was closed (``KafkaError._TRANSPORT``)."""

    def __init__(self, message: str) -> None:
        super().__init__(KafkaError(KafkaError._TRANSPORT, message, retriable=True))


class KafkaTimeoutError(KafkaException):
    """A request or operation did not complete in time (``KafkaError._TIMED_OUT``)."""

    def __init__(self, message: str) -> None:
        super().__init__(KafkaError(KafkaError._TIMED_OUT, message, retriable=True))


class ProtocolError(KafkaException):
    """A frame could not be decoded (truncated, garbled, oversized, wrong correlation id).

    The connection it arrived on has been closed; the caller reconnects.
    """

    def __init__(self, message: str) -> None:
        super().__init__(KafkaError(KafkaError._BAD_MSG, message, retriable=True))


class UnsupportedBrokerError(KafkaException):
    """The broker lacks an API or version the KIP-848 member needs (a pre-4.0 broker)."""

    def __init__(self, message: str) -> None:
        super().__init__(KafkaError(KafkaError.UNSUPPORTED_VERSION, message, fatal=True))


class ConfigError(KafkaException, ValueError):
    """Invalid configuration; the message names the key and the reason."""

    def __init__(self, message: str) -> None:
        super().__init__(KafkaError(KafkaError._INVALID_ARG, message))

    def __str__(self) -> str:
        return str(self.args[0].str())
