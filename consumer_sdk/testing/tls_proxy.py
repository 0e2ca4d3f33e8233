"""A TLS-terminating, optionally SASL-authenticating proxy in front of one Kafka broker.

For end-to-end security tests against EmbeddedKafka (whose mock brokers speak plaintext
only): clients connect with TLS (and SASL) to the proxy, which forwards plaintext to the
broker. It answers SaslHandshake and SaslAuthenticate itself (PLAIN, SCRAM-SHA-256 and
SCRAM-SHA-512 for a set of known users), and rewrites the broker addresses advertised in
Metadata and FindCoordinator responses through a shared ``advertise`` map, so every connection
a client opens after bootstrapping also goes through a proxy (front each broker with its own
proxy and give them all the same map).

`make_certificates` creates a throwaway CA and a server certificate for given host
names with the ``openssl`` command line tool.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime
import hashlib
import hmac
import importlib
import logging
import secrets
import shutil
import socket
import ssl
import struct
import subprocess
import threading
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32, i64Timedelta

from consumer_sdk.testing._proxy import ProxyBase, recv_exact

__all__ = ["Certificates", "TlsProxy", "make_certificates"]

log = logging.getLogger("consumer_sdk.testing")

API_METADATA = 3
API_FIND_COORDINATOR = 10
API_SASL_HANDSHAKE = 17
API_API_VERSIONS = 18
API_SASL_AUTHENTICATE = 36
_API_MODULES = {
    API_METADATA: "metadata",
    API_FIND_COORDINATOR: "find_coordinator",
    API_SASL_HANDSHAKE: "sasl_handshake",
    API_SASL_AUTHENTICATE: "sasl_authenticate",
    API_API_VERSIONS: "api_versions",
}
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_UNSUPPORTED_SASL_MECHANISM = 33
_ILLEGAL_SASL_STATE = 34
_SASL_AUTHENTICATION_FAILED = 58

Address = tuple[str, int]


# -- certificates ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the CA certificate (PEM): what clients trust
    cert: Path  # the server certificate (PEM), signed by the CA
    key: Path  # the server's private key (PEM, unencrypted)


def make_certificates(
    directory: Path | str, hosts: Sequence[str] = ("localhost", "127.0.0.1"), name: str = "server"
) -> Certificates:
    """A new CA and a server certificate for ``hosts`` (DNS names or IP addresses)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError("make_certificates needs the openssl command line tool")
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca, ca_key = d / f"{name}-ca.pem", d / f"{name}-ca.key"
    cert, key, csr, ext = (
        d / f"{name}.pem",
        d / f"{name}.key",
        d / f"{name}.csr",
        d / f"{name}.ext",
    )
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)

    run(
        "req",
        "-x509",
        *ec,
        "-keyout",
        str(ca_key),
        "-out",
        str(ca),
        "-days",
        "2",
        "-subj",
        f"/CN=consumer-sdk test CA {name}",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    )
    run("req", *ec, "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={hosts[0]}")
    sans = ",".join(
        f"IP:{h}" if h.replace(".", "").isdigit() or ":" in h else f"DNS:{h}" for h in hosts
    )
    ext.write_text(
        f"subjectAltName={sans}\nbasicConstraints=CA:FALSE\n"
        "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
    )
    run(
        "x509",
        "-req",
        "-in",
        str(csr),
        "-CA",
        str(ca),
        "-CAkey",
        str(ca_key),
        "-CAcreateserial",
        "-out",
        str(cert),
        "-days",
        "2",
        "-extfile",
        str(ext),
    )
    return Certificates(ca, cert, key)


# -- Kafka framing helpers ------------------------------------------------------------------


def _schema(api_key: int, version: int, kind: str) -> type[Any] | None:
    try:
        module = importlib.import_module(f"kio.schema.{_API_MODULES[api_key]}.v{version}.{kind}")
    except (KeyError, ImportError):
        return None
    name = {
        API_METADATA: "Metadata",
        API_FIND_COORDINATOR: "FindCoordinator",
        API_SASL_HANDSHAKE: "SaslHandshake",
        API_SASL_AUTHENTICATE: "SaslAuthenticate",
        API_API_VERSIONS: "ApiVersions",
    }[api_key]
    cls: type[Any] = getattr(module, f"{name}{kind.capitalize()}")
    return cls


def _decode_request(body: bytes, api_key: int, version: int) -> Any:
    request_type = _schema(api_key, version, "request")
    if request_type is None:
        raise ValueError(f"no schema for API {api_key} v{version}")
    _, offset = entity_reader(request_type.__header_schema__)(body, 0)
    request, _ = entity_reader(request_type)(body, offset)
    return request


def _encode_response(response: Any, correlation_id: int) -> bytes:
    import io

    header_type = type(response).__header_schema__
    buf = io.BytesIO()
    entity_writer(header_type)(buf, header_type(correlation_id=i32(correlation_id)))
    entity_writer(type(response))(buf, response)
    data = buf.getvalue()
    return struct.pack(">i", len(data)) + data


def _read_frame(sock: socket.socket) -> bytes | None:
    prefix = recv_exact(sock, 4)
    if prefix is None:
        return None
    (length,) = struct.unpack(">i", prefix)
    if length < 0 or length > 100 * 1024 * 1024:
        return None
    return recv_exact(sock, length)


# -- SASL server side ---------------------------------------------------------------------------


class _ScramServer:
    def __init__(self, mechanism: str, users: Mapping[str, str]) -> None:
        self._hash = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
        self._users = users
        self._iterations = 4096
        self._salt = secrets.token_bytes(16)
        self._state = "first"
        self._client_first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._salted = b""
        self.user: str | None = None

    def _h(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self._hash).digest()

    def step(self, data: bytes) -> tuple[bytes | None, str | None]:
        """``(server message, None)`` to go on, ``(final message or None, error)``."""
        text = data.decode("utf-8", "replace")
        if self._state == "first":
            if not text.startswith("n,,"):
                return None, "malformed client-first-message"
            self._client_first_bare = text[3:]
            attrs = dict(p.split("=", 1) for p in self._client_first_bare.split(",") if "=" in p)
            user = attrs.get("n", "").replace("=2C", ",").replace("=3D", "=")
            self.user = user
            password = self._users.get(user)
            # An unknown user gets a made-up salt: the failure comes at the proof, as in Kafka.
            self._salted = hashlib.pbkdf2_hmac(
                self._hash,
                (password or secrets.token_hex(8)).encode(),
                self._salt,
                self._iterations,
            )
            self._nonce = attrs.get("r", "") + secrets.token_urlsafe(18)
            salt = base64.b64encode(self._salt).decode()
            self._server_first = f"r={self._nonce},s={salt},i={self._iterations}"
            self._state = "final"
            return self._server_first.encode(), None
        if self._state != "final":
            return None, "unexpected SCRAM message"
        self._state = "done"
        without_proof, _, proof_b64 = text.rpartition(",p=")
        attrs = dict(p.split("=", 1) for p in without_proof.split(",") if "=" in p)
        if attrs.get("r") != self._nonce:
            return None, "nonce mismatch"
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        client_key = self._h(self._salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        signature = self._h(stored_key, auth_message)
        try:
            proof = base64.b64decode(proof_b64)
        except ValueError:
            return None, "malformed proof"
        recovered = bytes(a ^ b for a, b in zip(proof, signature, strict=False))
        if self.user not in self._users or not hmac.compare_digest(
            hashlib.new(self._hash, recovered).digest(), stored_key
        ):
            return None, "Authentication failed during authentication due to invalid credentials"
        server_signature = self._h(self._h(self._salted, b"Server Key"), auth_message)
        return f"v={base64.b64encode(server_signature).decode()}".encode(), None


class _SaslSession:
    def __init__(self, users: Mapping[str, str], mechanisms: Sequence[str]) -> None:
        self.users = users
        self.mechanisms = tuple(mechanisms)
        self.mechanism: str | None = None
        self.authenticated = False
        self._scram: _ScramServer | None = None

    def handshake(self, request: Any) -> Any:
        mechanism = str(request.mechanism)
        ok = mechanism in self.mechanisms
        if ok:
            self.mechanism = mechanism
        return {
            "error_code": 0 if ok else _UNSUPPORTED_SASL_MECHANISM,
            "mechanisms": self.mechanisms,
        }

    def authenticate(self, auth_bytes: bytes) -> tuple[bytes, int, str | None]:
        if self.mechanism is None:
            return b"", _ILLEGAL_SASL_STATE, "SaslAuthenticate before SaslHandshake"
        if self.mechanism == "PLAIN":
            parts = auth_bytes.split(b"\0")
            if len(parts) == 3:
                user, password = parts[1].decode("utf-8", "replace"), parts[2]
                expected = self.users.get(user)
                if expected is not None and hmac.compare_digest(expected.encode(), password):
                    self.authenticated = True
                    return b"", 0, None
            return (
                b"",
                _SASL_AUTHENTICATION_FAILED,
                ("Authentication failed: Invalid username or password"),
            )
        if self._scram is None:
            self._scram = _ScramServer(self.mechanism, self.users)
        message, error = self._scram.step(auth_bytes)
        if error is not None:
            return b"", _SASL_AUTHENTICATION_FAILED, error
        if self._scram._state == "done":
            self.authenticated = True
        return message or b"", 0, None


# -- the proxy ------------------------------------------------------------------------------


class TlsProxy(ProxyBase):
    """``TlsProxy(("127.0.0.1", broker_port), certs=..., sasl_users={"alice": "pw"})``.

    Listens on ``host`` (default 127.0.0.1). With ``certs`` it terminates TLS; with
    ``sasl_users`` it requires SASL authentication (``mechanisms``) before forwarding
    anything but ApiVersions. ``advertise`` maps upstream broker addresses to the addresses
    clients should use; this proxy adds its own upstream -> listen address to it.
    """

    def __init__(
        self,
        upstream: Address,
        *,
        certs: Certificates | None = None,
        sasl_users: Mapping[str, str] | None = None,
        mechanisms: Sequence[str] = SASL_MECHANISMS,
        advertise: MutableMapping[Address, Address] | None = None,
        host: str = "127.0.0.1",
        advertised_host: str | None = None,
    ) -> None:
        super().__init__(host, "tls-proxy")
        self.upstream = upstream
        self.host = advertised_host or host
        self.advertise: MutableMapping[Address, Address] = (
            advertise if advertise is not None else {}
        )
        self.advertise[upstream] = (self.host, self.port)
        self._ssl: ssl.SSLContext | None = None
        if certs is not None:
            self._ssl = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._ssl.load_cert_chain(str(certs.cert), str(certs.key))
        self._users = dict(sasl_users) if sasl_users is not None else None
        self._mechanisms = tuple(mechanisms)
        self.connections = 0
        self.handshake_failures: list[str] = []
        self.authenticated: list[tuple[str, str]] = []  # (mechanism, user)
        self.auth_failures: list[tuple[str, str]] = []
        self.rewritten = 0
        self._start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def _on_accept(self, client: socket.socket) -> None:
        threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        client: socket.socket = raw
        upstream: socket.socket | None = None
        try:
            if self._ssl is not None:
                raw.settimeout(10)
                try:
                    client = self._ssl.wrap_socket(raw, server_side=True)
                except (ssl.SSLError, OSError) as exc:
                    with self._lock:
                        self.handshake_failures.append(str(exc))
                    raw.close()
                    return
                client.settimeout(None)
            upstream = socket.create_connection(self.upstream, timeout=5)
            upstream.settimeout(None)
            with self._lock:
                self.connections += 1
            self._track(client, upstream)
            pending: dict[int, tuple[int, int]] = {}
            write_lock = threading.Lock()
            threading.Thread(
                target=self._pump_responses,
                args=(client, upstream, pending, write_lock),
                daemon=True,
            ).start()
            self._pump_requests(client, upstream, pending, write_lock)
        except OSError:
            pass
        finally:
            self._close_pair(client, *(s for s in (upstream,) if s is not None))

    def _pump_requests(
        self,
        client: socket.socket,
        upstream: socket.socket,
        pending: dict[int, tuple[int, int]],
        write_lock: threading.Lock,
    ) -> None:
        session = _SaslSession(self._users, self._mechanisms) if self._users is not None else None
        while True:
            body = _read_frame(client)
            if body is None or len(body) < 8:
                return
            api_key, version, cid = struct.unpack_from(">hhi", body, 0)
            if session is not None and api_key in (API_SASL_HANDSHAKE, API_SASL_AUTHENTICATE):
                reply = self._sasl(session, body, api_key, version, cid)
                with write_lock:
                    client.sendall(reply)
                continue
            if session is not None and not session.authenticated and api_key != API_API_VERSIONS:
                log.warning("tls proxy: API %d before SASL authentication; closing", api_key)
                return
            pending[cid] = (api_key, version)
            upstream.sendall(struct.pack(">i", len(body)) + body)

    def _sasl(
        self, session: _SaslSession, body: bytes, api_key: int, version: int, cid: int
    ) -> bytes:
        request = _decode_request(body, api_key, version)
        response_type = _schema(api_key, version, "response")
        assert response_type is not None
        from kio.schema.errors import ErrorCode

        if api_key == API_SASL_HANDSHAKE:
            fields = session.handshake(request)
            response = response_type(
                error_code=ErrorCode(fields["error_code"]), mechanisms=fields["mechanisms"]
            )
        else:
            auth, code, message = session.authenticate(bytes(request.auth_bytes))
            values: dict[str, Any] = {
                "error_code": ErrorCode(code),
                "error_message": message,
                "auth_bytes": auth,
            }
            if version >= 1:
                values["session_lifetime"] = i64Timedelta.parse(datetime.timedelta(0))
            response = response_type(**values)
            mech = session.mechanism or "?"
            user = (session._scram.user if session._scram else None) or _plain_user(
                request.auth_bytes
            )
            with self._lock:
                if code != 0:
                    self.auth_failures.append((mech, user))
                elif session.authenticated:
                    self.authenticated.append((mech, user))
        return _encode_response(response, cid)

    def _pump_responses(
        self,
        client: socket.socket,
        upstream: socket.socket,
        pending: dict[int, tuple[int, int]],
        write_lock: threading.Lock,
    ) -> None:
        try:
            while True:
                body = _read_frame(upstream)
                if body is None or len(body) < 4:
                    return
                (cid,) = struct.unpack_from(">i", body, 0)
                api_key, version = pending.pop(cid, (-1, -1))
                frame = struct.pack(">i", len(body)) + body
                if api_key in (API_METADATA, API_FIND_COORDINATOR):
                    frame = self._rewrite(body, api_key, version, cid) or frame
                elif api_key == API_API_VERSIONS and self._users is not None and version <= 2:
                    frame = self._offer_sasl(body, version, cid) or frame
                with write_lock:
                    client.sendall(frame)
        except OSError:
            pass
        finally:
            self._close_pair(client, upstream)

    def _offer_sasl(self, body: bytes, version: int, cid: int) -> bytes | None:
        """Add SaslHandshake and SaslAuthenticate to the broker's ApiVersions (the mock has
        neither; librdkafka only authenticates with a broker that lists them)."""
        response_type = _schema(API_API_VERSIONS, version, "response")
        if response_type is None:
            return None
        try:
            _, offset = entity_reader(response_type.__header_schema__)(body, 0)
            response, _ = entity_reader(response_type)(body, offset)
        except Exception:
            return None
        if int(response.error_code) != 0:
            return None
        key_type = type(response.api_keys[0])
        keys = [k for k in response.api_keys if int(k.api_key) not in (17, 36)]
        for key, high in ((API_SASL_HANDSHAKE, 1), (API_SASL_AUTHENTICATE, 2)):
            keys.append(key_type(api_key=i16(key), min_version=i16(0), max_version=i16(high)))
        return _encode_response(dataclasses.replace(response, api_keys=tuple(keys)), cid)

    def _map(self, host: str, port: int) -> Address:
        return self.advertise.get((host, int(port)), (host, int(port)))

    def _rewrite(self, body: bytes, api_key: int, version: int, cid: int) -> bytes | None:
        response_type = _schema(api_key, version, "response")
        if response_type is None:
            return None
        try:
            _, offset = entity_reader(response_type.__header_schema__)(body, 0)
            response, _ = entity_reader(response_type)(body, offset)
        except Exception:
            log.warning("tls proxy: cannot decode %s v%d; passing it on", response_type, version)
            return None
        if api_key == API_METADATA:
            brokers = []
            for b in response.brokers:
                host, port = self._map(b.host, int(b.port))
                brokers.append(dataclasses.replace(b, host=host, port=i32(port)))
            response = dataclasses.replace(response, brokers=tuple(brokers))
        elif hasattr(response, "coordinators"):
            coordinators = []
            for c in response.coordinators:
                host, port = self._map(c.host, int(c.port))
                coordinators.append(dataclasses.replace(c, host=host, port=i32(port)))
            response = dataclasses.replace(response, coordinators=tuple(coordinators))
        else:
            host, port = self._map(response.host, int(response.port))
            response = dataclasses.replace(response, host=host, port=i32(port))
        with self._lock:
            self.rewritten += 1
        return _encode_response(response, cid)

    def __enter__(self) -> TlsProxy:
        return self


def _plain_user(auth_bytes: bytes) -> str:
    parts = bytes(auth_bytes).split(b"\0")
    return parts[1].decode("utf-8", "replace") if len(parts) == 3 else "?"
