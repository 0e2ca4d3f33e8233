"""Throughput of the ``kip848`` Spark source against a direct confluent-kafka -> Arrow read.

Not a test. Run from the repository root (needs the spark extra and Java 17)::

    python -m bench.spark_source            # 160k records
    python -m bench.spark_source --quick    # 60k records, a couple of minutes
    KAFKA_HOME=... python -m bench.spark_source --real [--quick]   # 2.4M (240k) records

``--real``: 2.4M records of 100 bytes in 12 partitions on a real broker, in one run: a
direct read in this process, a hand-written ``mapInArrow`` job (one assign-only consumer
per partition and task) and the kip848 query with its defaults (``Trigger.AvailableNow``,
``maxOffsetsPerTrigger=500000``, noop sink), by wall time and by the summed ``addBatch``
(two job/query pairs back to back, ABBA order: the median of the pairs' ratios); and the
fixed per-query cost (query start to its first trigger, plus what follows its triggers:
the final empty trigger and the stop) of a one-record-per-partition kip848 query against a
no-op Python streaming source's one batch planned as as many tasks (seven pairs, ABBA, the
median of the pairs' ratios). The kip848 queries' time before their first trigger is
broken down from the source's ``eventLog``.

Against one EmbeddedKafka broker (4 partitions, 100-byte values), in one run:

* **direct**: one connected assign-only ``confluent_kafka.Consumer`` reads every partition
  from 0 to its high watermark and builds ``pyarrow.RecordBatch``es in the Kafka source
  schema (``records_to_batch``), in this process: what any Python reader of these offsets
  costs without Spark. It has the source's librdkafka fetch settings, asks ``consume()``
  for no more records than are left, and is timed on its second read (the first warms it,
  as the warm-up query and batch read warm the source).
* **source**: a ``Trigger.AvailableNow`` query with a ``noop`` sink reads the same offsets
  in one micro-batch (4 tasks), after a warm-up query (Python workers started). Rows/s are
  computed from the batch's ``triggerExecution`` time, and from the whole query's wall time.
* **micro-batch overhead**: a 12-partition topic read in batches of 1000 rows
  (maxOffsetsPerTrigger); the mean trigger time, its ``latestOffset`` part (the group
  member's poll, a commit and the watermark lookups), against a **no-op Python streaming
  source** planned as ONE input partition that yields 1000 prepared rows per trigger, on
  the same session and sink: Spark's own floor for a Python source.
* **one-batch wall time, broken down**: the one-batch query's wall time split into what
  comes before its first trigger (query start, the stream-reader process, the group
  member's join and assignment, ``prepareForTriggerAvailableNow``), the triggers, and what
  follows (the final empty trigger, stop, the member's leave); the same for the no-op
  source reading the same number of rows in one batch planned as the same number of tasks:
  Spark's floor for that query shape, and the wall-time ratio it alone would allow.

Both modes first byte-compile ``consumer_sdk`` and ``spark_integration`` (``compileall``, as
``pip install`` does for a wheel): an editable checkout under ``PYTHONDONTWRITEBYTECODE=1``
would otherwise recompile the SDK from source in every query's new stream-reader process.

Absolute numbers on shared machines are noise; the ratios within one run are the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

PARTITIONS = 4
SMALL_PARTITIONS = 12
VALUE = b"x" * 100


def _noop_source() -> Any:
    """A Python streaming source with no I/O: 1000 prepared rows per trigger, one task."""
    from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow

    from spark_integration import kafka_schema

    class NoopReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
        def __init__(self, rows: int, batches: int, tasks: int, total: int) -> None:
            # ``total`` (when > 0) caps the rows: the last batch may be partial, as a
            # Kafka topic's last micro-batch under maxOffsetsPerTrigger is.
            self.rows, self.batches, self.tasks = rows, batches, tasks
            self.target = total if total > 0 else rows * batches

        def initialOffset(self) -> dict[str, int]:
            return {"n": 0}

        def prepareForTriggerAvailableNow(self) -> None:
            pass

        def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
            return {"n": min(start["n"] + self.rows, self.target)}

        def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[Any]:
            lo, hi = start["n"], end["n"]
            step = -(-(hi - lo) // self.tasks)
            return [InputPartition((a, min(a + step, hi))) for a in range(lo, hi, step)]

        def read(self, partition: Any) -> Any:
            import pyarrow as pa

            from spark_integration.executor import arrow_schema

            lo, hi = partition.value
            n = hi - lo
            schema = arrow_schema(False)
            # Columns built in C (no per-row Python), so the rows cost Spark only.
            yield pa.RecordBatch.from_arrays(
                [
                    pa.repeat(pa.scalar(b"k", pa.binary()), n),
                    pa.repeat(pa.scalar(VALUE, pa.binary()), n),
                    pa.repeat(pa.scalar("noop", pa.string()), n),
                    pa.repeat(pa.scalar(0, pa.int32()), n),
                    pa.array(range(lo, hi), pa.int64()),
                    pa.repeat(pa.scalar(0, pa.timestamp("us", tz="UTC")), n),
                    pa.repeat(pa.scalar(0, pa.int32()), n),
                ],
                schema=schema,
            )

    class NoopSource(DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "noop1"

        def schema(self) -> str:
            return kafka_schema()

        def streamReader(self, schema: Any) -> NoopReader:
            return NoopReader(
                int(self.options["rows"]),
                int(self.options["batches"]),
                int(self.options.get("tasks", 1)),
                int(self.options.get("total", 0)),
            )

    return NoopSource


def _median_phases(runs: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    before, triggers, after = zip(*runs, strict=True)
    return (statistics.median(before), statistics.median(triggers), statistics.median(after))


def _counting_source() -> Any:
    """``kip848`` under another name whose tasks record, per Python worker, how many ranges
    got a reused or a created consumer (``bench.positions``: a directory, local mode)."""
    from spark_integration.executor import position_counts, read_range
    from spark_integration.options import SourceOptions
    from spark_integration.source import Kip848DataSource, Kip848StreamReader

    class CountingReader(Kip848StreamReader):  # type: ignore[misc]
        positions_dir = ""

        def read(self, partition: Any) -> Any:
            yield from read_range(partition.value)
            Path(self.positions_dir, f"{os.getpid()}.json").write_text(
                json.dumps(position_counts())
            )

    class CountingSource(Kip848DataSource):  # type: ignore[misc]
        @classmethod
        def name(cls) -> str:
            return "kip848counted"

        def _kip848_options(self) -> dict[str, str]:
            return {k: v for k, v in self.options.items() if k != "bench.positions"}

        def schema(self) -> Any:
            return Kip848DataSource(self._kip848_options()).schema()

        def streamReader(self, schema: Any) -> CountingReader:
            reader = CountingReader(SourceOptions.parse(self._kip848_options()))
            reader.positions_dir = self.options["bench.positions"]
            return reader

    return CountingSource


def _positions(directory: Path, before: dict[str, int]) -> dict[str, int]:
    """The workers' position counts summed, minus ``before`` (also updated to the sum)."""
    total: dict[str, int] = {}
    for f in directory.glob("*.json"):
        for k, v in json.loads(f.read_text()).items():
            total[k] = total.get(k, 0) + v
    delta = {k: v - before.get(k, 0) for k, v in total.items()}
    before.clear()
    before.update(total)
    return delta


def _noop_query(
    spark: Any, rows: int, batches: int, workdir: Path, tasks: int = 1, total: int = 0
) -> tuple[float, float, list[dict[str, Any]]]:
    """(wall seconds, wall-clock start, progress of the batches with rows)."""
    t0, started = time.time(), time.perf_counter()
    query = (
        spark.readStream.format("noop1")
        .option("rows", rows)
        .option("batches", batches)
        .option("tasks", tasks)
        .option("total", total)
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(workdir / "noop1"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    wall = time.perf_counter() - started
    return wall, t0, [p for p in query.recentProgress if p["numInputRows"]]


def _phases(wall: float, t0: float, progress: list[dict[str, Any]]) -> tuple[float, float, float]:
    """A one-batch query's wall time as (before its first trigger, triggers, after them), s.

    Progress ``timestamp`` is when a trigger started (UTC, ms)."""
    first = datetime.strptime(progress[0]["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")
    before = first.replace(tzinfo=UTC).timestamp() - t0
    triggers = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
    return before, triggers, wall - before - triggers


def _process_started(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds, 10 ms resolution), if it still exists."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        now, uptime = time.time(), float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    # /proc/stat's btime is whole seconds: count back from the uptime instead.
    return now - uptime + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _start_parts(
    t0: float, progress: list[dict[str, Any]], event_log: Path
) -> tuple[float, float, float, float] | None:
    """A kip848 query's time before its first trigger, from its stream reader's events:
    (query start to the stream-reader process, that process to the source's reader (Spark
    constructs it; the member starts joining), that to the member's stable assignment,
    that to the first trigger), s."""
    events = [json.loads(line) for line in event_log.read_text().splitlines()]
    start = next((e for e in events if e["kind"] == "start"), None)
    stable = next((e for e in events if e["kind"] == "stable"), None)
    if start is None or stable is None:
        return None
    process = next((e["t"] for e in events if e["kind"] == "process"), start["t"])
    first = datetime.strptime(progress[0]["timestamp"], "%Y-%m-%dT%H:%M:%S.%fZ")
    trigger = first.replace(tzinfo=UTC).timestamp()
    return process - t0, start["t"] - process, stable["t"] - start["t"], trigger - stable["t"]


def _compile_bytecode() -> str:
    """Byte-compile ``consumer_sdk`` and ``spark_integration`` where they have no bytecode.

    Spark starts a new Python process per query for the stream reader, which imports the
    source and the group member. An installed wheel carries its bytecode (pip compiles it
    at install), but an editable checkout under ``PYTHONDONTWRITEBYTECODE=1`` (this
    project's development and CI machines) has none and never writes it, so each of those
    processes would compile the SDK from source first (0.1-0.2 s of CPU, against nothing
    for the no-op source, which is pickled by value). Measured as installed; the output
    says which.
    """
    import compileall

    import consumer_sdk
    import spark_integration

    for package in (consumer_sdk, spark_integration):
        compileall.compile_dir(Path(package.__file__).parent, quiet=1)
    return (
        "present (compileall first, as pip install does for a wheel; "
        f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', 'unset')})"
    )


def _spark() -> Any:
    from spark_integration.session import local_session

    return local_session("bench-spark-source", "local[4]")


def _produce(bootstrap: str, topic: str, records: int, partitions: int = PARTITIONS) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000}
    )
    for i in range(records):
        while True:
            try:
                producer.produce(topic, VALUE, key=str(i).encode(), partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10000 == 0:
            producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError("records not delivered")


def _direct(bootstrap: str, topic: str) -> tuple[int, float]:
    """Read every offset with one assign-only consumer into Arrow batches; (rows, seconds)."""
    from confluent_kafka import Consumer, TopicPartition

    from spark_integration.executor import records_to_batch
    from spark_integration.options import _FETCH_DEFAULTS

    # The same librdkafka fetch settings as the source's executor consumers: with the
    # defaults a reader whose queue holds queued.min.messages backs off for a second
    # (fetch.queue.backoff.ms), which a 160k-record read hits.
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-direct",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            **_FETCH_DEFAULTS,
        }
    )
    try:
        ends = {
            p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in range(PARTITIONS)
        }
        # Connect first (the source's cached executor consumers are connected too).
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + 60
        while not [m for m in consumer.consume(1, 1.0) if m.error() is None]:
            if time.monotonic() > deadline:
                raise TimeoutError("the direct reader got no record within 60 s")
        for p in range(PARTITIONS):
            consumer.seek(TopicPartition(topic, p, 0))
        started = time.perf_counter()
        rows, done = 0, {p for p, end in ends.items() if end == 0}
        deadline = time.monotonic() + 600
        while len(done) < PARTITIONS:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the direct read stalled at {rows} rows")
            # Ask for no more than what is left: consume() waits out its whole timeout while
            # it has fewer messages than asked for (the source's tasks ask the same way).
            left = sum(ends.values()) - rows
            msgs = [m for m in consumer.consume(max(min(10000, left), 1), 1.0) if m.error() is None]
            if msgs:
                rows += records_to_batch(msgs).num_rows
                for m in msgs:
                    partition, offset = m.partition(), m.offset()
                    assert partition is not None and offset is not None
                    if offset + 1 >= ends[partition]:
                        done.add(partition)
        return rows, time.perf_counter() - started
    finally:
        consumer.close()


def _query(
    spark: Any,
    bootstrap: str,
    topic: str,
    group: str,
    max_per_trigger: int | None,
    workdir: Path,
    positions: Path | None = None,
    event_log: Path | None = None,
) -> tuple[float, float, list[dict[str, Any]]]:
    """(wall seconds, wall-clock start, progress of the batches with rows); with
    ``positions``, through the counting source writing there; with ``event_log``, the
    stream reader's events (``eventLog``) go there."""
    reader = spark.readStream
    if positions is not None:
        reader = reader.format("kip848counted").option("bench.positions", str(positions))
    else:
        reader = reader.format("kip848")
    stream = (
        reader.option("kafka.bootstrap.servers", bootstrap)
        .option("group.id", group)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
    )
    if max_per_trigger:
        stream = stream.option("maxOffsetsPerTrigger", max_per_trigger)
    if event_log is not None:
        stream = stream.option("eventLog", str(event_log))
    t0, started = time.time(), time.perf_counter()
    watcher = None
    if event_log is not None:
        watcher = threading.Thread(target=_note_process_start, args=(event_log,), daemon=True)
        watcher.start()
    query = (
        stream.load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(workdir / group))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(600)
    wall = time.perf_counter() - started
    if watcher is not None:
        watcher.join(5)
    return wall, t0, [p for p in query.recentProgress if p["numInputRows"]]


def _note_process_start(event_log: Path) -> None:
    """Append when the stream-reader process started (from /proc, while it runs) to the
    event log, as soon as its ``start`` event names its pid."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError, ValueError):
            for line in event_log.read_text().splitlines():
                event = json.loads(line)
                if event["kind"] == "start":
                    started = _process_started(event["pid"])
                    if started is not None:
                        with event_log.open("a") as f:
                            f.write(json.dumps({"kind": "process", "t": started}) + "\n")
                    return
        time.sleep(0.02)


def _step(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def run(quick: bool = False) -> dict[str, Any]:
    """Run the benchmark; return its figures (also printed by ``main``)."""
    from consumer_sdk.testing import EmbeddedKafka
    from spark_integration.offsets import OffsetRange, pack_tasks
    from spark_integration.options import SourceOptions

    # The mock broker keeps about 50k records per partition (older segments are deleted).
    records = 60_000 if quick else 160_000
    small = 1_000
    bytecode = _compile_bytecode()
    spark = _spark()
    spark.dataSource.register(_noop_source())
    small_batches = 10 if quick else 30
    out: dict[str, Any] = {}
    try:
        with EmbeddedKafka(brokers=1) as kafka, tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            bootstrap = kafka.bootstrap_servers
            kafka.create_topic("bench-warm", partitions=PARTITIONS)
            kafka.create_topic("bench", partitions=PARTITIONS)
            kafka.create_topic("bench-small", partitions=SMALL_PARTITIONS)
            _step(f"producing {records} records")
            _produce(bootstrap, "bench-warm", 4_000)
            _produce(bootstrap, "bench", records)
            _produce(bootstrap, "bench-small", small * small_batches, SMALL_PARTITIONS)
            _step("warm-up query")
            cold_wall, _, _ = _query(spark, bootstrap, "bench-warm", "bench-warm", None, workdir)
            _step("direct read (a warm-up read, then the timed one)")
            # Warm like the source: its Python workers and executor consumers have read before.
            _direct(bootstrap, "bench")
            rows, direct_s = _direct(bootstrap, "bench")
            assert rows == records, (rows, records)
            _step("warming executor consumers of the topic (a 4-record batch read)")
            # The direct reader connects before its timed read; so do the pooled executor
            # consumers (shared by every query of a worker), which then seek back to 0.
            (
                spark.read.format("kip848")
                .option("kafka.bootstrap.servers", bootstrap)
                .option("subscribe", "bench")
                .option("rowsPerTask", 1)
                .option(
                    "endingOffsets",
                    json.dumps({"bench": dict.fromkeys([str(p) for p in range(PARTITIONS)], 1)}),
                )
                .load()
                .count()
            )
            _step("one-batch query")
            wall, t0, progress = _query(spark, bootstrap, "bench", "bench-one", None, workdir)
            assert sum(p["numInputRows"] for p in progress) == records
            one_ms = sum(p["durationMs"]["triggerExecution"] for p in progress)
            read_ms = sum(p["durationMs"].get("addBatch", 0) for p in progress)
            _step("small-batch query")
            small_wall, _, small_progress = _query(
                spark, bootstrap, "bench-small", "bench-small", small, workdir
            )
            triggers = [p["durationMs"]["triggerExecution"] for p in small_progress]
            latest = [p["durationMs"].get("latestOffset", 0) for p in small_progress]
            per_row_ms = one_ms / records
            _step("no-op source, one input partition")
            _noop_query(spark, small, 3, workdir)  # warm-up
            _, _, noop_progress = _noop_query(spark, small, small_batches, workdir / "n2")
            noop = [p["durationMs"]["triggerExecution"] for p in noop_progress]
            _step("no-op source, the one-batch query's shape")
            # As many tasks as the kip848 source planned for the one batch.
            tasks = len(
                pack_tasks(
                    [OffsetRange("bench", p, 0, records // PARTITIONS) for p in range(PARTITIONS)],
                    SourceOptions.rows_per_task,
                )
            )
            noop_wall, noop_t0, noop_one = _noop_query(spark, records, 1, workdir / "n3", tasks)
    finally:
        spark.stop()
    direct_rate = records / direct_s
    source_rate = records / (one_ms / 1000)
    source_wall_rate = records / wall
    overhead = statistics.mean(triggers) - small * per_row_ms
    out["records"] = records
    out["bytecode of consumer_sdk and spark_integration"] = bytecode
    out["direct confluent-kafka -> Arrow, rows/s"] = round(direct_rate)
    out["kip848 source, one batch, rows/s (trigger time)"] = round(source_rate)
    out["kip848 source, one batch, rows/s (query wall time)"] = round(source_wall_rate)
    out["ratio source / direct (trigger time)"] = round(source_rate / direct_rate, 2)
    out["ratio source / direct (query wall time)"] = round(source_wall_rate / direct_rate, 2)
    out["addBatch share of the one-batch trigger"] = round(read_ms / one_ms, 2)
    out["one batch: query wall time, s"] = round(wall, 2)
    before, during, after = _phases(wall, t0, progress)
    out["one batch: before the first trigger / triggers / after, s"] = (
        f"{before:.2f} / {during:.2f} / {after:.2f}"
    )
    out[f"no-op source, one batch of {records} rows in {tasks} tasks: query wall time, s"] = round(
        noop_wall, 2
    )
    before, during, after = _phases(noop_wall, noop_t0, noop_one)
    out["no-op source, one batch: before the first trigger / triggers / after, s"] = (
        f"{before:.2f} / {during:.2f} / {after:.2f}"
    )
    out["ratio kip848 / no-op source, one-batch query wall time"] = round(wall / noop_wall, 2)
    out["wall-time ratio the no-op source alone reaches (its rows/s / direct)"] = round(
        records / noop_wall / direct_rate, 2
    )
    out[f"micro-batches of {small} rows from {SMALL_PARTITIONS} partitions: count"] = len(triggers)
    out[f"micro-batches of {small} rows: mean trigger ms"] = round(statistics.mean(triggers), 1)
    out[f"micro-batches of {small} rows: median trigger ms"] = round(statistics.median(triggers), 1)
    out["no-op Python source, one input partition: median trigger ms"] = round(
        statistics.median(noop), 1
    )
    out["ratio kip848 / no-op source, median small-batch trigger"] = round(
        statistics.median(triggers) / statistics.median(noop), 2
    )
    for phase in ("latestOffset", "queryPlanning", "walCommit", "addBatch", "commitOffsets"):
        k848 = statistics.median(p["durationMs"].get(phase, 0) for p in small_progress)
        base = statistics.median(p["durationMs"].get(phase, 0) for p in noop_progress)
        out[f"small batches, median {phase} ms: kip848 / no-op"] = f"{k848} / {base}"
    out["mean latestOffset ms (member poll + commit + watermarks)"] = round(
        statistics.mean(latest), 1
    )
    out["per-trigger overhead ms (beyond reading rows)"] = round(overhead, 1)
    out[f"rows/s at {small} rows per trigger / one-batch rows/s"] = round(
        (len(triggers) * small / (sum(triggers) / 1000)) / source_rate, 3
    )
    out["cold start: first query incl. Python workers, s"] = round(cold_wall, 1)
    out["whole small-batch query wall time, s"] = round(small_wall, 1)
    return out


REAL_PARTITIONS = 12
_START_PARTS = (
    "kip848 before its first trigger: query start to stream-reader process / to its "
    "reader / to stable assignment / to first trigger, s"
)


def _fmt_parts(runs: list[tuple[float, float, float, float]]) -> str:
    if not runs:
        return "unknown (no eventLog)"
    return " / ".join(f"{statistics.median(column):.2f}" for column in zip(*runs, strict=True))


#: Fixed-cost pairs (a kip848 and a no-op query back to back, ABBA order); the median of
#: the pairs' ratios is the figure (the ratio of the two medians is printed too).
FIXED_RUNS = 7
#: mapInArrow job / kip848 query pairs (ABBA order); the median of their ratios is the figure.
THROUGHPUT_PAIRS = 2


def _map_in_arrow_reader(bootstrap: str, topic: str, ends: dict[int, int]) -> Any:
    """The hand-written job's function: one assign-only consumer per Spark task reads its
    partition from 0 to the end and yields Arrow batches (the source's Arrow builder)."""

    def read(batches: Any) -> Any:
        from confluent_kafka import Consumer, TopicPartition

        from spark_integration.executor import records_to_batch
        from spark_integration.options import _FETCH_DEFAULTS

        for task in batches:
            for p in task.column(0).to_pylist():
                end = ends[p]
                consumer = Consumer(
                    {
                        "bootstrap.servers": bootstrap,
                        "group.id": "bench-mapinarrow",
                        "enable.auto.commit": False,
                        **_FETCH_DEFAULTS,
                    }
                )
                consumer.assign([TopicPartition(topic, p, 0)])
                at = 0
                while at < end:
                    msgs = [
                        m for m in consumer.consume(min(10000, end - at), 1.0) if m.error() is None
                    ]
                    if msgs:
                        at = msgs[-1].offset() + 1
                        yield records_to_batch(msgs)
                consumer.close()

    return read


def _direct_all(bootstrap: str, topic: str, ends: dict[int, int]) -> float:
    """One assign-only consumer reads every partition into Arrow batches; seconds."""
    from confluent_kafka import Consumer, TopicPartition

    from spark_integration.executor import records_to_batch
    from spark_integration.options import _FETCH_DEFAULTS

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench-direct",
            "enable.auto.commit": False,
            **_FETCH_DEFAULTS,
        }
    )
    started = time.perf_counter()
    consumer.assign([TopicPartition(topic, p, 0) for p in ends])
    rows, total = 0, sum(ends.values())
    while rows < total:
        msgs = [m for m in consumer.consume(min(10000, total - rows), 1.0) if m.error() is None]
        if msgs:
            rows += records_to_batch(msgs).num_rows
    seconds = time.perf_counter() - started
    consumer.close()
    return seconds


def run_real(quick: bool = False) -> dict[str, Any]:
    """2.4M x 100 B in 12 partitions on a real broker (``KAFKA_HOME``), AvailableNow,
    maxOffsetsPerTrigger=500000, noop sink: the direct read, a hand-written mapInArrow
    job, and the kip848 query with its defaults, in one run (``quick``: 240k records)."""
    from consumer_sdk.testing import KafkaCluster

    records = 240_000 if quick else 2_400_000
    out: dict[str, Any] = {"records": records}
    out["bytecode of consumer_sdk and spark_integration"] = _compile_bytecode()
    spark = _spark()
    spark.dataSource.register(_noop_source())
    spark.dataSource.register(_counting_source())
    try:
        with KafkaCluster(nodes=1) as kafka, tempfile.TemporaryDirectory() as tmp:
            workdir = Path(tmp)
            bootstrap = kafka.bootstrap_servers
            kafka.create_topic("bench-real", partitions=REAL_PARTITIONS)
            kafka.create_topic("bench-real-warm", partitions=REAL_PARTITIONS)
            kafka.create_topic("bench-real-fixed", partitions=REAL_PARTITIONS)
            _step(f"producing {records} records to a real broker")
            _produce(bootstrap, "bench-real", records, REAL_PARTITIONS)
            _produce(bootstrap, "bench-real-warm", 12_000, REAL_PARTITIONS)
            _produce(bootstrap, "bench-real-fixed", REAL_PARTITIONS, REAL_PARTITIONS)
            ends = {p: records // REAL_PARTITIONS for p in range(REAL_PARTITIONS)}
            _step("warm-up query (Python workers)")
            positions = workdir / "positions"
            positions.mkdir()
            _query(spark, bootstrap, "bench-real-warm", "bench-real-warm", None, workdir, positions)
            counted: dict[str, int] = {}
            _positions(positions, counted)
            _step("direct read")
            _direct_all(bootstrap, "bench-real", ends)  # warms the broker's page cache
            direct_s = _direct_all(bootstrap, "bench-real", ends)
            from spark_integration import kafka_schema

            def run_job(topic: str, job_ends: dict[int, int]) -> None:
                (
                    spark.range(REAL_PARTITIONS, numPartitions=REAL_PARTITIONS)
                    .selectExpr("cast(id as int) as p")
                    .mapInArrow(_map_in_arrow_reader(bootstrap, topic, job_ends), kafka_schema())
                    .write.format("noop")
                    .mode("overwrite")
                    .save()
                )

            _step("warm-up mapInArrow job")
            # As the warm-up query warms the source: the job's first run on a session
            # paid 4-5 s more than the next (measured with --quick: 6.61 s, then 1.78 s).
            run_job(
                "bench-real-warm", dict.fromkeys(range(REAL_PARTITIONS), 12_000 // REAL_PARTITIONS)
            )
            job_runs: list[float] = []
            query_runs: list[
                tuple[float, float, float, float]
            ] = []  # wall, addBatch, before, after
            big_parts_runs: list[tuple[float, float, float, float]] = []
            beyond_runs: list[dict[str, float]] = []
            ranges: dict[str, int] = {}
            # The no-op source in the query's shape (the same rows per trigger, triggers and
            # tasks, its columns built in C, no I/O): what Spark's Python streaming path
            # alone costs for these rows, run beside each pair.
            bound_runs: list[tuple[float, float]] = []  # wall, addBatch
            for i in range(THROUGHPUT_PAIRS):
                # ABBA order, as for the fixed cost: each pair ran back to back.
                order = ("job", "query", "bound") if i % 2 == 0 else ("bound", "query", "job")
                for kind in order:
                    if kind == "bound":
                        _step("no-op source in the query's shape")
                        b_wall, _, b_progress = _noop_query(
                            spark,
                            500_000,
                            -(-records // 500_000),
                            workdir / f"noop-shape-{i}",
                            REAL_PARTITIONS,
                            records,
                        )
                        assert sum(p["numInputRows"] for p in b_progress) == records
                        b_add = sum(p["durationMs"].get("addBatch", 0) for p in b_progress)
                        bound_runs.append((b_wall, b_add / 1000))
                        continue
                    if kind == "job":
                        _step("hand-written mapInArrow job")
                        started = time.perf_counter()
                        run_job("bench-real", ends)
                        job_runs.append(time.perf_counter() - started)
                        continue
                    _step("kip848 query")
                    big_events = workdir / f"events-big-{i}.jsonl"
                    wall, t0, progress = _query(
                        spark,
                        bootstrap,
                        "bench-real",
                        f"bench-real-g{i}",
                        500_000,
                        workdir,
                        positions,
                        big_events,
                    )
                    parts = _start_parts(t0, progress, big_events)
                    if parts is not None:
                        big_parts_runs.append(parts)
                    for k, v in _positions(positions, counted).items():
                        ranges[k] = ranges.get(k, 0) + v
                    assert sum(p["numInputRows"] for p in progress) == records
                    add_s = sum(p["durationMs"].get("addBatch", 0) for p in progress) / 1000
                    before, _, after = _phases(wall, t0, progress)
                    query_runs.append((wall, add_s, before, after))
                    # What each micro-batch costs beyond the read (addBatch), summed.
                    beyond_runs.append(
                        {
                            phase: sum(p["durationMs"].get(phase, 0) for p in progress) / 1000
                            for phase in (
                                "latestOffset",
                                "queryPlanning",
                                "walCommit",
                                "commitOffsets",
                            )
                        }
                    )
                    triggers = len(progress)
            _step("fixed per-query cost: 12-record kip848 queries and no-op source queries")
            # One record per partition: start to first trigger plus what follows the
            # triggers, for a query that reads almost nothing; the no-op source (no I/O,
            # one batch planned as 12 tasks) on the same session is Spark's floor for it.
            # FIXED_RUNS pairs, back to back (a busy moment of the machine hits both).
            _noop_query(spark, 12, 1, workdir / "noop-warm", REAL_PARTITIONS)
            kip848_runs: list[tuple[float, float, float]] = []
            noop_runs: list[tuple[float, float, float]] = []
            fixed_parts: list[tuple[float, float, float, float]] = []
            for i in range(FIXED_RUNS):
                # ABBA order: a drift of the machine's load over the loop favours neither.
                for kind in ("kip848", "noop") if i % 2 == 0 else ("noop", "kip848"):
                    if kind == "noop":
                        noop_wall, noop_t0, noop = _noop_query(
                            spark, 12, 1, workdir / f"noop-fixed-{i}", REAL_PARTITIONS
                        )
                        noop_runs.append(_phases(noop_wall, noop_t0, noop))
                        continue
                    events = workdir / f"events-fixed-{i}.jsonl"
                    small_wall, small_t0, small = _query(
                        spark,
                        bootstrap,
                        "bench-real-fixed",
                        f"bench-real-fixed-{i}",
                        None,
                        workdir,
                        None,
                        events,
                    )
                    assert sum(p["numInputRows"] for p in small) == REAL_PARTITIONS
                    kip848_runs.append(_phases(small_wall, small_t0, small))
                    parts = _start_parts(small_t0, small, events)
                    if parts is not None:
                        fixed_parts.append(parts)
            small_phases = _median_phases(kip848_runs)
            noop_phases = _median_phases(noop_runs)
            fixed = statistics.median(b + a for b, _, a in kip848_runs)
            noop_fixed = statistics.median(b + a for b, _, a in noop_runs)
            # Each pair ran back to back: its ratio cancels what the load did to both.
            pair_ratios = sorted(
                (kb + ka) / (nb + na)
                for (kb, _, ka), (nb, _, na) in zip(kip848_runs, noop_runs, strict=True)
            )
    finally:
        spark.stop()
    wall = statistics.median(q[0] for q in query_runs)
    add_s = statistics.median(q[1] for q in query_runs)
    by_wall = sorted(j / q[0] for j, q in zip(job_runs, query_runs, strict=True))
    by_add = sorted(j / q[1] for j, q in zip(job_runs, query_runs, strict=True))
    n = THROUGHPUT_PAIRS
    out["direct confluent-kafka -> Arrow (one process), s"] = round(direct_s, 2)
    out[f"mapInArrow job (one consumer per partition), wall s, {n} runs"] = ", ".join(
        f"{j:.2f}" for j in job_runs
    )
    out[f"kip848 query: wall s / summed addBatch s, {n} runs"] = ", ".join(
        f"{q[0]:.2f} / {q[1]:.2f}" for q in query_runs
    )
    out[f"ratio kip848 / mapInArrow by wall time, each of the {n} pairs"] = ", ".join(
        f"{r:.2f}" for r in by_wall
    )
    out[f"ratio kip848 / mapInArrow by summed addBatch, each of the {n} pairs"] = ", ".join(
        f"{r:.2f}" for r in by_add
    )
    out["ratio kip848 / mapInArrow, by wall time (speed), median of the pairs"] = round(
        statistics.median(by_wall), 2
    )
    out["ratio kip848 / mapInArrow, by summed addBatch (speed), median of the pairs"] = round(
        statistics.median(by_add), 2
    )
    bound_wall = sorted(j / b[0] for j, b in zip(job_runs, bound_runs, strict=True))
    bound_add = sorted(j / b[1] for j, b in zip(job_runs, bound_runs, strict=True))
    out[f"no-op source in the query's shape (no I/O): wall s / summed addBatch s, {n} runs"] = (
        ", ".join(f"{b[0]:.2f} / {b[1]:.2f}" for b in bound_runs)
    )
    out[
        "ceiling for any Python streaming source: no-op source in the query's shape / "
        "mapInArrow, by wall time / by summed addBatch (speed), median of the pairs"
    ] = f"{statistics.median(bound_wall):.2f} / {statistics.median(bound_add):.2f}"
    out["ratio kip848 / direct, by summed addBatch (speed), median query"] = round(
        direct_s / add_s, 2
    )
    out["ratio kip848 / direct, by wall time (speed), median query"] = round(direct_s / wall, 2)
    out[f"kip848 queries: ranges on a reused / a created consumer (of {60 * n})"] = " / ".join(
        str(ranges.get(k, 0)) for k in ("reused", "created")
    )
    out["kip848 query: before the first trigger / after the triggers, s, each run"] = ", ".join(
        f"{q[2]:.2f} / {q[3]:.2f}" for q in query_runs
    )
    out[_START_PARTS + ", medians"] = _fmt_parts(big_parts_runs)
    out[f"{_START_PARTS}; fixed-cost queries, medians"] = _fmt_parts(fixed_parts)
    out[
        f"kip848 query: {triggers} triggers' latestOffset / queryPlanning / walCommit / "
        "commitOffsets, s, medians"
    ] = " / ".join(
        f"{statistics.median(b[phase] for b in beyond_runs):.2f}" for phase in beyond_runs[0]
    )
    out[f"fixed cost, median of {FIXED_RUNS}, before first trigger / after: kip848; no-op, s"] = (
        f"{small_phases[0]:.2f} / {small_phases[2]:.2f}; "
        f"{noop_phases[0]:.2f} / {noop_phases[2]:.2f}"
    )
    out[f"fixed per-query cost (start to first trigger + after), median of {FIXED_RUNS}, s"] = (
        f"{fixed:.2f} / {noop_fixed:.2f}"
    )
    out["ratio of the medians, fixed per-query cost kip848 / no-op source"] = round(
        fixed / noop_fixed, 2
    )
    out[f"fixed per-query cost kip848 / no-op source, each of the {FIXED_RUNS} pairs"] = ", ".join(
        f"{r:.2f}" for r in pair_ratios
    )
    out[
        "ratio fixed per-query cost kip848 / no-op source, median of the pairs (cost; goal <= 1.2)"
    ] = round(statistics.median(pair_ratios), 2)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer records (a short CI variant)")
    parser.add_argument(
        "--real",
        action="store_true",
        help="the 2.4M-record, 12-partition real-broker case (KAFKA_HOME): direct read, "
        "mapInArrow job, kip848 query",
    )
    args = parser.parse_args(argv)
    figures = run_real(args.quick) if args.real else run(args.quick)
    for key, value in figures.items():
        print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
