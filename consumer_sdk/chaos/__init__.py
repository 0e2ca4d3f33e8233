"""Chaos soak for the consumer group member: ``python -m consumer_sdk.chaos --duration 600``.

See `consumer_sdk.chaos.driver` (the faults), `consumer_sdk.chaos.member` (a member
process and its log) and `consumer_sdk.chaos.analysis` (the checks), and
``docs/reliability.md`` for a recorded run.

Imports: the public API (`consumer_sdk.Consumer`), `consumer_sdk.testing` for the cluster,
`consumer_sdk.protocol.client` to read committed offsets, and ``confluent_kafka`` for the
producer and the reference member; `analysis` is pure (the standard library and
`consumer_sdk.error_codes`). Threads and processes: every member is a process of its own;
the driver's producer, committed-offset sampler and fault actions run on threads of the
driver process.
"""

from __future__ import annotations

from consumer_sdk.chaos.analysis import Summary, analyze

__all__ = ["Summary", "analyze"]
