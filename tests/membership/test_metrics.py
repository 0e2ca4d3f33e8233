"""Metrics under the Java client's names, computed from virtual time."""

from __future__ import annotations

import math

from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.membership import FailureKind, MembershipMetrics

from .harness import INTERVAL, T1, Driver, err, ok, stable

NAMES = {
    "rebalance-latency-avg",
    "rebalance-latency-max",
    "rebalance-latency-total",
    "rebalance-total",
    "rebalance-rate-per-hour",
    "failed-rebalance-total",
    "failed-rebalance-rate-per-hour",
    "last-rebalance-seconds-ago",
    "assigned-partitions",
    "heartbeat-response-time-max",
    "heartbeat-rate",
    "heartbeat-total",
    "last-heartbeat-seconds-ago",
    "partition-revoked-latency-avg",
    "partition-revoked-latency-max",
    "partition-assigned-latency-avg",
    "partition-assigned-latency-max",
    "partition-lost-latency-avg",
    "partition-lost-latency-max",
    "commit-latency-avg",
    "commit-latency-max",
    "commit-rate",
    "commit-total",
}


def test_all_reference_names_exported() -> None:
    snapshot = MembershipMetrics().snapshot(0)
    assert set(snapshot) == NAMES
    assert snapshot["last-rebalance-seconds-ago"] == -1.0
    assert snapshot["last-heartbeat-seconds-ago"] == -1.0
    assert math.isnan(snapshot["rebalance-latency-avg"])


def test_rebalance_metrics_on_successful_rebalance() -> None:
    d = Driver()
    d.metadata()
    d.join("t1")
    d.advance(10)
    d.respond(ok(1, {T1: [0, 1]}))  # RECONCILING from here
    d.advance(250)
    d.run_callbacks()  # ACKNOWLEDGING: the rebalance ends
    m = d.core.metrics.snapshot(d.now)
    assert m["rebalance-total"] == 1
    assert m["rebalance-latency-avg"] == 250
    assert m["rebalance-latency-max"] == 250
    assert m["rebalance-latency-total"] == 250
    assert m["rebalance-rate-per-hour"] == 60  # one in the 60 s window
    assert m["assigned-partitions"] == 2
    d.advance(3000)
    assert d.core.metrics.snapshot(d.now)["last-rebalance-seconds-ago"] == 3.0


def test_rebalance_metrics_for_multiple_reconciliations() -> None:
    d = stable({T1: [0]})
    for epoch, latency in [(2, 100), (3, 300)]:
        d.advance(INTERVAL)
        d.must_hb()
        d.respond(ok(epoch, {T1: list(range(epoch))}))
        d.advance(latency)
        d.run_callbacks()
        d.must_hb()
        d.respond(ok(epoch))
    m = d.core.metrics.snapshot(d.now)
    assert m["rebalance-total"] == 3
    assert m["rebalance-latency-max"] == 300
    assert m["rebalance-latency-total"] == 400
    assert m["assigned-partitions"] == 3


def test_rebalance_metrics_on_failed_rebalance() -> None:
    d = stable({T1: [0]})
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(ok(2, {T1: [0, 1]}))
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(err(ErrorCode.FENCED_MEMBER_EPOCH))
    m = d.core.metrics.snapshot(d.now)
    assert m["failed-rebalance-total"] == 1
    assert m["failed-rebalance-rate-per-hour"] == 60
    assert m["rebalance-total"] == 1  # only the first one


def test_metrics_when_heartbeat_failed_retriable_is_not_a_failed_rebalance() -> None:
    d = stable({T1: [0]})
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(ok(2, {T1: [0, 1]}))
    d.advance(INTERVAL)
    d.must_hb()
    d.fail(FailureKind.TIMEOUT)
    assert d.core.metrics.snapshot(d.now)["failed-rebalance-total"] == 0


def test_heartbeat_metrics() -> None:
    d = stable()
    before = d.core.metrics.snapshot(d.now)["heartbeat-total"]
    d.advance(INTERVAL)
    d.must_hb()
    d.advance(42)
    d.respond(ok(1))
    d.advance(1000)
    m = d.core.metrics.snapshot(d.now)
    assert m["heartbeat-total"] == before + 1
    assert m["heartbeat-response-time-max"] >= 42
    assert m["last-heartbeat-seconds-ago"] == 1.042
    assert m["heartbeat-rate"] > 0
    d.advance(120_000)
    assert d.core.metrics.snapshot(d.now)["heartbeat-rate"] == 0


def test_callback_latency_metrics() -> None:
    d = Driver()
    d.metadata()
    d.join("t1")
    d.respond(ok(1, {T1: [0]}))
    (cb,) = d.pending_callbacks()
    d.advance(70)
    d.complete(cb)
    d.must_hb()
    d.respond(ok(1))
    d.advance(INTERVAL)
    d.must_hb()
    d.respond(err(ErrorCode.UNKNOWN_MEMBER_ID))
    d.advance(30)
    d.run_callbacks()
    m = d.core.metrics.snapshot(d.now)
    assert m["partition-assigned-latency-max"] == 70
    assert m["partition-lost-latency-avg"] == 30
    assert math.isnan(m["partition-revoked-latency-max"])


def test_commit_metrics_are_recorded_by_the_host() -> None:
    metrics = MembershipMetrics()
    metrics.record_commit(1000, 12)
    metrics.record_commit(2000, 30)
    m = metrics.snapshot(2000)
    assert (m["commit-total"], m["commit-latency-max"], m["commit-latency-avg"]) == (2, 30, 21)
    assert m["commit-rate"] == 2 / 60
