"""A non-blocking broker connection with many requests in flight, matched by correlation id.

`MuxConnection` is driven by one network thread (see
`consumer_sdk.runtime.netloop.NetworkLoop`): the thread calls `MuxConnection.submit`
to queue requests, and `on_readable` / `flush` when
the selector says so. Setting the connection up (TCP connect, TLS handshake, ApiVersions, SASL)
reuses the blocking `BrokerConnection`, so every
security setting behaves exactly as for a dedicated connection; the negotiated socket is then
handed over, switched to non-blocking mode, and shared.

As with the blocking connection, a framing error, a timed-out request or a socket error closes
the connection and fails every request on it: a late or garbled response can never be read as
the answer to another request. Requests get their results through callbacks, on the network
thread.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import ssl
import struct
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from kio.static.protocol import ResponsePayload

from consumer_sdk.domain import HeartbeatRequest, HeartbeatResponse
from consumer_sdk.errors import (
    KafkaException,
    KafkaTimeoutError,
    KafkaTransportError,
    ProtocolError,
    UnsupportedBrokerError,
)
from consumer_sdk.protocol import messages as m
from consumer_sdk.protocol.connection import BrokerConnection, pick_version
from consumer_sdk.protocol.framing import (
    FrameReader,
    decode_response,
    encode_request,
    peek_correlation_id,
)
from consumer_sdk.protocol.heartbeat_codec import HeartbeatEncoder
from consumer_sdk.protocol.security import ConnectionSettings

__all__ = ["Call", "Done", "HeartbeatCall", "KioCall", "MuxConnection", "VersionCache"]

log = logging.getLogger("consumer_sdk.protocol")

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

#: ``done(result, error)``: exactly one of them is None.
Done = Callable[[Any, KafkaException | None], None]

_RECV_BYTES = 256 * 1024
_CID = struct.Struct(">i")  # a response frame's correlation id (see `peek_correlation_id`)
_HB_API = m.API_CONSUMER_GROUP_HEARTBEAT
_HB_PREFIX = struct.Struct(">ihhi")  # frame length, api key, api version, correlation id


class VersionCache:
    """The version to use per API key on one negotiated connection (looked up once)."""

    __slots__ = ("_chosen", "api_versions")

    def __init__(self, api_versions: dict[int, tuple[int, int]]) -> None:
        self.api_versions = api_versions
        self._chosen: dict[int, int | None] = {}

    def pick(self, api_key: int) -> int | None:
        try:
            return self._chosen[api_key]
        except KeyError:
            version = pick_version(self.api_versions, api_key, m.SUPPORTED_VERSIONS[api_key])
            self._chosen[api_key] = version
            return version


class Call(Protocol[T_co]):
    """One request: how to encode it for a negotiated connection and decode its answer."""

    api_key: int
    client_id: str | None

    def encode(self, versions: VersionCache, correlation_id: int) -> bytes: ...

    def decode(self, frame: bytes, correlation_id: int) -> T_co: ...


class KioCall(Generic[T]):
    """A request built with `consumer_sdk.protocol.messages` (``build(version)``), its
    response converted to a domain type by ``convert``."""

    def __init__(
        self,
        api_key: int,
        build: Callable[[int], m.Call],
        convert: Callable[[Any], T],
        client_id: str | None,
    ) -> None:
        self.api_key = api_key
        self.client_id = client_id
        self._build = build
        self._convert = convert
        self._response_type: type[ResponsePayload] | None = None

    def encode(self, versions: VersionCache, correlation_id: int) -> bytes:
        version = versions.pick(self.api_key)
        if version is None:
            raise UnsupportedBrokerError(
                f"the broker supports no version of API {self.api_key} that this SDK implements"
            )
        payload, self._response_type = self._build(version)
        return encode_request(payload, correlation_id, self.client_id)

    def decode(self, frame: bytes, correlation_id: int) -> T:
        assert self._response_type is not None
        return self._convert(decode_response(frame, self._response_type, correlation_id))


_HB_RESPONSES: dict[int, type[ResponsePayload]] = {}
# Heartbeat responses already decoded, by version and by their bytes after the correlation
# id: a member's answers repeat byte for byte while nothing changes (same epoch, interval, no
# assignment), and equal bytes decode to an equal, immutable response. Small frames only (the
# plain answers), and bounded: cleared when full, so a member costs one full decode after that.
_HB_DECODED: dict[int, dict[bytes, HeartbeatResponse]] = {0: {}, 1: {}}
_HB_DECODED_MAX_BYTES = 256
_HB_DECODED_LIMIT = 8192


def _hb_response_type(version: int) -> type[ResponsePayload]:
    rt = _HB_RESPONSES.get(version)
    if rt is None:
        _, rt = m.heartbeat_call(HeartbeatRequest("g", "m", 0), version)
        _HB_RESPONSES[version] = rt
    return rt


class HeartbeatCall:
    """A ConsumerGroupHeartbeat encoded by the shared fast encoder."""

    __slots__ = ("_body", "_encoder", "_version", "_waiter", "client_id", "request")

    api_key = m.API_CONSUMER_GROUP_HEARTBEAT

    def __init__(
        self, request: HeartbeatRequest, encoder: HeartbeatEncoder, client_id: str | None
    ) -> None:
        self.request = request
        self.client_id = client_id
        self._encoder = encoder
        self._version = 0
        # The frame after the correlation id, for `_version` (a call may be sent again, one
        # send at a time: the host reuses it for the next heartbeat of the same request).
        self._body = b""
        # Its waiter, for `MuxConnection.send_heartbeat` (one send at a time: reused).
        self._waiter: _Waiter | None = None

    def encode(self, versions: VersionCache, correlation_id: int) -> bytes:
        chosen = versions._chosen
        version = chosen[_HB_API] if _HB_API in chosen else versions.pick(_HB_API)
        if version is None:
            raise UnsupportedBrokerError(
                "the broker does not support ConsumerGroupHeartbeat (API 68): the KIP-848 "
                "consumer group protocol needs Apache Kafka 4.0+"
            )
        body = self._body
        if not body or version != self._version:
            self._version = version
            try:
                body = self._body = self._encoder.encode_body(self.request, version, self.client_id)
            except ValueError as exc:  # e.g. a regex subscription on a v0-only broker
                raise UnsupportedBrokerError(str(exc)) from None
        return _HB_PREFIX.pack(8 + len(body), _HB_API, version, correlation_id) + body

    def decode(self, frame: bytes, correlation_id: int) -> HeartbeatResponse:
        cache = _HB_DECODED.get(self._version)
        rest = frame[4:]
        if cache is not None:
            known = cache.get(rest)
            # (the correlation id read in C: `peek_correlation_id` costs a call per answer)
            if known is not None and _CID.unpack_from(frame, 0)[0] == correlation_id:
                return known
        response = m.heartbeat_from_kio(
            decode_response(frame, _hb_response_type(self._version), correlation_id)
        )
        if cache is not None and len(rest) <= _HB_DECODED_MAX_BYTES:
            if len(cache) >= _HB_DECODED_LIMIT:
                cache.clear()
            cache[rest] = response
        return response


@dataclass(slots=True)
class _Waiter:
    call: Call[Any]
    done: Done
    deadline: float
    correlation_id: int = -1


class MuxConnection:
    """One shared connection to ``host:port`` with ``settings``; see the module docstring.

    ``connect(settings, host, port, timeout)`` runs the blocking setup off the network thread
    (the owner decides where); the owner reports its outcome with `connected` or
    `connect_failed`.
    """

    NEW, CONNECTING, READY, REAUTHENTICATING, CLOSED = (
        "NEW",
        "CONNECTING",
        "READY",
        "REAUTHENTICATING",
        "CLOSED",
    )

    def __init__(self, host: str, port: int, settings: ConnectionSettings) -> None:
        self.host = host
        self.port = port
        self.settings = settings
        self.state = self.NEW
        self.sock: socket.socket | None = None
        self.versions = VersionCache({})
        self.failures = 0  # consecutive failed connection attempts
        self.retry_at = 0.0
        #: KIP-368: when the SASL session must be renewed (monotonic), and whether new requests
        #: are held back until the requests in flight are answered and the exchange ran.
        self.reauth_at: float | None = None
        self.paused = False
        self.generation = 0  # bumped per established socket (stale timers check it)
        #: Bumped (``changes[0] += 1``) at every change of ``state``; the owner may share one
        #: list among its connections: while it holds, no connection changed state or socket.
        self.changes: list[int] = [0]
        self.reauthentications = 0
        # Where the connection's own log records go (the ``logger`` of the member that opened
        # it); None: the consumer_sdk loggers.
        self.log_target: Any = None
        self._cid = 0
        self._queued: deque[_Waiter] = deque()  # waiting for the connection
        self._in_flight: dict[int, _Waiter] = {}
        self._out = bytearray()
        self._reader = FrameReader(settings.receive_message_max_bytes)
        #: Called with the socket just before it is closed (the owner unregisters it).
        self.before_close: Callable[[socket.socket], None] | None = None

    def __repr__(self) -> str:
        return (
            f"MuxConnection({self.host}:{self.port}, {self.state}, "
            f"in_flight={len(self._in_flight)}, queued={len(self._queued)})"
        )

    @property
    def wants_write(self) -> bool:
        return bool(self._out)

    @property
    def idle(self) -> bool:
        return not self._queued and not self._in_flight

    def waiters(self) -> Sequence[_Waiter]:
        return [*self._queued, *self._in_flight.values()]

    # -- requests -----------------------------------------------------------------------

    def submit(self, call: Call[Any], done: Done, deadline: float) -> None:
        """Queue ``call``; ``done`` runs once with its result or error (network thread)."""
        waiter = _Waiter(call, done, deadline)
        if type(call) is HeartbeatCall:
            call._waiter = waiter  # (see `send_heartbeat`)
        if self.state == self.READY and not self.paused:
            # `_write(waiter)`, inline (once per request)
            cid = self._cid = (self._cid + 1) & 0x7FFFFFFF
            waiter.correlation_id = cid
            try:
                data = call.encode(self.versions, cid)
            except KafkaException as exc:
                _complete(waiter, None, exc)
                return
            self._in_flight[cid] = waiter
            self._out += data
        else:
            self._queued.append(waiter)

    def send_heartbeat(self, call: HeartbeatCall, done: Done, deadline: float) -> None:
        """`submit` for a heartbeat call sent again once its last send was answered (the
        host's plain heartbeat, while its request holds): its encoded body and its waiter
        serve again, with a new correlation id. Else (not ready, another version, the waiter
        still in flight or another ``done``) as `submit` (network thread)."""
        version = self.versions._chosen.get(_HB_API)
        waiter = call._waiter
        if (
            self.state is not self.READY
            or self.paused
            or version is None
            or version != call._version
            or not call._body
            or waiter is None
            or waiter.done is not done
            or self._in_flight.get(waiter.correlation_id) is waiter
        ):
            self.submit(call, done, deadline)
            return
        waiter.deadline = deadline
        cid = self._cid = (self._cid + 1) & 0x7FFFFFFF
        waiter.correlation_id = cid
        self._in_flight[cid] = waiter
        body = call._body
        self._out += _HB_PREFIX.pack(8 + len(body), _HB_API, version, cid) + body

    def _write(self, waiter: _Waiter) -> None:
        self._cid = (self._cid + 1) & 0x7FFFFFFF
        waiter.correlation_id = self._cid
        try:
            data = waiter.call.encode(self.versions, self._cid)
        except KafkaException as exc:
            _complete(waiter, None, exc)
            return
        self._in_flight[self._cid] = waiter
        self._out += data

    def expire(self, now: float) -> float | None:
        """Fail queued requests past their deadline; a timed-out request in flight closes the
        connection. Returns the earliest remaining deadline."""
        for w in [w for w in self._queued if w.deadline <= now]:
            self._queued.remove(w)
            _complete(
                w,
                None,
                KafkaTimeoutError(
                    f"{type(w.call).__name__} to {self.host}:{self.port} timed out waiting for "
                    "the connection"
                ),
            )
        late = [w for w in self._in_flight.values() if w.deadline <= now]
        if late:
            self.close(
                KafkaTimeoutError(
                    f"request to {self.host}:{self.port} timed out (correlation id "
                    f"{late[0].correlation_id}); closing the connection"
                )
            )
            return None
        deadlines = [w.deadline for w in self.waiters()]
        return min(deadlines) if deadlines else None

    # -- connection setup -----------------------------------------------------------------

    def start_connecting(self) -> None:
        self.state = self.CONNECTING
        self.changes[0] += 1

    def connected(self, conn: BrokerConnection) -> None:
        """The blocking setup (or re-authentication) succeeded: take its socket over and send
        what is queued."""
        if self.state not in (self.CONNECTING, self.REAUTHENTICATING):
            conn.close()
            return
        reauthenticated = self.state == self.REAUTHENTICATING
        self.reauth_at = conn.reauth_at
        sock, self._cid = conn.detach()
        self._cid = (self._cid - 1) & 0x7FFFFFFF
        sock.setblocking(False)
        self.sock = sock
        self.versions = VersionCache(conn.api_versions)
        self.state = self.READY
        self.paused = False
        self.failures = 0
        self.generation += 1
        self.changes[0] += 1
        if reauthenticated:
            self.reauthentications += 1
        else:
            self._reader = FrameReader(self.settings.receive_message_max_bytes)
        queued, self._queued = self._queued, deque()
        for w in queued:
            self._write(w)

    @property
    def ready_for_reauth(self) -> bool:
        """Paused for KIP-368 and quiet: nothing in flight or unwritten, no partial frame."""
        return (
            self.paused
            and self.state == self.READY
            and self.sock is not None
            and not self._in_flight
            and not self._out
            and not self._reader.pending
        )

    def take_for_reauth(self) -> BrokerConnection:
        """Hand the quiet socket to a blocking connection for the SASL exchange (the caller
        has stopped watching it); `connected` takes it back."""
        sock = self.sock
        assert sock is not None and self.ready_for_reauth
        self.sock = None
        self.state = self.REAUTHENTICATING
        self.changes[0] += 1
        next_cid = (self._cid + 1) & 0x7FFFFFFF
        return BrokerConnection.adopt(
            self.host, self.port, self.settings, sock, next_cid, self.versions.api_versions
        )

    def connect_failed(self, exc: KafkaException, backoff_s: float, now: float) -> None:
        self.failures += 1
        self.retry_at = now + backoff_s
        self.state = self.NEW
        self.changes[0] += 1
        queued, self._queued = self._queued, deque()
        for w in queued:
            _complete(w, None, exc)

    # -- socket events ----------------------------------------------------------------------

    def flush(self) -> None:
        """Write as much of the pending output as the socket takes."""
        sock = self.sock
        if sock is None or not self._out:
            return
        try:
            sent = sock.send(self._out)
        except (BlockingIOError, ssl.SSLWantWriteError, ssl.SSLWantReadError):
            return
        except OSError as exc:
            self.close(
                KafkaTransportError(
                    f"send to {self.host}:{self.port} failed: {exc.strerror or exc}"
                )
            )
            return
        del self._out[:sent]

    def on_readable(self) -> None:
        """Read what arrived and complete the requests it answers."""
        sock = self.sock
        if sock is None:
            return
        frames: list[bytes] = []
        try:
            while True:
                try:
                    data = sock.recv(_RECV_BYTES)
                except (BlockingIOError, ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    break
                if not data:
                    if self._reader.pending:  # closed in the middle of a response
                        raise ProtocolError(
                            f"truncated frame: connection to {self.host}:"
                            f"{self.port} closed after {self._reader.pending} "
                            "bytes of a response"
                        )
                    raise KafkaTransportError(
                        f"connection to {self.host}:{self.port} closed by the broker"
                    )
                frames.extend(self._reader.feed(data))
                if len(data) < _RECV_BYTES and not (
                    isinstance(sock, ssl.SSLSocket) and sock.pending()
                ):
                    break
        except KafkaException as exc:
            self._deliver(frames)
            self.close(exc)
            return
        except OSError as exc:
            self._deliver(frames)
            self.close(
                KafkaTransportError(
                    f"read from {self.host}:{self.port} failed: {exc.strerror or exc}"
                )
            )
            return
        self._deliver(frames)

    def _deliver(self, frames: list[bytes]) -> None:
        for frame in frames:
            if len(frame) >= 4:  # `peek_correlation_id`, inline (once per answer)
                cid = _CID.unpack_from(frame, 0)[0]
            else:
                try:
                    cid = peek_correlation_id(frame)
                except ProtocolError as exc:
                    self.close(exc)
                    return
            waiter = self._in_flight.pop(cid, None)
            if waiter is None:
                where = f"{self.host}:{self.port}"
                self.close(
                    ProtocolError(
                        f"response with correlation id {cid} from {where} "
                        "does not match the awaited request (none in flight "
                        "has that id)"
                    )
                )
                return
            call = waiter.call
            if type(call) is HeartbeatCall:
                # A plain answer seen before: `call.decode`'s cache lookup, inline (once per
                # heartbeat; ``cid`` is the frame's own, so its check there holds).
                cache = _HB_DECODED.get(call._version)
                known = None if cache is None else cache.get(frame[4:])
                if known is not None:
                    try:
                        waiter.done(known, None)
                    except Exception:  # one member's bug must not break the shared connection
                        log.exception("request completion callback failed")
                    continue
            try:
                result = call.decode(frame, cid)
            except ProtocolError as exc:
                _complete(waiter, None, exc)
                self.close(exc)
                return
            try:  # `_complete(waiter, result, None)`, inline (once per answer)
                waiter.done(result, None)
            except Exception:  # one member's bug must not break the shared connection
                log.exception("request completion callback failed")

    def close(self, error: KafkaException | None = None) -> None:
        """Close the socket and fail every request on this connection with ``error``."""
        sock, self.sock = self.sock, None
        if sock is not None:
            if self.before_close is not None:
                self.before_close(sock)
            with contextlib.suppress(OSError):
                sock.close()
        was_ready = self.state == self.READY
        self.state = self.NEW if error is not None else self.CLOSED
        self.changes[0] += 1
        self.paused = False
        self._out.clear()
        exc = error or KafkaTransportError(f"connection to {self.host}:{self.port} closed")
        if was_ready and error is not None:
            log.info("connection to %s:%s closed: %s", self.host, self.port, exc.args[0].str())
        waiters = self.waiters()
        self._queued.clear()
        self._in_flight.clear()
        for w in waiters:
            _complete(w, None, exc)


def _complete(waiter: _Waiter, result: Any, error: KafkaException | None) -> None:
    try:
        waiter.done(result, error)
    except Exception:  # one member's bug must not break the shared connection
        log.exception("request completion callback failed")
