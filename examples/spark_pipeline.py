"""A Spark Structured Streaming pipeline whose query is a KIP-848 consumer-group member.

python examples/spark_pipeline.py            # local Spark against EmbeddedKafka
python examples/spark_pipeline.py HOST:PORT  # a real Kafka 4.x cluster (topic "orders")

The query reads "orders" with ``format("kip848")`` (same columns as Spark's ``kafka``
source), parses ``customer,amount`` values, and appends them to Parquet with
``Trigger.AvailableNow``; the group's committed offsets then equal what the sink holds, so
``kafka-consumer-groups --describe --group orders-etl`` shows the query's lag. Running it
again with the same checkpoint reads only new records. Needs Java 17 and
``pip install -e '.[spark]'``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

import spark_integration

TOPIC, GROUP = "orders", "orders-etl"


def spark_session() -> Any:
    """A small local SparkSession with the kip848 source registered."""
    from spark_integration.session import local_session

    return local_session("kip848-pipeline", "local[2]")


def run(spark: Any, bootstrap: str, workdir: Path, max_per_trigger: int = 500) -> dict[str, Any]:
    """Run the pipeline until it caught up (availableNow); return a summary."""
    from pyspark.sql import functions as F

    spark_integration.register(spark)
    orders = (
        spark.readStream.format("kip848")  # was: .format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("group.id", GROUP)
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")  # only where the group has no committed offset
        .option("maxOffsetsPerTrigger", max_per_trigger)
        # The query's checkpoint: the source reads its commit log to commit each batch to
        # Kafka as soon as it is durable, and exactly when the query stops.
        .option("checkpointLocation", str(workdir / "checkpoint"))
        .load()
    )
    fields = F.split(F.col("value").cast("string"), ",")
    parsed = orders.select(
        "partition",
        "offset",
        fields.getItem(0).alias("customer"),
        fields.getItem(1).cast("double").alias("amount"),
    )
    out = workdir / "orders"
    query = (
        parsed.writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(workdir / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    table = spark.read.parquet(str(out))
    totals = {
        r.customer: round(r.total, 2)
        for r in table.groupBy("customer").agg(F.sum("amount").alias("total")).collect()
    }
    return {"records": table.count(), "batches": len(batches), "totals": totals}


def committed_lag(bootstrap: str) -> dict[int, int]:
    """Per-partition lag of the group (high watermark - committed), as lag tooling sees it."""
    from confluent_kafka import Consumer, TopicPartition

    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": GROUP})
    try:
        parts = probe.list_topics(TOPIC, timeout=10).topics[TOPIC].partitions
        tps = probe.committed([TopicPartition(TOPIC, p) for p in parts], timeout=10)
        return {
            tp.partition: probe.get_watermark_offsets(tp, timeout=10)[1] - max(tp.offset, 0)
            for tp in tps
        }
    finally:
        probe.close()


def main_embedded(spark: Any, orders: int = 2000) -> dict[str, Any]:
    """Produce ``orders`` records to an EmbeddedKafka, run the pipeline, report."""
    from consumer_sdk.testing import EmbeddedKafka

    with EmbeddedKafka(brokers=1, heartbeat_interval_ms=500) as kafka:
        kafka.create_topic(TOPIC, partitions=4)
        kafka.produce(TOPIC, [f"c{i % 7},{i % 100}.5" for i in range(orders)])
        with tempfile.TemporaryDirectory(prefix="kip848-pipeline-") as tmp:
            summary = run(spark, kafka.bootstrap_servers, Path(tmp))
            summary["lag"] = committed_lag(kafka.bootstrap_servers)
    return summary


def main(argv: list[str]) -> None:
    spark = spark_session()
    try:
        if argv:
            workdir = Path(tempfile.mkdtemp(prefix="kip848-pipeline-"))
            summary = run(spark, argv[0], workdir)
            summary["lag"] = committed_lag(argv[0])
        else:
            summary = main_embedded(spark)
    finally:
        spark.stop()
    print(f"processed {summary['records']} records in {summary['batches']} batches")
    print(f"totals per customer: {summary['totals']}")
    print(f"group lag per partition after the run: {summary['lag']}")


if __name__ == "__main__":
    main(sys.argv[1:])
