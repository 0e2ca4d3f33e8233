"""Connection settings with librdkafka's key names: timeouts, TLS and SASL.

Secrets are held in `Secret`, whose ``repr``/``str`` never show the value.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from consumer_sdk.errors import ConfigError

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]

_PROTOCOLS: tuple[str, ...] = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


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


@dataclass(frozen=True)
class ConnectionSettings:
    """Everything a broker connection needs, parsed from librdkafka-style keys."""

    client_id: str = "consumer-sdk"
    security_protocol: SecurityProtocol = "PLAINTEXT"
    socket_timeout_ms: int = 60_000
    connection_setup_timeout_ms: int = 30_000
    reconnect_backoff_ms: int = 100
    reconnect_backoff_max_ms: int = 1_000
    receive_message_max_bytes: int = 100_000_000
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_key_password: Secret | None = field(default=None, repr=False)
    ssl_check_hostname: bool = True
    ssl_verify: bool = True
    sasl_mechanism: SaslMechanism = "PLAIN"
    sasl_username: str | None = None
    sasl_password: Secret | None = field(default=None, repr=False)

    @property
    def uses_tls(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def ssl_context(self) -> ssl.SSLContext:
        """A client TLS context: verification and hostname checking on unless disabled."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ssl_ca_location)
        if not self.ssl_verify:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        else:
            ctx.check_hostname = self.ssl_check_hostname
        if self.ssl_certificate_location:
            password = self.ssl_key_password.reveal() if self.ssl_key_password else None
            ctx.load_cert_chain(
                self.ssl_certificate_location, self.ssl_key_location, password=password
            )
        return ctx

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ConnectionSettings:
        """Build from librdkafka keys (unrelated keys are ignored here)."""

        def get_int(key: str, default: int, minimum: int = 0) -> int:
            raw = config.get(key, default)
            try:
                value = int(raw)
            except (TypeError, ValueError):
                raise ConfigError(f"{key}: expected an integer, got {raw!r}") from None
            if isinstance(raw, bool) or value < minimum:
                raise ConfigError(f"{key}: expected an integer >= {minimum}, got {raw!r}")
            return value

        def get_bool(key: str, default: bool) -> bool:
            raw = config.get(key, default)
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.lower() in ("true", "false"):
                return raw.lower() == "true"
            raise ConfigError(f"{key}: expected true or false, got {raw!r}")

        def get_str(key: str) -> str | None:
            raw = config.get(key)
            if raw is None:
                return None
            if not isinstance(raw, str):
                raise ConfigError(f"{key}: expected a string, got {type(raw).__name__}")
            return raw

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
        password = get_str("sasl.password")
        key_password = get_str("ssl.key.password")
        username = get_str("sasl.username")
        if protocol.startswith("SASL") and (username is None or password is None):
            raise ConfigError(
                f"sasl.username / sasl.password: required with security.protocol={protocol}"
            )
        client_id = get_str("client.id") or "consumer-sdk"
        return cls(
            client_id=client_id,
            security_protocol=protocol,  # type: ignore[arg-type]
            socket_timeout_ms=get_int("socket.timeout.ms", 60_000, 10),
            connection_setup_timeout_ms=get_int("socket.connection.setup.timeout.ms", 30_000, 10),
            reconnect_backoff_ms=get_int("reconnect.backoff.ms", 100),
            reconnect_backoff_max_ms=get_int("reconnect.backoff.max.ms", 1_000),
            receive_message_max_bytes=get_int("receive.message.max.bytes", 100_000_000, 1000),
            ssl_ca_location=get_str("ssl.ca.location"),
            ssl_certificate_location=get_str("ssl.certificate.location"),
            ssl_key_location=get_str("ssl.key.location"),
            ssl_key_password=Secret(key_password) if key_password is not None else None,
            ssl_check_hostname=algorithm == "https",
            ssl_verify=get_bool("enable.ssl.certificate.verification", True),
            sasl_mechanism=mechanism,  # type: ignore[arg-type]
            sasl_username=username,
            sasl_password=Secret(password) if password is not None else None,
        )


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
