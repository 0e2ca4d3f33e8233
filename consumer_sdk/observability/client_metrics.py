"""Per-consumer counters beyond the membership core's: commits (with failures), partitions
assigned / revoked / lost, the data plane's fetches (from librdkafka's statistics), and
the last error. Thread-safe; no dependency beyond the standard library.

Names follow the Java consumer where it has the metric (``consumer-fetch-manager-metrics``:
``fetch-total``, ``records-consumed-total``, ``bytes-consumed-total``, ``records-lag``,
``records-lag-max``); the others are this SDK's, in the same style.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "COORDINATOR_GROUP",
    "FETCH_GROUP",
    "ClientMetrics",
    "LastError",
    "end_offset",
    "fill_consumer_lag",
]

#: records-lag-max covers the lag values observed over this window (seconds), as Kafka's sensors.
LAG_WINDOW_S = 60.0

COORDINATOR_GROUP = "consumer-coordinator-metrics"
FETCH_GROUP = "consumer-fetch-manager-metrics"

Partition = tuple[str, int]


@dataclass(frozen=True)
class LastError:
    """The most recent error this consumer reported (to the application or in its log)."""

    code: int
    name: str
    message: str
    at: float  # wall-clock seconds


def end_offset(partition_stats: Mapping[str, Any], read_committed: bool) -> int:
    """The offset lag is counted to in librdkafka's partition statistics: the last stable
    offset under ``read_committed``, else the high watermark (-1001 while unknown)."""
    key = "ls_offset" if read_committed else "hi_offset"
    value = partition_stats.get(key, -1001)
    return int(value) if isinstance(value, int) else -1001


def _lag(end: int, offset: int | None) -> int:
    """librdkafka's rule: -1 unless both offsets are known and ``offset`` <= ``end``."""
    if offset is None or offset < 0 or end < 0 or offset > end:
        return -1
    return end - offset


def fill_consumer_lag(
    stats: dict[str, Any],
    committed: Mapping[Partition, int],
    stored: Mapping[Partition, int],
    read_committed: bool,
) -> None:
    """Write this member's ``committed_offset``, ``stored_offset``, ``consumer_lag`` (to the
    committed offset) and ``consumer_lag_stored`` into librdkafka's per-partition statistics,
    as librdkafka computes them for its own group consumer (the fetcher commits nothing, so
    its own values are -1001 / -1)."""
    for topic, block in (stats.get("topics") or {}).items():
        for number, part in (block.get("partitions") or {}).items():
            try:
                key = (topic, int(number))
            except ValueError:
                continue
            if key[1] < 0:  # librdkafka's internal UA partition
                continue
            end = end_offset(part, read_committed)
            done = committed.get(key)
            kept = stored.get(key)
            part["committed_offset"] = -1001 if done is None else done
            part["commited_offset"] = part["committed_offset"]  # librdkafka spells it both ways
            part["stored_offset"] = -1001 if kept is None else kept
            part["consumer_lag"] = _lag(end, done)
            part["consumer_lag_stored"] = _lag(end, kept)


class ClientMetrics:
    """What the runtime records beside the membership core's metrics."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, float] = {
            "commit-failed-total": 0.0,
            "partitions-assigned-total": 0.0,
            "partitions-revoked-total": 0.0,
            "partitions-lost-total": 0.0,
        }
        self._fetch: dict[str, float] = {}
        self._fetch_prev: tuple[float, dict[str, float]] | None = None
        self._end_offsets: dict[Partition, int] = {}
        self._app_offsets: dict[Partition, int] = {}
        self._lag_samples: dict[Partition, deque[tuple[float, int]]] = {}
        self._last_error: LastError | None = None

    # -- recording (any thread) ------------------------------------------------------------

    def record_commit_failed(self) -> None:
        with self._lock:
            self._counters["commit-failed-total"] += 1

    def record_partitions(self, kind: str, count: int) -> None:
        """``kind``: ``assigned``, ``revoked`` or ``lost``."""
        with self._lock:
            self._counters[f"partitions-{kind}-total"] += count

    def record_error(self, code: int, name: str, message: str, at: float) -> None:
        with self._lock:
            self._last_error = LastError(code, name, message, at)

    def absorb_statistics(self, stats: Mapping[str, Any], now: float, read_committed: bool) -> None:
        """Take the fetch counters and the partitions' end offsets from one librdkafka
        statistics document (``now``: monotonic seconds, for the rates)."""
        fetches = 0
        for broker in (stats.get("brokers") or {}).values():
            req = broker.get("req") or {}
            fetches += int(req.get("Fetch", 0))
        totals = {
            "fetch-total": float(fetches),
            "records-consumed-total": float(stats.get("rxmsgs", 0)),
            "bytes-consumed-total": float(stats.get("rxmsg_bytes", 0)),
        }
        ends: dict[Partition, int] = {}
        positions: dict[Partition, int] = {}
        for topic, block in (stats.get("topics") or {}).items():
            for number, part in (block.get("partitions") or {}).items():
                if number.lstrip("-").isdigit() and int(number) >= 0:
                    key = (topic, int(number))
                    end = end_offset(part, read_committed)
                    if end >= 0:
                        ends[key] = end
                    app = part.get("app_offset", -1001)
                    if isinstance(app, int) and app >= 0:
                        positions[key] = app
        with self._lock:
            prev = self._fetch_prev
            self._fetch = dict(totals)
            if prev is not None and now > prev[0]:
                span = now - prev[0]
                for name, rate in (
                    ("fetch-total", "fetch-rate"),
                    ("records-consumed-total", "records-consumed-rate"),
                    ("bytes-consumed-total", "bytes-consumed-rate"),
                ):
                    self._fetch[rate] = max(totals[name] - prev[1][name], 0.0) / span
            self._fetch_prev = (now, totals)
            self._end_offsets = ends
            self._app_offsets = positions

    def record_lag(self, now: float, lags: Mapping[Partition, int]) -> None:
        """One observation of every assigned partition's lag (``now``: monotonic seconds);
        partitions missing from ``lags`` are forgotten."""
        with self._lock:
            samples = self._lag_samples
            for gone in samples.keys() - lags.keys():
                del samples[gone]
            for key, value in lags.items():
                window = samples.setdefault(key, deque())
                window.append((now, value))
                while window and window[0][0] <= now - LAG_WINDOW_S:
                    window.popleft()

    def lag_max(self) -> dict[Partition, int]:
        """Per partition, the largest lag observed in the last `LAG_WINDOW_S` seconds."""
        with self._lock:
            return {k: max(v for _, v in w) for k, w in self._lag_samples.items() if w}

    # -- reading ---------------------------------------------------------------------------

    @property
    def last_error(self) -> LastError | None:
        return self._last_error

    def end_offsets(self) -> dict[Partition, int]:
        """End offsets from the last statistics document (empty before the first)."""
        with self._lock:
            return dict(self._end_offsets)

    def app_offsets(self) -> dict[Partition, int]:
        """librdkafka's application positions from the last statistics document."""
        with self._lock:
            return dict(self._app_offsets)

    def snapshot(self) -> dict[str, dict[str, float]]:
        """Counters by metric group and name."""
        with self._lock:
            fetch = dict(self._fetch)
            counters = dict(self._counters)
        return {COORDINATOR_GROUP: counters, FETCH_GROUP: fetch}
