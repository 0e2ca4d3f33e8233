"""A transactional copier (consume-transform-produce), run as a child process by test_eos.py.

``python -m tests.realkafka.eos_copier BOOTSTRAP SRC DST GROUP TRANSACTIONAL_ID``

An SDK ``Consumer`` (read_committed, no auto-commit) reads SRC; each batch is produced to
DST (same partition, value upper-cased) and its offsets are sent to the same transaction
with ``consumer_group_metadata()``. One line per step goes to stdout, so the test can
SIGKILL the copier at a chosen point: ``open N`` (records produced, nothing committed),
``offsets N`` (offsets sent too, transaction still open), ``committed N``; a transaction
the broker aborts (``aborted N``) is retried from the committed offsets.
"""

from __future__ import annotations

import sys
import time

from confluent_kafka import OFFSET_BEGINNING, KafkaException, Producer, TopicPartition

from consumer_sdk import Consumer


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def main(bootstrap: str, src: str, dst: str, group: str, transactional_id: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    # Fences the previous incarnation and aborts its open transaction first.
    producer.init_transactions(60)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([src])
    say("started")
    n = 0
    while True:
        msgs = [m for m in consumer.consume(20, 0.5) if m.error() is None]
        if not msgs:
            continue
        n += 1
        producer.begin_transaction()
        next_offsets: dict[int, int] = {}
        for m in msgs:
            producer.produce(dst, (m.value() or b"").upper(), key=m.key(), partition=m.partition())
            next_offsets[m.partition()] = m.offset() + 1  # type: ignore[operator]
        producer.flush(30)
        say(f"open {n}")
        time.sleep(0.05)
        try:
            producer.send_offsets_to_transaction(
                [TopicPartition(src, p, o) for p, o in sorted(next_offsets.items())],
                consumer.consumer_group_metadata(),
                30,
            )
            say(f"offsets {n}")
            time.sleep(0.05)
            producer.commit_transaction(30)
        except KafkaException as exc:
            # E.g. the group moved on (rebalance) while the batch was processed: abort it and
            # continue from the group's committed offsets.
            if not exc.args[0].txn_requires_abort():
                raise
            say(f"aborted {n} {exc.args[0].name()}")
            producer.abort_transaction(30)
            rewind(consumer, src)
            continue
        say(f"committed {n} {len(msgs)}")


def rewind(consumer: Consumer, src: str) -> None:
    """Seek every assigned partition back to the group's committed offset."""
    for tp in consumer.committed(consumer.assignment(), 30):
        offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
        consumer.seek(TopicPartition(src, tp.partition, offset))


if __name__ == "__main__":
    main(*sys.argv[1:6])
