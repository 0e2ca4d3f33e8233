"""Consume with manual commits, committing processed offsets before partitions are revoked.

python examples/revoke_time_commits.py            # runs against EmbeddedKafka
python examples/revoke_time_commits.py HOST:PORT  # or a real Kafka 4.x cluster
"""

from __future__ import annotations

import sys
from typing import Any

from consumer_sdk import Consumer, KafkaException, TopicPartition


def run(bootstrap: str, topic: str, records: int) -> None:
    processed: dict[tuple[str, int], int] = {}  # partition -> next offset to commit

    def on_revoke(consumer: Any, partitions: list[TopicPartition]) -> None:
        done = [
            TopicPartition(p.topic, p.partition, processed[(p.topic, p.partition)])
            for p in partitions
            if (p.topic, p.partition) in processed
        ]
        if done:
            consumer.commit(offsets=done, asynchronous=False)  # before the partitions move
            print(f"revoked {[p.partition for p in partitions]}, committed {len(done)}")
        for p in partitions:
            processed.pop((p.topic, p.partition), None)

    def on_assign(consumer: Any, partitions: list[TopicPartition]) -> None:
        print(
            f"assigned {[p.partition for p in partitions]} (member epoch {consumer.member_epoch})"
        )

    config = {
        "bootstrap.servers": bootstrap,
        "group.id": "example-revoke-commits",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    with Consumer(config) as consumer:
        consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        seen = 0
        while seen < records:
            try:
                msg = consumer.poll(1.0)
            except KafkaException as exc:
                print(f"error: {exc}")
                continue
            if msg is None or msg.error() is not None:
                continue
            seen += 1  # process the record here
            processed[(msg.topic(), msg.partition())] = msg.offset() + 1
            if seen % 100 == 0:
                consumer.commit(asynchronous=True)
        on_revoke(consumer, consumer.assignment())  # commit what is left before close
    print(f"processed {seen} records")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        run(sys.argv[1], "orders", 500)
    else:
        from consumer_sdk.testing import EmbeddedKafka

        with EmbeddedKafka(brokers=1, heartbeat_interval_ms=500) as kafka:
            kafka.create_topic("orders", partitions=3)
            kafka.produce("orders", [f"order-{i}".encode() for i in range(500)])
            run(kafka.bootstrap_servers, "orders", 500)
