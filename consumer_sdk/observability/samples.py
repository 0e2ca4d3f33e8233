"""Every metric of one consumer as labelled samples: what the Prometheus and OpenTelemetry
exporters publish.

Each sample names its Java metric group (``consumer-coordinator-metrics``,
``consumer-fetch-manager-metrics``) and metric (``rebalance-total``, ``records-lag``) and
carries the labels ``client_id``, ``member_id`` and ``group``, so that two consumers in one
process are two series; per-partition metrics add ``topic`` and ``partition``. Averages and
maxima without samples in their window (NaN) are left out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from consumer_sdk.observability.client_metrics import COORDINATOR_GROUP, FETCH_GROUP

__all__ = ["DESCRIPTIONS", "Sample", "collect", "export_name", "metric_keys"]


@dataclass(frozen=True)
class Sample:
    group: str
    name: str
    value: float
    labels: tuple[tuple[str, str], ...]


#: What the metrics beyond the membership core's mean (the core's are in docs/metrics.md).
DESCRIPTIONS = {
    "commit-failed-total": "OffsetCommit requests that failed (after retries)",
    "partitions-assigned-total": "Partitions handed to on_assign",
    "partitions-revoked-total": "Partitions handed to on_revoke",
    "partitions-lost-total": "Partitions handed to on_lost",
    "fetch-total": "Fetch requests sent by the data plane",
    "fetch-rate": "Fetch requests per second between the last two statistics",
    "records-consumed-total": "Records received from the brokers",
    "records-consumed-rate": "Records received per second between the last two statistics",
    "bytes-consumed-total": "Record bytes received from the brokers",
    "bytes-consumed-rate": "Record bytes received per second between the last two statistics",
    "records-lag": "High watermark minus position, per partition",
    "records-lag-max": "Largest records-lag observed in the last 60 s (per partition, and "
    "over all partitions without partition labels)",
}


def export_name(group: str, name: str, separator: str = "_") -> str:
    """``kafka_consumer_coordinator_rebalance_total`` (Prometheus) or, with ``"."``,
    ``kafka.consumer.coordinator.rebalance_total`` (OpenTelemetry)."""
    family = group.removeprefix("consumer-").removesuffix("-metrics").replace("-", "_")
    return separator.join(("kafka", "consumer", family, name.replace("-", "_")))


def metric_keys() -> list[tuple[str, str]]:
    """Every (group, name) `collect` can return."""
    from consumer_sdk.membership.metrics import MembershipMetrics
    from consumer_sdk.observability.client_metrics import ClientMetrics

    keys = [(COORDINATOR_GROUP, name) for name in MembershipMetrics().snapshot(0)]
    for group, names in ClientMetrics().snapshot().items():
        keys.extend((group, name) for name in names)
    keys.extend(
        (FETCH_GROUP, name)
        for name in DESCRIPTIONS
        if not name.startswith(("commit-", "partitions-"))
    )
    return sorted(set(keys))


def collect(member: Any) -> list[Sample]:
    """The samples of one `GroupMember` or `Consumer` now (an empty list once closed)."""
    if getattr(member, "_closed", False):
        return []
    base = (
        ("client_id", member.client_id),
        ("member_id", member.member_id),
        ("group", member.group_id),
    )
    out: list[Sample] = []
    values: dict[str, dict[str, float]] = {COORDINATOR_GROUP: dict(member.metrics())}
    for group, counters in member._client_metrics.snapshot().items():
        values.setdefault(group, {}).update(counters)
    for group, named in values.items():
        for name, value in sorted(named.items()):
            if math.isfinite(value):
                out.append(Sample(group, name, float(value), base))
    lag_of = getattr(member, "lag", None)
    if lag_of is not None:
        lags = lag_of()
        highest = member._client_metrics.lag_max()
        for (topic, partition), lag in sorted(lags.items()):
            labels = (*base, ("topic", topic), ("partition", str(partition)))
            out.append(Sample(FETCH_GROUP, "records-lag", float(lag), labels))
            out.append(
                Sample(
                    FETCH_GROUP,
                    "records-lag-max",
                    float(highest.get((topic, partition), lag)),
                    labels,
                )
            )
        if lags:
            top = max(max(lags.values()), *highest.values()) if highest else max(lags.values())
            out.append(Sample(FETCH_GROUP, "records-lag-max", float(top), base))
    return out
