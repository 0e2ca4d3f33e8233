"""A blocking connection to one broker: framing, correlation ids, timeouts, TLS, SASL, ApiVersions.

One request is in flight per connection (a lock serializes callers). Any framing problem,
timeout or socket error closes the connection, so a late or garbled response can never be
read as the answer to a later request; the caller reconnects. A SASL session with a lifetime
(KIP-368) is renewed by re-authenticating on the same connection before it ends.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import random
import socket
import ssl
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TypeVar

from kio.static.protocol import RequestPayload, ResponsePayload

from consumer_sdk._version import __version__
from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.errors import (
    BrokerResponseError,
    KafkaTimeoutError,
    KafkaTransportError,
    ProtocolError,
)
from consumer_sdk.protocol import messages
from consumer_sdk.protocol.framing import (
    api_versions_error_code,
    decode_api_versions_v0,
    decode_response,
    encode_request,
    parse_frame_length,
)
from consumer_sdk.protocol.oauth import oauthbearer_initial_message
from consumer_sdk.protocol.sasl import (
    OAuthBearerClient,
    SaslError,
    SaslMechanismClient,
    mechanism_client,
)
from consumer_sdk.protocol.security import ConnectionSettings

__all__ = ["BrokerConnection", "TlsHandshakeError", "pick_version", "warm_schemas"]

log = logging.getLogger("consumer_sdk.protocol")

R = TypeVar("R", bound=ResponsePayload)

# Each version's kio schemas are imported when first sent: a connection uses one (two after
# a downgrade), and every process that opens one pays the import.
_API_VERSIONS = messages.Schemas("api_versions", (0, 1, 2, 3, 4))
_API_VERSIONS_MAX = max(_API_VERSIONS)


def warm_schemas() -> None:
    """Import what a member's first connection and requests use, ahead of them.

    The kio schemas are imported on first use (a process that imports the package but
    never connects, as Spark's planner and executors, pays nothing), which put 0.1-0.2 s of
    imports on a member's join path, between its subscription and its first heartbeat. The
    first member of a process runs this when it takes the network loop, before it can
    subscribe: first the newest versions (what a current broker negotiates), then the older
    ones (an older broker's or the mock cluster's, and the ApiVersions downgrade).
    """
    import encodings.idna  # noqa: F401  (socket.getaddrinfo encodes host names with it)

    _API_VERSIONS.load_newest()
    messages.warm_member_schemas(every_version=False)
    _API_VERSIONS.load_all()
    messages.warm_member_schemas(every_version=True)


class TlsHandshakeError(KafkaTransportError):
    """The TLS handshake failed (e.g. certificate verification): a configuration problem the
    application must hear about, not only a dropped connection. Still retried like one."""


def pick_version(
    broker_ranges: Mapping[int, tuple[int, int]], api_key: int, ours: Sequence[int]
) -> int | None:
    """The highest version in ``ours`` inside the broker's range for ``api_key``, if any."""
    rng = broker_ranges.get(api_key)
    if rng is None:
        return None
    lo, hi = rng
    usable = [v for v in ours if lo <= v <= hi]
    return max(usable) if usable else None


_FAMILIES = {"any": socket.AF_UNSPEC, "v4": socket.AF_INET, "v6": socket.AF_INET6}


def _connect(host: str, port: int, timeout_s: float, family: str) -> socket.socket:
    """A TCP connection to the first address of ``host`` that accepts it, among those of
    ``family`` (broker.address.family: any, v4 or v6), within ``timeout_s`` per attempt."""
    if family == "any":
        return socket.create_connection((host, port), timeout=timeout_s)
    error: OSError | None = None
    infos = socket.getaddrinfo(host, port, _FAMILIES[family], socket.SOCK_STREAM)
    for af, kind, proto, _, address in infos:
        sock = socket.socket(af, kind, proto)
        try:
            sock.settimeout(timeout_s)
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error or OSError(f"no {family} address for {host}")


class BrokerConnection:
    """A blocking, negotiated connection to one broker."""

    def __init__(
        self, host: str, port: int, settings: ConnectionSettings, node_id: int | None = None
    ) -> None:
        self.host = host
        self.port = port
        self.node_id = node_id
        self.settings = settings
        self._sock: socket.socket | None = None
        # Re-entrant: a KIP-368 re-authentication holds it across its whole exchange.
        self._lock = threading.RLock()
        self._correlation_id = 0
        self.api_versions: dict[int, tuple[int, int]] = {}
        self.api_versions_version: int | None = None
        self._reauth_at: float | None = None
        self.reauthentications = 0

    def __repr__(self) -> str:
        state = "open" if self._sock is not None else "closed"
        return f"BrokerConnection(node={self.node_id}, {self.host}:{self.port}, {state})"

    @property
    def is_open(self) -> bool:
        return self._sock is not None

    # -- lifecycle -------------------------------------------------------------------------

    def open(self, timeout_s: float | None = None) -> None:
        """Connect, wrap TLS, negotiate ApiVersions and authenticate; bounded by ``timeout_s``."""
        if timeout_s is None:
            timeout_s = self.settings.connection_setup_timeout_ms / 1000
        deadline = time.monotonic() + timeout_s
        self.close()
        try:
            sock = _connect(
                self.host, self.port, max(timeout_s, 0.001), self.settings.address_family
            )
        except OSError as exc:
            raise KafkaTransportError(
                f"connect to {self.host}:{self.port} failed: {exc.strerror or exc}"
            ) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.settings.uses_tls:
            try:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))
                sock = self.settings.ssl_context().wrap_socket(sock, server_hostname=self.host)
            except ssl.SSLCertVerificationError as exc:
                sock.close()
                raise TlsHandshakeError(
                    f"TLS handshake with {self.host}:{self.port} failed: certificate "
                    f"verification failed: {exc.verify_message}"
                ) from None
            except ssl.SSLError as exc:
                sock.close()
                raise TlsHandshakeError(
                    f"TLS handshake with {self.host}:{self.port} failed: {exc}"
                ) from None
            except OSError as exc:
                sock.close()
                raise KafkaTransportError(
                    f"TLS handshake with {self.host}:{self.port} failed: {exc}"
                ) from None
        self._sock = sock
        try:
            self._negotiate_api_versions(deadline)
            if self.settings.uses_sasl:
                self._authenticate(deadline)
        except BaseException:
            self.close()
            raise
        log.debug("connected to %s:%s (node %s)", self.host, self.port, self.node_id)

    def detach(self) -> tuple[socket.socket, int]:
        """Hand the open, negotiated socket over (to a multiplexing owner) with the next
        correlation id to use; this object is closed afterwards."""
        with self._lock:
            sock, self._sock = self._sock, None
            if sock is None:
                raise KafkaTransportError(f"connection to {self.host}:{self.port} is closed")
            return sock, (self._correlation_id + 1) & 0x7FFFFFFF

    @classmethod
    def adopt(
        cls,
        host: str,
        port: int,
        settings: ConnectionSettings,
        sock: socket.socket,
        next_correlation_id: int,
        api_versions: dict[int, tuple[int, int]],
    ) -> BrokerConnection:
        """Wrap a socket negotiated earlier (and handed over with `detach`) again, in
        blocking mode, e.g. to re-authenticate it."""
        conn = cls(host, port, settings)
        sock.setblocking(True)
        conn._sock = sock
        conn._correlation_id = (next_correlation_id - 1) & 0x7FFFFFFF
        conn.api_versions = api_versions
        return conn

    @property
    def reauth_at(self) -> float | None:
        """When (monotonic) the SASL session must be re-authenticated (KIP-368), if ever."""
        return self._reauth_at

    def reauthenticate(self, timeout_s: float | None = None) -> None:
        """Run the SASL exchange again on this connection now (KIP-368)."""
        budget = self.settings.connection_setup_timeout_ms / 1000
        if timeout_s is not None:
            budget = min(budget, max(timeout_s, 1.0))
        with self._lock:
            try:
                self._authenticate(time.monotonic() + budget)
            except BaseException:
                self.close()
                raise
        self.reauthentications += 1

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def __enter__(self) -> BrokerConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- requests --------------------------------------------------------------------------

    def version_for(self, api_key: int, ours: Sequence[int]) -> int | None:
        return pick_version(self.api_versions, api_key, ours)

    def request(
        self, payload: RequestPayload, response_type: type[R], timeout_s: float | None = None
    ) -> R:
        """Send ``payload`` and return its decoded response."""
        if self._reauth_at is not None:
            self._maybe_reauthenticate(timeout_s)
        frame, cid = self._roundtrip(payload, timeout_s)
        try:
            return decode_response(frame, response_type, cid)
        except ProtocolError:
            self.close()
            raise

    def _roundtrip(self, payload: RequestPayload, timeout_s: float | None) -> tuple[bytes, int]:
        if timeout_s is None:
            timeout_s = self.settings.socket_timeout_ms / 1000
        with self._lock:
            sock = self._sock
            if sock is None:
                raise KafkaTransportError(f"connection to {self.host}:{self.port} is closed")
            self._correlation_id = (self._correlation_id + 1) & 0x7FFFFFFF
            cid = self._correlation_id
            deadline = time.monotonic() + timeout_s
            name = type(payload).__name__
            try:
                data = encode_request(payload, cid, self.settings.client_id)
                sock.settimeout(max(timeout_s, 0.001))
                sock.sendall(data)
                size = parse_frame_length(
                    self._read_exact(sock, 4, deadline), self.settings.receive_message_max_bytes
                )
                frame = self._read_exact(sock, size, deadline)
            except TimeoutError:
                self.close()
                raise KafkaTimeoutError(
                    f"{name} to {self.host}:{self.port} timed out after {timeout_s:.3f}s"
                ) from None
            except (ProtocolError, KafkaTransportError):
                self.close()
                raise
            except ssl.SSLError as exc:
                # A TLS alert after the handshake: with TLS 1.3 a broker that requires a
                # client certificate (ssl.client.auth=required) refuses it only here.
                self.close()
                hint = ""
                if "CERTIFICATE" in str(exc.reason or exc).upper():
                    hint = (
                        " (does the listener require a client certificate? set "
                        "ssl.certificate.location/.pem or ssl.keystore.location)"
                    )
                raise TlsHandshakeError(
                    f"{name} to {self.host}:{self.port} failed: the broker ended the TLS "
                    f"session: {exc.reason or exc}{hint}"
                ) from None
            except OSError as exc:
                self.close()
                raise KafkaTransportError(
                    f"{name} to {self.host}:{self.port} failed: {exc.strerror or exc}"
                ) from None
            return frame, cid

    def _read_exact(self, sock: socket.socket, n: int, deadline: float) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError
            sock.settimeout(remaining)
            chunk = sock.recv(min(n - len(chunks), 1 << 20))
            if not chunk:
                if chunks:
                    raise ProtocolError(
                        f"truncated frame: connection to {self.host}:{self.port} closed after "
                        f"{len(chunks)} of {n} bytes"
                    )
                if n == 4:
                    raise KafkaTransportError(
                        f"connection to {self.host}:{self.port} closed by the broker"
                    )
                raise ProtocolError(f"truncated frame from {self.host}:{self.port}: body missing")
            chunks += chunk
        return bytes(chunks)

    # -- handshakes ------------------------------------------------------------------------

    def _negotiate_api_versions(self, deadline: float) -> None:
        version = _API_VERSIONS_MAX
        for _ in range(len(_API_VERSIONS) + 1):
            request_module, response_module = _API_VERSIONS[version]
            request_type: type[RequestPayload] = request_module.ApiVersionsRequest
            response_type: type[ResponsePayload] = response_module.ApiVersionsResponse
            payload = (
                request_type(
                    client_software_name="consumer-sdk", client_software_version=__version__
                )  # type: ignore[call-arg]
                if version >= 3
                else request_type()
            )
            frame, cid = self._roundtrip(payload, max(deadline - time.monotonic(), 0.001))
            try:
                error = api_versions_error_code(frame)
                if error == ErrorCode.UNSUPPORTED_VERSION:
                    version = self._downgrade_api_versions(frame, version)
                    continue
                if error != ErrorCode.NONE:
                    raise BrokerResponseError.from_code(error, "ApiVersions failed")
                response = decode_response(frame, response_type, cid)
            except ProtocolError:
                self.close()
                raise
            self.api_versions = {
                int(k.api_key): (int(k.min_version), int(k.max_version))
                for k in response.api_keys  # type: ignore[union-attr]
            }
            self.api_versions_version = version
            return
        raise ProtocolError(f"ApiVersions negotiation with {self.host}:{self.port} did not settle")

    def _downgrade_api_versions(self, frame: bytes, rejected: int) -> int:
        """The broker rejected our ApiVersions version: re-read the v0 body for its range.

        A body that does not parse as v0 (librdkafka's mock writes a non-standard one) makes
        us step down one version at a time instead.
        """
        if rejected == 0:
            raise ProtocolError(f"{self.host}:{self.port} rejected ApiVersions v0")
        try:
            body = decode_api_versions_v0(frame)
            ranges = {int(k.api_key): int(k.max_version) for k in body.api_keys}
            return min(ranges.get(18, 0), rejected - 1)
        except ProtocolError:
            return rejected - 1

    def _authenticate(self, deadline: float) -> None:
        """SaslHandshake + SaslAuthenticate; with a session lifetime from the broker (KIP-368),
        schedule the re-authentication that keeps this connection open past it."""
        # Imported here: only SASL connections use them.
        from kio.schema.sasl_authenticate.v1.request import SaslAuthenticateRequest
        from kio.schema.sasl_authenticate.v1.response import SaslAuthenticateResponse
        from kio.schema.sasl_handshake.v1.request import SaslHandshakeRequest
        from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse

        s = self.settings
        self._reauth_at = None
        handshake = self.request(
            SaslHandshakeRequest(mechanism=s.sasl_mechanism),
            SaslHandshakeResponse,
            max(deadline - time.monotonic(), 0.001),
        )
        if handshake.error_code != 0:
            offered = ", ".join(handshake.mechanisms) or "none"
            raise SaslError(
                f"broker {self.host}:{self.port} does not enable SASL mechanism "
                f"{s.sasl_mechanism} (it offers: {offered})"
            )
        mech: SaslMechanismClient
        if s.sasl_mechanism == "OAUTHBEARER":
            assert s.oauth is not None
            token = s.oauth.token()
            who = token.principal or f"the {s.oauth.describe} token"
            mech = OAuthBearerClient(oauthbearer_initial_message(token))
        else:
            username, password = s.credentials.get()
            if username is None or password is None:
                raise SaslError(f"SASL {s.sasl_mechanism}: no sasl.username / sasl.password set")
            who = username
            mech = mechanism_client(s.sasl_mechanism, username, password.reveal())
        message: bytes | None = mech.first()
        lifetime_ms = 0
        while message is not None:
            response = self.request(
                SaslAuthenticateRequest(auth_bytes=message),
                SaslAuthenticateResponse,
                max(deadline - time.monotonic(), 0.001),
            )
            if response.error_code != 0:
                detail = response.error_message or ErrorCode.name_of(response.error_code)
                if isinstance(mech, OAuthBearerClient):
                    assert s.oauth is not None
                    s.oauth.invalidate()
                    if mech.server_error:
                        detail = f"{detail} (server said: {mech.server_error})"
                raise SaslError(
                    f"SASL {s.sasl_mechanism} authentication as {who!r} failed: {detail}"
                )
            lifetime_ms = _lifetime_ms(response.session_lifetime)
            message = mech.step(response.auth_bytes)
            if message is None and isinstance(response.auth_bytes, bytes):
                break
        if lifetime_ms > 0:
            # Java's rule: re-authenticate at a random 85-95% of the session lifetime.
            fraction = 0.85 + 0.10 * random.random()
            self._reauth_at = time.monotonic() + lifetime_ms / 1000 * fraction
            log.debug(
                "%s:%s: SASL session lifetime %d ms; re-authenticating in %.1f s",
                self.host,
                self.port,
                lifetime_ms,
                self._reauth_at - time.monotonic(),
            )

    def _maybe_reauthenticate(self, timeout_s: float | None) -> None:
        """KIP-368: re-authenticate on this connection before the broker's session ends."""
        reauth_at = self._reauth_at
        if reauth_at is None or time.monotonic() < reauth_at:
            return
        budget = self.settings.connection_setup_timeout_ms / 1000
        if timeout_s is not None:
            budget = min(budget, max(timeout_s, 1.0))
        with self._lock:  # no other request may interleave with the exchange
            if self._reauth_at is None or self._sock is None:
                return
            try:
                self._authenticate(time.monotonic() + budget)
            except BaseException:
                self.close()
                raise
        self.reauthentications += 1
        log.debug("%s:%s: re-authenticated (KIP-368)", self.host, self.port)


def _lifetime_ms(value: object) -> int:
    if value is None:
        return 0
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    if isinstance(value, int | float | str):
        try:
            return int(value)
        except ValueError:
            return 0
    return 0
