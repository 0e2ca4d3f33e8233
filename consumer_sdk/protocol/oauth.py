"""OAUTHBEARER tokens for the group connection: where they come from and when to renew them.

Three sources, chosen as librdkafka chooses them:

- ``oauth_cb`` (confluent-kafka's contract): ``oauth_cb(sasl.oauthbearer.config)`` returns
  ``(token, expiry_epoch_seconds[, principal[, extensions]])``;
- ``sasl.oauthbearer.method=oidc``: the OAuth 2.0 client-credentials grant against
  ``sasl.oauthbearer.token.endpoint.url``;
- ``enable.sasl.oauthbearer.unsecure.jwt=true``: an unsecured JWT (``alg: none``) built from
  ``sasl.oauthbearer.config`` (``principal=... [scope=...] [lifeSeconds=...]``), for
  development and tests against brokers running Kafka's unsecured validator.

A token is renewed once 80% of its lifetime has passed (librdkafka's rule), so each new
authentication (a new connection, or a KIP-368 re-authentication) presents a fresh one.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from consumer_sdk.errors import ConfigError
from consumer_sdk.protocol.sasl import SaslError

__all__ = [
    "OAuthError",
    "OAuthToken",
    "OAuthTokenProvider",
    "oauthbearer_initial_message",
    "parse_extensions",
    "unsecured_jwt",
]

OAuthCallback = Callable[[str | None], Any]

_REFRESH_AT = 0.8
_EXTENSION_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


class OAuthError(SaslError):
    """No OAUTHBEARER token could be obtained (the callback failed, the token endpoint
    refused, or the token is malformed). The message never includes a secret."""


@dataclass(frozen=True)
class OAuthToken:
    value: str = field(repr=False)
    expiry_s: float  # epoch seconds
    principal: str | None = None
    extensions: Mapping[str, str] = field(default_factory=dict)
    obtained_s: float = field(default_factory=time.time)

    def refresh_due(self, now_s: float) -> bool:
        return now_s >= self.obtained_s + (self.expiry_s - self.obtained_s) * _REFRESH_AT


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def jwt_claims(token: str) -> dict[str, Any]:
    """The (unverified) claims of a compact JWS; ``{}`` when ``token`` is not one."""
    parts = token.split(".")
    if len(parts) != 3:
        return {}
    try:
        claims = json.loads(_b64url_decode(parts[1]))
    except ValueError:
        return {}
    return claims if isinstance(claims, dict) else {}


def parse_extensions(text: str | None, key: str) -> dict[str, str]:
    """``"k1=v1,k2=v2"`` (``sasl.oauthbearer.extensions``) as a dict, with RFC 7628 checks."""
    result: dict[str, str] = {}
    if not text:
        return result
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        if not sep or not name:
            raise ConfigError(f"{key}: {item!r} is not key=value")
        _check_extension(name, value, key)
        result[name] = value
    return result


def _check_extension(name: str, value: str, where: str) -> None:
    if name == "auth" or not set(name) <= _EXTENSION_KEY_CHARS:
        raise ConfigError(
            f"{where}: invalid SASL extension name {name!r} (letters only, not 'auth')"
        )
    if any(not (0x20 <= ord(c) <= 0x7E or c in "\t\r\n") for c in value):
        raise ConfigError(f"{where}: SASL extension {name!r} has an invalid character")


def unsecured_jwt(config: str | None, now_s: float | None = None) -> OAuthToken:
    """librdkafka's unsecured token from ``sasl.oauthbearer.config``:
    ``principal=NAME [principalClaimName=sub] [scope=a,b] [scopeClaimName=scope]
    [lifeSeconds=3600] [extension_NAME=value ...]`` (space separated)."""
    key = "sasl.oauthbearer.config"
    settings: dict[str, str] = {}
    for item in (config or "").split():
        name, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"{key}: {item!r} is not key=value")
        settings[name] = value
    principal = settings.pop("principal", "")
    if not principal:
        raise ConfigError(f"{key}: the unsecured JWT needs principal=NAME (e.g. 'principal=admin')")
    principal_claim = settings.pop("principalClaimName", "sub")
    scope_claim = settings.pop("scopeClaimName", "scope")
    scope = [s for s in settings.pop("scope", "").split(",") if s]
    life = settings.pop("lifeSeconds", "3600")
    if not life.isdigit() or int(life) < 1:
        raise ConfigError(f"{key}: lifeSeconds must be a positive integer, got {life!r}")
    extensions: dict[str, str] = {}
    for name in list(settings):
        if name.startswith("extension_"):
            ext = name.removeprefix("extension_")
            _check_extension(ext, settings[name], key)
            extensions[ext] = settings.pop(name)
    if settings:
        raise ConfigError(f"{key}: unknown setting(s) {', '.join(sorted(settings))}")
    now = int(time.time() if now_s is None else now_s)
    expiry = now + int(life)
    claims: dict[str, Any] = {principal_claim: principal, "iat": now, "exp": expiry}
    if scope:
        claims[scope_claim] = scope
    header = _b64url(json.dumps({"alg": "none"}).encode())
    payload = _b64url(json.dumps(claims).encode())
    return OAuthToken(f"{header}.{payload}.", float(expiry), principal, extensions, float(now))


def oauthbearer_initial_message(token: OAuthToken) -> bytes:
    """The client's first OAUTHBEARER message (RFC 7628 section 3.1)."""
    ext = "".join(f"{k}={v}\x01" for k, v in token.extensions.items())
    return f"n,,\x01auth=Bearer {token.value}\x01{ext}\x01".encode()


def token_from_callback(result: Any) -> OAuthToken:
    """Validate what an ``oauth_cb`` returned (confluent-kafka's tuple)."""
    if not isinstance(result, tuple | list) or not 2 <= len(result) <= 4:
        raise OAuthError(
            "oauth_cb must return (token, expiry_epoch_seconds[, principal[, extensions]]), "
            f"got {type(result).__name__}"
        )
    value, expiry = result[0], result[1]
    principal = result[2] if len(result) > 2 else None
    extensions = result[3] if len(result) > 3 else None
    if not isinstance(value, str) or not value:
        raise OAuthError("oauth_cb: the token must be a non-empty string")
    if isinstance(expiry, bool) or not isinstance(expiry, int | float):
        raise OAuthError(f"oauth_cb: the expiry must be epoch seconds, got {expiry!r}")
    if principal is not None and not isinstance(principal, str):
        raise OAuthError("oauth_cb: the principal must be a string")
    ext: dict[str, str] = {}
    if extensions is not None:
        if not isinstance(extensions, Mapping):
            raise OAuthError("oauth_cb: the extensions must be a dict of str to str")
        for k, v in extensions.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise OAuthError("oauth_cb: the extensions must be a dict of str to str")
            try:
                _check_extension(k, v, "oauth_cb")
            except ConfigError as exc:
                raise OAuthError(str(exc)) from None
            ext[k] = v
    if float(expiry) <= time.time():
        raise OAuthError(f"oauth_cb: the token already expired (expiry {expiry})")
    return OAuthToken(value, float(expiry), principal or jwt_claims(value).get("sub"), ext)


@dataclass(frozen=True)
class OidcSettings:
    token_endpoint_url: str
    client_id: str
    client_secret: str = field(repr=False)
    scope: str | None = None
    extensions: Mapping[str, str] = field(default_factory=dict)
    ca_location: str | None = None
    ca_pem: str | None = field(default=None, repr=False)
    sub_claim: str = "sub"


def oidc_client_credentials(settings: OidcSettings, timeout_s: float = 30.0) -> OAuthToken:
    """One token from the OAuth 2.0 client-credentials grant (RFC 6749 section 4.4)."""
    # Imported here: http.client and email cost every process importing the member ~30 ms.
    import urllib.error
    import urllib.parse
    import urllib.request

    form = {"grant_type": "client_credentials"}
    if settings.scope:
        form["scope"] = settings.scope
    basic = base64.b64encode(f"{settings.client_id}:{settings.client_secret}".encode()).decode()
    request = urllib.request.Request(
        settings.token_endpoint_url,
        data=urllib.parse.urlencode(form).encode(),
        headers={
            "Authorization": f"Basic {basic}",
            "Content-Type": "application/x-www-form-urlencoded",
            "Accept": "application/json",
        },
        method="POST",
    )
    context = None
    if settings.token_endpoint_url.lower().startswith("https"):
        import ssl

        try:
            context = ssl.create_default_context(
                cafile=settings.ca_location, cadata=settings.ca_pem
            )
        except (OSError, ssl.SSLError) as exc:
            raise OAuthError(f"https.ca.location / https.ca.pem: cannot load: {exc}") from None
    where = f"token endpoint {settings.token_endpoint_url}"
    try:
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as response:
            body = response.read(1 << 20)
    except urllib.error.HTTPError as exc:
        detail = exc.read(500).decode("utf-8", "replace").strip()
        raise OAuthError(f"{where} answered HTTP {exc.code}: {detail or exc.reason}") from None
    except (urllib.error.URLError, OSError) as exc:
        raise OAuthError(f"{where} unreachable: {getattr(exc, 'reason', exc)}") from None
    try:
        document = json.loads(body)
        value = document["access_token"]
    except (ValueError, KeyError, TypeError):
        raise OAuthError(f"{where}: the response has no access_token") from None
    if not isinstance(value, str) or not value:
        raise OAuthError(f"{where}: the access_token is not a string")
    claims = jwt_claims(value)
    now = time.time()
    if isinstance(claims.get("exp"), int | float):
        expiry = float(claims["exp"])
    elif isinstance(document.get("expires_in"), int | float):
        expiry = now + float(document["expires_in"])
    else:
        raise OAuthError(f"{where}: the token has neither an exp claim nor expires_in")
    sub = claims.get(settings.sub_claim)
    return OAuthToken(
        value, expiry, sub if isinstance(sub, str) else None, dict(settings.extensions), now
    )


class OAuthTokenProvider:
    """The current token of one client, renewed at 80% of its lifetime (thread-safe)."""

    def __init__(self, fetch: Callable[[], OAuthToken], describe: str) -> None:
        self._fetch = fetch
        self.describe = describe
        self._lock = threading.Lock()
        self._token: OAuthToken | None = None
        self.fetches = 0

    @classmethod
    def from_callback(cls, callback: OAuthCallback, config: str | None) -> OAuthTokenProvider:
        def fetch() -> OAuthToken:
            try:
                result = callback(config)
            except Exception as exc:
                raise OAuthError(f"oauth_cb raised {type(exc).__name__}: {exc}") from None
            return token_from_callback(result)

        return cls(fetch, "oauth_cb")

    def token(self) -> OAuthToken:
        with self._lock:
            token = self._token
            if token is None or token.refresh_due(time.time()):
                token = self._fetch()
                self._token = token
                self.fetches += 1
            return token

    def invalidate(self) -> None:
        """Forget the cached token (the broker rejected it): the next use fetches a new one."""
        with self._lock:
            self._token = None
