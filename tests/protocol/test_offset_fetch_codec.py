"""OffsetFetch request mapping: listed partitions per topic, or every partition (null topics)."""

from __future__ import annotations

import pytest

from consumer_sdk.domain import OffsetFetchRequest
from consumer_sdk.protocol import messages as m


@pytest.mark.parametrize("version", [6, 7, 8, 9])
def test_all_partitions_is_a_null_topic_list(version: int) -> None:
    request, _ = m.offset_fetch_call(OffsetFetchRequest("g", None, require_stable=False), version)
    topics = request.groups[0].topics if version >= 8 else request.topics
    assert topics is None


@pytest.mark.parametrize("version", [6, 7, 8, 9])
def test_listed_partitions_are_grouped_by_topic(version: int) -> None:
    wanted = (("b", 1), ("a", 0), ("b", 0))
    request, _ = m.offset_fetch_call(OffsetFetchRequest("g", wanted), version)
    topics = request.groups[0].topics if version >= 8 else request.topics
    assert [(t.name, list(t.partition_indexes)) for t in topics] == [("a", [0]), ("b", [1, 0])]
