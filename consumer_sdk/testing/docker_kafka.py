"""DockerKafka: one real Kafka 4.x node in a Docker container (testcontainers, ``apache/kafka``).

The fallback backend of the pytest plugin's real-Kafka fixtures where no ``KAFKA_HOME`` is
available; it needs the ``testcontainers`` package and a reachable Docker engine
(`docker_unavailable_reason` says which is missing). Its operations run on the calling thread.
"""

from __future__ import annotations

import contextlib
import threading
import time

from consumer_sdk.testing._cluster_ops import (
    DEFAULT_HEARTBEAT_MS,
    DEFAULT_SESSION_MS,
    ClusterOps,
    KafkaClusterError,
)
from consumer_sdk.testing._helpers import free_ports

__all__ = ["DOCKER_KAFKA_IMAGE", "DockerKafka", "docker_unavailable_reason"]

DOCKER_KAFKA_IMAGE = "apache/kafka:4.1.0"


def docker_unavailable_reason() -> str | None:
    """None when testcontainers is installed and a Docker engine answers, else why not."""
    try:
        from testcontainers.core.docker_client import DockerClient
    except Exception as exc:  # depends on the environment
        return f"testcontainers is not installed ({exc})"
    try:
        DockerClient().client.ping()
    except Exception as exc:
        return f"no Docker engine reachable ({type(exc).__name__}: {exc})"
    return None


class DockerKafka(ClusterOps):
    """A single real Kafka 4.x node in a Docker container (testcontainers, ``apache/kafka``).

    The fallback backend where no ``KAFKA_HOME`` is available: topic, data and group
    operations as on `KafkaCluster`; node faults need `KafkaCluster`.
    """

    def __init__(
        self,
        *,
        image: str = DOCKER_KAFKA_IMAGE,
        heartbeat_interval_ms: int = 500,
        session_timeout_ms: int = 6000,
        start_timeout: float = 120.0,
    ) -> None:
        from testcontainers.core.container import DockerContainer

        self._lock = threading.RLock()
        self._admin = None
        self._producer = None
        self._closed = False
        [self._port] = free_ports(1)
        hb, session = heartbeat_interval_ms, session_timeout_ms
        env: dict[str, object] = {
            "KAFKA_NODE_ID": 1,
            "KAFKA_PROCESS_ROLES": "broker,controller",
            "KAFKA_LISTENERS": "PLAINTEXT://:9092,CONTROLLER://:9093",
            "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{self._port}",
            "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
            "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": 1,
            "KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS": 10,
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": 1,
            "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": 1,
            "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": 0,
            "KAFKA_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": hb,
            "KAFKA_GROUP_CONSUMER_MIN_HEARTBEAT_INTERVAL_MS": min(hb, DEFAULT_HEARTBEAT_MS),
            "KAFKA_GROUP_CONSUMER_SESSION_TIMEOUT_MS": session,
            "KAFKA_GROUP_CONSUMER_MIN_SESSION_TIMEOUT_MS": min(session, DEFAULT_SESSION_MS),
        }
        container = DockerContainer(image).with_bind_ports(9092, self._port)
        for key, value in env.items():
            container = container.with_env(key, str(value))
        self._container = container
        container.start()
        try:
            deadline = time.monotonic() + start_timeout
            while True:
                try:
                    self.admin().list_topics(timeout=2)
                    break
                except Exception:
                    if time.monotonic() >= deadline:
                        raise KafkaClusterError(
                            f"Kafka container {image} not ready after {start_timeout:.0f}s"
                        ) from None
                    time.sleep(0.5)
            self.coordinator_for(
                "__consumer_sdk_warmup", timeout=max(deadline - time.monotonic(), 30)
            )
        except BaseException:
            self.close()
            raise

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self._port}"

    def _check_open(self) -> None:
        if self._closed:
            raise KafkaClusterError("DockerKafka is closed")

    @property
    def node_ids(self) -> list[int]:
        return [1]

    def _unsupported(self, what: str) -> KafkaClusterError:
        return KafkaClusterError(
            f"{what} needs KafkaCluster (set KAFKA_HOME to a Kafka 4.x distribution); the "
            "Docker backend runs one node without node faults"
        )

    def stop_node(self, node_id: int, timeout: float = 60.0) -> None:
        raise self._unsupported("stop_node")

    def kill_node(self, node_id: int) -> None:
        raise self._unsupported("kill_node")

    def pause_node(self, node_id: int) -> None:
        raise self._unsupported("pause_node")

    def resume_node(self, node_id: int) -> None:
        raise self._unsupported("resume_node")

    def start_node(self, node_id: int, timeout: float | None = None) -> None:
        raise self._unsupported("start_node")

    def close(self) -> None:
        """Stop and remove the container (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._producer = None
        self._admin = None
        with contextlib.suppress(Exception):
            self._container.stop()

    def __enter__(self) -> DockerKafka:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
