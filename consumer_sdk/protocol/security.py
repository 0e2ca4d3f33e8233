"""Connection settings with librdkafka's key names: timeouts, TLS (files, PEM strings, PKCS#12)
and SASL (PLAIN, SCRAM, OAUTHBEARER).

Secrets are held in `Secret`, whose ``repr``/``str`` never show the value.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from consumer_sdk.errors import ConfigError
from consumer_sdk.protocol.oauth import (
    OAuthTokenProvider,
    OidcSettings,
    oidc_client_credentials,
    parse_extensions,
    unsecured_jwt,
)

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]
AddressFamily = Literal["any", "v4", "v6"]

_PROTOCOLS: tuple[str, ...] = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")


class Secret:
    """A credential whose value never appears in ``repr``, ``str``, logs or exceptions."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and other._value == self._value

    def __hash__(self) -> int:
        return hash(("Secret", self._value))

    def __reduce__(self) -> tuple[Any, ...]:
        return (Secret, (self._value,))


class SaslCredentials:
    """The SASL PLAIN/SCRAM user of one client; ``set`` (``set_sasl_credentials``) takes
    effect at the next authentication, existing connections stay as they are."""

    __slots__ = ("_lock", "_password", "_username")

    def __init__(self, username: str | None, password: Secret | None) -> None:
        self._lock = threading.Lock()
        self._username = username
        self._password = password

    def get(self) -> tuple[str | None, Secret | None]:
        with self._lock:
            return self._username, self._password

    def set(self, username: str, password: str) -> None:
        if not isinstance(username, str) or not isinstance(password, str):
            raise TypeError("set_sasl_credentials(username, password) takes two strings")
        with self._lock:
            self._username, self._password = username, Secret(password)

    def __repr__(self) -> str:
        return f"SaslCredentials(username={self._username!r}, password='***')"


@dataclass(frozen=True)
class ConnectionSettings:
    """Everything a broker connection needs, parsed from librdkafka-style keys."""

    client_id: str = "consumer-sdk"
    security_protocol: SecurityProtocol = "PLAINTEXT"
    socket_timeout_ms: int = 60_000
    connection_setup_timeout_ms: int = 30_000
    #: broker.address.family: which addresses of a broker's host name to connect to.
    address_family: AddressFamily = "any"
    reconnect_backoff_ms: int = 100
    reconnect_backoff_max_ms: int = 1_000
    receive_message_max_bytes: int = 100_000_000
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: Secret | None = field(default=None, repr=False)
    ssl_ca_pem: str | None = field(default=None, repr=False)
    ssl_certificate_pem: str | None = field(default=None, repr=False)
    ssl_key_pem: Secret | None = field(default=None, repr=False)
    ssl_keystore_location: str | None = None
    ssl_keystore_password: Secret | None = field(default=None, repr=False)
    ssl_check_hostname: bool = True
    ssl_verify: bool = True
    sasl_mechanism: SaslMechanism = "PLAIN"
    sasl_username: str | None = None
    sasl_password: Secret | None = field(default=None, repr=False)
    #: OAUTHBEARER token source (oauth_cb, OIDC or the unsecured JWT); None for other mechanisms.
    oauth: OAuthTokenProvider | None = field(default=None, repr=False, compare=False)
    credentials: SaslCredentials = field(init=False, repr=False, compare=False)
    _ssl_cache: list[ssl.SSLContext] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "credentials", SaslCredentials(self.sasl_username, self.sasl_password)
        )

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context (built once): verification and hostname checking on unless
        disabled; CA, certificate and key from files, PEM strings or a PKCS#12 keystore."""
        if self._ssl_cache:
            return self._ssl_cache[0]
        location = self.ssl_ca_location
        # librdkafka's "probe" means the system's CA locations, which Python uses by default.
        cafile = None if location in (None, "probe") or os.path.isdir(location) else location
        capath = location if location not in (None, "probe") and os.path.isdir(location) else None
        try:
            ctx = ssl.create_default_context(
                ssl.Purpose.SERVER_AUTH, cafile=cafile, capath=capath, cadata=self.ssl_ca_pem
            )
        except (OSError, ssl.SSLError) as exc:
            key = "ssl.ca.pem" if self.ssl_ca_pem else "ssl.ca.location"
            raise ConfigError(f"{key}: cannot load the CA certificate(s): {exc}") from None
        if not self.ssl_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx.check_hostname = self.ssl_check_hostname
        key_password = self.ssl_key_password.reveal() if self.ssl_key_password else None
        if self.ssl_keystore_location:
            password = self.ssl_keystore_password.reveal() if self.ssl_keystore_password else None
            cert_pem, key_pem = _read_pkcs12(self.ssl_keystore_location, password)
            _load_chain_from_memory(ctx, cert_pem, key_pem, None)
        elif self.ssl_certificate_pem or self.ssl_key_pem:
            cert = self.ssl_certificate_pem or _read_text(
                "ssl.certificate.location", self.ssl_certificate_location
            )
            key = (
                self.ssl_key_pem.reveal()
                if self.ssl_key_pem
                else _read_text("ssl.key.location", self.ssl_key_location)
            )
            _load_chain_from_memory(ctx, cert, key, key_password)
        elif self.ssl_certificate_location:
            try:
                ctx.load_cert_chain(
                    self.ssl_certificate_location, self.ssl_key_location, password=key_password
                )
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(
                    "ssl.certificate.location / ssl.key.location: the certificate and key do "
                    f"not load (missing file, wrong ssl.key.password or not a pair): {exc}"
                ) from None
        self._ssl_cache.append(ctx)
        return ctx

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ConnectionSettings:
        """Build from librdkafka keys (unrelated keys are ignored here)."""

        def get_int(key: str, default: int, minimum: int = 0) -> int:
            raw = config.get(key, default)
            if isinstance(raw, bool) or not isinstance(raw, int | str):
                raise ConfigError(f"{key}: expected an integer, got {raw!r}")
            try:
                value = int(raw)
            except ValueError:
                raise ConfigError(f"{key}: expected an integer, got {raw!r}") from None
            if value < minimum:
                raise ConfigError(f"{key}: expected an integer >= {minimum}, got {raw!r}")
            return value

        def get_bool(key: str, default: bool) -> bool:
            raw = config.get(key, default)
            parsed = parse_bool(raw)
            if parsed is None:
                raise ConfigError(f"{key}: expected true or false, got {raw!r}")
            return parsed

        def get_str(key: str) -> str | None:
            raw = config.get(key)
            if raw is None:
                return None
            if not isinstance(raw, str):
                raise ConfigError(f"{key}: expected a string, got {type(raw).__name__}")
            return raw

        def exclusive(*keys: str) -> None:
            present = [k for k in keys if config.get(k) is not None]
            if len(present) > 1:
                raise ConfigError(f"{' and '.join(present)}: set only one of them")

        protocol = str(config.get("security.protocol", "PLAINTEXT")).upper()
        if protocol not in _PROTOCOLS:
            raise ConfigError(
                f"security.protocol: {protocol!r} is not one of {', '.join(_PROTOCOLS)}"
            )
        mechanism = str(config.get("sasl.mechanism", config.get("sasl.mechanisms", "PLAIN")))
        mechanism = mechanism.upper()
        if mechanism not in _MECHANISMS:
            raise ConfigError(
                f"sasl.mechanism: {mechanism!r} is not supported (use one of "
                f"{', '.join(_MECHANISMS)})"
            )
        algorithm = str(config.get("ssl.endpoint.identification.algorithm", "https")).lower()
        if algorithm not in ("https", "none"):
            raise ConfigError(
                f"ssl.endpoint.identification.algorithm: expected https or none, got {algorithm!r}"
            )
        exclusive("ssl.ca.location", "ssl.ca.pem")
        exclusive("ssl.certificate.location", "ssl.certificate.pem", "ssl.keystore.location")
        exclusive("ssl.key.location", "ssl.key.pem", "ssl.keystore.location")
        password = get_str("sasl.password")
        key_password = get_str("ssl.key.password")
        key_pem = get_str("ssl.key.pem")
        keystore_password = get_str("ssl.keystore.password")
        username = get_str("sasl.username")
        oauth: OAuthTokenProvider | None = None
        if protocol.startswith("SASL") and mechanism == "OAUTHBEARER":
            oauth = _oauth_provider(config, get_str, get_bool)
        elif protocol.startswith("SASL") and (username is None or password is None):
            raise ConfigError(
                f"sasl.username / sasl.password: required with security.protocol={protocol} "
                f"and sasl.mechanism={mechanism}"
            )
        client_id = get_str("client.id") or "consumer-sdk"
        family = str(config.get("broker.address.family", "any")).lower()
        if family not in ("any", "v4", "v6"):
            raise ConfigError(f"broker.address.family: expected any, v4 or v6, got {family!r}")
        settings = cls(
            client_id=client_id,
            security_protocol=protocol,  # type: ignore[arg-type]
            socket_timeout_ms=get_int("socket.timeout.ms", 60_000, 10),
            connection_setup_timeout_ms=get_int("socket.connection.setup.timeout.ms", 30_000, 10),
            address_family=family,  # type: ignore[arg-type]
            reconnect_backoff_ms=get_int("reconnect.backoff.ms", 100),
            reconnect_backoff_max_ms=get_int("reconnect.backoff.max.ms", 1_000),
            receive_message_max_bytes=get_int("receive.message.max.bytes", 100_000_000, 1000),
            ssl_ca_location=get_str("ssl.ca.location"),
            ssl_certificate_location=get_str("ssl.certificate.location"),
            ssl_key_location=get_str("ssl.key.location"),
            ssl_key_password=Secret(key_password) if key_password is not None else None,
            ssl_ca_pem=get_str("ssl.ca.pem"),
            ssl_certificate_pem=get_str("ssl.certificate.pem"),
            ssl_key_pem=Secret(key_pem) if key_pem is not None else None,
            ssl_keystore_location=get_str("ssl.keystore.location"),
            ssl_keystore_password=(
                Secret(keystore_password) if keystore_password is not None else None
            ),
            ssl_check_hostname=algorithm == "https",
            ssl_verify=get_bool("enable.ssl.certificate.verification", True),
            sasl_mechanism=mechanism,  # type: ignore[arg-type]
            sasl_username=username,
            sasl_password=Secret(password) if password is not None else None,
            oauth=oauth,
        )
        if settings.uses_tls:
            settings.ssl_context()  # bad files, PEM or passwords fail here, naming the key
        return settings


def parse_bool(raw: object) -> bool | None:
    """librdkafka's boolean spellings: true/false, t/f, 1/0 (strings or Python values)."""
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    if isinstance(raw, str):
        text = raw.strip().lower()
        if text in ("true", "t", "1"):
            return True
        if text in ("false", "f", "0"):
            return False
    return None


def _oauth_provider(
    config: Mapping[str, Any],
    get_str: Callable[[str], str | None],
    get_bool: Callable[[str, bool], bool],
) -> OAuthTokenProvider:
    """The OAUTHBEARER token source librdkafka would use for this configuration."""
    callback = config.get("oauth_cb")
    method = (get_str("sasl.oauthbearer.method") or "default").lower()
    if method not in ("default", "oidc"):
        raise ConfigError(f"sasl.oauthbearer.method: expected default or oidc, got {method!r}")
    oauth_config = get_str("sasl.oauthbearer.config")
    if callback is not None:
        if not callable(callback):
            raise ConfigError(f"oauth_cb: expected a callable, got {type(callback).__name__}")
        return OAuthTokenProvider.from_callback(callback, oauth_config)
    if method == "oidc":
        url = get_str("sasl.oauthbearer.token.endpoint.url")
        # librdkafka's newer names for the same two settings
        client_id = get_str("sasl.oauthbearer.client.id") or get_str(
            "sasl.oauthbearer.client.credentials.client.id"
        )
        secret = get_str("sasl.oauthbearer.client.secret") or get_str(
            "sasl.oauthbearer.client.credentials.client.secret"
        )
        for key, value in (
            ("sasl.oauthbearer.token.endpoint.url", url),
            ("sasl.oauthbearer.client.id", client_id),
            ("sasl.oauthbearer.client.secret", secret),
        ):
            if not value:
                raise ConfigError(f"{key}: required with sasl.oauthbearer.method=oidc")
        assert url is not None and client_id is not None and secret is not None
        if not url.lower().startswith(("http://", "https://")):
            raise ConfigError(
                f"sasl.oauthbearer.token.endpoint.url: expected an http(s) URL, got {url!r}"
            )
        oidc = OidcSettings(
            url,
            client_id,
            secret,
            get_str("sasl.oauthbearer.scope"),
            parse_extensions(get_str("sasl.oauthbearer.extensions"), "sasl.oauthbearer.extensions"),
            get_str("https.ca.location"),
            get_str("https.ca.pem"),
            get_str("sasl.oauthbearer.sub.claim.name") or "sub",
        )
        timeout_s = 30.0
        return OAuthTokenProvider(lambda: oidc_client_credentials(oidc, timeout_s), "oidc")
    if get_bool("enable.sasl.oauthbearer.unsecure.jwt", False):
        unsecured_jwt(oauth_config)  # a bad sasl.oauthbearer.config fails now
        return OAuthTokenProvider(lambda: unsecured_jwt(oauth_config), "unsecured JWT")
    raise ConfigError(
        "sasl.mechanism=OAUTHBEARER: no token source; set oauth_cb, or "
        "sasl.oauthbearer.method=oidc (with its token endpoint and client), or "
        "enable.sasl.oauthbearer.unsecure.jwt=true with sasl.oauthbearer.config=principal=..."
    )


def _read_text(key: str, path: str | None) -> str:
    if path is None:
        raise ConfigError(f"{key}: required with the other half of the certificate/key pair")
    try:
        with open(path, encoding="ascii") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{key}: cannot read {path!r}: {exc}") from None


def _read_pkcs12(path: str, password: str | None) -> tuple[str, str]:
    """Certificate chain and key (PEM) of a PKCS#12 keystore, via ``cryptography``."""
    try:
        from cryptography.hazmat.primitives.serialization import (
            Encoding,
            NoEncryption,
            PrivateFormat,
            pkcs12,
        )
    except ImportError:  # pragma: no cover - cryptography is a dependency
        raise ConfigError(
            "ssl.keystore.location: reading PKCS#12 needs the 'cryptography' package"
        ) from None
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"ssl.keystore.location: cannot read {path!r}: {exc}") from None
    try:
        key, cert, extra = pkcs12.load_key_and_certificates(
            data, password.encode() if password is not None else None
        )
    except ValueError as exc:
        raise ConfigError(
            f"ssl.keystore.location: {path!r} is not a PKCS#12 keystore this password "
            f"(ssl.keystore.password) opens: {exc}"
        ) from None
    if key is None or cert is None:
        raise ConfigError(f"ssl.keystore.location: {path!r} holds no private key and certificate")
    chain = "".join(c.public_bytes(Encoding.PEM).decode() for c in [cert, *extra])
    key_pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()
    return chain, key_pem


def _load_chain_from_memory(
    ctx: ssl.SSLContext, cert_pem: str, key_pem: str, password: str | None
) -> None:
    """``load_cert_chain`` for PEM strings: the ssl module reads only files, so the PEM goes
    to an anonymous in-memory file (memfd) or, without memfd, a private file removed at once."""
    for key, text in (("ssl.certificate.pem", cert_pem), ("ssl.key.pem", key_pem)):
        if "-----BEGIN" not in text:
            raise ConfigError(f"{key}: not PEM (no -----BEGIN line)")
    with _secret_file(cert_pem + "\n" + key_pem) as path:
        try:
            ctx.load_cert_chain(path, password=password)
        except ssl.SSLError as exc:
            raise ConfigError(
                f"ssl.certificate.pem / ssl.key.pem: the certificate and key do not load "
                f"(wrong ssl.key.password, or not a matching pair): {exc.reason or exc}"
            ) from None


@contextlib.contextmanager
def _secret_file(text: str) -> Iterator[str]:
    data = text.encode()
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("consumer-sdk-tls", getattr(os, "MFD_CLOEXEC", 0))
        try:
            os.write(fd, data)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    directory = tempfile.mkdtemp(prefix="consumer-sdk-tls-")  # mode 0700
    path = os.path.join(directory, "chain.pem")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.remove(path)
        with contextlib.suppress(OSError):
            os.rmdir(directory)


def parse_bootstrap_servers(value: object) -> list[tuple[str, int]]:
    """``"host1:9092,host2:9092"`` -> ``[("host1", 9092), ...]`` with clear errors."""
    if not isinstance(value, str) or not value.strip():
        raise ConfigError("bootstrap.servers: required, e.g. 'localhost:9092'")
    result: list[tuple[str, int]] = []
    for item in value.split(","):
        item = item.strip()
        if "://" in item:
            item = item.split("://", 1)[1]
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(f"bootstrap.servers: {item!r} is not host:port")
        result.append((host.strip("[]"), int(port)))
    return result
