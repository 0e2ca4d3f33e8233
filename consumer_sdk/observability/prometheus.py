"""Prometheus exposition of consumers' metrics (``pip install 'kip848-consumer[prometheus]'``).

    from prometheus_client import start_http_server
    from consumer_sdk.observability.prometheus import ConsumerCollector

    collector = ConsumerCollector.register()     # on prometheus_client's default registry
    collector.add(consumer)                      # any number of consumers
    start_http_server(9000)                      # GET /metrics

Every metric is a gauge named after its Java group and name
(``kafka_consumer_coordinator_rebalance_latency_avg``,
``kafka_consumer_fetch_manager_records_lag``), labelled by ``client_id``, ``member_id`` and
``group`` (and ``topic``/``partition`` for per-partition metrics). Values are read at scrape
time; a closed consumer drops out of the exposition.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

try:
    from prometheus_client.core import Metric
    from prometheus_client.registry import REGISTRY, Collector, CollectorRegistry
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError(
        "consumer_sdk.observability.prometheus needs prometheus_client: "
        "pip install 'kip848-consumer[prometheus]'"
    ) from exc

from consumer_sdk.membership.metrics import GROUP as _COORDINATOR
from consumer_sdk.observability.samples import DESCRIPTIONS, collect, export_name

__all__ = ["ConsumerCollector"]


class ConsumerCollector(Collector):
    """A ``prometheus_client`` collector for any number of consumers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._members: list[Any] = []

    @classmethod
    def register(cls, registry: CollectorRegistry | None = None) -> ConsumerCollector:
        """A new collector, registered on ``registry`` (default: prometheus_client's)."""
        collector = cls()
        (REGISTRY if registry is None else registry).register(collector)
        return collector

    def add(self, member: Any) -> None:
        """Export ``member`` (a `Consumer` or `GroupMember`) from the next scrape on."""
        with self._lock:
            if member not in self._members:
                self._members.append(member)

    def remove(self, member: Any) -> None:
        with self._lock:
            if member in self._members:
                self._members.remove(member)

    def describe(self) -> list[Metric]:
        # No up-front description: the metric set depends on the consumers added later.
        return []

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            members = list(self._members)
        families: dict[str, Metric] = {}
        for member in members:
            if getattr(member, "_closed", False):
                self.remove(member)
                continue
            for sample in collect(member):
                name = export_name(sample.group, sample.name)
                family = families.get(name)
                if family is None:
                    doc = DESCRIPTIONS.get(sample.name) or f"{_COORDINATOR} {sample.name}"
                    family = families[name] = Metric(name, doc, "gauge")
                family.add_sample(name, dict(sample.labels), sample.value)
        yield from families.values()
