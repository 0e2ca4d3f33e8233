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
        {**BASE, "maxOffsetsPerTrigger": "10", "includeHeaders": "true", "minPartitions": "8",
         "kafka.security.protocol": "PLAINTEXT", "kafka.fetch.wait.max.ms": "50",
         "kafka.max.poll.interval.ms": "600000", "kafka.queued.min.messages": "1000"}
    )  # fmt: skip
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
    pattern = SourceOptions.parse({**{k: v for k, v in BASE.items() if k != "subscribe"},
                                   "subscribePattern": "orders-.*"})  # fmt: skip
    assert pattern.subscription == ["^orders-.*"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"kafka.auto.offset.reset": "earliest"}, "startingOffsets"),
        ({"kafka.enable.auto.commit": "true"}, "commits offsets itself"),
        ({"subscribePattern": "x"}, "exactly one of subscribe"),
        ({"assign": '{"t": [0]}'}, "assign: not supported"),
        ({"kafka.group.id": "other"}, "disagree"),
        ({"maxOffsetsPerTrigger": "0"}, "maxoffsetspertrigger: must be >= 1"),
        ({"failOnDataLoss": "maybe"}, "failondataloss"),
        ({"subscribePattern": None, "subscribe": " , "}, "comma-separated"),
    ],
)
def test_bad_options_are_rejected_with_the_option_name(extra: dict[str, str | None],
                                                       message: str) -> None:  # fmt: skip
    raw = {k: v for k, v in {**BASE, **extra}.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        SourceOptions.parse(raw)


def test_missing_required_options() -> None:
    with pytest.raises(ValueError, match=r"bootstrap\.servers"):
        SourceOptions.parse({"group.id": "g", "subscribe": "t"})
    with pytest.raises(ValueError, match=r"group\.id: required"):
        SourceOptions.parse({"kafka.bootstrap.servers": "h:1", "subscribe": "t"})
