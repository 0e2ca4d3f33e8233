"""``allow.auto.create.topics``, ``broker.address.family`` and ``enable.metrics.push`` work
as in confluent-kafka (``group.protocol=consumer``), checked side by side on the real broker
(which allows topic creation: ``auto.create.topics.enable=true``)."""

from __future__ import annotations

from typing import Any

import confluent_kafka
import pytest

from consumer_sdk import Consumer, KafkaError
from consumer_sdk.config import ConsumerConfig
from consumer_sdk.testing import KafkaCluster, close_client, wait_until
from tests.realkafka.support import unique

IMPLS = ["sdk", "ck"]
WAIT_S = 45.0


def _consumer(impl: str, conf: dict[str, Any]) -> Any:
    if impl == "ck":
        return confluent_kafka.Consumer({**conf, "group.protocol": "consumer"})
    return Consumer(conf)


def _close(impl: str, consumer: Any) -> None:
    if impl == "ck":
        assert close_client(consumer)
    else:
        consumer.close()


@pytest.mark.realkafka
@pytest.mark.parametrize("impl", IMPLS)
def test_allow_auto_create_topics(real_kafka: KafkaCluster, impl: str) -> None:
    """With ``allow.auto.create.topics=true`` the SDK's metadata request for the subscription
    creates a subscribed topic that does not exist (as the Java client and librdkafka's
    documentation say), and the member is assigned it. confluent-kafka's
    ``group.protocol=consumer`` consumer creates nothing (a documented difference): by the
    time it has read the other subscribed topic, the missing one still does not exist. (With
    the default, false, neither creates it: tests/realkafka/test_error_channel.py.)"""
    existing, missing = unique(f"autocreate-in-{impl}"), unique(f"autocreate-{impl}")
    real_kafka.create_topic(existing, partitions=1)
    real_kafka.produce(existing, [b"x"])
    conf = {
        "bootstrap.servers": real_kafka.bootstrap_servers,
        "group.id": unique("autocreate"),
        "auto.offset.reset": "earliest",
        "allow.auto.create.topics": True,
    }
    consumer = _consumer(impl, conf)
    records: list[bytes | None] = []
    try:
        consumer.subscribe([existing, missing])

        def settled() -> bool:
            msg = consumer.poll(0.05)
            if msg is not None and msg.error() is None:
                records.append(msg.value())
            if impl == "ck":
                return bool(records)
            return any(tp.topic == missing for tp in consumer.assignment())

        wait_until(settled, timeout=WAIT_S, interval=0, description=f"{impl}: subscription")
    finally:
        _close(impl, consumer)
    assert (missing in real_kafka.topics()) is (impl == "sdk")


@pytest.mark.realkafka
@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("family", ["v4", "v6"])
def test_broker_address_family(real_kafka: KafkaCluster, impl: str, family: str) -> None:
    """``localhost`` has only an IPv4 address here (the broker listens on 127.0.0.1): with
    ``v4`` the consumer reads, with ``v6`` it finds no address and reports to error_cb."""
    topic = unique("family")
    real_kafka.create_topic(topic, partitions=1)
    real_kafka.produce(topic, [b"x"])
    port = real_kafka.bootstrap_servers.split(",")[0].rsplit(":", 1)[1]
    errors: list[KafkaError] = []
    conf = {
        "bootstrap.servers": f"localhost:{port}",
        "group.id": unique("family"),
        "auto.offset.reset": "earliest",
        "broker.address.family": family,
        "error_cb": errors.append,
    }
    consumer = _consumer(impl, conf)
    records: list[bytes | None] = []
    try:
        consumer.subscribe([topic])

        def outcome() -> bool:
            msg = consumer.poll(0.05)
            if msg is not None and msg.error() is None:
                records.append(msg.value())
            return bool(records) if family == "v4" else bool(errors)

        wait_until(outcome, timeout=WAIT_S, interval=0, description=f"{impl} with {family}")
        if family == "v4":
            assert records == [b"x"] and errors == []
        else:
            assert records == [] and consumer.assignment() == []
    finally:
        _close(impl, consumer)


def test_enable_metrics_push_goes_to_the_fetcher() -> None:
    """KIP-714 push is librdkafka's, for the fetcher's own metrics (default true)."""
    base = {"bootstrap.servers": "localhost:9092", "group.id": "g"}
    assert "enable.metrics.push" not in ConsumerConfig.from_mapping(base).fetcher_config()
    for value in (True, False):
        conf = ConsumerConfig.from_mapping({**base, "enable.metrics.push": value})
        assert conf.fetcher_config()["enable.metrics.push"] is value
