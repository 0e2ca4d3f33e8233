"""Consumer configuration: a frozen dataclass over librdkafka-style dotted keys.

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
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import confluent_kafka

from consumer_sdk.errors import ConfigError
from consumer_sdk.membership.config import MembershipConfig
from consumer_sdk.observability.log_routing import LIBRDKAFKA_LOGGER
from consumer_sdk.protocol.security import (
    ConnectionSettings,
    parse_bool,
    parse_bootstrap_servers,
)

__all__ = ["CONNECTION_KEYS", "FETCHER_KEYS", "FORBIDDEN_KEYS", "ConsumerConfig", "FieldSpec"]

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


_REQUIRED: Any = object()


@dataclass(frozen=True)
class FieldSpec:
    """One group key of `ConsumerConfig`: its attribute's librdkafka-style key, default and
    check (the subset of a pydantic ``FieldInfo`` that tools such as docs/gen.py read)."""

    alias: str | None
    default: Any = _REQUIRED
    kind: Literal["str", "optional_str", "int", "bool", "literal", "other"] = "other"
    ge: int | None = None
    le: int | None = None
    choices: tuple[str, ...] = ()
    exclude: bool | None = None

    def is_required(self) -> bool:
        return self.default is _REQUIRED


class _Invalid(Exception):
    """A value's problem: ``message`` about the value ``shown`` (as ``(got ...)``)."""

    def __init__(self, message: str, shown: object) -> None:
        super().__init__(message)
        self.message, self.shown = message, shown


@dataclass(frozen=True)
class ConsumerConfig:
    """Validated consumer settings (construct with `from_mapping`)."""

    bootstrap_servers: str
    group_id: str
    connection: ConnectionSettings
    group_instance_id: str | None = None
    client_id: str = "consumer-sdk"
    client_rack: str | None = None
    group_protocol: Literal["consumer"] = "consumer"
    group_remote_assignor: str | None = None
    max_poll_interval_ms: int = 300_000
    enable_auto_commit: bool = True
    auto_commit_interval_ms: int = 5_000
    auto_offset_reset: Literal["earliest", "latest", "error"] = "latest"
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1_000
    enable_auto_offset_store: bool = True
    allow_auto_create_topics: bool = False
    fetcher_overrides: dict[str, Any] = field(default_factory=dict)
    callbacks: dict[str, Any] = field(default_factory=dict)
    raw_connection: dict[str, Any] = field(default_factory=dict, repr=False)

    #: The group keys in order, then the excluded (non-key) attributes. Checked without
    #: pydantic: importing it cost the Spark source's stream-reader process ~0.15 s per query.
    model_fields: ClassVar[dict[str, FieldSpec]] = {
        "bootstrap_servers": FieldSpec("bootstrap.servers", kind="str"),
        "group_id": FieldSpec("group.id", kind="str"),
        "group_instance_id": FieldSpec("group.instance.id", None, "optional_str"),
        "client_id": FieldSpec("client.id", "consumer-sdk", "str"),
        "client_rack": FieldSpec("client.rack", None, "optional_str"),
        "group_protocol": FieldSpec("group.protocol", "consumer", "literal", choices=("consumer",)),
        "group_remote_assignor": FieldSpec("group.remote.assignor", None, "optional_str"),
        "max_poll_interval_ms": FieldSpec(
            "max.poll.interval.ms", 300_000, "int", ge=1, le=86_400_000
        ),
        "enable_auto_commit": FieldSpec("enable.auto.commit", True, "bool"),
        "auto_commit_interval_ms": FieldSpec("auto.commit.interval.ms", 5_000, "int", ge=0),
        "auto_offset_reset": FieldSpec(
            "auto.offset.reset", "latest", "literal", choices=("earliest", "latest", "error")
        ),
        "retry_backoff_ms": FieldSpec("retry.backoff.ms", 100, "int", ge=1, le=300_000),
        "retry_backoff_max_ms": FieldSpec("retry.backoff.max.ms", 1_000, "int", ge=1, le=300_000),
        "enable_auto_offset_store": FieldSpec("enable.auto.offset.store", True, "bool"),
        "allow_auto_create_topics": FieldSpec("allow.auto.create.topics", False, "bool"),
        "connection": FieldSpec(None, exclude=True),
        "fetcher_overrides": FieldSpec(None, {}, exclude=True),
        "callbacks": FieldSpec(None, {}, exclude=True),
        "raw_connection": FieldSpec(None, {}, exclude=True),
    }

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
        values: dict[str, Any] = {}
        problems: list[str] = []
        for name, spec in cls.model_fields.items():
            if spec.alias is None or spec.alias not in model_keys:
                continue
            try:
                values[name] = _check(name, spec, model_keys[spec.alias])
            except _Invalid as exc:
                problems.append(f"{spec.alias}: {exc.message} (got {exc.shown!r})")
        if problems:
            raise ConfigError("; ".join(problems))
        parsed = cls(
            **values,
            connection=connection,
            fetcher_overrides=fetcher,
            callbacks=callbacks,
            raw_connection=connection_keys,
        )
        _check_with_librdkafka(parsed.fetcher_config(), config)
        return parsed

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


_INTEGER = re.compile(r"\s*[+-]?\d+\s*")
_ASSIGNOR_NAME = re.compile(r"[A-Za-z0-9._-]+")


def _check(name: str, spec: FieldSpec, value: object) -> Any:
    """One group key's value as the attribute holds it, or `_Invalid`: integers and booleans
    as librdkafka takes them, nothing looser (an int or a string of digits, not True, not
    1.5; true/false/t/f/1/0), strings as strings (bytes decoded as UTF-8)."""
    if spec.kind == "bool":
        parsed = parse_bool(value)
        if parsed is None:
            raise _Invalid("expected true or false", value)
        return parsed
    if spec.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise _Invalid(f"expected an integer, not {type(value).__name__}", value)
        if isinstance(value, str):
            if not _INTEGER.fullmatch(value):
                raise _Invalid("expected an integer", value)
            value = int(value)
        number = int(value)
        if spec.ge is not None and number < spec.ge:
            raise _Invalid(f"Input should be greater than or equal to {spec.ge}", number)
        if spec.le is not None and number > spec.le:
            raise _Invalid(f"Input should be less than or equal to {spec.le}", number)
        return number
    if spec.kind == "literal":
        if name == "auto_offset_reset" and isinstance(value, str):
            value = _OFFSET_RESET.get(value.lower(), value)
        if isinstance(value, str) and value in spec.choices:
            return value
        *head, last = (repr(c) for c in spec.choices)
        raise _Invalid(f"expected {', '.join(head) + ' or ' + last if head else last}", value)
    if spec.kind == "optional_str" and value is None:
        return None
    text = _string(value)
    if name == "group_id" and not text.strip():
        raise _Invalid("must be a non-empty string", text)
    if name == "group_instance_id" and not text.strip():
        raise _Invalid("must be a non-empty string when set", text)
    if name == "group_remote_assignor" and not _ASSIGNOR_NAME.fullmatch(text):
        raise _Invalid(f"{text!r} is not an assignor name (e.g. 'uniform' or 'range')", text)
    return text


def _string(value: object) -> str:
    if isinstance(value, str):
        return str(value)
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            raise _Invalid(
                "Input should be a valid string, unable to parse raw data as a unicode string",
                value,
            ) from None
    raise _Invalid("Input should be a valid string", value)


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
