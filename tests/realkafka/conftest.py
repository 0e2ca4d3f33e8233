"""The real-Kafka tier: fixtures come from the public plugin (consumer_sdk.testing.pytest_plugin).

``real_kafka`` is a session-wide single node (KAFKA_HOME, else Docker, else skipped with the
reason); ``real_kafka_cluster`` a module-wide 3-node cluster for node faults.
"""

from __future__ import annotations
