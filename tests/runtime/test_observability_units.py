"""Pure parts of the observability layer: librdkafka statistics in, lag and counters out;
group-view diffs for ``consumer-sdk groups watch``; health rules."""

from __future__ import annotations

from typing import Any

from consumer_sdk.admin.groups import GroupView, MemberView, changes
from consumer_sdk.membership import MemberState
from consumer_sdk.observability.client_metrics import ClientMetrics, fill_consumer_lag
from consumer_sdk.observability.health import evaluate


def _stats(parts: dict[str, dict[str, Any]], **top: Any) -> dict[str, Any]:
    return {"topics": {"t": {"partitions": parts}}, **top}


def test_fill_consumer_lag_follows_librdkafkas_rules() -> None:
    stats = _stats(
        {
            "0": {"hi_offset": 100, "ls_offset": 90},
            "1": {"hi_offset": 50, "ls_offset": 50},
            "2": {"hi_offset": -1001, "ls_offset": -1001},
            "-1": {"hi_offset": 7},
        }
    )
    fill_consumer_lag(stats, {("t", 0): 40, ("t", 2): 5}, {("t", 0): 100, ("t", 1): 60}, False)
    parts = stats["topics"]["t"]["partitions"]
    assert (parts["0"]["consumer_lag"], parts["0"]["consumer_lag_stored"]) == (60, 0)
    assert parts["0"]["committed_offset"] == parts["0"]["commited_offset"] == 40
    # No committed offset; a stored offset past the end: -1, as librdkafka.
    assert (parts["1"]["consumer_lag"], parts["1"]["consumer_lag_stored"]) == (-1, -1)
    assert parts["1"]["committed_offset"] == -1001
    # End offset unknown.
    assert parts["2"]["consumer_lag"] == -1
    assert "consumer_lag" not in parts["-1"]
    fill_consumer_lag(stats, {("t", 0): 40}, {}, True)  # read_committed: to the LSO
    assert parts["0"]["consumer_lag"] == 50


def test_client_metrics_rates_end_offsets_and_lag_window() -> None:
    m = ClientMetrics()
    brokers = {"b1": {"req": {"Fetch": 10}}, "b2": {"req": {"Fetch": 5}}}
    first = _stats(
        {"0": {"hi_offset": 10, "app_offset": 4}}, brokers=brokers, rxmsgs=100, rxmsg_bytes=1000
    )
    m.absorb_statistics(first, 100.0, False)
    assert m.snapshot()["consumer-fetch-manager-metrics"] == {
        "fetch-total": 15.0,
        "records-consumed-total": 100.0,
        "bytes-consumed-total": 1000.0,
    }
    later = dict(first, rxmsgs=300, rxmsg_bytes=1500)
    m.absorb_statistics(later, 102.0, False)
    fetch = m.snapshot()["consumer-fetch-manager-metrics"]
    assert fetch["records-consumed-rate"] == 100.0 and fetch["bytes-consumed-rate"] == 250.0
    assert m.end_offsets() == {("t", 0): 10} and m.app_offsets() == {("t", 0): 4}
    m.record_lag(0.0, {("t", 0): 9, ("t", 1): 3})
    m.record_lag(30.0, {("t", 0): 2, ("t", 1): 1})
    assert m.lag_max() == {("t", 0): 9, ("t", 1): 3}
    m.record_lag(61.0, {("t", 0): 1})  # the first samples left the window; t-1 unassigned
    assert m.lag_max() == {("t", 0): 2}


def _member(member_id: str, epoch: int, owned: list[int], target: list[int]) -> MemberView:
    return MemberView(
        member_id,
        None,
        f"client-{member_id}",
        "/127.0.0.1",
        None,
        epoch,
        ("t",),
        None,
        tuple(("t", p) for p in owned),
        tuple(("t", p) for p in target),
    )


def _group(epoch: int, *members: MemberView) -> GroupView:
    return GroupView("g", "Stable", epoch, epoch, "uniform", members)


def test_changes_name_who_gained_and_lost_what() -> None:
    a1 = _member("a", 1, [0, 1, 2, 3], [0, 1, 2, 3])
    first = changes(None, _group(1, a1))
    assert [(c.kind, c.member_id) for c in first] == [
        ("state", None),
        ("joined", "a"),
        ("gained", "a"),
        ("target", "a"),
    ]
    a2 = _member("a", 2, [0, 1], [0, 1])
    b2 = _member("b", 2, [2, 3], [2, 3])
    moved = changes(_group(1, a1), _group(2, a2, b2))
    kinds = {(c.kind, c.member_id): c.partitions for c in moved}
    assert kinds[("lost", "a")] == (("t", 2), ("t", 3))
    assert kinds[("gained", "b")] == (("t", 2), ("t", 3))
    assert ("epoch", "a") in kinds and ("joined", "b") in kinds
    gone = changes(_group(2, a2, b2), _group(3, _member("a", 3, [0, 1], [0, 1, 2, 3])))
    assert [(c.kind, c.member_id) for c in gone] == [
        ("state", None),
        ("left", "b"),
        ("epoch", "a"),
        ("target", "a"),
    ]
    assert str(gone[1]) == "client-b b: left (had t[2,3])"
    assert changes(_group(3, a1), _group(3, a1)) == []


def _health(**overrides: Any) -> tuple[bool, bool, tuple[str, ...]]:
    args: dict[str, Any] = dict(
        closed=False,
        fatal=None,
        network_failure=None,
        state=MemberState.STABLE,
        member_epoch=3,
        coordinator_known=True,
        subscribed=True,
        manual=False,
        heartbeat_age_s=0.2,
        heartbeat_interval_ms=500,
        request_timeout_ms=30_000,
        poll_age_s=0.1,
        max_poll_interval_ms=300_000,
    )
    args.update(overrides)
    return evaluate(**args)


def test_health_rules() -> None:
    assert _health() == (True, True, ())
    assert _health(coordinator_known=False)[:2] == (True, False)
    assert _health(state=MemberState.JOINING)[:2] == (True, False)
    assert _health(heartbeat_age_s=31.5)[:2] == (True, False)
    assert _health(heartbeat_age_s=30.9)[:2] == (True, True)
    assert _health(poll_age_s=301.0)[:2] == (False, False)
    assert _health(fatal="UNRELEASED_INSTANCE_ID")[:2] == (False, False)
    assert _health(closed=True)[2][0] == "closed"
    # A manual assignment is ready while live, without a group.
    assert _health(manual=True, subscribed=False, state=MemberState.UNSUBSCRIBED)[:2] == (
        True,
        True,
    )
