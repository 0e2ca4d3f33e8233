"""EmbeddedKafka against real sockets and real confluent-kafka clients (shared cluster)."""

from __future__ import annotations

import errno
import re
import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from consumer_sdk.testing import EmbeddedKafka, EmbeddedKafkaError, close_client, wait_until

from .kafka_wire import api_versions

METADATA, FETCH, API_VERSIONS, CONSUMER_GROUP_HEARTBEAT = 3, 1, 18, 68


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _connect_errno(address: tuple[str, int]) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(2.0)
        return sock.connect_ex(address)


@pytest.fixture
def reader(embedded_kafka: EmbeddedKafka) -> Iterator[Consumer]:
    """An assign-mode consumer (never joins a group)."""
    consumer = Consumer(
        {
            "bootstrap.servers": embedded_kafka.bootstrap_servers,
            "group.id": _name("assign-reader"),
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    yield consumer
    assert close_client(consumer)


def _read(consumer: Consumer, topic: str, partitions: int, count: int) -> list[Any]:
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    messages: list[Any] = []

    def got_all() -> bool:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            messages.append(msg)
        return len(messages) >= count

    wait_until(got_all, timeout=15.0, interval=0, description=f"{count} messages")
    return messages


def test_bootstrap_string_lists_every_broker_on_loopback(embedded_kafka: EmbeddedKafka) -> None:
    entries = embedded_kafka.bootstrap_servers.split(",")
    assert len(entries) == embedded_kafka.broker_count == 3
    assert all(re.fullmatch(r"127\.0\.0\.1:\d+", entry) for entry in entries)
    ports = [int(entry.rsplit(":", 1)[1]) for entry in entries]
    assert len(set(ports)) == 3
    assert [embedded_kafka.broker_address(b) for b in (1, 2, 3)] == [
        ("127.0.0.1", port) for port in ports
    ]
    assert embedded_kafka.alive
    assert embedded_kafka.librdkafka_version


def test_produce_and_consume_back(embedded_kafka: EmbeddedKafka, reader: Consumer) -> None:
    topic = _name("orders")
    embedded_kafka.create_topic(topic, partitions=6)
    assert embedded_kafka.topics()[topic] == 6

    assert embedded_kafka.produce(topic, [b"v1", "v2"], key=b"same-key") == 2
    assert embedded_kafka.produce(topic, [(b"k3", b"v3")], partition=4, headers={"h": b"x"}) == 1
    assert embedded_kafka.produce(topic, b"single", partition=5) == 1
    assert embedded_kafka.produce(topic, []) == 0

    messages = _read(reader, topic, 6, 4)
    by_value = {m.value(): m for m in messages}
    assert set(by_value) == {b"v1", b"v2", b"v3", b"single"}
    assert by_value[b"v1"].key() == by_value[b"v2"].key() == b"same-key"
    assert by_value[b"v1"].partition() == by_value[b"v2"].partition()  # same key, same partition
    assert (by_value[b"v3"].key(), by_value[b"v3"].partition()) == (b"k3", 4)
    assert by_value[b"v3"].headers() == [("h", b"x")]
    assert by_value[b"single"].partition() == 5


def test_produce_to_missing_partition_fails(embedded_kafka: EmbeddedKafka) -> None:
    topic = _name("small")
    embedded_kafka.create_topic(topic, partitions=2)
    with pytest.raises(EmbeddedKafkaError, match="partition 2 does not exist"):
        embedded_kafka.produce(topic, [b"x"], partition=2)


def test_create_and_delete_topic(embedded_kafka: EmbeddedKafka) -> None:
    topic = _name("doomed")
    embedded_kafka.create_topic(topic, partitions=3, replication_factor=1)
    with pytest.raises(EmbeddedKafkaError, match="TOPIC_ALREADY_EXISTS") as excinfo:
        embedded_kafka.create_topic(topic, partitions=3)
    assert excinfo.value.code == 36

    embedded_kafka.delete_topic(topic)
    assert topic not in embedded_kafka.topics()
    with pytest.raises(EmbeddedKafkaError) as excinfo:
        embedded_kafka.delete_topic(topic)
    assert excinfo.value.code == 3

    embedded_kafka.create_topic(topic, partitions=5)  # the name can be reused
    assert embedded_kafka.topics()[topic] == 5


def test_request_tracking(embedded_kafka: EmbeddedKafka, reader: Consumer) -> None:
    topic = _name("tracked")
    embedded_kafka.create_topic(topic, partitions=2)
    embedded_kafka.produce(topic, [b"a", b"b"])
    embedded_kafka.clear_requests()
    assert embedded_kafka.request_counts() == {}

    _read(reader, topic, 2, 2)
    counts = embedded_kafka.request_counts()
    assert counts.get(METADATA, 0) >= 1
    assert counts.get(FETCH, 0) >= 1
    fetches = embedded_kafka.requests(FETCH)
    assert len(fetches) >= 1 and all(r.api_key == FETCH for r in fetches)
    everything = embedded_kafka.requests()
    assert all(1 <= r.broker_id <= 3 for r in everything)
    stamps = [r.timestamp_us for r in everything]
    assert stamps == sorted(stamps)

    assert close_client(reader)
    embedded_kafka.clear_requests()
    assert embedded_kafka.request_counts() == {}
    assert embedded_kafka.requests() == []

    api_versions(embedded_kafka.broker_address(3))
    first = embedded_kafka.requests()
    api_versions(embedded_kafka.broker_address(2))
    second = embedded_kafka.requests()
    assert [(r.api_key, r.broker_id) for r in second] == [(API_VERSIONS, 3), (API_VERSIONS, 2)]
    assert second[:1] == first
    assert embedded_kafka.request_counts() == {API_VERSIONS: 2}


def test_broker_down_refuses_connections_until_up(embedded_kafka: EmbeddedKafka) -> None:
    address = embedded_kafka.broker_address(3)
    assert _connect_errno(address) == 0
    embedded_kafka.broker_down(3)
    try:
        assert _connect_errno(address) == errno.ECONNREFUSED
        assert _connect_errno(embedded_kafka.broker_address(1)) == 0
    finally:
        embedded_kafka.broker_up(3)
    assert _connect_errno(address) == 0
    assert api_versions(address)[0] == 0


def test_set_rtt_delays_responses(embedded_kafka: EmbeddedKafka) -> None:
    address = embedded_kafka.broker_address(2)
    embedded_kafka.set_rtt(2, ms=300)
    try:
        assert api_versions(address)[2] >= 0.28
    finally:
        embedded_kafka.set_rtt(2, ms=0)
    assert api_versions(address)[2] < 0.25


def test_push_request_errors_and_clear(embedded_kafka: EmbeddedKafka) -> None:
    address = embedded_kafka.broker_address(1)
    embedded_kafka.push_request_errors(API_VERSIONS, [42])
    assert api_versions(embedded_kafka.broker_address(2))[0] == 42  # any broker pops it
    assert api_versions(address)[0] == 0

    embedded_kafka.push_request_errors(API_VERSIONS, [42, 42])
    embedded_kafka.clear_request_errors(API_VERSIONS)
    assert api_versions(address)[0] == 0


def test_push_broker_errors_with_rtt(embedded_kafka: EmbeddedKafka) -> None:
    embedded_kafka.push_broker_errors(broker_id=2, api_key=API_VERSIONS, errors=[(15, 0), (0, 300)])
    assert embedded_kafka.pending_broker_errors(2, API_VERSIONS) == 2
    assert api_versions(embedded_kafka.broker_address(1))[0] == 0  # other brokers unaffected
    error, _, _ = api_versions(embedded_kafka.broker_address(2))
    assert error == 15
    error, _, elapsed = api_versions(embedded_kafka.broker_address(2))
    assert error == 0 and elapsed >= 0.28
    assert embedded_kafka.pending_broker_errors(2, API_VERSIONS) == 0


def test_advertised_api_versions_and_set_api_version(embedded_kafka: EmbeddedKafka) -> None:
    address = embedded_kafka.broker_address(1)
    _, versions, _ = api_versions(address)
    # The ranges docs/shared reference/embedded-kafka.md relies on.
    assert versions[CONSUMER_GROUP_HEARTBEAT] == (1, 1)
    assert versions[9] == (0, 6)  # OffsetFetch
    assert versions[10] == (0, 3)  # FindCoordinator
    assert 69 not in versions  # ConsumerGroupDescribe

    embedded_kafka.set_api_version(CONSUMER_GROUP_HEARTBEAT, -1, -1)
    try:
        assert CONSUMER_GROUP_HEARTBEAT not in api_versions(address)[1]
    finally:
        embedded_kafka.set_api_version(CONSUMER_GROUP_HEARTBEAT, 1, 1)
    assert api_versions(address)[1][CONSUMER_GROUP_HEARTBEAT] == (1, 1)


def test_partition_set_leader(embedded_kafka: EmbeddedKafka, reader: Consumer) -> None:
    topic = _name("leaders")
    embedded_kafka.create_topic(topic, partitions=2)
    for broker_id in (1, 2, 3):
        embedded_kafka.partition_set_leader(topic, 0, broker_id)

        def leader_is(expected: int = broker_id) -> bool:
            metadata = reader.list_topics(topic, timeout=5.0)
            return bool(metadata.topics[topic].partitions[0].leader == expected)

        wait_until(leader_is, timeout=5.0, description=f"leader {broker_id}")

    missing = _name("never-created")
    with pytest.raises(EmbeddedKafkaError, match="unknown topic") as excinfo:
        embedded_kafka.partition_set_leader(missing, 0, 1)
    assert excinfo.value.code == 3
    assert missing not in embedded_kafka.topics()  # the mock did not auto-create it


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda k: k.broker_down(0), ValueError),
        (lambda k: k.broker_up(4), ValueError),
        (lambda k: k.set_rtt(2, ms=-1), ValueError),
        (lambda k: k.set_group_coordinator("g", 5), ValueError),
        (lambda k: k.set_group_coordinator("", 1), ValueError),
        (lambda k: k.create_topic("", partitions=1), ValueError),
        (lambda k: k.create_topic("bad name", partitions=1), ValueError),
        (lambda k: k.create_topic("t", partitions=0), ValueError),
        (lambda k: k.create_topic("t", partitions=1, replication_factor=4), ValueError),
        (lambda k: k.create_topic("t", partitions=True), TypeError),
        (lambda k: k.delete_topic(".."), ValueError),
        (lambda k: k.produce("t", [1]), TypeError),
        (lambda k: k.produce("t", [b"x"], partition=-1), ValueError),
        (lambda k: k.push_request_errors(68, [1 << 20]), ValueError),
        (lambda k: k.push_request_errors(-1, [15]), ValueError),
        (lambda k: k.push_broker_errors(9, 68, [(15, 0)]), ValueError),
        (lambda k: k.push_broker_errors(1, 68, [(15, -5)]), ValueError),
        (lambda k: k.set_heartbeat_interval(0), ValueError),
        (lambda k: k.set_session_timeout(-1), ValueError),
        (lambda k: k.set_api_version(68, -2, 1), ValueError),
        (lambda k: k.set_target_assignment("g", {"": [("t", 0)]}), ValueError),
        (lambda k: k.set_target_assignment("g", {"m": [("t", -1)]}), ValueError),
        (lambda k: k.set_target_assignment("g", {"a": [("t", 0)], "b": [("t", 0)]}), ValueError),
        (lambda k: k.partition_set_leader("t", 0, 7), ValueError),
        (lambda k: k.requests(api_key=-3), ValueError),
    ],
)
def test_invalid_arguments_are_rejected_in_the_parent(
    embedded_kafka: EmbeddedKafka, call: object, error: type[Exception]
) -> None:
    with pytest.raises(error):
        call(embedded_kafka)  # type: ignore[operator]
    embedded_kafka.ensure_alive()


def test_mock_errors_carry_the_code(embedded_kafka: EmbeddedKafka) -> None:
    with pytest.raises(EmbeddedKafkaError) as excinfo:
        embedded_kafka.set_api_version(30000, 0, 1)  # beyond the mock's API table
    assert excinfo.value.code == -186  # _INVALID_ARG
    embedded_kafka.ensure_alive()
