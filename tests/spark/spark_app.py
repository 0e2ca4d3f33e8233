"""A Spark application (its own driver process) running one kip848 query, driven over stdin.

The multi-application tests start it as a child process: local mode, a standalone master
(``--master spark://...``) or a Spark Connect client (``--remote sc://...``). Commands,
one per line: ``start`` (the query, resumed from its checkpoint), ``stop`` (``query.stop()``,
graceful), ``exit``. Each answer is one line: ``ready``, ``started``, ``stopped``,
``error <text>``. The sink is ``foreachBatch`` writing ``<workdir>/sink/<batch id>.json``
(the batch's (topic, partition, offset) triples) atomically: a replayed batch overwrites
its file, so the sink is exactly-once, as Spark recommends for ``foreachBatch``.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


def make_sink(path: str) -> Callable[[Any, int], None]:
    """The foreachBatch function (a closure: pickled by value for Spark Connect)."""

    def sink(df: Any, batch_id: int) -> None:
        import json
        import os

        rows = [
            [r.topic, r.partition, r.offset]
            for r in df.select("topic", "partition", "offset").collect()
        ]
        os.makedirs(path, exist_ok=True)
        tmp = os.path.join(path, f".{batch_id}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(rows, f)
        os.replace(tmp, os.path.join(path, f"{batch_id}.json"))

    return sink


def read_sink(workdir: Path) -> list[tuple[str, int, int]]:
    """Every record in an application's sink (one entry per record per batch file)."""
    out: list[tuple[str, int, int]] = []
    for f in sorted((workdir / "sink").glob("*.json")):
        out.extend((t, p, o) for t, p, o in json.loads(f.read_text()))
    return out


def session(args: argparse.Namespace) -> Any:
    if args.remote:
        from pyspark.sql import SparkSession

        import spark_integration

        spark = SparkSession.builder.remote(args.remote).getOrCreate()
        spark_integration.register(spark)
        return spark
    from spark_integration.session import local_session

    return local_session(
        f"kip848-app-{args.name}",
        args.master,
        **{
            "spark.sql.streaming.noDataMicroBatches.enabled": "false",
            "spark.python.authenticate.socketTimeout": "120s",
            "spark.sql.shuffle.partitions": "2",
            "spark.executor.memory": "512m",
            "spark.cores.max": "1",
        },
    )


def start(spark: Any, args: argparse.Namespace) -> Any:
    workdir = Path(args.workdir)
    checkpoint = str(workdir / "checkpoint")
    df = (
        spark.readStream.format("kip848")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.topic)
        .option("group.id", args.group)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(args.max_offsets))
        .option("checkpointLocation", checkpoint)
        .option("eventLog", str(workdir / "events.jsonl"))
        .load()
    )
    writer = df.writeStream.foreachBatch(make_sink(str(workdir / "sink"))).option(
        "checkpointLocation", checkpoint
    )
    if args.trigger == "once":
        writer = writer.trigger(once=True)
    elif args.trigger == "availableNow":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{args.trigger_ms} milliseconds")
    return writer.start()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--remote", default=None)
    parser.add_argument("--trigger", default="processingTime")
    parser.add_argument("--trigger-ms", type=int, default=300)
    parser.add_argument("--max-offsets", type=int, default=300)
    args = parser.parse_args()
    spark = session(args)
    query: Any = None
    print("ready", flush=True)

    def watch() -> None:  # a failed query is reported at once, not at the next command
        reported: set[int] = set()
        while True:
            current = query
            if current is not None and id(current) not in reported:
                try:
                    current.awaitTermination(1)
                    failure = current.exception()
                except Exception as exc:  # the session is stopping
                    failure = exc
                if failure is not None:
                    reported.add(id(current))
                    print("error " + json.dumps(f"the query failed: {failure}"), flush=True)
            else:
                time.sleep(0.5)

    threading.Thread(target=watch, daemon=True).start()
    for line in sys.stdin:
        command = line.strip()
        try:
            if command.startswith("start"):
                trigger = command.split(" ", 1)[1] if " " in command else None
                query = start(
                    spark,
                    argparse.Namespace(
                        **{**vars(args), **({"trigger": trigger} if trigger else {})}
                    ),
                )
                print("started", flush=True)
            elif command == "stop":
                if query is not None:
                    query.stop()
                    if query.exception() is not None:
                        raise RuntimeError(str(query.exception()))
                    query = None
                print("stopped", flush=True)
            elif command == "progress":
                batches = [] if query is None else [p.json for p in query.recentProgress]
                print("progress " + json.dumps(batches), flush=True)
            elif command == "exit":
                break
        except Exception:
            print("error " + json.dumps(traceback.format_exc()), flush=True)
    if query is not None:
        query.stop()
    spark.stop()


if __name__ == "__main__":
    main()
