"""A real Apache Kafka 4.x broker (KRaft, single node) through testcontainers.

Skips with the reason when testcontainers or a Docker engine is unavailable; every other
test module still runs.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

KAFKA_IMAGE = "apache/kafka:4.1.0"


def _docker_unavailable_reason() -> str | None:
    try:
        from testcontainers.core.docker_client import DockerClient
    except Exception as exc:  # pragma: no cover - depends on the environment
        return f"testcontainers is not installed ({exc})"
    try:
        DockerClient().client.ping()
    except Exception as exc:
        return f"no Docker engine reachable for the real-Kafka tier ({type(exc).__name__}: {exc})"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def real_kafka() -> Iterator[str]:
    """Bootstrap servers of a real Kafka 4.x with short consumer-group timings."""
    reason = _docker_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    from testcontainers.core.container import DockerContainer

    port = _free_port()
    env: dict[str, Any] = {
        "KAFKA_NODE_ID": 1,
        "KAFKA_PROCESS_ROLES": "broker,controller",
        "KAFKA_LISTENERS": "PLAINTEXT://:9092,CONTROLLER://:9093",
        "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{port}",
        "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
        "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": 1,
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": 1,
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": 1,
        "KAFKA_GROUP_CONSUMER_MIN_HEARTBEAT_INTERVAL_MS": 500,
        "KAFKA_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": 500,
        "KAFKA_GROUP_CONSUMER_MIN_SESSION_TIMEOUT_MS": 6000,
        "KAFKA_GROUP_CONSUMER_SESSION_TIMEOUT_MS": 6000,
        "KAFKA_GROUP_CONSUMER_ASSIGNMENT_INTERVAL_MS": 100,
    }
    container = DockerContainer(KAFKA_IMAGE).with_bind_ports(9092, port)
    for key, value in env.items():
        container = container.with_env(key, str(value))
    container.start()
    try:
        servers = f"127.0.0.1:{port}"
        _wait_ready(servers)
        yield servers
    finally:
        container.stop()


def _wait_ready(servers: str, timeout: float = 90.0) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": servers})
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin.list_topics(timeout=2)
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
