"""Consume throughput: this SDK's poll()/consume() vs a raw confluent-kafka assign-mode
consumer reading the same records from the same cluster (EmbeddedKafka, or a real Apache
Kafka ``KafkaCluster``), in one run.

Both consumers get the same settings, ``CONSUMER_CONFIG`` included: librdkafka stops
fetching a partition for ``fetch.queue.backoff.ms`` (1 s by default) once its prefetch queue
holds ``queued.min.messages`` (100,000) records, and whether a run crosses that threshold
decides a one-second stall in a run of about one second: the figure then measured the
stall, not the client (seen on the real cluster: pair ratios 0.11, 1.02 and 0.52 in one
run). With a 10 ms backoff the prefetch never pauses for long and both clients are
measured on their own per-record work.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import confluent_kafka

#: Settings both consumers get (besides bootstrap servers, group id and offset reset).
CONSUMER_CONFIG = {"enable.auto.commit": False, "fetch.queue.backoff.ms": 10}


def _available(bootstrap: str, topic: str, partitions: int) -> int:
    c = confluent_kafka.Consumer({"bootstrap.servers": bootstrap, "group.id": "watermarks"})
    try:
        total = 0
        for p in range(partitions):
            low, high = c.get_watermark_offsets(confluent_kafka.TopicPartition(topic, p), 10)
            total += high - low
        return total
    finally:
        c.close()


Rates = tuple[float, float, float, float]

#: Records per chunk whose reading-thread CPU time is taken apart (see `_read`).
_CHUNK = 10_000


def _read(c: Any, n: int, batch: bool, what: Callable[[int], str]) -> Rates:
    """Read ``n`` records with ``c`` (the same loop for both clients); records per second of
    wall-clock time, per second of this process's CPU time and per second of the reading
    (application) thread's CPU time, from the first record; and the reading thread's CPU
    time per record in its cheapest chunks of `_CHUNK` records (the 10th percentile, ns):
    other processes on the machine inflate some chunks' CPU time (caches, the other
    hyperthread), rarely all, so this moves least with the load."""
    got = 0
    start: float | None = None
    cpu_start = thread_start = 0.0
    chunks: list[float] = []
    chunk_start = chunk_thread = 0
    deadline = time.monotonic() + 300
    while got < n:
        if time.monotonic() > deadline:
            raise TimeoutError(what(got))
        if batch:
            msgs = c.consume(500, 1.0)
        else:
            m = c.poll(1.0)
            msgs = [m] if m is not None else []
        for m in msgs:
            if m.error() is None:
                if start is None:
                    start, cpu_start = time.perf_counter(), time.process_time()
                    thread_start = time.thread_time()
                    chunk_start, chunk_thread = got, time.thread_time_ns()
                got += 1
                if got - chunk_start == _CHUNK:
                    thread_ns = time.thread_time_ns()
                    chunks.append((thread_ns - chunk_thread) / _CHUNK)
                    chunk_start, chunk_thread = got, thread_ns
    now, cpu_now, thread_now = time.perf_counter(), time.process_time(), time.thread_time()
    elapsed = now - (start or now)
    cpu = cpu_now - (cpu_start if start is not None else cpu_now)
    thread = thread_now - (thread_start if start is not None else thread_now)
    chunks.sort()
    cheapest = chunks[len(chunks) // 10] if chunks else math.nan
    return (
        (got - 1) / elapsed,
        (got - 1) / max(cpu, 1e-6),
        (got - 1) / max(thread, 1e-6),
        cheapest,
    )


def _raw(bootstrap: str, topic: str, partitions: int, n: int, batch: bool) -> Rates:
    c = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"raw-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            **CONSUMER_CONFIG,
        }
    )
    c.assign(
        [
            confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
            for p in range(partitions)
        ]
    )
    try:
        return _read(c, n, batch, lambda got: f"raw consumer read {got} of {n} records in 300 s")
    finally:
        c.close()


def _sdk(bootstrap: str, topic: str, n: int, batch: bool) -> Rates:
    from consumer_sdk import Consumer

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"sdk-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            **CONSUMER_CONFIG,
        }
    )
    c.subscribe([topic])

    def what(got: int) -> str:
        return (
            f"SDK consumer read {got} of {n} records in 300 s (state {c.state.name}, "
            f"assignment {[tp.partition for tp in c.assignment()]})"
        )

    try:
        return _read(c, n, batch, what)
    finally:
        c.close()


def run(
    quick: bool = False, kafka: Any = None, pairs: int | None = None, records: int | None = None
) -> dict[str, Any]:
    """``pairs`` interleaved SDK/raw pairs per API on ``kafka`` (or a fresh 1-broker
    EmbeddedKafka); ``records`` spread evenly over the partitions."""
    import contextlib

    from consumer_sdk.testing import EmbeddedKafka

    n = records or (50_000 if quick else 300_000)
    partitions = 6
    payload = [b"x" * 100] * 5_000
    results: dict[str, list[float]] = {}
    ratios: dict[str, list[float]] = {"poll": [], "consume": []}
    cpu_ratios: dict[str, list[float]] = {"poll": [], "consume": []}
    app_ratios: dict[str, list[float]] = {"poll": [], "consume": []}
    chunk_ratios: dict[str, list[float]] = {"poll": [], "consume": []}
    pairs = pairs or (3 if quick else 5)
    with contextlib.ExitStack() as stack:
        if kafka is None:
            kafka = stack.enter_context(EmbeddedKafka(brokers=1))
        topic = f"throughput-{uuid.uuid4().hex[:6]}"
        kafka.create_topic(topic, partitions=partitions)
        for i in range(max(n // len(payload), partitions)):
            kafka.produce(topic, payload, partition=i % partitions)
        # The mock broker trims old segments of large partitions; read what it still holds.
        n = _available(kafka.bootstrap_servers, topic, partitions)
        # Interleaved pairs; the ratio of each pair is taken, then the median of the ratios,
        # so load from other processes on this shared machine hits both sides alike.
        for i in range(pairs):
            for mode, batch in (("poll", False), ("consume", True)):
                if i % 2 == 0:
                    raw, raw_cpu, raw_app, raw_ns = _raw(
                        kafka.bootstrap_servers, topic, partitions, n, batch
                    )
                    sdk, sdk_cpu, sdk_app, sdk_ns = _sdk(kafka.bootstrap_servers, topic, n, batch)
                else:
                    sdk, sdk_cpu, sdk_app, sdk_ns = _sdk(kafka.bootstrap_servers, topic, n, batch)
                    raw, raw_cpu, raw_app, raw_ns = _raw(
                        kafka.bootstrap_servers, topic, partitions, n, batch
                    )
                results.setdefault(f"raw_{mode}", []).append(raw)
                results.setdefault(f"sdk_{mode}", []).append(sdk)
                results.setdefault(f"raw_cpu_{mode}", []).append(raw_cpu)
                results.setdefault(f"sdk_cpu_{mode}", []).append(sdk_cpu)
                results.setdefault(f"raw_app_{mode}", []).append(raw_app)
                results.setdefault(f"sdk_app_{mode}", []).append(sdk_app)
                results.setdefault(f"raw_chunk_ns_{mode}", []).append(raw_ns)
                results.setdefault(f"sdk_chunk_ns_{mode}", []).append(sdk_ns)
                ratios[mode].append(sdk / raw)
                cpu_ratios[mode].append(sdk_cpu / raw_cpu)
                app_ratios[mode].append(sdk_app / raw_app)
                chunk_ratios[mode].append(raw_ns / sdk_ns)
    out: dict[str, Any] = {
        "records": n,
        "record_bytes": 100,
        "partitions": partitions,
        "pairs": pairs,
        "config": dict(CONSUMER_CONFIG),
    }
    if n <= 0:
        raise RuntimeError("the broker holds no records to read")
    for mode in ("poll", "consume"):
        raw = statistics.median(results[f"raw_{mode}"])
        sdk = statistics.median(results[f"sdk_{mode}"])
        out[mode] = {
            "raw_per_s": raw,
            "sdk_per_s": sdk,
            "ratio": statistics.median(ratios[mode]),
            "ratios": ratios[mode],
            "raw_all": results[f"raw_{mode}"],
            "sdk_all": results[f"sdk_{mode}"],
            # records per CPU second of the consuming process (all its threads)
            "raw_per_cpu_s": statistics.median(results[f"raw_cpu_{mode}"]),
            "sdk_per_cpu_s": statistics.median(results[f"sdk_cpu_{mode}"]),
            "cpu_ratio": statistics.median(cpu_ratios[mode]),
            "cpu_ratios": cpu_ratios[mode],
            # records per CPU second of the reading thread alone (the application's): where
            # the SDK's own per-record work runs; librdkafka's threads do the fetching
            "raw_per_app_cpu_s": statistics.median(results[f"raw_app_{mode}"]),
            "sdk_per_app_cpu_s": statistics.median(results[f"sdk_app_{mode}"]),
            "app_cpu_ratio": statistics.median(app_ratios[mode]),
            "app_cpu_ratios": app_ratios[mode],
            # the reading thread's CPU ns per record in its cheapest 10,000-record chunks
            # (10th percentile): what the load of other processes moves least; the ratio is
            # raw's over the SDK's (higher is better, as the others)
            "raw_chunk_ns": statistics.median(results[f"raw_chunk_ns_{mode}"]),
            "sdk_chunk_ns": statistics.median(results[f"sdk_chunk_ns_{mode}"]),
            "app_chunk_ratio": statistics.median(chunk_ratios[mode]),
            "app_chunk_ratios": chunk_ratios[mode],
        }
    return out


if __name__ == "__main__":
    result = run(quick="--quick" in sys.argv)
    for mode in ("poll", "consume"):
        row = result[mode]
        print(
            f"{mode:<8} raw {row['raw_per_s']:,.0f}/s  sdk {row['sdk_per_s']:,.0f}/s  "
            f"ratio {row['ratio']:.2f}  per CPU second {row['cpu_ratio']:.2f}  "
            f"per application-thread CPU second {row['app_cpu_ratio']:.2f}  "
            f"cheapest chunks {row['app_chunk_ratio']:.2f} "
            f"(sdk {row['sdk_chunk_ns']:.0f} ns, raw {row['raw_chunk_ns']:.0f} ns per record)"
        )
