"""The kip848 executor's consumer pool without Spark: worker processes read micro-batches.

Not a test. Run from the repository root (needs the spark extra and ``KAFKA_HOME``)::

    python -m bench.spark_pool            # 12 partitions x 200k records of 100 B
    python -m bench.spark_pool --quick    # 12 x 40k

``WORKERS`` processes stand in for Spark's Python workers: each keeps its own pool (the
executor module's globals) and takes ranges from one queue, a batch's 12 ranges (one per
partition, in a shuffled order) at a time, as Spark hands a batch's tasks to any idle
worker; five batches of 40k-record (``--quick``: 8k) ranges read every partition to its
end through `spark_integration.executor.read_range`. Each librdkafka settings variant
(the source's defaults; librdkafka's ``fetch.wait.max.ms`` and ``queued.min.messages``)
runs in every round, rounds in alternating order; the figures are the medians of the wall
time, the workers' CPU time and the broker's CPU time. Absolute numbers on shared machines
are noise; compare the variants of one run.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import statistics
import sys
import time
from typing import Any

from bench.spark_source import _produce

PARTITIONS = 12
BATCHES = 5
WORKERS = 4
ROUNDS = 3
TOPIC = "bench-pool"
#: The source's defaults against librdkafka's, one setting at a time.
VARIANTS: dict[str, dict[str, str]] = {
    "source defaults": {},
    "fetch.wait.max.ms 500": {"fetch.wait.max.ms": "500"},
    "queued.min.messages 100000": {"queued.min.messages": "100000"},
}


def _worker(config: dict[str, str], tasks: Any, done: Any) -> None:
    from spark_integration.executor import ReadTask, position_counts, read_range
    from spark_integration.offsets import OffsetRange

    while (item := tasks.get()) is not None:
        partition, start, end = item
        task = ReadTask.make(
            OffsetRange(TOPIC, partition, start, end),
            config,
            include_headers=False,
            fail_on_data_loss=True,
            poll_timeout_ms=60_000,
            arrow_batch_size=10_000,
        )
        rows = sum(batch.num_rows for batch in read_range(task))
        if rows != end - start:
            raise AssertionError(f"read {rows} records of [{start}, {end})")
        done.put(rows)
    cpu = os.times()
    done.put((cpu.user + cpu.system, position_counts()))


def _cpu_of(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _round(config: dict[str, str], per_range: int, broker_pid: int, seed: int) -> tuple[float, ...]:
    """(wall s, workers' CPU s, broker CPU s) of one pool reading every batch."""
    ctx = mp.get_context("fork")
    tasks: Any = ctx.Queue()
    done: Any = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(config, tasks, done)) for _ in range(WORKERS)]
    for p in procs:
        p.start()
    for i in range(WORKERS):  # each worker connects one consumer first (warm workers)
        tasks.put((i, 0, 1))
    for _ in range(WORKERS):
        done.get()
    order = random.Random(seed)
    broker_before, started = _cpu_of(broker_pid), time.perf_counter()
    for k in range(BATCHES):
        partitions = list(range(PARTITIONS))
        order.shuffle(partitions)
        for partition in partitions:
            tasks.put((partition, k * per_range, (k + 1) * per_range))
        for _ in partitions:
            done.get()
    wall, broker = time.perf_counter() - started, _cpu_of(broker_pid) - broker_before
    for _ in procs:
        tasks.put(None)
    cpu = sum(done.get()[0] for _ in procs)
    for p in procs:
        p.join()
    return wall, cpu, broker


def run(quick: bool = False) -> dict[str, Any]:
    from consumer_sdk.testing import KafkaCluster
    from spark_integration.options import SourceOptions

    per_range = 8_000 if quick else 40_000
    out: dict[str, Any] = {"records": PARTITIONS * BATCHES * per_range}
    with KafkaCluster(nodes=1) as kafka:
        kafka.create_topic(TOPIC, partitions=PARTITIONS)
        _produce(kafka.bootstrap_servers, TOPIC, PARTITIONS * BATCHES * per_range, PARTITIONS)
        (broker_pid,) = kafka.node_pids().values()
        base = SourceOptions.parse(
            {
                "kafka.bootstrap.servers": kafka.bootstrap_servers,
                "group.id": "bench-pool",
                "subscribe": TOPIC,
            }
        ).fetch_config("executor")
        figures: dict[str, list[tuple[float, ...]]] = {name: [] for name in VARIANTS}
        for i in range(ROUNDS):
            names = list(VARIANTS) if i % 2 == 0 else list(VARIANTS)[::-1]
            for name in names:
                config = {k: str(v) for k, v in {**base, **VARIANTS[name]}.items()}
                figures[name].append(_round(config, per_range, broker_pid, i))
    for name, runs in figures.items():
        out[f"{name}: wall / workers' CPU / broker CPU, s, medians of {ROUNDS}"] = " / ".join(
            f"{statistics.median(r[j] for r in runs):.2f}" for j in range(3)
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer records")
    args = parser.parse_args(argv)
    for key, value in run(args.quick).items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
