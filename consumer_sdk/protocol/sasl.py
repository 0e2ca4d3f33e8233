"""SASL PLAIN, SCRAM-SHA-256/512 and OAUTHBEARER client exchanges (RFC 4616, 5802/7677, 7628).

Each mechanism is a small step function over opaque server bytes, so the connection
drives it through SaslAuthenticate without knowing the mechanism.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Callable

from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.errors import KafkaException, kafka_error


class SaslError(KafkaException):
    """Authentication failed; the message never includes the password."""

    def __init__(self, message: str) -> None:
        super().__init__(kafka_error(ErrorCode.SASL_AUTHENTICATION_FAILED, message, fatal=True))


class SaslMechanismClient:
    """One authentication exchange. ``step(server_bytes)`` returns the next client message,
    or ``None`` when the exchange is complete."""

    name: str

    def first(self) -> bytes:
        raise NotImplementedError

    def step(self, server: bytes) -> bytes | None:
        raise NotImplementedError


class PlainClient(SaslMechanismClient):
    name = "PLAIN"

    def __init__(self, username: str, password: str) -> None:
        self._message = b"\0" + username.encode() + b"\0" + password.encode()

    def first(self) -> bytes:
        return self._message

    def step(self, server: bytes) -> bytes | None:
        return None


def _saslname(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


class ScramClient(SaslMechanismClient):
    def __init__(
        self,
        mechanism: str,
        username: str,
        password: str,
        nonce_factory: Callable[[], str] | None = None,
    ) -> None:
        self.name = mechanism
        self._hash = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
        self._username = username
        self._password = password
        self._nonce = (nonce_factory or (lambda: secrets.token_urlsafe(24)))()
        self._bare = f"n={_saslname(username)},r={self._nonce}"
        self._server_signature: bytes | None = None
        self._done = False

    def _hmac(self, key: bytes, msg: bytes) -> bytes:
        return hmac.new(key, msg, self._hash).digest()

    def first(self) -> bytes:
        return ("n,," + self._bare).encode()

    def step(self, server: bytes) -> bytes | None:
        if self._server_signature is None:
            return self._final_message(server)
        if self._done:
            return None
        attrs = _parse_attrs(server)
        if "e" in attrs:
            raise SaslError(f"{self.name}: server rejected the credentials: {attrs['e']}")
        verifier = base64.b64decode(attrs.get("v", ""))
        if not hmac.compare_digest(verifier, self._server_signature):
            raise SaslError(f"{self.name}: server signature mismatch (possible impostor broker)")
        self._done = True
        return None

    def _final_message(self, server: bytes) -> bytes:
        attrs = _parse_attrs(server)
        if "e" in attrs:
            raise SaslError(f"{self.name}: server error: {attrs['e']}")
        try:
            nonce, salt, iterations = attrs["r"], base64.b64decode(attrs["s"]), int(attrs["i"])
        except (KeyError, ValueError) as exc:
            raise SaslError(f"{self.name}: malformed server-first-message") from exc
        if not nonce.startswith(self._nonce) or iterations < 1:
            raise SaslError(f"{self.name}: invalid server nonce or iteration count")
        salted = hashlib.pbkdf2_hmac(self._hash, self._password.encode(), salt, iterations)
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        without_proof = f"c=biws,r={nonce}"
        auth_message = f"{self._bare},{server.decode()},{without_proof}".encode()
        signature = self._hmac(stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        self._server_signature = self._hmac(self._hmac(salted, b"Server Key"), auth_message)
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()


def _parse_attrs(data: bytes) -> dict[str, str]:
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise SaslError("SCRAM: server message is not UTF-8") from exc
    attrs: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if sep:
            attrs[key] = value
    return attrs


class OAuthBearerClient(SaslMechanismClient):
    """RFC 7628: send the bearer token; a server challenge is an error report (JSON), which
    the client acknowledges with a single 0x01 before the broker fails the exchange."""

    name = "OAUTHBEARER"

    def __init__(self, initial: bytes) -> None:
        self._initial = initial
        self.server_error: str | None = None

    def first(self) -> bytes:
        return self._initial

    def step(self, server: bytes) -> bytes | None:
        if not server:
            return None
        if self.server_error is not None:
            raise SaslError("OAUTHBEARER: unexpected server message after an error report")
        self.server_error = bytes(server).decode("utf-8", "replace")
        return b"\x01"


def mechanism_client(mechanism: str, username: str, password: str) -> SaslMechanismClient:
    if mechanism == "PLAIN":
        return PlainClient(username, password)
    if mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        return ScramClient(mechanism, username, password)
    raise SaslError(f"unsupported SASL mechanism {mechanism!r}")
