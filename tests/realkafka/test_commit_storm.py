"""The commit storm on the real broker (``bench/commit_storm.py``): SDK and confluent-kafka
members in one group that scales every second while every member commits after every batch.

Nothing produced may go unread: the group starts committed at 0 with ``auto.offset.reset``
``latest``, so a position moved to the reset policy by a stale-epoch answer would skip
records. The failures each client surfaces are counted; only rebalance-time refusals may be
among them (their ratio to confluent-kafka's is the benchmark's, not this test's).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.commit_storm import KINDS, storm

pytestmark = pytest.mark.realkafka

# What a commit may meet while the group moves under it (the Java client's CommitRequestManager:
# a new epoch not yet seen, or a member fenced or already gone).
REBALANCE_REFUSALS = {"STALE_MEMBER_EPOCH", "UNKNOWN_MEMBER_ID", "FENCED_MEMBER_EPOCH"}


def test_a_group_scaling_every_second_loses_nothing_and_commits_through_it(
    real_kafka: Any, tmp_path: Path
) -> None:
    result = storm(real_kafka, seconds=16, members_per_kind=2, interval=1.0, work_dir=tmp_path)
    assert result.scale_steps >= 10
    assert result.produced > 0
    assert result.lost == 0, f"unread records (partition, offset): {result.lost_sample}"
    for kind in KINDS:
        assert result.commits[kind] > 0, f"{kind} members never committed"
        unexpected = set(result.failures[kind]) - REBALANCE_REFUSALS
        assert not unexpected, f"{kind} surfaced {result.failures[kind]}"
