"""Options of the ``kip848`` source, validated once on the driver (no Spark needed)."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spark_integration.offsets import Partition, parse_starting_offsets

__all__ = ["SourceOptions"]

#: ``kafka.*`` parameters refused like Spark's Kafka source does (the source owns them).
REJECTED_KAFKA_PARAMS: dict[str, str] = {
    "auto.offset.reset": "use the startingOffsets option",
    "enable.auto.commit": "the source commits offsets itself as batches complete",
    "enable.auto.offset.store": "the source commits offsets itself as batches complete",
    "key.deserializer": "keys are always bytes (binary); cast or decode in the query",
    "value.deserializer": "values are always bytes (binary); cast or decode in the query",
    "interceptor.classes": "not supported",
    "group.protocol": "the source is always a consumer-protocol (KIP-848) member",
}
#: Group-membership settings that only the driver's GroupMember uses.
_MEMBER_ONLY = frozenset(
    {"group.instance.id", "group.remote.assignor", "max.poll.interval.ms", "client.rack"}
)
_TRUE = {"true": True, "false": False}
_FETCH_DEFAULTS = {
    "fetch.wait.max.ms": "10",
    "fetch.queue.backoff.ms": "10",
    "fetch.error.backoff.ms": "10",
    "queued.max.messages.kbytes": "16384",  # per cached consumer's prefetch
}


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    raw = options.get(key)
    if raw is None:
        return default
    value = _TRUE.get(str(raw).strip().lower())
    if value is None:
        raise ValueError(f"{key}: expected true or false, got {raw!r}")
    return value


def _int(options: Mapping[str, str], key: str, default: int | None, minimum: int) -> int | None:
    raw = options.get(key)
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"{key}: expected an integer, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{key}: must be >= {minimum}, got {value}")
    return value


@functools.lru_cache(maxsize=256)
def _member_accepts(key: str) -> bool:
    """Whether ``consumer_sdk``'s config model knows ``key`` (others go to executors only)."""
    from consumer_sdk.config import ConsumerConfig  # imported lazily: executors never need it
    from consumer_sdk.errors import ConfigError

    try:
        ConsumerConfig.from_mapping(
            {"bootstrap.servers": "localhost:9092", "group.id": "x", key: ""}
        )
    except ConfigError as exc:
        return not str(exc).startswith(f"{key}: unknown configuration property")
    return True


@dataclass(frozen=True)
class SourceOptions:
    """The parsed options (Spark passes them lower-cased; keys here are lower-case)."""

    bootstrap_servers: str
    group_id: str
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    starting_offsets: str | dict[Partition, int] = "latest"
    starting_timestamp: int | None = None
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    poll_timeout_ms: int = 120_000
    join_timeout_ms: int = 60_000
    arrow_batch_size: int = 10_000
    event_log: str | None = None
    kafka_params: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> SourceOptions:
        """Validate ``.option(...)`` values; raise ValueError naming the bad option."""
        options = {str(k).lower(): str(v) for k, v in raw.items()}
        kafka = {k[len("kafka.") :]: v for k, v in options.items() if k.startswith("kafka.")}
        bootstrap = kafka.pop("bootstrap.servers", None)
        if not bootstrap:
            raise ValueError("kafka.bootstrap.servers: required, e.g. 'broker1:9092,broker2:9092'")
        group_ids = {v for v in (options.get("group.id"), kafka.pop("group.id", None)) if v}
        if len(group_ids) != 1:
            raise ValueError(
                "group.id: required once (as group.id or kafka.group.id): the consumer group "
                "this query joins"
                if not group_ids
                else f"group.id and kafka.group.id disagree: {sorted(group_ids)}"
            )
        for key, why in REJECTED_KAFKA_PARAMS.items():
            if key in kafka:
                raise ValueError(f"kafka.{key}: not supported: {why}")
        if "assign" in options:
            raise ValueError(
                "assign: not supported: a consumer-group source gets its partitions from the "
                "group; use subscribe or subscribePattern (or Spark's kafka source for assign)"
            )
        subscribe, pattern = options.get("subscribe"), options.get("subscribepattern")
        if (subscribe is None) == (pattern is None):
            raise ValueError("exactly one of subscribe or subscribePattern is required")
        topics: tuple[str, ...] = ()
        if subscribe is not None:
            topics = tuple(t.strip() for t in subscribe.split(",") if t.strip())
            if not topics:
                raise ValueError("subscribe: give a comma-separated list of topic names")
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"subscribePattern: invalid regex {pattern!r}: {exc}") from None
            # The group protocol takes a regex as a subscription starting with '^'.
            pattern = pattern if pattern.startswith("^") else "^" + pattern
        return cls(
            bootstrap_servers=bootstrap,
            group_id=group_ids.pop(),
            topics=topics,
            pattern=pattern,
            starting_offsets=parse_starting_offsets(options.get("startingoffsets")),
            starting_timestamp=_int(options, "startingtimestamp", None, 0),
            max_offsets_per_trigger=_int(options, "maxoffsetspertrigger", None, 1),
            min_partitions=_int(options, "minpartitions", None, 1),
            fail_on_data_loss=_bool(options, "failondataloss", True),
            include_headers=_bool(options, "includeheaders", False),
            poll_timeout_ms=_int(options, "kafkaconsumer.polltimeoutms", 120_000, 1) or 120_000,
            join_timeout_ms=_int(options, "jointimeoutms", 60_000, 0) or 0,
            arrow_batch_size=_int(options, "arrowbatchsize", 10_000, 1) or 10_000,
            event_log=options.get("eventlog"),
            kafka_params=kafka,
        )

    @property
    def subscription(self) -> list[str]:
        """What ``GroupMember.subscribe`` takes: topic names, or one ``^regex``."""
        return [self.pattern] if self.pattern is not None else list(self.topics)

    def member_config(self) -> dict[str, Any]:
        """Config of the driver's ``consumer_sdk.GroupMember``."""
        conf: dict[str, Any] = {k: v for k, v in self.kafka_params.items() if _member_accepts(k)}
        conf.setdefault("client.id", "spark-kip848")
        conf.update(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "group.id": self.group_id,
                "enable.auto.commit": False,
            }
        )
        return conf

    def fetch_config(self, role: str) -> dict[str, Any]:
        """Config of an assign-only ``confluent_kafka.Consumer`` (driver watermarks, executors).

        It uses the group id ``<group.id>-spark-<role>``, never subscribes and never commits,
        so it never joins any group.
        """
        conf: dict[str, Any] = {k: v for k, v in self.kafka_params.items() if k not in _MEMBER_ONLY}
        conf.setdefault("client.id", f"spark-kip848-{role}")
        # A task reads a range that exists: never wait on the broker or behind a backoff
        # (librdkafka's defaults add 0.5-1 s after a seek or resume).
        for key, value in _FETCH_DEFAULTS.items():
            conf.setdefault(key, value)
        conf.update(
            {
                "bootstrap.servers": self.bootstrap_servers,
                "group.id": f"{self.group_id}-spark-{role}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "error",
                "enable.partition.eof": True,
            }
        )
        return conf
