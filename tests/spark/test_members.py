"""Executor members: long-lived consumer_sdk Consumers as a Spark barrier stage."""

from __future__ import annotations

import collections
import json
import os
from pathlib import Path
from typing import Any

import pytest

from consumer_sdk.testing import EmbeddedKafka
from tests.spark.helpers import (
    PlainMember,
    Record,
    all_records,
    committed,
    high_watermarks,
    produce,
    wait_for,
)

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")
pytestmark = pytest.mark.spark

PARTS = 6


def written(out: Path) -> list[Record]:
    rows: list[Record] = []
    for f in out.glob("*.jsonl"):
        for line in f.read_text().splitlines():
            if line.strip():
                topic, partition, offset = json.loads(line)
                rows.append((str(topic), int(partition), int(offset)))
    return rows


def test_refuses_more_members_than_free_task_slots(
    spark: Any, embedded_kafka: EmbeddedKafka
) -> None:
    from spark_integration import run_group_members

    slots = spark.sparkContext.defaultParallelism
    config = {"bootstrap.servers": embedded_kafka.bootstrap_servers, "group.id": "m-refuse"}
    with pytest.raises(ValueError, match=f"members={slots + 1} exceeds the {slots} free task"):
        run_group_members(spark, config, ["m-refuse"], print, members=slots + 1)
    with pytest.raises(ValueError, match="members must be >= 1"):
        run_group_members(spark, config, ["m-refuse"], print, members=0)


def test_two_members_and_a_third_consumer(
    spark: Any, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    from spark_integration import run_group_members

    topic, group = "m-share", "m-share-g"
    embedded_kafka.create_topic(topic, partitions=PARTS)
    produce(embedded_kafka, topic, PARTS, 100, "a")
    out = tmp_path / "out"
    out.mkdir()

    def process(batch: Any) -> None:  # runs in the executor's Python worker
        cols = batch.select(["topic", "partition", "offset"]).to_pydict()
        with open(out / f"{os.getpid()}.jsonl", "a", encoding="utf-8") as f:
            for row in zip(cols["topic"], cols["partition"], cols["offset"], strict=True):
                f.write(json.dumps(row) + "\n")

    config = {
        "bootstrap.servers": embedded_kafka.bootstrap_servers,
        "group.id": group,
        "auto.offset.reset": "earliest",
    }
    job = run_group_members(
        spark, config, [topic], process, members=2, control_dir=tmp_path / "ctl", batch_size=50
    )
    third: PlainMember | None = None
    try:
        wait_for(lambda: len(set(written(out))) == 600, 90, "the members reading the backlog")
        third = PlainMember(embedded_kafka, group, topic)
        wait_for(lambda: third is not None and len(third.owned) == 2, 30, "a 2/2/2 split")
        produce(embedded_kafka, topic, PARTS, 100, "b")
        wait_for(lambda: len(set(written(out)) | set(third.records)) == 1200, 60, "round two")
        # Progress files are rewritten every 0.2 s; each member owns 2 partitions by now.
        wait_for(
            lambda: len([p for p in job.progress().values() if p["records"] > 0]) == 2,
            10,
            "both members processing",
        )
        third.close()
        produce(embedded_kafka, topic, PARTS, 50, "c")
        wait_for(lambda: len(set(written(out)) | set(third.records)) == 1500, 60, "round three")
        reports = job.stop(timeout=60)
    finally:
        if third is not None:
            third.close()
        if job.running():
            job.stop(timeout=30)
    assert [r.stopped_by for r in reports] == ["stop-file", "stop-file"]
    assert sum(r.revocations for r in reports) >= 1 and all(r.records for r in reports)

    processed = written(out) + third.records
    produced = all_records(embedded_kafka, topic, PARTS)
    assert set(processed) == produced, "a record was never processed"
    events = job.events()
    # Duplicates may only come from work a member had not committed when it lost a partition.
    counts = collections.Counter(processed)
    duplicates = sorted(r for r, n in counts.items() if n > 1)
    lost = {p for e in events if e["kind"] == "lost" for p in e["partitions"]}
    assert all(f"{t}:{p}" in lost for t, p, _ in duplicates), duplicates[:10]

    # Revoke-then-assign: each revocation commits what was processed, before the release.
    owned: dict[tuple[int, str], float] = {}
    intervals: list[tuple[str, float, float]] = []  # (partition, assigned, released)
    revocations = checked = 0
    for i, e in enumerate(events):
        if e["kind"] == "assign":
            owned.update({(e["member"], p): e["t"] for p in e["partitions"]})
        if e["kind"] == "lost":
            for p in e["partitions"]:
                intervals.append((p, owned.pop((e["member"], p)), e["t"]))
        if e["kind"] != "revoke-start":
            continue
        revocations += 1
        done = next(
            d for d in events[i:] if d["kind"] == "revoke-done" and d["member"] == e["member"]
        )
        syncs = [
            c
            for c in events
            if c["kind"] == "commit"
            and c["member"] == e["member"]
            and e["t"] <= c["t"] <= done["t"]
            and c["sync"]
        ]
        at_revoke = {k: v for c in syncs for k, v in c["offsets"].items()}
        before = events[:i]
        for part in e["partitions"]:
            spans = [
                x["spans"][part]
                for x in before
                if x["member"] == e["member"] and x["kind"] == "processed" and part in x["spans"]
            ]
            earlier = [
                c["offsets"][part]
                for c in before
                if c["member"] == e["member"] and c["kind"] == "commit" and part in c["offsets"]
            ]
            if spans:  # it processed records: committed up to them, at revoke time at the latest
                last = max(s[1] for s in spans) + 1
                assert at_revoke.get(part, max(earlier, default=-1)) == last, (part, last)
                checked += 1
            intervals.append((part, owned.pop((e["member"], part)), done["t"]))
    assert revocations and checked, "no revocation of a partition with processed records"
    for t, kind, parts in third.events:  # the third consumer got partitions only after release
        for p in parts if kind == "assign" else []:
            clash = [iv for iv in intervals if iv[0] == f"{topic}:{p}" and iv[1] <= t < iv[2]]
            assert not clash, (p, t, clash)
    # Stopping flushed, committed and left: the group's offsets are at the end.
    assert committed(embedded_kafka, group, topic, PARTS) == high_watermarks(
        embedded_kafka, topic, PARTS
    )


def test_members_stop_after_max_records_or_a_duration(
    spark: Any, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    from spark_integration import run_group_members

    topic, group = "m-stop", "m-stop-g"
    embedded_kafka.create_topic(topic, partitions=2)
    produce(embedded_kafka, topic, 2, 150, "a")
    config = {
        "bootstrap.servers": embedded_kafka.bootstrap_servers,
        "group.id": group,
        "auto.offset.reset": "earliest",
    }
    job = run_group_members(
        spark,
        config,
        [topic],
        lambda batch: None,
        members=1,
        max_records=100,
        batch_size=40,
        control_dir=tmp_path / "a",
    )
    (report,) = job.wait(timeout=60)
    assert report.stopped_by == "max_records"
    assert 100 <= report.records < 300 and report.commits >= 1
    # What it processed is exactly what it committed before leaving.
    assert sum(committed(embedded_kafka, group, topic, 2).values()) == report.records
    job = run_group_members(
        spark,
        config,
        [topic],
        lambda batch: None,
        members=1,
        stop_after_s=2.0,
        control_dir=tmp_path / "b",
    )
    (report,) = job.wait(timeout=60)
    assert report.stopped_by == "stop_after_s"
    assert committed(embedded_kafka, group, topic, 2) == {0: 150, 1: 150}


def _ownership(
    events: list[dict[str, Any]], ended: dict[int, float]
) -> list[tuple[str, int, float, float]]:
    """(partition, pid, from, to) for every run of every member: from its assign to its
    revoke-done / lost / close, or to ``ended[pid]`` (killed) / the last event."""
    open_: dict[tuple[int, str], float] = {}
    out: list[tuple[str, int, float, float]] = []
    last = max(e["t"] for e in events)
    for e in events:
        pid = e["pid"]
        if e["kind"] == "assign":
            for p in e["partitions"]:
                open_[(pid, p)] = e["t"]
        elif e["kind"] in ("revoke-done", "lost"):
            for p in e["partitions"]:
                out.append((p, pid, open_.pop((pid, p)), e["t"]))
        elif e["kind"] == "closed":
            for q, p in list(open_):
                if q == pid:
                    out.append((p, pid, open_.pop((q, p)), e["t"]))
    for (pid, p), t in open_.items():
        out.append((p, pid, t, ended.get(pid, last)))
    return out


def test_a_killed_member_is_restarted_and_nothing_is_lost(
    spark: Any, embedded_kafka: EmbeddedKafka, tmp_path: Path
) -> None:
    """SIGKILL one member's Python worker: the other keeps going, the member comes back
    (new process, new assignment), every record is processed and committed, and no
    partition is owned by two live members at once."""
    import signal
    import time

    from spark_integration import run_group_members

    topic, group = "m-kill", "m-kill-g"
    embedded_kafka.create_topic(topic, partitions=PARTS)
    produce(embedded_kafka, topic, PARTS, 100, "a")
    out = tmp_path / "out"
    out.mkdir()

    def process(batch: Any) -> None:
        cols = batch.select(["topic", "partition", "offset"]).to_pydict()
        with open(out / f"{os.getpid()}.jsonl", "a", encoding="utf-8") as f:
            for row in zip(cols["topic"], cols["partition"], cols["offset"], strict=True):
                f.write(json.dumps(row) + "\n")

    config = {
        "bootstrap.servers": embedded_kafka.bootstrap_servers,
        "group.id": group,
        "auto.offset.reset": "earliest",
    }
    job = run_group_members(
        spark,
        config,
        [topic],
        process,
        members=2,
        batch_size=50,
        control_dir=tmp_path / "ctl",
        restart_backoff_s=(0.5, 2.0),
    )
    try:
        wait_for(lambda: len(set(written(out))) == 600, 120, "both members reading")

        def starts(member: int) -> list[int]:
            return [
                e["pid"] for e in job.events() if e["kind"] == "start" and e["member"] == member
            ]

        wait_for(lambda: starts(0) and starts(1), 30, "both members started")
        victim = starts(0)[-1]
        os.kill(victim, signal.SIGKILL)
        killed_at = time.time()
        produce(embedded_kafka, topic, PARTS, 100, "b")
        wait_for(lambda: len(starts(0)) >= 2, 120, "member 0 restarted")
        wait_for(
            lambda: any(e["kind"] == "assign" and e["pid"] == starts(0)[-1] for e in job.events()),
            120,
            "member 0 back in the group",
        )
        produce(embedded_kafka, topic, PARTS, 50, "c")
        wait_for(
            lambda: set(written(out)) == all_records(embedded_kafka, topic, PARTS),
            120,
            "every record processed",
        )
        reports = job.stop(timeout=90)
    finally:
        if job.running():
            job.stop(timeout=30)
    assert job.restarts == {0: 1, 1: 0}
    assert [r.stopped_by for r in reports] == ["stop-file", "stop-file"]
    assert reports[0].restarts == 1 and all(r.records for r in reports)
    survivor = starts(1)
    assert len(survivor) == 1, "the other member was restarted too"
    intervals = _ownership(job.events(), {victim: killed_at})
    for p1, pid1, a1, b1 in intervals:
        for p2, pid2, a2, b2 in intervals:
            if p1 == p2 and pid1 != pid2:
                assert b1 <= a2 or b2 <= a1, f"{p1} owned by {pid1} and {pid2} at once"
    # Stopping flushed, committed and left: the group's offsets are at the end.
    assert committed(embedded_kafka, group, topic, PARTS) == high_watermarks(
        embedded_kafka, topic, PARTS
    )
