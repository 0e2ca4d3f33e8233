"""Test support: `EmbeddedKafka`, a real Kafka-protocol cluster for tests and demos.

``EmbeddedKafka`` hosts librdkafka's mock cluster (shipped inside the confluent-kafka
wheel) in a child process and exposes topic management, produce, broker faults, error
injection, KIP-848 group settings and request tracking:

    from consumer_sdk.testing import EmbeddedKafka

    with EmbeddedKafka(brokers=3, heartbeat_interval_ms=500, session_timeout_ms=6000) as kafka:
        kafka.create_topic("orders", partitions=6)
        kafka.produce("orders", [b"v1", b"v2"])
        ...  # point clients at kafka.bootstrap_servers

The pytest plugin `consumer_sdk.testing.pytest_plugin` (registered through the
``pytest11`` entry point) provides the ``embedded_kafka`` and ``embedded_kafka_factory``
fixtures.

`KafkaCluster` runs the real thing: Apache Kafka >= 4.0 (KRaft, 1 or 3 nodes) from a
distribution directory (``KAFKA_HOME``), with node faults (stop, SIGKILL, SIGSTOP) and the
same topic/produce/group helpers; the plugin's ``real_kafka`` and ``real_kafka_cluster``
fixtures start it (`DockerKafka`, one node in a container, where there is no ``KAFKA_HOME``).

Imports: anything in the SDK (it drives real clients; the real-Kafka backends use
`consumer_sdk.protocol.client`), ``confluent_kafka``, and ``kio`` in the broker proxies. The
SDK proper never imports it (only the demo and the chaos soak start clusters).

Threads and processes: a cluster lives in other processes (EmbeddedKafka's child process, one
JVM per KafkaCluster node). Their methods run on the calling thread and block until the
cluster has answered or the timeout has passed. EmbeddedKafka reads its child's output on two
threads of its own; the proxies (`faulty_proxy`, `tls_proxy`) accept and forward connections
on threads of their own.
"""

from __future__ import annotations

from consumer_sdk.testing._cluster_ops import (
    GroupDescription,
    GroupMemberDescription,
    KafkaClusterError,
)
from consumer_sdk.testing._embedded import EmbeddedKafka, EmbeddedKafkaError, MockRequest
from consumer_sdk.testing._helpers import close_client, wait_until
from consumer_sdk.testing.docker_kafka import DockerKafka
from consumer_sdk.testing.kafka_cluster import KafkaCluster

__all__ = [
    "DockerKafka",
    "EmbeddedKafka",
    "EmbeddedKafkaError",
    "GroupDescription",
    "GroupMemberDescription",
    "KafkaCluster",
    "KafkaClusterError",
    "MockRequest",
    "close_client",
    "wait_until",
]
