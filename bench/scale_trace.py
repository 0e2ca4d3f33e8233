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
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.failover_phases import HEARTBEAT_MS, SESSION_MS, _librdkafka_events, _Run, settle


def _ready_at(proc: Any) -> float:
    return float(next(e["at"] for e in proc.events if e["ev"] == "ready"))


def _one(
    kind: str, kafka: Any, workdir: Path, scenario: str, members: int, partitions: int
) -> tuple[float, list[str]]:
    run = _Run(kind, kafka, partitions, workdir)
    try:
        first = run.spawn(1, sdk_logs=False)
        first[0].ready.wait(60)
        run.wait_converged()
        settle()
        new = run.spawn(members - 1, sdk_logs=False)
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
    for i, p in enumerate(run.procs):
        events = list(p.events)
        if kind == "confluent":
            events += _librdkafka_events(p.stderr_path)

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
    return done - t0, lines


def main(argv: list[str] | None = None) -> int:
    from consumer_sdk.testing import KafkaCluster

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--scenario", choices=("out", "in"), default="out")
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=20)
    ns = parser.parse_args(argv)
    times: dict[str, list[float]] = {"sdk": [], "confluent": []}
    with (
        KafkaCluster(
            nodes=3, heartbeat_interval_ms=HEARTBEAT_MS, session_timeout_ms=SESSION_MS
        ) as kafka,
        tempfile.TemporaryDirectory() as tmp,
    ):
        for i in range(ns.pairs):
            for kind in ("sdk", "confluent") if i % 2 == 0 else ("confluent", "sdk"):
                took, lines = _one(kind, kafka, Path(tmp), ns.scenario, ns.members, ns.partitions)
                times[kind].append(took)
                print(f"{kind}: converged after {took * 1000:.0f} ms", flush=True)
                print("\n".join(lines), flush=True)
    for kind, values in times.items():
        print(f"{kind}: mean {statistics.mean(values) * 1000:.0f} ms over {len(values)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
