"""The offset JSON, admission control, range splitting and option parsing (no Spark)."""

from __future__ import annotations

import itertools
import json

import pytest

from spark_integration.offsets import (
    META_KEY,
    OffsetRange,
    SourceOffset,
    parse_starting_offsets,
    rate_limit,
    split_ranges,
)
from spark_integration.options import SourceOptions

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "group.id": "g", "subscribe": "t"}


def test_offset_json_round_trip_is_stable() -> None:
    offset = SourceOffset({("b", 1): 5, ("a", 0): 7, ("a", 10): 1}, {("a", 10): 0}, 4, "m")
    data = offset.to_json()
    assert list(data) == ["a", "b", META_KEY]
    assert data["a"] == {"0": 7, "10": 1}
    assert data[META_KEY] == {"epoch": 4, "member": "m", "starts": {"a": {"10": 0}}}
    text = json.dumps(data)
    again = SourceOffset.from_json(json.loads(text))
    assert again == offset
    assert json.dumps(again.to_json()) == text
    assert SourceOffset.from_json(None) == SourceOffset()
    with pytest.raises(ValueError, match="offset"):
        SourceOffset.from_json({"a": {"0": "x"}})


def test_rate_limit_is_proportional_and_never_starves_small_partitions() -> None:
    start = {("t", 0): 0, ("t", 1): 0, ("t", 2): 100}
    latest = {("t", 0): 1000, ("t", 1): 3, ("t", 2): 100}
    ends = rate_limit(100, start, latest)
    assert ends[("t", 2)] == 100  # no backlog
    assert ends[("t", 1)] == 1  # 100 * 3/1003 < 1 -> rounded up
    assert ends[("t", 0)] == 99  # floor(100 * 1000/1003)
    assert rate_limit(5000, start, latest) == latest
    assert rate_limit(10, {("t", 0): 5}, {("t", 0): 5}) == {("t", 0): 5}


def test_split_ranges_honours_min_partitions() -> None:
    ranges = [OffsetRange("t", 0, 0, 100), OffsetRange("t", 1, 10, 10), OffsetRange("t", 2, 0, 5)]
    assert split_ranges(ranges, None) == [ranges[0], ranges[2]]
    assert split_ranges(ranges, 2) == [ranges[0], ranges[2]]
    parts = split_ranges(ranges, 6)
    assert sum(r.size for r in parts) == 105
    assert len([r for r in parts if r.partition == 0]) == 6
    zero = sorted((r for r in parts if r.partition == 0), key=lambda r: r.from_offset)
    assert zero[0].from_offset == 0 and zero[-1].until_offset == 100
    assert all(a.until_offset == b.from_offset for a, b in itertools.pairwise(zero))


def test_starting_offsets_forms() -> None:
    assert parse_starting_offsets(None) == "latest"
    assert parse_starting_offsets(" Earliest ") == "earliest"
    assert parse_starting_offsets('{"t": {"0": 5, "1": -2}}') == {("t", 0): 5, ("t", 1): -2}
    with pytest.raises(ValueError, match="startingOffsets"):
        parse_starting_offsets("soon")
    with pytest.raises(ValueError, match=">= -2"):
        parse_starting_offsets('{"t": {"0": -3}}')


def test_options_parse_and_split_configs() -> None:
    opts = SourceOptions.parse(
        {
            **BASE,
            "maxOffsetsPerTrigger": "10",
            "includeHeaders": "true",
            "minPartitions": "8",
            "kafka.security.protocol": "PLAINTEXT",
            "kafka.fetch.wait.max.ms": "50",
            "kafka.max.poll.interval.ms": "600000",
            "kafka.queued.min.messages": "1000",
        }
    )
    assert (opts.max_offsets_per_trigger, opts.include_headers, opts.min_partitions) == (
        10,
        True,
        8,
    )
    assert opts.subscription == ["t"] and opts.fail_on_data_loss
    member = opts.member_config()
    assert member["group.id"] == "g" and member["enable.auto.commit"] is False
    assert member["max.poll.interval.ms"] == "600000"
    assert member["security.protocol"] == "PLAINTEXT"
    executor = opts.fetch_config("executor")
    assert executor["group.id"] == "g-spark-executor"
    assert executor["auto.offset.reset"] == "error"
    assert "max.poll.interval.ms" not in executor and executor["fetch.wait.max.ms"] == "50"
    assert SourceOptions.parse({**BASE, "kafka.group.id": "g"}).group_id == "g"
    pattern = SourceOptions.parse(
        {**{k: v for k, v in BASE.items() if k != "subscribe"}, "subscribePattern": "orders-.*"}
    )
    assert pattern.subscription == ["^orders-.*"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"kafka.auto.offset.reset": "earliest"}, "startingOffsets"),
        ({"kafka.enable.auto.commit": "true"}, "commits offsets itself"),
        ({"subscribePattern": "x"}, "exactly one of subscribe"),
        ({"assign": '{"t": [0]}'}, "exactly one of subscribe"),
        ({"subscribe": None, "assign": '{"t": 0}'}, "assign: topic 't' needs a non-empty"),
        ({"kafka.group.id": "other"}, "disagree"),
        ({"maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger: must be >= 1"),
        ({"failOnDataLoss": "maybe"}, "failOnDataLoss: expected true or false"),
        ({"subscribePattern": None, "subscribe": " , "}, "comma-separated"),
        ({"endingOffsets": "latest"}, "endingOffsets: only for batch queries"),
        ({"endingTimestamp": "5"}, "endingTimestamp: only for batch queries"),
        ({"topic": "x"}, "topic: not supported: a sink option"),
        ({"groupIdPrefix": "p"}, "groupIdPrefix: not supported with subscribe"),
        ({"startingOffsetsByTimestampStrategy": "oldest"}, "error or latest"),
        ({"startingOffsetsByTimestamp": '{"t": {"0": -5}}'}, "timestamps must be >= 0"),
        ({"maxTriggerDelay": "soon"}, "maxTriggerDelay: expected a duration"),
        ({"minOffsetsPerTrigger": "50", "maxOffsetsPerTrigger": "10"}, "must be <="),
        ({"startingOfsets": "earliest"}, r"unknown option\(s\) \['startingofsets'\]"),
    ],
)
def test_bad_options_are_rejected_with_the_option_name(
    extra: dict[str, str | None], message: str
) -> None:
    raw = {k: v for k, v in {**BASE, **extra}.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        SourceOptions.parse(raw)


def test_missing_required_options() -> None:
    with pytest.raises(ValueError, match=r"bootstrap\.servers"):
        SourceOptions.parse({"group.id": "g", "subscribe": "t"})
    with pytest.raises(ValueError, match=r"group\.id: required"):
        SourceOptions.parse({"kafka.bootstrap.servers": "h:1", "subscribe": "t"})


def _without_prefix(opts: SourceOptions) -> SourceOptions:
    import dataclasses

    return dataclasses.replace(opts, client_group_prefix="")


#: A valid non-default value for each option the source implements.
SAMPLES: dict[str, str] = {
    "assign": '{"t": [0, 1]}',
    "subscribe": "t2",
    "subscribePattern": "t.*",
    "kafka.bootstrap.servers": "127.0.0.1:9093",
    "startingTimestamp": "1000",
    "startingOffsetsByTimestamp": '{"t": {"0": 1000}}',
    "startingOffsetsByTimestampStrategy": "latest",
    "startingOffsets": '{"t": {"0": 3}}',
    "endingTimestamp": "2000",
    "endingOffsetsByTimestamp": '{"t": {"0": 2000}}',
    "endingOffsets": '{"t": {"0": 5}}',
    "failOnDataLoss": "false",
    "kafkaConsumer.pollTimeoutMs": "5000",
    "fetchOffset.numRetries": "7",
    "fetchOffset.retryIntervalMs": "50",
    "maxOffsetsPerTrigger": "100",
    "minOffsetsPerTrigger": "10",
    "maxTriggerDelay": "30s",
    "minPartitions": "4",
    "maxRecordsPerPartition": "1000",
    "groupIdPrefix": "etl",
    "kafka.group.id": "g",
    "includeHeaders": "true",
    "group.id": "g2",
    "joinTimeoutMs": "1000",
    "rowsPerTask": "100",
    "arrowBatchSize": "100",
    "eventLog": "/tmp/events.jsonl",
    "checkpointLocation": "/tmp/ck",
}


def test_every_option_is_implemented_or_rejected() -> None:
    """Each documented option either changes the parsed options or is refused by name;
    every option of Spark's Kafka source is listed, and docs/spark.md shows its status."""
    from pathlib import Path

    from spark_integration.options import KIP848_OPTIONS, SPARK_KAFKA_OPTIONS

    spark_names = {o.name for o in SPARK_KAFKA_OPTIONS}
    # Spark 4.x structured-streaming-kafka-integration.md, source options.
    assert spark_names >= {
        "assign",
        "subscribe",
        "subscribePattern",
        "kafka.bootstrap.servers",
        "startingTimestamp",
        "startingOffsetsByTimestamp",
        "startingOffsets",
        "endingTimestamp",
        "endingOffsetsByTimestamp",
        "endingOffsets",
        "failOnDataLoss",
        "kafkaConsumer.pollTimeoutMs",
        "fetchOffset.numRetries",
        "fetchOffset.retryIntervalMs",
        "maxOffsetsPerTrigger",
        "minOffsetsPerTrigger",
        "maxTriggerDelay",
        "minPartitions",
        "maxRecordsPerPartition",
        "groupIdPrefix",
        "kafka.group.id",
        "includeHeaders",
        "startingOffsetsByTimestampStrategy",
    }
    docs = (Path(__file__).resolve().parents[2] / "docs" / "spark.md").read_text()
    for info in SPARK_KAFKA_OPTIONS + KIP848_OPTIONS:
        assert f"| `{info.name}`" in docs, f"docs/spark.md lacks a row for {info.name}"
        if info.status == "rejected":
            with pytest.raises(ValueError, match=f"^{info.name}: not supported"):
                SourceOptions.parse({**BASE, info.name: "x"})
            continue
        batch = info.status == "batch"
        modes = [True] if batch else [False] if info.status == "streaming" else [False, True]
        for is_batch in modes:
            base = dict(BASE)
            if info.name in ("assign", "subscribe", "subscribePattern"):
                base.pop("subscribe")
                opts = SourceOptions.parse({**base, info.name: SAMPLES[info.name]}, is_batch)
                assert (opts.assign, opts.topics, opts.pattern) == {
                    "assign": ((("t", 0), ("t", 1)), (), None),
                    "subscribe": ((), ("t2",), None),
                    "subscribePattern": ((), (), "^t.*"),
                }[info.name]
                continue
            if info.name in ("kafka.group.id", "group.id"):
                base.pop("group.id")
                opts = SourceOptions.parse({**base, info.name: "g9"}, is_batch)
                assert opts.group_id == "g9" and opts.client_group_prefix == "g9"
                continue
            if info.name == "groupIdPrefix":
                base = {"kafka.bootstrap.servers": "h:1", "assign": SAMPLES["assign"]}
                opts = SourceOptions.parse({**base, info.name: "etl"}, batch=is_batch)
                assert opts.client_group_prefix.startswith("etl-")
                continue
            default = _without_prefix(SourceOptions.parse(base, batch=is_batch))
            changed = _without_prefix(
                SourceOptions.parse({**base, info.name: SAMPLES[info.name]}, batch=is_batch)
            )
            assert changed != default, f"{info.name} is accepted but changes nothing"


def test_batch_and_assign_options() -> None:
    opts = SourceOptions.parse(
        {
            "kafka.bootstrap.servers": "h:1",
            "assign": '{"a": [1, 0], "b": [2]}',
            "startingOffsetsByTimestamp": '{"a": {"0": 10}}',
            "endingOffsets": '{"a": {"0": 7}}',
        },
        batch=True,
    )
    assert opts.assign == (("a", 0), ("a", 1), ("b", 2)) and not opts.membership
    assert opts.starting_offsets == "earliest" and opts.group_id is None
    assert opts.starting_by_timestamp == {("a", 0): 10} and opts.ending_offsets == {("a", 0): 7}
    assert opts.fetch_config("executor")["group.id"].startswith("spark-kip848-")
    with pytest.raises(ValueError, match=r"'latest' .* not valid in a batch"):
        SourceOptions.parse({**BASE, "startingOffsets": "latest"}, batch=True)
    with pytest.raises(ValueError, match=r"'earliest' .* not valid in a batch"):
        SourceOptions.parse({**BASE, "endingOffsets": '{"t": {"0": -2}}'}, batch=True)
    with pytest.raises(ValueError, match="only for streaming"):
        SourceOptions.parse({**BASE, "maxOffsetsPerTrigger": "5"}, batch=True)
    streaming = SourceOptions.parse({**BASE, "minOffsetsPerTrigger": "5", "maxTriggerDelay": "2m"})
    assert (streaming.min_offsets_per_trigger, streaming.max_trigger_delay_ms) == (5, 120_000)


def test_pack_tasks_and_split_by_size() -> None:
    from spark_integration.offsets import pack_tasks, split_by_size

    small = [OffsetRange("t", p, 0, 80 + p) for p in range(12)]
    assert [len(t) for t in pack_tasks(small, 20_000)] == [12]
    big = [OffsetRange("t", p, 0, 15_000) for p in range(4)]  # 60k rows: 3 balanced tasks
    tasks = pack_tasks(big, 20_000)
    assert sorted(sum(r.size for r in t) for t in tasks) == [15_000, 15_000, 30_000]
    # A whole range per task: never split here (a split range seeks its consumer back).
    one = pack_tasks([OffsetRange("t", 0, 0, 100_000)], 20_000)
    assert one == [[OffsetRange("t", 0, 0, 100_000)]]
    mixed = pack_tasks(small + big, 20_000)
    assert sorted(r for t in mixed for r in t) == sorted(small + big) and len(mixed) == 4
    parts = split_by_size([OffsetRange("t", 0, 5, 30)], 10)
    assert [(r.from_offset, r.until_offset) for r in parts] == [(5, 15), (15, 25), (25, 30)]
