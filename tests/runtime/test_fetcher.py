"""The assign-only data plane against EmbeddedKafka: fencing drops records, unfencing
rewinds so nothing is lost, unassign stops delivery."""

from __future__ import annotations

from consumer_sdk.runtime.fetcher import Fetcher
from consumer_sdk.testing import EmbeddedKafka
from tests.runtime.harness import wait_for


def test_fence_drops_then_unfence_rewinds_without_loss(embedded_kafka: EmbeddedKafka) -> None:
    topic = "fetch-fence"
    embedded_kafka.create_topic(topic, partitions=1)
    embedded_kafka.produce(topic, [f"v{i}".encode() for i in range(20)], partition=0)
    fetcher = Fetcher({"bootstrap.servers": embedded_kafka.bootstrap_servers,
                       "group.id": "fetch-fence-g", "auto.offset.reset": "earliest"})  # fmt: skip
    try:
        fetcher.assign({(topic, 0): None})
        got = [wait_for(lambda: fetcher.poll(0.1), what="first record").offset()]
        while len(got) < 5:
            msg = fetcher.poll(0.5)
            if msg is not None:
                got.append(msg.offset())
        assert fetcher.positions() == {(topic, 0): 5}
        fetcher.fence([(topic, 0)])
        dropped = [fetcher.poll(0.1) for _ in range(10)]
        assert all(m is None for m in dropped), "a fenced partition delivers nothing"
        fetcher.unfence([(topic, 0)])
        while len(got) < 20:
            msg = fetcher.poll(0.5)
            if msg is not None:
                got.append(msg.offset())
        assert got == list(range(20)), "unfencing rewinds to the last delivered position"
        fetcher.unassign([(topic, 0)])
        embedded_kafka.produce(topic, [b"late"], partition=0)
        assert all(fetcher.poll(0.1) is None for _ in range(5))
        assert fetcher.positions() == {}
    finally:
        fetcher.close()
