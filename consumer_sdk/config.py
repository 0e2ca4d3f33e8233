"""Consumer configuration: a pydantic model over librdkafka-style dotted keys.

Unknown keys, wrong types and keys the KIP-848 protocol forbids fail at construction with
one `ConfigError` naming the key and the reason. Fetch-related
librdkafka keys pass through to the data plane's ``confluent_kafka.Consumer``.
"""

from __future__ import annotations

import difflib
import logging
import re
import time
from collections.abc import Mapping
from typing import Any, Literal

import confluent_kafka
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from consumer_sdk.errors import ConfigError
from consumer_sdk.membership.config import MembershipConfig
from consumer_sdk.observability.log_routing import LIBRDKAFKA_LOGGER
from consumer_sdk.protocol.security import (
    ConnectionSettings,
    parse_bool,
    parse_bootstrap_servers,
)

__all__ = ["CONNECTION_KEYS", "FETCHER_KEYS", "FORBIDDEN_KEYS", "ConsumerConfig"]

#: Keys the consumer group protocol moved to the broker; rejected like librdkafka does.
FORBIDDEN_KEYS: dict[str, str] = {
    "session.timeout.ms": "the broker sets it (group.consumer.session.timeout.ms)",
    "heartbeat.interval.ms": "the broker sets it (group.consumer.heartbeat.interval.ms)",
    "partition.assignment.strategy": (
        "assignment runs on the broker; choose a server assignor with group.remote.assignor"
    ),
    "group.protocol.type": "the consumer group protocol has no protocol type",
}

#: librdkafka keys handed to the fetcher (confluent_kafka.Consumer in assign-only mode).
FETCHER_KEYS = frozenset(
    {
        "fetch.wait.max.ms",
        "fetch.min.bytes",
        "fetch.max.bytes",
        "fetch.message.max.bytes",
        "max.partition.fetch.bytes",
        "fetch.error.backoff.ms",
        "fetch.queue.backoff.ms",
        "queued.min.messages",
        "queued.max.messages.kbytes",
        "isolation.level",
        "check.crcs",
        "enable.partition.eof",
        "client.dns.lookup",
        "topic.metadata.refresh.interval.ms",
        "metadata.max.age.ms",
        "statistics.interval.ms",
        "debug",
        "log_level",
        "api.version.request.timeout.ms",
        "socket.keepalive.enable",
        "socket.receive.buffer.bytes",
        "socket.send.buffer.bytes",
        "connections.max.idle.ms",
        "ssl.cipher.suites",
        "ssl.curves.list",
        "ssl.sigalgs.list",
        # KIP-714: the fetcher's librdkafka pushes its own metrics when the broker asks.
        "enable.metrics.push",
    }
)

# Keys read by the connection layer (ConnectionSettings) and also given to the fetcher.
_CONNECTION_KEYS = frozenset(
    {
        "bootstrap.servers",
        "client.id",
        "security.protocol",
        "socket.timeout.ms",
        "socket.connection.setup.timeout.ms",
        "broker.address.family",
        "reconnect.backoff.ms",
        "reconnect.backoff.max.ms",
        "receive.message.max.bytes",
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.key.password",
        "ssl.ca.pem",
        "ssl.certificate.pem",
        "ssl.key.pem",
        "ssl.keystore.location",
        "ssl.keystore.password",
        "ssl.endpoint.identification.algorithm",
        "enable.ssl.certificate.verification",
        "sasl.mechanism",
        "sasl.mechanisms",
        "sasl.username",
        "sasl.password",
        "sasl.oauthbearer.config",
        "sasl.oauthbearer.method",
        "sasl.oauthbearer.client.id",
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.client.credentials.client.id",
        "sasl.oauthbearer.client.credentials.client.secret",
        "sasl.oauthbearer.sub.claim.name",
        "sasl.oauthbearer.token.endpoint.url",
        "sasl.oauthbearer.scope",
        "sasl.oauthbearer.extensions",
        "enable.sasl.oauthbearer.unsecure.jwt",
        "https.ca.location",
        "https.ca.pem",
    }
)
#: The connection settings (TLS, SASL, timeouts) shared by the group and fetch connections.
CONNECTION_KEYS = _CONNECTION_KEYS
_CALLBACK_KEYS = frozenset(
    {"error_cb", "stats_cb", "logger", "throttle_cb", "oauth_cb", "on_commit"}
)
# Callbacks the membership runtime serves itself (the fetcher never commits).
_RUNTIME_CALLBACKS = frozenset({"on_commit"})

_OFFSET_RESET = {
    "earliest": "earliest",
    "smallest": "earliest",
    "beginning": "earliest",
    "latest": "latest",
    "largest": "latest",
    "end": "latest",
    "error": "error",
}


class ConsumerConfig(BaseModel):
    """Validated consumer settings (construct with `from_mapping`)."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", populate_by_name=True, arbitrary_types_allowed=True
    )

    bootstrap_servers: str = Field(alias="bootstrap.servers")
    group_id: str = Field(alias="group.id")
    group_instance_id: str | None = Field(default=None, alias="group.instance.id")
    client_id: str = Field(default="consumer-sdk", alias="client.id")
    client_rack: str | None = Field(default=None, alias="client.rack")
    group_protocol: Literal["consumer"] = Field(default="consumer", alias="group.protocol")
    group_remote_assignor: str | None = Field(default=None, alias="group.remote.assignor")
    max_poll_interval_ms: int = Field(
        default=300_000, ge=1, le=86_400_000, alias="max.poll.interval.ms"
    )
    enable_auto_commit: bool = Field(default=True, alias="enable.auto.commit")
    auto_commit_interval_ms: int = Field(default=5_000, ge=0, alias="auto.commit.interval.ms")
    auto_offset_reset: Literal["earliest", "latest", "error"] = Field(
        default="latest", alias="auto.offset.reset"
    )
    retry_backoff_ms: int = Field(default=100, ge=1, le=300_000, alias="retry.backoff.ms")
    retry_backoff_max_ms: int = Field(default=1_000, ge=1, le=300_000, alias="retry.backoff.max.ms")
    enable_auto_offset_store: bool = Field(default=True, alias="enable.auto.offset.store")
    allow_auto_create_topics: bool = Field(default=False, alias="allow.auto.create.topics")

    connection: ConnectionSettings = Field(exclude=True)
    fetcher_overrides: dict[str, Any] = Field(default_factory=dict, exclude=True)
    callbacks: dict[str, Any] = Field(default_factory=dict, exclude=True)
    raw_connection: dict[str, Any] = Field(default_factory=dict, exclude=True, repr=False)

    @field_validator("group_id")
    @classmethod
    def _group_id_not_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must be a non-empty string")
        return value

    @field_validator("group_instance_id")
    @classmethod
    def _instance_id_not_empty(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must be a non-empty string when set")
        return value

    @field_validator("group_remote_assignor")
    @classmethod
    def _assignor_name(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[A-Za-z0-9._-]+", value):
            raise ValueError(f"{value!r} is not an assignor name (e.g. 'uniform' or 'range')")
        return value

    @field_validator("auto_offset_reset", mode="before")
    @classmethod
    def _offset_reset_alias(cls, value: object) -> object:
        if isinstance(value, str) and value.lower() in _OFFSET_RESET:
            return _OFFSET_RESET[value.lower()]
        return value

    @classmethod
    def from_mapping(cls, config: Mapping[str, Any]) -> ConsumerConfig:
        """Validate a librdkafka-style dict; raise ConfigError naming the first bad key."""
        if not isinstance(config, Mapping):
            raise ConfigError(f"configuration must be a dict, got {type(config).__name__}")
        known = {f.alias for f in cls.model_fields.values() if f.alias}
        model_keys: dict[str, Any] = {}
        connection_keys: dict[str, Any] = {}
        fetcher: dict[str, Any] = {}
        callbacks: dict[str, Any] = {}
        for key, value in config.items():
            if not isinstance(key, str):
                raise ConfigError(f"configuration keys must be strings, got {key!r}")
            if key in FORBIDDEN_KEYS:
                raise ConfigError(
                    f"{key}: not allowed with the consumer group protocol (KIP-848): "
                    f"{FORBIDDEN_KEYS[key]}"
                )
            if key == "logger":
                if not isinstance(value, logging.Logger | logging.LoggerAdapter):
                    raise ConfigError(
                        f"logger: expected a logging.Logger, got {type(value).__name__}"
                    )
                callbacks[key] = value
            elif key in _CALLBACK_KEYS:
                if not callable(value):
                    raise ConfigError(f"{key}: expected a callable, got {type(value).__name__}")
                callbacks[key] = value
                if key == "oauth_cb":
                    connection_keys[key] = value  # the group connection's token source too
            elif key in FETCHER_KEYS:
                fetcher[key] = value
            elif key in _CONNECTION_KEYS:
                connection_keys[key] = value
                if key in ("bootstrap.servers", "client.id"):
                    model_keys[key] = value
            elif key in known:
                model_keys[key] = value
            else:
                candidates = sorted(KNOWN_KEYS)
                close = difflib.get_close_matches(key, candidates, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{key}: unknown configuration property{hint}")
        if "bootstrap.servers" not in config:
            raise ConfigError("bootstrap.servers: required, e.g. 'localhost:9092'")
        if "group.id" not in config:
            raise ConfigError("group.id: required (the consumer group to join)")
        parse_bootstrap_servers(config["bootstrap.servers"])
        connection = ConnectionSettings.from_config(connection_keys)
        try:
            parsed = cls.model_validate(
                {
                    **model_keys,
                    "connection": connection,
                    "fetcher_overrides": fetcher,
                    "callbacks": callbacks,
                    "raw_connection": connection_keys,
                }
            )
        except ValidationError as exc:
            raise ConfigError(_describe(exc, cls)) from None
        _check_with_librdkafka(parsed.fetcher_config(), config)
        return parsed

    @field_validator("*", mode="before")
    @classmethod
    def _strict_scalars(cls, value: object, info: ValidationInfo) -> object:
        """Integers and booleans as librdkafka takes them, nothing looser: an int or a string
        of digits for integers (not True, not 1.5); true/false/t/f/1/0 for booleans."""
        field = cls.model_fields.get(info.field_name or "")
        annotation = field.annotation if field is not None else None
        if annotation is bool:
            parsed = parse_bool(value)
            if parsed is None:
                raise ValueError("expected true or false")
            return parsed
        if annotation is int or annotation == int | None:
            if value is None and annotation is not int:
                return value
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise ValueError(f"expected an integer, not {type(value).__name__}")
            if isinstance(value, str):
                if not re.fullmatch(r"\s*[+-]?\d+\s*", value):
                    raise ValueError("expected an integer")
                return int(value)
        return value

    def membership_config(self) -> MembershipConfig:
        """What the membership core needs of this configuration."""
        return MembershipConfig(
            group_id=self.group_id,
            group_instance_id=self.group_instance_id,
            client_rack=self.client_rack,
            remote_assignor=self.group_remote_assignor,
            rebalance_timeout_ms=self.max_poll_interval_ms,
            auto_commit=self.enable_auto_commit,
            retry_backoff_ms=self.retry_backoff_ms,
            retry_backoff_max_ms=self.retry_backoff_max_ms,
            client_id=self.client_id,
        )

    def fetcher_config(self) -> dict[str, Any]:
        """Settings for the assign-only ``confluent_kafka.Consumer`` data plane."""
        conf: dict[str, Any] = {
            key: value for key, value in self.raw_connection.items() if key != "sasl.mechanisms"
        }
        if "sasl.mechanisms" in self.raw_connection and "sasl.mechanism" not in conf:
            conf["sasl.mechanism"] = self.raw_connection["sasl.mechanisms"]
        conf.update(self.fetcher_overrides)
        conf.update(
            {
                "group.id": self.group_id,
                "client.id": f"{self.client_id}-fetcher",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": self.auto_offset_reset,
            }
        )
        # error_cb, stats_cb, logger, throttle_cb, oauth_cb: librdkafka's own (error_cb also
        # gets the group-level errors from the membership runtime).
        conf.update({k: v for k, v in self.callbacks.items() if k not in _RUNTIME_CALLBACKS})
        # librdkafka's log lines through Python logging, never raw to stderr.
        conf.setdefault("logger", LIBRDKAFKA_LOGGER)
        return conf


_PROBE_LOGGER = logging.getLogger("consumer_sdk.config.probe")
_PROBE_LOGGER.addHandler(logging.NullHandler())
_PROBE_LOGGER.propagate = False
_LIBRDKAFKA_KEY = re.compile(r'(?:property|for) "([^"]+)"|`([a-z.]+)`')


def _sensitive(key: str) -> bool:
    """Keys whose values are secrets: never echoed in an error message."""
    return any(word in key for word in ("password", "secret", "key.pem", "oauthbearer.config"))


def _check_with_librdkafka(fetcher_conf: Mapping[str, Any], original: Mapping[str, Any]) -> None:
    """Let librdkafka validate the fetcher's settings now, at construction, so a bad value
    (``isolation.level='serializable'``) is a ConfigError naming the key, not a failure
    later inside the consumer. The probe has no bootstrap servers: it never connects."""
    conf = {k: v for k, v in fetcher_conf.items() if k not in _CALLBACK_KEYS}
    conf.pop("bootstrap.servers", None)
    conf["logger"] = _PROBE_LOGGER
    if "oauth_cb" in fetcher_conf or str(conf.get("sasl.oauthbearer.method")).lower() == "oidc":
        # A stand-in token source: with method=oidc librdkafka would call the token endpoint
        # at once (the OIDC keys themselves are checked by ConnectionSettings).
        conf.pop("sasl.oauthbearer.method", None)
        conf["oauth_cb"] = lambda _config: ("probe", time.time() + 3600)
    try:
        probe = confluent_kafka.Consumer(conf)
    except (confluent_kafka.KafkaException, ValueError, TypeError) as exc:
        error = exc.args[0] if exc.args else exc
        text = error.str() if isinstance(error, confluent_kafka.KafkaError) else str(error)
        text = text.removeprefix("Failed to create consumer: ")
        match = _LIBRDKAFKA_KEY.search(text)
        key = next((g for g in match.groups() if g), None) if match else None
        if key is not None and key in original:
            shown = "(hidden)" if _sensitive(key) else repr(original[key])
            raise ConfigError(f"{key}: invalid value {shown}: {text}") from None
        raise ConfigError(f"invalid configuration: {text}") from None
    probe.close()


#: Every key ``ConsumerConfig.from_mapping`` accepts (hosts that pass options through, such
#: as the Spark source, use it to route keys).
KNOWN_KEYS: frozenset[str] = frozenset(
    {f.alias for f in ConsumerConfig.model_fields.values() if f.alias}
    | FETCHER_KEYS
    | _CONNECTION_KEYS
    | _CALLBACK_KEYS
)


def _describe(exc: ValidationError, model: type[BaseModel]) -> str:
    aliases = {name: f.alias or name for name, f in model.model_fields.items()}
    problems = []
    for error in exc.errors():
        loc = error["loc"][0] if error["loc"] else "?"
        key = aliases.get(str(loc), str(loc))
        message = error["msg"].removeprefix("Value error, ")
        if error["type"] == "literal_error":
            message = f"expected {error['ctx']['expected']}"
        problems.append(f"{key}: {message} (got {error.get('input')!r})")
    return "; ".join(problems)
