"""The error boundary between the network and the member driver (loop thread).

Every error the transport meets is mapped here, once, into the `Failure` value the sans-IO
driver and its request managers decide on (kind, code, detail); the original exception
travels along as ``Failure.cause`` so that a blocking call can hand it to the application
unchanged. The driver's application-bound errors are turned into ``KafkaError`` here too.
Nothing else in the runtime reads an exception's class or message to decide what to do.
"""

from __future__ import annotations

from confluent_kafka import KafkaError

from consumer_sdk.errors import (
    KafkaException,
    KafkaTimeoutError,
    KafkaTransportError,
    ProtocolError,
    UnsupportedBrokerError,
)
from consumer_sdk.membership import ErrorEvent, Failure, FailureKind
from consumer_sdk.membership.requests import COMMIT_RETRIABLE, CommitResult
from consumer_sdk.protocol.connection import TlsHandshakeError
from consumer_sdk.protocol.sasl import SaslError
from consumer_sdk.runtime.offsets import CommitFailedError

__all__ = [
    "commit_error",
    "commit_failed",
    "event_error",
    "exception_of",
    "failure_of",
    "unreachable_error",
]


def failure_of(exc: KafkaException) -> Failure:
    """How the driver sees a request that got no answer. ``code`` is the code the application
    sees for it: SASL failures keep theirs, TLS handshake failures are ``_SSL`` (as
    confluent-kafka names them), the others keep the exception's."""
    error = exc.args[0]
    message = error.str()
    code = int(error.code())
    if isinstance(exc, UnsupportedBrokerError):
        return Failure(FailureKind.UNSUPPORTED_VERSION_CLIENT, message, code, exc)
    if isinstance(exc, KafkaTimeoutError):
        return Failure(FailureKind.TIMEOUT, message, code, exc)
    if isinstance(exc, SaslError):
        return Failure(FailureKind.AUTHENTICATION, message, code, exc)
    if isinstance(exc, TlsHandshakeError):
        return Failure(FailureKind.AUTHENTICATION, message, KafkaError._SSL, exc)
    if isinstance(exc, KafkaTransportError | ProtocolError):
        return Failure(FailureKind.DISCONNECTED, message, code, exc)
    kind = FailureKind.RETRIABLE if error.retriable() else FailureKind.FATAL
    return Failure(kind, message, code, exc)


def exception_of(failure: Failure) -> KafkaException:
    """The exception a blocking call raises for ``failure``: the transport's own when there
    was one, else a timeout (the driver gave up waiting, e.g. for a coordinator)."""
    if isinstance(failure.cause, KafkaException):
        return failure.cause
    if failure.kind is FailureKind.TIMEOUT:
        return KafkaTimeoutError(failure.message)
    return KafkaTransportError(failure.message)


def unreachable_error(code: int, message: str, transport: bool) -> KafkaError:
    """The ``error_cb`` error for a coordinator that cannot be found: a broker's error code
    as is; for a request that got no answer, a timeout counts as a transport error."""
    if transport and code == KafkaError._TIMED_OUT:
        code = KafkaError._TRANSPORT
    return KafkaError(code, message, retriable=True)


def event_error(event: ErrorEvent) -> KafkaError:
    """The ``KafkaError`` of an error the membership reports (fatal, or retriable)."""
    return KafkaError(event.code, event.message, fatal=event.fatal, retriable=not event.fatal)


def commit_error(result: CommitResult) -> KafkaError:
    """The ``on_commit`` error of a failed commit."""
    code = result.error_code
    return KafkaError(code, result.error_message, retriable=code in COMMIT_RETRIABLE)


def commit_failed(result: CommitResult) -> CommitFailedError:
    """The exception a failed synchronous commit raises (built from its code and detail)."""
    code = result.error_code
    retriable = code in COMMIT_RETRIABLE and not result.dropped  # a deleted topic: final
    return CommitFailedError(code, result.detail, retriable=retriable)
