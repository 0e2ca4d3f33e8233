"""Heartbeats around a scale-out or scale-in, member by member: this SDK vs confluent-kafka.

    python -m bench.scale_trace --pairs N [--scenario out|in] [--members 5] [--partitions 20]

One real 3-node Apache Kafka (``KafkaCluster``, ``KAFKA_HOME``; heartbeat interval 500 ms,
session 3 s, as bench/convergence.py). ``out``: one member owns every partition, then
``--members - 1`` more subscribe at once; ``in``: all of them own partitions, then all but
the first close at once. The SDK and confluent-kafka (``group.protocol=consumer``) alternate.
Members are traced as in `bench.failover_phases` (the SDK's heartbeat trace, librdkafka's
``debug=cgrp,consumer`` lines). Per run it prints the convergence time and, per member, in
ms from the step's start: when it subscribed (``out``), every heartbeat as (sent, answered,
error code) and every change of its partitions as (time, partitions owned).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.failover_phases import HEARTBEAT_MS, SESSION_MS, _librdkafka_events, _Run, settle


def _ready_at(proc: Any) -> float:
    return float(next(e["at"] for e in proc.events if e["ev"] == "ready"))


def _sent_after(beats: list[dict[str, Any]], at: float) -> float | None:
    return next((b["sent"] for b in beats if b["sent"] >= at), None)


def _answer_before(beats: list[dict[str, Any]], at: float) -> dict[str, Any] | None:
    answered = [b for b in beats if b.get("err") == 0 and b["at"] <= at]
    return max(answered, key=lambda b: b["at"]) if answered else None


def _steps_out(
    procs: list[Any], all_events: list[list[dict[str, Any]]], t0: float
) -> dict[str, float]:
    """A scale-out's steps (ms), member by member; the new members' figures are of the
    last one to get its partitions (the one convergence waits for).

    - ``join``: the new member's subscribe() -> its join heartbeat sent;
    - ``interval``: its join heartbeat sent -> the heartbeat that brought its partitions sent
      (one interval when the old owner's revocation was acknowledged before; two if not);
    - ``assign_cb``: that heartbeat's answer -> its on_assign;
    - ``revoke_learn``: the old owner's heartbeat that brought the revocation, sent, from t0;
    - ``revoke_cb``: that answer -> its on_revoke;
    - ``ack``: its on_revoke -> the acknowledging heartbeat sent;
    - ``got``: the last new member's on_assign, from t0."""
    out: dict[str, float] = {}
    beats_of = [
        sorted((e for e in events if e["ev"] == "hb"), key=lambda e: e["sent"])
        for events in all_events
    ]
    old_beats, old_events = beats_of[0], all_events[0]
    owned = [e for e in old_events if e["ev"] == "owned"]
    revoked = next(
        (
            e
            for prev, e in itertools.pairwise(owned)
            if e["at"] >= t0 - 1 and len(e["owned"]) < len(prev["owned"])
        ),
        None,
    )
    if revoked is not None:
        answer = _answer_before(old_beats, revoked["at"])
        ack = _sent_after(old_beats, revoked["at"])
        if answer is not None:
            out["revoke_learn"] = (answer["sent"] - t0) * 1000
            out["revoke_cb"] = (revoked["at"] - answer["at"]) * 1000
        if ack is not None:
            out["ack"] = (ack - revoked["at"]) * 1000
            out["ack_at"] = (ack - t0) * 1000
    last: tuple[float, dict[str, float]] | None = None
    for proc, events, beats in zip(procs[1:], all_events[1:], beats_of[1:], strict=True):
        ready = _ready_at(proc)
        got = next((e for e in events if e["ev"] == "owned" and e["owned"]), None)
        join = _sent_after(beats, ready)
        if got is None or join is None:
            continue
        answer = _answer_before(beats, got["at"])
        row = {"join": (join - ready) * 1000, "got": (got["at"] - t0) * 1000}
        if answer is not None:
            row["interval"] = (answer["sent"] - join) * 1000
            row["assign_cb"] = (got["at"] - answer["at"]) * 1000
        if last is None or got["at"] > last[0]:
            last = (got["at"], row)
    if last is not None:
        out.update(last[1])
    return out


def _one(
    kind: str, kafka: Any, workdir: Path, scenario: str, members: int, partitions: int
) -> tuple[float, list[str], dict[str, float]]:
    run = _Run(kind, kafka, partitions, workdir)
    try:
        first = run.spawn(1, sdk_logs=False)
        first[0].ready.wait(60)
        run.wait_converged()
        settle()
        new = run.spawn(members - 1, sdk_logs=False, sync=True)
        run.subscribe(new)  # together, once constructed (as bench/convergence.py)
        for p in new:
            p.ready.wait(60)
        t0 = max(_ready_at(p) for p in new)
        done = run.wait_converged()
        if scenario == "in":
            settle()
            leaving, run.procs = run.procs[1:], run.procs[:1]
            t0 = time.time()
            for p in leaving:
                assert p.popen.stdin is not None
                p.popen.stdin.close()
            done = run.wait_converged()
            run.procs += leaving
    finally:
        run.close()
    lines = []
    all_events = []
    for i, p in enumerate(run.procs):
        events = list(p.events)
        if kind == "confluent":
            events += _librdkafka_events(p.stderr_path)
        all_events.append(events)

        def ms(at: float) -> int:
            return round((at - t0) * 1000)

        beats = [
            (ms(e["sent"]), ms(e["at"]), e.get("err", e.get("fail")))
            for e in sorted((e for e in events if e["ev"] == "hb"), key=lambda e: e["sent"])
            if t0 - 1 < e["sent"] < done + 0.2
        ]
        owned = [
            (ms(e["at"]), len(e["owned"]))
            for e in events
            if e["ev"] == "owned" and e["at"] > t0 - 1
        ]
        joined = f" subscribed {ms(_ready_at(p))}" if scenario == "out" else ""
        lines.append(f"  member {i}:{joined} heartbeats {beats} owned {owned}")
    steps = _steps_out(run.procs, all_events, t0) if scenario == "out" else {}
    if steps:
        lines.append("  steps (ms): " + ", ".join(f"{k} {v:.0f}" for k, v in steps.items()))
    return done - t0, lines, steps


def main(argv: list[str] | None = None) -> int:
    from consumer_sdk.testing import KafkaCluster

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--scenario", choices=("out", "in"), default="out")
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=20)
    ns = parser.parse_args(argv)
    times: dict[str, list[float]] = {"sdk": [], "confluent": []}
    steps: dict[str, list[dict[str, float]]] = {"sdk": [], "confluent": []}
    with (
        KafkaCluster(
            nodes=3, heartbeat_interval_ms=HEARTBEAT_MS, session_timeout_ms=SESSION_MS
        ) as kafka,
        tempfile.TemporaryDirectory() as tmp,
    ):
        for i in range(ns.pairs):
            for kind in ("sdk", "confluent") if i % 2 == 0 else ("confluent", "sdk"):
                took, lines, step = _one(
                    kind, kafka, Path(tmp), ns.scenario, ns.members, ns.partitions
                )
                times[kind].append(took)
                steps[kind].append(step)
                print(f"{kind}: converged after {took * 1000:.0f} ms", flush=True)
                print("\n".join(lines), flush=True)
    for kind, values in times.items():
        print(
            f"{kind}: mean {statistics.mean(values) * 1000:.0f} ms, median "
            f"{statistics.median(values) * 1000:.0f} ms over {len(values)} runs"
        )
        names = sorted({k for step in steps[kind] for k in step})
        medians = {
            k: statistics.median([step[k] for step in steps[kind] if k in step]) for k in names
        }
        if medians:
            print(
                f"{kind}: step medians (ms) "
                + ", ".join(f"{k} {v:.0f}" for k, v in medians.items())
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
