"""Membership metrics (the Java client's group ``consumer-coordinator-metrics``), in virtual time.

Like Kafka's sensors, averages, maxima and rates are computed over a sliding window (two
30-second samples by default, so 60 s), and ``*-total`` values are cumulative. An average or a
maximum without samples is NaN; a ``*-seconds-ago`` metric is -1 until the first event.
The core records rebalance, heartbeat and callback metrics; commit metrics are recorded by the
host's commit path through `MembershipMetrics.record_commit`.
"""

from __future__ import annotations

import math
from collections import deque
from itertools import repeat

GROUP = "consumer-coordinator-metrics"
DEFAULT_WINDOW_MS = 60_000

CALLBACK_KINDS = ("revoked", "assigned", "lost")


class _Windowed:
    """Values recorded at virtual times; statistics over the last ``window_ms``."""

    __slots__ = ("_samples", "_window_ms")

    def __init__(self, window_ms: int) -> None:
        self._window_ms = window_ms
        self._samples: deque[tuple[int, float]] = deque()

    def record(self, now_ms: int, value: float = 1.0) -> None:
        samples = self._samples
        samples.append((now_ms, value))
        limit = now_ms - self._window_ms
        if samples[0][0] <= limit:  # per heartbeat: expire only if due (inline: hot path)
            popleft = samples.popleft
            while samples and samples[0][0] <= limit:
                popleft()

    def _expire(self, now_ms: int) -> None:
        while self._samples and self._samples[0][0] <= now_ms - self._window_ms:
            self._samples.popleft()

    def avg(self, now_ms: int) -> float:
        self._expire(now_ms)
        if not self._samples:
            return math.nan
        return sum(v for _, v in self._samples) / len(self._samples)

    def max(self, now_ms: int) -> float:
        self._expire(now_ms)
        if not self._samples:
            return math.nan
        return max(v for _, v in self._samples)

    def rate_per_second(self, now_ms: int) -> float:
        self._expire(now_ms)
        return len(self._samples) / (self._window_ms / 1000.0)


class MembershipMetrics:
    """Plain counters and latencies; `snapshot` returns them under the reference names."""

    __slots__ = (
        "_assigned_partitions",
        "_callback_latency",
        "_commit_latency",
        "_commit_total",
        "_commits",
        "_failed_rebalance_total",
        "_failed_rebalances",
        "_heartbeat_response_time",
        "_heartbeat_total",
        "_heartbeats",
        "_last_heartbeat_ms",
        "_last_heartbeat_response_ms",
        "_last_rebalance_end_ms",
        "_rebalance_latency",
        "_rebalance_latency_total",
        "_rebalance_start_ms",
        "_rebalance_total",
        "_window_ms",
        "lane_answered",
        "lane_sent",
    )

    def __init__(self, window_ms: int = DEFAULT_WINDOW_MS) -> None:
        self._window_ms = window_ms
        # rebalance
        self._rebalance_latency = _Windowed(window_ms)
        self._rebalance_latency_total = 0.0
        self._rebalance_total = 0
        self._failed_rebalances = _Windowed(window_ms)
        self._failed_rebalance_total = 0
        self._last_rebalance_end_ms: int | None = None
        self._rebalance_start_ms: int | None = None
        self._assigned_partitions = 0
        # heartbeat
        self._heartbeat_response_time = _Windowed(window_ms)
        self._heartbeats = _Windowed(window_ms)
        self._heartbeat_total = 0
        self._last_heartbeat_ms: int | None = None
        self._last_heartbeat_response_ms: int | None = None
        #: The heartbeats' lane (`HeartbeatRequestManager.stable_beat` and `quiet_answer`)
        #: only notes its heartbeats here: when each was sent, and when each quiet answer
        #: came for one sent when. `settle` moves them into the windows and counters above
        #: before anything reads or records those, so every value read is the one recording
        #: each at once would give.
        self.lane_sent: list[int] = []
        self.lane_answered: list[tuple[int, int]] = []
        # callbacks
        self._callback_latency = {kind: _Windowed(window_ms) for kind in CALLBACK_KINDS}
        # commits
        self._commit_latency = _Windowed(window_ms)
        self._commits = _Windowed(window_ms)
        self._commit_total = 0

    # -- rebalance ---------------------------------------------------------------------------

    @property
    def rebalance_in_progress(self) -> bool:
        return self._rebalance_start_ms is not None

    def record_rebalance_started(self, now_ms: int) -> None:
        self._rebalance_start_ms = now_ms

    def record_rebalance_ended(self, now_ms: int) -> None:
        if self._rebalance_start_ms is None:
            return
        latency = float(now_ms - self._rebalance_start_ms)
        self._rebalance_start_ms = None
        self._rebalance_latency.record(now_ms, latency)
        self._rebalance_latency_total += latency
        self._rebalance_total += 1
        self._last_rebalance_end_ms = now_ms

    def record_rebalance_failed(self, now_ms: int) -> None:
        """A heartbeat failed while a rebalance was in progress: count it and end the attempt."""
        if self._rebalance_start_ms is None:
            return
        self._rebalance_start_ms = None
        self._failed_rebalances.record(now_ms)
        self._failed_rebalance_total += 1

    def set_assigned_partitions(self, count: int) -> None:
        self._assigned_partitions = count

    # -- heartbeat ---------------------------------------------------------------------------

    # A STABLE member's fast paths (`HeartbeatRequestManager.stable_beat`, `quiet_answer`)
    # note their heartbeats in ``lane_sent`` and ``lane_answered`` instead of the two below:
    # change one, change `settle` too (tests/membership/test_fast_path.py compares the
    # metrics of both paths).

    #: Notes kept before `settle` runs anyway (a lane that nothing reads for this many
    #: heartbeats: the fast path calls it then).
    LANE_NOTES = 64

    def settle(self) -> None:
        """The lane's heartbeats into the windows and counters, in the order they came."""
        # Each window then expires what recording the last note at once would have (times
        # only grow): a member whose metrics nobody reads keeps one window, not every beat.
        sent = self.lane_sent
        if sent:
            self._heartbeats._samples.extend(zip(sent, repeat(1.0)))
            self._heartbeats._expire(sent[-1])
            self._heartbeat_total += len(sent)
            self._last_heartbeat_ms = sent[-1]
            sent.clear()
        answered = self.lane_answered
        if answered:
            self._heartbeat_response_time._samples.extend(
                [(at, float(at - sent_ms)) for at, sent_ms in answered]
            )
            self._heartbeat_response_time._expire(answered[-1][0])
            self._last_heartbeat_response_ms = answered[-1][0]
            answered.clear()

    def record_heartbeat_sent(self, now_ms: int) -> None:
        if self.lane_sent or self.lane_answered:
            self.settle()
        window = self._heartbeats
        samples = window._samples
        samples.append((now_ms, 1.0))
        if samples[0][0] <= now_ms - window._window_ms:
            window._expire(now_ms)
        self._heartbeat_total += 1
        self._last_heartbeat_ms = now_ms

    def record_heartbeat_response_time(self, now_ms: int, latency_ms: int) -> None:
        if self.lane_sent or self.lane_answered:
            self.settle()
        window = self._heartbeat_response_time
        samples = window._samples
        samples.append((now_ms, float(latency_ms)))
        if samples[0][0] <= now_ms - window._window_ms:
            window._expire(now_ms)
        self._last_heartbeat_response_ms = now_ms

    @property
    def last_heartbeat_response_ms(self) -> int | None:
        """When the coordinator last answered a heartbeat (any answer), None before one."""
        answered = self.lane_answered
        return answered[-1][0] if answered else self._last_heartbeat_response_ms

    # -- callbacks and commits -----------------------------------------------------------------

    def record_callback_latency(self, kind: str, now_ms: int, latency_ms: int) -> None:
        """``kind`` is ``"revoked"``, ``"assigned"`` or ``"lost"``."""
        self._callback_latency[kind].record(now_ms, float(latency_ms))

    def record_commit(self, now_ms: int, latency_ms: int) -> None:
        """Record one commit (called by the host's commit path, not by the core)."""
        self._commit_latency.record(now_ms, float(latency_ms))
        self._commits.record(now_ms)
        self._commit_total += 1

    # -- export ------------------------------------------------------------------------------

    def snapshot(self, now_ms: int) -> dict[str, float]:
        """All metrics by their reference names, evaluated at ``now_ms``."""
        if self.lane_sent or self.lane_answered:
            self.settle()

        def seconds_ago(then: int | None) -> float:
            return -1.0 if then is None else (now_ms - then) / 1000.0

        out: dict[str, float] = {
            "rebalance-latency-avg": self._rebalance_latency.avg(now_ms),
            "rebalance-latency-max": self._rebalance_latency.max(now_ms),
            "rebalance-latency-total": self._rebalance_latency_total,
            "rebalance-total": float(self._rebalance_total),
            "rebalance-rate-per-hour": self._rebalance_latency.rate_per_second(now_ms) * 3600.0,
            "failed-rebalance-total": float(self._failed_rebalance_total),
            "failed-rebalance-rate-per-hour": self._failed_rebalances.rate_per_second(now_ms)
            * 3600.0,
            "last-rebalance-seconds-ago": seconds_ago(self._last_rebalance_end_ms),
            "assigned-partitions": float(self._assigned_partitions),
            "heartbeat-response-time-max": self._heartbeat_response_time.max(now_ms),
            "heartbeat-rate": self._heartbeats.rate_per_second(now_ms),
            "heartbeat-total": float(self._heartbeat_total),
            "last-heartbeat-seconds-ago": seconds_ago(self._last_heartbeat_ms),
            "commit-latency-avg": self._commit_latency.avg(now_ms),
            "commit-latency-max": self._commit_latency.max(now_ms),
            "commit-rate": self._commits.rate_per_second(now_ms),
            "commit-total": float(self._commit_total),
        }
        for kind in CALLBACK_KINDS:
            out[f"partition-{kind}-latency-avg"] = self._callback_latency[kind].avg(now_ms)
            out[f"partition-{kind}-latency-max"] = self._callback_latency[kind].max(now_ms)
        return out
