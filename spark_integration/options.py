"""Options of the ``kip848`` source, validated once at load (no Spark needed).

Every option Spark's Kafka source documents is either implemented or rejected with an
error naming it (`SPARK_KAFKA_OPTIONS`); options of this source only are listed in
`KIP848_OPTIONS`. Any other option is refused, so a typo never goes unnoticed.
"""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spark_integration.offsets import (
    EARLIEST,
    LATEST,
    Partition,
    parse_assign,
    parse_offsets_json,
    parse_timestamps,
)

__all__ = ["KIP848_OPTIONS", "SPARK_KAFKA_OPTIONS", "OptionInfo", "SourceOptions"]


@dataclass(frozen=True)
class OptionInfo:
    """One documented option: ``status`` is ``supported``, ``batch`` (batch queries only),
    ``streaming`` (streaming queries only) or ``rejected`` (an error at load)."""

    name: str
    status: str
    note: str


#: Every source option of Spark's Kafka source (Spark 4.x docs), with its status here.
SPARK_KAFKA_OPTIONS: tuple[OptionInfo, ...] = (
    OptionInfo(
        "assign",
        "supported",
        "fixed partitions, no group membership; offsets committed to group.id if set",
    ),
    OptionInfo("subscribe", "supported", "the query joins group.id and reads what it is assigned"),
    OptionInfo("subscribePattern", "supported", "a regex subscription evaluated by the broker"),
    OptionInfo("kafka.bootstrap.servers", "supported", "required"),
    OptionInfo(
        "startingTimestamp",
        "supported",
        "one timestamp for every partition (offsets-for-times); wins over the others",
    ),
    OptionInfo(
        "startingOffsetsByTimestamp",
        "supported",
        "per-partition timestamps; unlisted partitions use startingOffsets",
    ),
    OptionInfo(
        "startingOffsetsByTimestampStrategy",
        "supported",
        "error (default) or latest when no record is at or after the timestamp",
    ),
    OptionInfo(
        "startingOffsets",
        "supported",
        "latest (streaming default) / earliest (batch default) / JSON with -2, -1",
    ),
    OptionInfo("endingTimestamp", "batch", "batch queries only; rejected for streaming"),
    OptionInfo("endingOffsetsByTimestamp", "batch", "batch queries only; rejected for streaming"),
    OptionInfo(
        "endingOffsets",
        "batch",
        "latest (default) / JSON with -1; batch only; rejected for streaming",
    ),
    OptionInfo(
        "failOnDataLoss",
        "supported",
        "deleted topics and out-of-range offsets: error (true) or a warning (false)",
    ),
    OptionInfo("kafkaConsumer.pollTimeoutMs", "supported", "executor wait for a range's records"),
    OptionInfo("fetchOffset.numRetries", "supported", "driver offset lookups: retries"),
    OptionInfo("fetchOffset.retryIntervalMs", "supported", "driver offset lookups: retry interval"),
    OptionInfo("maxOffsetsPerTrigger", "streaming", "split over partitions by backlog"),
    OptionInfo(
        "minOffsetsPerTrigger", "streaming", "wait for this many records or maxTriggerDelay"
    ),
    OptionInfo("maxTriggerDelay", "streaming", "default 15m; with minOffsetsPerTrigger"),
    OptionInfo("minPartitions", "supported", "split large ranges into at least this many tasks"),
    OptionInfo("maxRecordsPerPartition", "supported", "split ranges larger than this"),
    OptionInfo(
        "groupIdPrefix",
        "supported",
        "assign / batch without group.id: prefix of the clients' group ids; "
        "rejected with subscribe (the group is group.id)",
    ),
    OptionInfo("kafka.group.id", "supported", "the group, same as group.id"),
    OptionInfo("includeHeaders", "supported", "adds headers array<struct<key,value>>"),
    OptionInfo("topic", "rejected", "a sink option; kip848 is a source"),
)

#: Options of this source only.
KIP848_OPTIONS: tuple[OptionInfo, ...] = (
    OptionInfo(
        "group.id", "supported", "the consumer group (required with subscribe / subscribePattern)"
    ),
    OptionInfo(
        "joinTimeoutMs",
        "supported",
        "at query start: how long to wait for a broker, the subscribed topics and the "
        "first assignment before failing with an error (default 60000)",
    ),
    OptionInfo(
        "rowsPerTask",
        "supported",
        "records per Spark task: a batch is read by up to ceil(records / rowsPerTask) "
        "balanced tasks of whole partition ranges, so small batches over many partitions "
        "take one task; ranges are split only by minPartitions / maxRecordsPerPartition "
        "(default 20000)",
    ),
    OptionInfo("arrowBatchSize", "supported", "rows per Arrow batch from a task (10000)"),
    OptionInfo("eventLog", "supported", "JSON-lines file of the member's events"),
    OptionInfo(
        "checkpointLocation",
        "supported",
        "the query's checkpoint (the same path as the sink's): the stream reader reads "
        "its commit log to commit each batch to Kafka as soon as it is durable, and "
        "exactly on stop (Trigger.Once, the last batch before a stop)",
    ),
)

_ALL = SPARK_KAFKA_OPTIONS + KIP848_OPTIONS
_KNOWN = {o.name.lower(): o for o in _ALL}

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
    # A fetch with records is answered at once whatever this is; it paces the fetches of a
    # consumer at the end of the log, and a fetch long-polling there holds back the next
    # fetch of its connection (one in flight per broker): at librdkafka's 500 ms, a pooled
    # consumer re-assigned from a partition read to its end waited ~250 ms for its first
    # records. Idle pooled consumers are unassigned, so they send no fetch at all.
    "fetch.wait.max.ms": "10",
    "fetch.queue.backoff.ms": "10",
    "fetch.error.backoff.ms": "10",
    "queued.max.messages.kbytes": "16384",  # per cached consumer's prefetch
    # librdkafka fetches ahead of the application up to this many records (default 100k):
    # what a consumer prefetched past its range's end is fetched, parsed and dropped.
    "queued.min.messages": "10000",
}
_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def _bool(options: Mapping[str, str], key: str, default: bool) -> bool:
    raw = options.get(key)
    if raw is None:
        return default
    value = _TRUE.get(str(raw).strip().lower())
    if value is None:
        raise ValueError(f"{_KNOWN[key].name}: expected true or false, got {raw!r}")
    return value


def _int(options: Mapping[str, str], key: str, default: int | None, minimum: int) -> int | None:
    raw = options.get(key)
    if raw is None:
        return default
    name = _KNOWN[key].name if key in _KNOWN else key
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise ValueError(f"{name}: expected an integer, got {raw!r}") from None
    if value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value}")
    return value


def parse_duration_ms(raw: str, name: str) -> int:
    """Spark's time strings: ``15m``, ``30s``, ``500ms``, ``1h``; a bare number is ms."""
    match = _DURATION.match(raw)
    if not match:
        raise ValueError(f"{name}: expected a duration like 15m, 30s or 500ms, got {raw!r}")
    return int(match.group(1)) * _UNIT_MS[(match.group(2) or "ms").lower()]


def _client_prefix(group_id: str | None, prefix: str | None) -> str:
    """Prefix of the assign-only clients' group ids (unique per query without group.id)."""
    if group_id:
        return group_id
    return f"{(prefix or 'spark-kip848').strip()}-{uuid.uuid4().hex[:12]}"


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
    group_id: str | None
    topics: tuple[str, ...] = ()
    pattern: str | None = None
    assign: tuple[Partition, ...] = ()
    batch: bool = False
    starting_offsets: str | dict[Partition, int] = "latest"
    starting_timestamp: int | None = None
    starting_by_timestamp: dict[Partition, int] | None = None
    timestamp_strategy: str = "error"
    ending_offsets: str | dict[Partition, int] = "latest"
    ending_timestamp: int | None = None
    ending_by_timestamp: dict[Partition, int] | None = None
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60_000
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    rows_per_task: int = 20_000
    fail_on_data_loss: bool = True
    include_headers: bool = False
    poll_timeout_ms: int = 120_000
    fetch_retries: int = 3
    fetch_retry_interval_ms: int = 10
    join_timeout_ms: int = 60_000
    checkpoint: str | None = None
    arrow_batch_size: int = 10_000
    event_log: str | None = None
    client_group_prefix: str = "spark-kip848"
    kafka_params: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, raw: Mapping[str, Any], batch: bool = False) -> SourceOptions:
        """Validate ``.option(...)`` values; raise ValueError naming the bad option."""
        options = {str(k).lower(): str(v) for k, v in raw.items() if v is not None}
        unknown = sorted(k for k in options if not k.startswith("kafka.") and k not in _KNOWN)
        if unknown:
            raise ValueError(
                f"unknown option(s) {unknown} for format kip848; supported: "
                + ", ".join(sorted(o.name for o in _ALL if o.status != "rejected"))
            )
        for key in options:
            info = _KNOWN.get(key)
            if info is None:
                continue
            if info.status == "rejected":
                raise ValueError(f"{info.name}: not supported: {info.note}")
            if info.status == "batch" and not batch:
                raise ValueError(
                    f"{info.name}: only for batch queries (spark.read); a streaming query "
                    "runs until stopped (use Trigger.AvailableNow to stop at the data present)"
                )
            if info.status == "streaming" and batch:
                raise ValueError(f"{info.name}: only for streaming queries (spark.readStream)")
        kafka = {k[len("kafka.") :]: v for k, v in options.items() if k.startswith("kafka.")}
        bootstrap = kafka.pop("bootstrap.servers", None)
        if not bootstrap:
            raise ValueError("kafka.bootstrap.servers: required, e.g. 'broker1:9092,broker2:9092'")
        for key, why in REJECTED_KAFKA_PARAMS.items():
            if key in kafka:
                raise ValueError(f"kafka.{key}: not supported: {why}")
        subscribe, pattern = options.get("subscribe"), options.get("subscribepattern")
        assign_raw = options.get("assign")
        if sum(x is not None for x in (subscribe, pattern, assign_raw)) != 1:
            raise ValueError("exactly one of subscribe, subscribePattern or assign is required")
        group_ids = {v for v in (options.get("group.id"), kafka.pop("group.id", None)) if v}
        if len(group_ids) > 1:
            raise ValueError(f"group.id and kafka.group.id disagree: {sorted(group_ids)}")
        group_id = group_ids.pop() if group_ids else None
        membership = not batch and assign_raw is None
        if membership and group_id is None:
            raise ValueError(
                "group.id: required (as group.id or kafka.group.id) with subscribe or "
                "subscribePattern: the consumer group this query joins"
            )
        prefix = options.get("groupidprefix")
        if prefix is not None and membership:
            raise ValueError(
                "groupIdPrefix: not supported with subscribe/subscribePattern: the query joins "
                "the group named by group.id"
            )
        if prefix is not None and not prefix.strip():
            raise ValueError("groupIdPrefix: must not be empty")
        topics: tuple[str, ...] = ()
        if subscribe is not None:
            topics = tuple(dict.fromkeys(t.strip() for t in subscribe.split(",") if t.strip()))
            if not topics:
                raise ValueError("subscribe: give a comma-separated list of topic names")
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"subscribePattern: invalid regex {pattern!r}: {exc}") from None
            # The group protocol takes a regex as a subscription starting with '^'.
            pattern = pattern if pattern.startswith("^") else "^" + pattern
        assign = parse_assign(assign_raw) if assign_raw is not None else ()
        starting = parse_offsets_json(
            options.get("startingoffsets"), "startingOffsets", "earliest" if batch else "latest"
        )
        ending = parse_offsets_json(options.get("endingoffsets"), "endingOffsets", "latest")
        if batch:
            if starting == "latest" or (isinstance(starting, dict) and LATEST in starting.values()):
                raise ValueError("startingOffsets: 'latest' (-1) is not valid in a batch query")
            if ending == "earliest" or (isinstance(ending, dict) and EARLIEST in ending.values()):
                raise ValueError("endingOffsets: 'earliest' (-2) is not valid in a batch query")
        strategy = options.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
        if strategy not in ("error", "latest"):
            raise ValueError(
                f"startingOffsetsByTimestampStrategy: expected error or latest, got {strategy!r}"
            )
        by_ts = options.get("startingoffsetsbytimestamp")
        end_by_ts = options.get("endingoffsetsbytimestamp")
        min_per_trigger = _int(options, "minoffsetspertrigger", None, 1)
        max_per_trigger = _int(options, "maxoffsetspertrigger", None, 1)
        if min_per_trigger and max_per_trigger and min_per_trigger > max_per_trigger:
            raise ValueError(
                f"minOffsetsPerTrigger ({min_per_trigger}) must be <= maxOffsetsPerTrigger "
                f"({max_per_trigger})"
            )
        delay_raw = options.get("maxtriggerdelay")
        delay = parse_duration_ms(delay_raw, "maxTriggerDelay") if delay_raw else 15 * 60_000
        return cls(
            bootstrap_servers=bootstrap,
            group_id=group_id,
            topics=topics,
            pattern=pattern,
            assign=assign,
            batch=batch,
            starting_offsets=starting,
            starting_timestamp=_int(options, "startingtimestamp", None, 0),
            starting_by_timestamp=(
                parse_timestamps(by_ts, "startingOffsetsByTimestamp") if by_ts else None
            ),
            timestamp_strategy=strategy,
            ending_offsets=ending,
            ending_timestamp=_int(options, "endingtimestamp", None, 0),
            ending_by_timestamp=(
                parse_timestamps(end_by_ts, "endingOffsetsByTimestamp") if end_by_ts else None
            ),
            max_offsets_per_trigger=max_per_trigger,
            min_offsets_per_trigger=min_per_trigger,
            max_trigger_delay_ms=delay,
            min_partitions=_int(options, "minpartitions", None, 1),
            max_records_per_partition=_int(options, "maxrecordsperpartition", None, 1),
            rows_per_task=_int(options, "rowspertask", 20_000, 1) or 20_000,
            fail_on_data_loss=_bool(options, "failondataloss", True),
            include_headers=_bool(options, "includeheaders", False),
            poll_timeout_ms=_int(options, "kafkaconsumer.polltimeoutms", 120_000, 1) or 120_000,
            fetch_retries=_int(options, "fetchoffset.numretries", 3, 0) or 0,
            fetch_retry_interval_ms=_int(options, "fetchoffset.retryintervalms", 10, 0) or 0,
            join_timeout_ms=_int(options, "jointimeoutms", 60_000, 0) or 0,
            checkpoint=options.get("checkpointlocation") or None,
            arrow_batch_size=_int(options, "arrowbatchsize", 10_000, 1) or 10_000,
            event_log=options.get("eventlog"),
            client_group_prefix=_client_prefix(group_id, prefix),
            kafka_params=kafka,
        )

    @property
    def membership(self) -> bool:
        """Whether the query is a group member (subscribe / subscribePattern, streaming)."""
        return not self.batch and not self.assign

    @property
    def description(self) -> str:
        """Like Spark's ``KafkaV2[Subscribe[orders]]``, with the group."""
        if self.assign:
            what = "Assign[" + ", ".join(f"{t}-{p}" for t, p in self.assign) + "]"
        elif self.pattern:
            what = f"SubscribePattern[{self.pattern}]"
        else:
            what = "Subscribe[" + ", ".join(self.topics) + "]"
        return f"kip848[{what}, group={self.group_id}]" if self.group_id else f"kip848[{what}]"

    @property
    def subscription(self) -> list[str]:
        """What ``GroupMember.subscribe`` takes: topic names, or one ``^regex``."""
        return [self.pattern] if self.pattern is not None else list(self.topics)

    def matches(self, topic: str) -> bool:
        """Whether ``topic`` is subscribed (names, the regex as a full match, or assigned)."""
        if self.pattern is not None:
            return re.fullmatch(self.pattern[1:], topic) is not None
        if self.assign:
            return any(t == topic for t, _ in self.assign)
        return topic in self.topics

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

        It uses the group id ``<group.id>-spark-<role>`` (or a unique one from
        ``groupIdPrefix``), never subscribes and never commits, so it never joins any group.
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
                "group.id": f"{self.client_group_prefix}-spark-{role}",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "error",
                "enable.partition.eof": True,
            }
        )
        return conf

    def commit_config(self) -> dict[str, Any]:
        """Config of the non-member client that commits ``assign`` queries' offsets."""
        conf = {k: v for k, v in self.fetch_config("commit").items()}
        conf["group.id"] = self.group_id
        return conf
