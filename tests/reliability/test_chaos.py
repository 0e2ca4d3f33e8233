"""The chaos soak: a short CI run of ``python -m consumer_sdk.chaos``, and the checker itself on
hand-made logs (it must catch each kind of violation)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from consumer_sdk.chaos.analysis import (
    analyze,
    librdkafka_heartbeats,
    librdkafka_start_offsets,
)

CI_DURATION_S = 30


def test_chaos_ci_run(tmp_path: Path) -> None:
    """~30 s: kills, pauses, restarts, coordinator moves, broker outages (each at least once)."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "consumer_sdk.chaos",
            "--duration",
            str(CI_DURATION_S),
            "--workdir",
            str(tmp_path),
            "--seed",
            "848",
        ],
        capture_output=True,
        text=True,
        timeout=CI_DURATION_S + 240,
        check=False,
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    report = result.stdout + "\n" + result.stderr[-3000:]
    assert result.returncode == 0, report
    assert summary["violations"] == {}, report
    assert summary["produced"] > 1000 and summary["lost"] == 0
    assert summary["processed_unique"] == summary["produced"]
    assert summary["duplicates"] == (
        summary["duplicates_explained"]
        + summary["duplicates_mock_readoption"]
        + summary["duplicates_mock_reset"]
        + summary["duplicates_librdkafka"]
    ), report
    assert summary["overlaps"] == 0 and summary["committed_regressions"] == 0
    assert summary["close_failures"] == 0
    for action in ("kill", "stop", "restart", "coordinator", "broker_down"):
        assert summary["actions"].get(action, 0) >= 1, (action, summary["actions"])
    assert "result:                      PASS" in result.stdout


# -- the checker on synthetic logs -------------------------------------------------------------


def ev(t: float, kind: str, inc: str, **fields: Any) -> dict[str, Any]:
    return {"t": t, "ev": kind, "inc": inc, **fields}


def clean_run() -> list[dict[str, Any]]:
    """a owns p0 and processes 0..2, commits 3, revokes; b takes over and processes 3."""
    return [
        ev(1.0, "assign", "a/1", parts=[0]),
        *(ev(1.1 + i / 10, "rec", "a/1", p=0, o=i) for i in range(3)),
        ev(1.5, "commit", "a/1", offsets={"0": 3}),
        ev(2.0, "revoke", "a/1", parts=[0]),
        ev(2.1, "assign", "b/2", parts=[0]),
        ev(2.2, "rec", "b/2", p=0, o=3),
        ev(2.3, "commit", "b/2", offsets={"0": 4}),
    ]


def check(members: list[dict[str, Any]], driver: list[dict[str, Any]] = (), **kw: Any) -> Any:  # type: ignore[assignment]
    samples = kw.pop("samples", [(3.0, {0: 4})])
    return analyze(members, list(driver), {0: 4}, samples, session_s=6.0, close_timeout_s=10.0)


def test_checker_passes_a_clean_handover() -> None:
    summary = check(clean_run())
    assert summary.violations == {} and summary.processed_unique == 4


def test_checker_counts_a_lost_record() -> None:
    events = [e for e in clean_run() if not (e["ev"] == "rec" and e["o"] == 1)]
    assert check(events).violations == {"lost": 1}


def test_checker_explains_redone_work_of_a_killed_member() -> None:
    events = [
        *clean_run()[:4],
        ev(1.6, "rec", "a/1", p=0, o=3),  # processed, then killed before committing it
        ev(8.0, "assign", "b/2", parts=[0]),
        ev(8.1, "rec", "b/2", p=0, o=3),
        ev(8.2, "commit", "b/2", offsets={"0": 4}),
    ]
    summary = check(events, [ev(1.7, "kill", "a/1")])
    assert summary.violations == {} and summary.duplicates == summary.duplicates_explained == 1


def test_checker_flags_a_duplicate_after_a_clean_revoke() -> None:
    events = [*clean_run(), ev(2.25, "rec", "b/2", p=0, o=2)]
    assert check(events).violations == {"duplicates_unexplained": 1}


def test_checker_flags_overlapping_ownership() -> None:
    events = clean_run()
    events[6] = ev(1.9, "assign", "b/2", parts=[0])  # before a's revoke completed
    summary = check(events)
    assert summary.violations == {"overlaps": 1}, summary.examples


def test_checker_ends_a_paused_members_ownership_when_it_was_fenced() -> None:
    events = [
        ev(1.0, "assign", "a/1", parts=[0]),
        *(ev(1.1 + i / 10, "rec", "a/1", p=0, o=i) for i in range(3)),
        ev(1.5, "commit", "a/1", offsets={"0": 3}),
        ev(8.0, "assign", "b/2", parts=[0]),  # a stopped at 1.6; fenced at 7.6
        ev(8.1, "rec", "b/2", p=0, o=3),
        ev(8.2, "commit", "b/2", offsets={"0": 4}),
        ev(10.0, "rec", "a/1", p=0, o=3),  # zombie: a buffered record after SIGCONT
        ev(10.1, "commit_failed", "a/1", offsets={"0": 4}, error="UNKNOWN_MEMBER_ID"),
        ev(10.2, "lost", "a/1", parts=[0]),
    ]
    summary = check(events, [ev(1.6, "stop", "a/1"), ev(9.9, "cont", "a/1")])
    assert summary.violations == {}, summary.examples
    assert summary.duplicates_explained == 1


def test_checker_counts_the_mock_re_adopting_a_fenced_member_apart() -> None:
    """a, stopped and fenced, gets partition 0 back right after its on_lost while b still
    owns it (librdkafka's mock re-creates it from its stale heartbeat): an overlap and the
    records b's late commit did not cover are reported apart, not as violations."""
    events = [
        ev(1.0, "assign", "a/1", parts=[0]),
        ev(1.1, "rec", "a/1", p=0, o=0),
        ev(1.2, "commit", "a/1", offsets={"0": 1}),
        ev(8.0, "assign", "b/2", parts=[0]),  # a stopped at 1.5, fenced at 7.5
        ev(8.1, "rec", "b/2", p=0, o=1),
        ev(8.2, "rec", "b/2", p=0, o=2),
        ev(10.0, "lost", "a/1", parts=[0]),  # a resumed at 9.9
        ev(10.01, "assign", "a/1", parts=[0]),  # re-adopted while b still owns it
        ev(10.1, "rec", "a/1", p=0, o=2),
        ev(10.2, "rec", "a/1", p=0, o=3),
        ev(10.3, "commit", "a/1", offsets={"0": 4}),
        ev(10.4, "commit", "b/2", offsets={"0": 3}),
        ev(10.5, "revoke", "b/2", parts=[0]),
    ]
    summary = check(
        events, [ev(1.5, "stop", "a/1"), ev(9.9, "cont", "a/1")], samples=[(11.0, {0: 4})]
    )
    assert summary.violations == {}, summary.examples
    assert summary.overlaps_mock_readoption == 1 and summary.duplicates_mock_readoption == 1


def hb(sent: float, inc: str, tp: list[int] | None, req_ep: int = 5, **outcome: Any) -> Any:
    """A heartbeat from an SDK member's trace (``tp``: the partitions it reported owned)."""
    return ev(
        sent + 0.002,
        "hb",
        inc,
        sent=sent,
        req_ep=req_ep,
        tp=tp,
        **(outcome or {"err": 0, "resp_ep": req_ep, "assigned": None}),
    )


def mock_reset_run(**change: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The soak's overlap (seed 20261124): a owns p0 and reports it; the coordinator broker
    goes down at 5.0 and up at 6.4; b gets p0 (assign at 6.6) before a heartbeats again; a's
    first heartbeat after the outage (6.7, full after its failure) still lists p0, its
    response revokes it, on_revoke runs (7.0) and only then a reports it released (7.01)."""
    members = [
        ev(0.5, "start", "a/1", impl="sdk"),
        ev(1.0, "assign", "a/1", parts=[0]),
        hb(1.1, "a/1", [0]),
        hb(1.6, "a/1", None),
        hb(4.6, "a/1", None),
        hb(5.1, "a/1", None, fail="KafkaTransportError: connection closed by the broker"),
        change.get("extra", hb(6.7, "a/1", [0], assigned=[])),
        ev(7.0, "revoke", "a/1", parts=[0]),
        hb(7.01, "a/1", [], assigned=[0]),
        ev(6.0, "start", "b/2", impl="ck"),
        ev(6.6, "assign", "b/2", parts=[0]),
        ev(7.5, "commit", "b/2", offsets={"0": 4}),
    ]
    members = [e for e in members if e not in change.get("drop", [])]
    members += [ev(1.2 + i / 10, "rec", "a/1", p=0, o=i) for i in range(4)]
    members += [ev(1.7, "commit", "a/1", offsets={"0": 4})]
    driver = [
        ev(
            change.get("down", 5.0),
            "broker_down",
            "",
            broker=1,
            coordinator=change.get("coordinator", True),
        ),
        ev(6.4, "broker_up", "", broker=1),
    ]
    return members, driver


def test_checker_counts_an_overlap_after_the_mock_forgot_the_owner_apart() -> None:
    members, driver = mock_reset_run()
    summary = check(members, driver)
    assert summary.violations == {}, summary.format()
    assert summary.overlaps == 0 and summary.overlaps_mock_reset == 1
    (example,) = summary.examples["mock-reset overlaps"]
    assert "a/1 still reported it owned: its heartbeat at 1.100 (epoch 5) listed [0]" in example
    assert "the coordinator went down at 5.000" in example
    assert "from the mock forgetting an owner's partitions" in summary.format()


@pytest.mark.parametrize(
    "change",
    [
        # the SDK released p0 before b got it (an SDK bug, e.g. acking before on_revoke)
        {"extra": hb(6.5, "a/1", [], assigned=[])},
        # a full heartbeat built from the wrong set after the failure
        {"extra": hb(6.45, "a/1", [1])},
        # a leave heartbeat went out
        {"extra": hb(6.5, "a/1", None, req_ep=-1)},
        # no coordinator outage: nothing made the mock forget
        {"coordinator": False},
        # the outage came before the owner ever reported p0
        {"down": 0.5},
        # no trace of the owner (a confluent-kafka member, or an SDK without the trace)
        {"drop": [hb(1.1, "a/1", [0])]},
    ],
)
def test_checker_keeps_every_other_overlap_a_violation(change: dict[str, Any]) -> None:
    members, driver = mock_reset_run(**change)
    summary = check(members, driver)
    assert summary.violations == {"overlaps": 1}, summary.format()
    assert summary.overlaps_mock_reset == 0


def ck_owner_run(grant_at: float = 6.5, fault: str = "coordinator") -> list[dict[str, Any]]:
    """The soak's other overlap: the confluent-kafka member a owns p0, the coordinator moves at
    5.0 (librdkafka closes its old coordinator connection), the SDK member b is granted p0 at
    ``grant_at`` (its traced heartbeat response) and a's on_revoke ends at 7.0."""
    return [
        ev(0.5, "start", "a/1", impl="ck"),
        ev(1.0, "assign", "a/1", parts=[0]),
        *(ev(1.2 + i / 10, "rec", "a/1", p=0, o=i) for i in range(4)),
        ev(1.7, "commit", "a/1", offsets={"0": 4}),
        ev(7.0, "revoke", "a/1", parts=[0]),
        ev(2.0, "start", "b/2", impl="sdk"),
        hb(grant_at - 0.002, "b/2", [1], assigned=[0, 1], resp_ep=9),
        ev(grant_at + 0.01, "assign", "b/2", parts=[0]),
        ev(7.5, "commit", "b/2", offsets={"0": 4}),
    ]


def test_checker_counts_an_overlap_with_a_confluent_kafka_owner_the_mock_forgot_apart() -> None:
    summary = check(ck_owner_run(), [ev(5.0, "coordinator", "", broker=2)])
    assert summary.violations == {}, summary.format()
    assert summary.overlaps_mock_reset == 1
    (example,) = summary.examples["mock-reset overlaps"]
    assert "the broker gave it to b/2 at 6.500" in example
    assert "on_revoke ended at 7.000" in example and "moved at 5.000" in example


@pytest.mark.parametrize(
    ("members", "driver"),
    [
        (ck_owner_run(), []),  # no coordinator fault
        (ck_owner_run(), [ev(6.55, "coordinator", "", broker=2)]),  # only after the grant
        # the taker has no trace (it is not an SDK member)
        (
            [
                {**e, "impl": "ck"} if e["ev"] == "start" else e
                for e in ck_owner_run()
                if e["ev"] != "hb"
            ],
            [ev(5.0, "coordinator", "", broker=2)],
        ),
    ],
    ids=["no-fault", "fault-after-grant", "no-trace"],
)
def test_checker_keeps_other_overlaps_with_a_confluent_kafka_owner(
    members: list[dict[str, Any]], driver: list[dict[str, Any]]
) -> None:
    summary = check(members, driver)
    assert summary.violations == {"overlaps": 1}, summary.format()


def test_checker_never_blames_a_real_broker_for_an_overlap() -> None:
    members, driver = mock_reset_run()
    driver.insert(0, ev(0.0, "start", "", args={"broker": "real"}))
    assert check(members, driver).violations == {"overlaps": 1}


@pytest.mark.parametrize(("impl", "violations"), [("ck", {}), ("sdk", {"overlaps": 1})])
def test_checker_ends_a_confluent_kafka_members_ownership_after_a_coordinator_outage(
    impl: str, violations: dict[str, int]
) -> None:
    """The coordinator broker is down 5.0-7.4; a confluent-kafka member whose reconnect backoff
    outlasts its 6 s session is fenced at about 11 and learns it at 12.0: a zombie window.
    An SDK member (reconnect backoff capped at 1 s) fenced that way is a violation."""
    events = [
        ev(0.5, "start", "a/1", impl=impl),
        ev(1.0, "assign", "a/1", parts=[0]),
        *(ev(1.2 + i / 10, "rec", "a/1", p=0, o=i) for i in range(4)),
        ev(1.7, "commit", "a/1", offsets={"0": 4}),
        ev(11.2, "assign", "b/2", parts=[0]),
        ev(11.3, "commit", "b/2", offsets={"0": 4}),
        ev(12.0, "lost", "a/1", parts=[0]),
    ]
    driver = [
        ev(5.0, "broker_down", "", broker=1, coordinator=True),
        ev(7.4, "broker_up", "", broker=1),
    ]
    summary = analyze(
        events,
        driver,
        {0: 4},
        [(13.0, {0: 4})],
        session_s=6.0,
        close_timeout_s=10.0,
        heartbeat_interval_s=0.5,
    )
    assert summary.violations == violations, summary.format()
    assert summary.zombie_windows == (1 if impl == "ck" else 0)


def test_checker_counts_work_redone_in_a_mock_reset_overlap_apart() -> None:
    """The member the mock gave the partition early starts from the committed offset of then,
    so it redoes what the owner processed and committed meanwhile: counted with the overlap."""
    members, driver = mock_reset_run()
    members += [ev(6.7, "rec", "b/2", p=0, o=3), ev(6.8, "commit", "b/2", offsets={"0": 4})]
    summary = check(members, driver)
    assert summary.violations == {}, summary.format()
    assert summary.duplicates == summary.duplicates_mock_reset == 1


def test_checker_ends_a_killed_members_later_ownership_at_the_kill() -> None:
    """A stop before the ownership began (the member was resumed since) does not end it."""
    events = [
        ev(1.0, "assign", "a/1", parts=[0]),
        ev(8.0, "lost", "a/1", parts=[0]),  # stopped at 1.5, resumed at 7.9
        ev(8.1, "assign", "a/1", parts=[0]),
        ev(12.0, "assign", "b/2", parts=[0]),  # a killed at 13.0: an overlap
        *(ev(12.1 + i / 10, "rec", "b/2", p=0, o=i) for i in range(4)),
        ev(12.6, "commit", "b/2", offsets={"0": 4}),
    ]
    driver = [ev(1.5, "stop", "a/1"), ev(7.9, "cont", "a/1"), ev(13.0, "kill", "a/1")]
    summary = check(events, driver, samples=[(14.0, {0: 4})])
    assert summary.violations == {"overlaps": 1}, summary.format()


def test_checker_flags_committed_offset_regressions_and_slow_closes() -> None:
    events = [*clean_run(), ev(3.0, "closed", "b/2", took=12.5)]
    summary = check(events, samples=[(1.0, {0: 3}), (2.0, {0: 2}), (3.0, {0: 4})])
    assert summary.violations == {"committed_regressions": 1, "close_failures": 1}


@pytest.mark.parametrize("bad", [{"--members": "0"}, {"--ck-members": "0"}])
def test_chaos_needs_both_kinds_of_member(bad: dict[str, str]) -> None:
    args = [a for kv in bad.items() for a in kv]
    result = subprocess.run(
        [sys.executable, "-m", "consumer_sdk.chaos", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--members and --ck-members must be at least 1" in result.stderr


def test_checker_ends_ownership_when_the_coordinator_node_was_cut_off() -> None:
    """Real cluster: the coordinator's node hung (SIGSTOP) at 1.6; a, running but cut off,
    was fenced by the coordinator and b got the partition at 8.0; a learned at 9.0. Not an
    overlap: a zombie window of 1 s (the same log without the driver's fault is one)."""
    events = [
        ev(1.0, "assign", "a/1", parts=[0]),
        *(ev(1.1 + i / 10, "rec", "a/1", p=0, o=i) for i in range(3)),
        ev(1.5, "commit", "a/1", offsets={"0": 3}),
        ev(8.0, "assign", "b/2", parts=[0]),
        ev(8.1, "rec", "b/2", p=0, o=3),
        ev(8.2, "commit", "b/2", offsets={"0": 4}),
        ev(9.0, "lost", "a/1", parts=[0]),
    ]
    fault = [ev(1.6, "node_pause", "", node=2, coordinator=True)]
    summary = check(events, fault)
    assert summary.violations == {}, summary.examples
    assert summary.zombie_windows == 1 and abs(summary.zombie_max_s - 1.0) < 1e-6
    not_coordinator = [ev(1.6, "node_pause", "", node=3, coordinator=False)]
    assert check(events, not_coordinator).violations == {"overlaps": 1}


def test_checker_counts_zombie_records_per_client() -> None:
    """Records a member processed inside its zombie window (after the broker could have
    fenced it, before it learned) are counted per client, once each."""
    events = [
        ev(0.5, "start", "a/1", impl="ck"),
        ev(1.0, "assign", "a/1", parts=[0]),
        *(ev(1.1 + i / 10, "rec", "a/1", p=0, o=i) for i in range(3)),
        ev(1.5, "commit", "a/1", offsets={"0": 3}),
        ev(8.0, "assign", "b/2", parts=[0]),
        ev(8.1, "rec", "b/2", p=0, o=3),
        ev(8.2, "commit", "b/2", offsets={"0": 4}),
        ev(8.5, "rec", "a/1", p=0, o=3),  # cut off, fenced at 7.6, handed out anyway
        ev(9.0, "lost", "a/1", parts=[0]),
    ]
    fault = [ev(1.6, "node_pause", "", node=2, coordinator=True)]
    summary = check(events, fault)
    assert summary.violations == {}, summary.examples
    assert summary.zombie_records == {"ck": 1}
    assert "zombie records:              SDK 0, confluent-kafka 1" in summary.format()
    assert check([e for e in events if e["t"] != 8.5], fault).zombie_records == {}


def test_checker_takes_the_coordinator_from_the_drivers_watch() -> None:
    """The check made just before the fault said node 3 was not the coordinator, but the
    driver's coordinator watch saw the group on node 3 (before the fault, or while node 3
    was down): a cut-off. Seen only on other nodes, or only after node 3 was back: none."""
    events = [
        ev(1.0, "assign", "a/1", parts=[0]),
        *(ev(1.1 + i / 10, "rec", "a/1", p=0, o=i) for i in range(3)),
        ev(1.5, "commit", "a/1", offsets={"0": 3}),
        ev(8.0, "assign", "b/2", parts=[0]),
        ev(8.1, "rec", "b/2", p=0, o=3),
        ev(8.2, "commit", "b/2", offsets={"0": 4}),
        ev(9.0, "lost", "a/1", parts=[0]),
    ]
    fault = [
        ev(1.6, "node_pause", "", node=3, coordinator=False),
        ev(8.5, "node_resume", "", node=3),
    ]

    def seen(*at: tuple[float, int]) -> list[dict[str, Any]]:
        return [ev(t, "coordinator_seen", "", node=n) for t, n in at]

    for watch in (seen((0.5, 3)), seen((0.5, 1), (2.0, 3))):
        assert check(events, fault + watch).violations == {}, watch
    for watch in (seen((0.5, 1)), seen((0.5, 3), (1.0, 1)), seen((0.5, 1), (8.7, 3))):
        assert check(events, fault + watch).violations == {"overlaps": 1}, watch


def test_checker_ends_ownership_of_a_member_fenced_as_its_commit_shows() -> None:
    """a's last successful commit at 1.5; its heartbeats then stalled and the broker expired
    it; b got the partition at 8.0; a learned it only at 9.0, from a commit rejected with
    UNKNOWN_MEMBER_ID in the on_revoke of its close. A zombie window (a's ownership ends one
    session after 1.5), unless b got it before then: an overlap. Without the fencing error a
    plain overlap."""

    def run(b_at: float, error: str) -> list[dict[str, Any]]:
        return [
            ev(1.0, "assign", "a/1", parts=[0]),
            *(ev(1.1 + i / 10, "rec", "a/1", p=0, o=i) for i in range(3)),
            ev(1.5, "commit", "a/1", offsets={"0": 3}),
            ev(b_at, "assign", "b/2", parts=[0]),
            ev(b_at + 0.1, "rec", "b/2", p=0, o=3),
            ev(b_at + 0.2, "commit", "b/2", offsets={"0": 4}),
            ev(9.0, "commit_failed", "a/1", offsets={"0": 3}, error=error),
            ev(9.0, "revoke", "a/1", parts=[0]),
        ]

    fenced = 'KafkaError{code=UNKNOWN_MEMBER_ID,val=25,str="Commit failed: Broker: Unknown member"}'
    summary = check(run(8.0, fenced))
    assert summary.violations == {}, summary.examples
    assert summary.zombie_windows == 1 and abs(summary.zombie_max_s - 1.0) < 1e-6
    assert check(run(6.0, fenced)).violations == {"overlaps": 1}  # before 1.5 + 6 s
    assert check(run(8.0, "KafkaError{code=REQUEST_TIMED_OUT}")).violations == {"overlaps": 1}


def test_checker_takes_the_earlier_of_a_members_pause_and_its_coordinators_hang() -> None:
    """a was cut off when the coordinator's node hung at 1.0, then SIGSTOPped at 3.0: the
    coordinator fenced it on its own resume at 7.2, and b took the partition then. The
    fencing bound is the earlier cut-off (1.0 + 6 s - 0.5 s), not the stop."""
    events = [
        ev(0.5, "assign", "a/1", parts=[0]),
        *(ev(0.6 + i / 10, "rec", "a/1", p=0, o=i) for i in range(3)),
        ev(0.95, "commit", "a/1", offsets={"0": 3}),
        ev(7.2, "assign", "b/2", parts=[0]),
        ev(7.3, "rec", "b/2", p=0, o=3),
        ev(7.4, "commit", "b/2", offsets={"0": 4}),
        ev(12.0, "lost", "a/1", parts=[0]),
    ]
    driver = [
        ev(1.0, "node_pause", "", node=2, coordinator=True),
        ev(3.0, "stop", "a/1"),
        ev(11.9, "cont", "a/1"),
    ]
    summary = check(events, driver)
    assert summary.violations == {}, summary.examples
    assert summary.zombie_windows == 1


def fenced_while_running(b_at: float, trace: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """a owns p0, commits at 1.5 and reports ``lost`` at 9.0 with no fault of its own or its
    coordinator's node; b got p0 at ``b_at``."""
    return [
        ev(1.0, "assign", "a/1", parts=[0]),
        *(ev(1.1 + i / 10, "rec", "a/1", p=0, o=i) for i in range(3)),
        ev(1.5, "commit", "a/1", offsets={"0": 3}),
        *trace,
        ev(b_at, "assign", "b/2", parts=[0]),
        ev(b_at + 0.1, "rec", "b/2", p=0, o=3),
        ev(b_at + 0.2, "commit", "b/2", offsets={"0": 4}),
        ev(9.0, "lost", "a/1", parts=[0]),
    ]


def test_checker_ends_ownership_of_a_member_fenced_while_running_at_its_last_heartbeat() -> None:
    """a's last heartbeat answered without error was sent at 1.2 (its answer came only at
    4.0: the broker restarts the session when it reads a heartbeat, not when it answers), so
    the broker can have expired a from 7.2 on: b from 7.5 is a zombie window, b at 7.0 an
    overlap. Without a heartbeat trace, a's reported ``lost`` stays its end: an overlap."""
    trace = [
        ev(0.9, "hb", "a/1", err=0, sent=0.8),
        ev(4.0, "hb", "a/1", err=0, sent=1.2),
        ev(4.5, "hb", "a/1", fail="KafkaTransportError: timed out", sent=4.1),
    ]
    summary = check(fenced_while_running(7.5, trace))
    assert summary.violations == {}, summary.examples
    assert summary.zombie_windows == 1 and abs(summary.zombie_max_s - 1.5) < 1e-6
    assert "fenced_running" in summary.examples["zombie windows"][0]
    assert check(fenced_while_running(7.0, trace)).violations == {"overlaps": 1}
    assert check(fenced_while_running(7.5, [])).violations == {"overlaps": 1}


def revoked_during_a_commit(impl: str, b_at: float) -> list[dict[str, Any]]:
    """a (``impl``) owns p0, processed 0..2; its on_revoke began at 2.0 and returned at 2.4
    after a synchronous commit of 3; b took p0 at ``b_at``."""
    return [
        ev(0.5, "start", "a/1", impl=impl),
        ev(1.0, "assign", "a/1", parts=[0]),
        *(ev(1.1 + i / 10, "rec", "a/1", p=0, o=i) for i in range(3)),
        ev(2.0, "revoking", "a/1", parts=[0]),
        ev(2.3, "commit", "a/1", offsets={"0": 3}),
        ev(2.4, "revoke", "a/1", parts=[0]),
        ev(b_at, "assign", "b/2", parts=[0]),
        ev(b_at + 0.3, "rec", "b/2", p=0, o=3),
        ev(b_at + 0.4, "commit", "b/2", offsets={"0": 4}),
    ]


def test_checker_ends_a_confluent_kafka_owner_at_its_on_revoke_start() -> None:
    """librdkafka may acknowledge a revocation while on_revoke (a synchronous commit inside)
    still runs: a confluent-kafka owner's ownership ends when its callback began. An SDK
    member acknowledges only after on_revoke returned: b inside its callback is an overlap."""
    assert check(revoked_during_a_commit("ck", 2.1)).violations == {}
    assert check(revoked_during_a_commit("sdk", 2.1)).violations == {"overlaps": 1}
    assert check(revoked_during_a_commit("ck", 1.9)).violations == {"overlaps": 1}


def acknowledged_before_on_revoke(
    owner: str, granted: bool, owner_rec_at: float | None
) -> list[dict[str, Any]]:
    """a (``owner``) owns p0 and processed 0..2; the broker gave p0 to the SDK member b at 1.85
    (``granted``: b's heartbeat answer shows it) and b took it at 1.9, before a's on_revoke
    began at 2.0; a processed offset 3 at ``owner_rec_at`` (if set) and b went on from a's
    commit."""
    redone = owner_rec_at is not None
    return [
        ev(0.5, "start", "a/1", impl=owner),
        ev(0.6, "start", "b/2", impl="sdk"),
        ev(1.0, "assign", "a/1", parts=[0]),
        *(ev(1.1 + i / 10, "rec", "a/1", p=0, o=i) for i in range(3)),
        *([ev(owner_rec_at, "rec", "a/1", p=0, o=3)] if redone else []),
        *([ev(1.85, "hb", "b/2", err=0, sent=1.8, resp_ep=5, assigned=[0])] if granted else []),
        ev(1.9, "assign", "b/2", parts=[0]),
        ev(2.0, "revoking", "a/1", parts=[0]),
        ev(2.1, "commit", "a/1", offsets={"0": 4 if redone else 3}),
        ev(2.2, "revoke", "a/1", parts=[0]),
        ev(2.3, "rec", "b/2", p=0, o=3),
        ev(2.4, "commit", "b/2", offsets={"0": 4}),
    ]


def test_checker_tells_librdkafkas_early_acknowledgement_from_an_overlap() -> None:
    """librdkafka can acknowledge a revocation before it calls on_revoke (seen during a group's
    first formation): with the broker's grant in the SDK taker's trace and no record of the
    partition processed by the confluent-kafka owner after the taker had it, that is counted
    apart. An SDK owner, a taker with no grant, or a record the owner processed in that window
    stays an overlap."""
    summary = check(acknowledged_before_on_revoke("ck", granted=True, owner_rec_at=None))
    assert summary.violations == {}, summary.examples
    assert summary.overlaps_ck_early_ack == 1
    assert (
        "before a/1 (confluent-kafka)"
        in summary.examples["confluent-kafka early acknowledgements"][0]
    )
    sdk_owner = acknowledged_before_on_revoke("sdk", granted=True, owner_rec_at=None)
    assert check(sdk_owner).violations == {"overlaps": 1}
    no_grant = acknowledged_before_on_revoke("ck", granted=False, owner_rec_at=None)
    assert check(no_grant).violations == {"overlaps": 1}
    processed = check(acknowledged_before_on_revoke("ck", granted=True, owner_rec_at=1.95))
    assert processed.violations["overlaps"] == 1 and processed.overlaps_ck_early_ack == 0


def redone_after_early_acknowledgement(owner: str, committed_at: float) -> list[dict[str, Any]]:
    """a (``owner``) owns p0 and processed 0..2 without committing; the broker gave p0 to the
    SDK member b (its heartbeat answer at 1.85), b took it at 1.9 and, finding no commit of
    a's, redid 0..2 and went on to 3; a's on_revoke began at 2.0; a committed 3 at
    ``committed_at``."""
    events = [
        ev(0.5, "start", "a/1", impl=owner),
        ev(0.6, "start", "b/2", impl="sdk"),
        ev(1.0, "assign", "a/1", parts=[0]),
        *(ev(1.1 + i / 10, "rec", "a/1", p=0, o=i) for i in range(3)),
        ev(1.85, "hb", "b/2", err=0, sent=1.8, resp_ep=5, assigned=[0]),
        ev(1.9, "assign", "b/2", parts=[0]),
        ev(2.0, "revoking", "a/1", parts=[0]),
        ev(committed_at, "commit", "a/1", offsets={"0": 3}),
        ev(2.2, "revoke", "a/1", parts=[0]),
        *(ev(2.3 + i / 100, "rec", "b/2", p=0, o=i) for i in range(4)),
        ev(2.4, "commit", "b/2", offsets={"0": 4}),
    ]
    return sorted(events, key=lambda e: e["t"])


def test_checker_explains_what_the_taker_redid_after_an_early_acknowledgement() -> None:
    """The records a confluent-kafka owner processed before librdkafka acknowledged the
    revocation ahead of on_revoke, committed only in on_revoke (after the SDK taker had the
    partition and read its committed offset), are redone by the taker: counted apart, not
    unexplained. Committed before the taker had the partition, or an SDK owner (which
    acknowledges only after on_revoke), they stay violations."""
    summary = check(redone_after_early_acknowledgement("ck", committed_at=2.1))
    assert summary.violations == {}, summary.examples
    assert summary.duplicates == summary.duplicates_ck_early_ack == 3
    assert summary.overlaps_ck_early_ack == 1
    committed_first = check(redone_after_early_acknowledgement("ck", committed_at=1.5))
    assert committed_first.violations == {
        "duplicates_unexplained": 3,
        "rewinds_sdk": 1,  # the SDK taker began below a's commit, logged before its assign
    }, committed_first.examples
    sdk_owner = check(redone_after_early_acknowledgement("sdk", committed_at=2.1))
    assert sdk_owner.violations == {"duplicates_unexplained": 3, "overlaps": 1}
    assert sdk_owner.duplicates_ck_early_ack == 0


def rewound_after_a_handover(taker: str, committed_at: float) -> list[dict[str, Any]]:
    """a (SDK) owns p0, processes 0..2 and commits 3 at ``committed_at``, revokes at 2.0; b
    (``taker``) takes p0 at 2.1 but starts at offset 0: it processes 0 and 1, commits 2 (the
    committed offset goes back), then processes 2 and 3 and commits 4."""
    events = [
        ev(0.5, "start", "a/1", impl="sdk"),
        ev(0.6, "start", "b/2", impl=taker),
        ev(1.0, "assign", "a/1", parts=[0]),
        *(ev(1.1 + i / 10, "rec", "a/1", p=0, o=i) for i in range(3)),
        ev(committed_at, "commit", "a/1", offsets={"0": 3}),
        ev(2.0, "revoke", "a/1", parts=[0]),
        ev(2.1, "assign", "b/2", parts=[0]),
        ev(2.2, "rec", "b/2", p=0, o=0),
        ev(2.21, "rec", "b/2", p=0, o=1),
        ev(2.25, "commit", "b/2", offsets={"0": 2}),
        ev(2.4, "rec", "b/2", p=0, o=2),
        ev(2.41, "rec", "b/2", p=0, o=3),
        ev(2.5, "commit", "b/2", offsets={"0": 4}),
    ]
    return sorted(events, key=lambda e: e["t"])


REWIND_SAMPLES = [(1.8, {0: 3}), (2.3, {0: 2}), (3.0, {0: 4})]


def test_checker_counts_a_confluent_kafka_rewind_apart_and_an_sdk_rewind_as_a_violation() -> None:
    """A member looks its committed offset up after on_assign: one that starts below the last
    commit logged before its assign rewound. librdkafka was seen doing so on the real broker
    (a partition taken right after its member was fenced, begun at 0 below a commit of 623):
    its redone records and the regression its own commit caused are counted apart. The same
    from an SDK member is a violation, and so are its duplicates and regression."""
    ck = check(rewound_after_a_handover("ck", committed_at=1.5), samples=REWIND_SAMPLES)
    assert ck.violations == {}, ck.examples
    assert ck.rewinds == {"ck": 1}
    assert ck.duplicates == ck.duplicates_ck_rewind == 3
    assert ck.committed_regressions_ck_rewind == 1 and ck.committed_regressions == 0
    assert "began at offset 0, below 3 committed by a/1" in ck.examples["rewinds"][0]
    sdk = check(rewound_after_a_handover("sdk", committed_at=1.5), samples=REWIND_SAMPLES)
    assert sdk.violations == {
        "rewinds_sdk": 1,
        "duplicates_unexplained": 3,
        "committed_regressions": 1,
    }, sdk.examples
    assert sdk.duplicates_ck_rewind == 0 and sdk.committed_regressions_ck_rewind == 0


def test_a_confluent_kafka_rewind_shows_what_librdkafka_read() -> None:
    """librdkafka's ``debug=cgrp`` line on the committed offset it read is parsed and printed
    with the rewind (what the next CI failure of this kind needs to tell its cause)."""
    line = (
        "%7|2.150|OFFSETFETCH|b/2#consumer-1| [thrd:main]: Adding chaos-topic [0] back to "
        "pending list with offset INVALID\n"
    )
    parsed = librdkafka_start_offsets(["%7|2.0|HEARTBEAT|b/2#consumer-1| other\n", line])
    assert parsed == [
        {"t": 2.15, "ev": "rdk_offset", "inc": "b/2", "p": 0, "why": "with offset INVALID"}
    ]
    events = sorted([*rewound_after_a_handover("ck", 1.5), *parsed], key=lambda e: e["t"])
    summary = check(events, samples=REWIND_SAMPLES)
    assert summary.violations == {} and summary.rewinds == {"ck": 1}
    assert "(librdkafka: with offset INVALID at 2.150)" in summary.examples["rewinds"][0]


def test_checker_sees_no_rewind_below_a_commit_logged_after_the_assign() -> None:
    """A commit logged only after the taker's assign may not have been there when the taker
    looked its offset up: no rewind, and what the taker redid stays unexplained."""
    late = check(rewound_after_a_handover("ck", committed_at=2.15), samples=REWIND_SAMPLES)
    assert late.rewinds == {} and late.duplicates_ck_rewind == 0
    assert late.violations == {"duplicates_unexplained": 3, "committed_regressions": 1}


def closed_while_cut_off(closing: bool, last_ok_sent: float) -> list[dict[str, Any]]:
    """a owns p0 and processed 0..3 but committed only 3; its last heartbeat answered without
    error was sent at ``last_ok_sent``; b took p0 at 8.0 and redid offset 3; a was closed at
    9.0 and revoked p0 at 9.5 after its commit timed out."""
    return [
        ev(0.9, "hb", "a/1", err=0, sent=0.8),
        ev(1.0, "assign", "a/1", parts=[0]),
        *(ev(1.1 + i / 10, "rec", "a/1", p=0, o=i) for i in range(4)),
        ev(1.5, "commit", "a/1", offsets={"0": 3}, sent=1.45),
        ev(last_ok_sent + 0.05, "hb", "a/1", err=0, sent=last_ok_sent),
        ev(last_ok_sent + 0.6, "hb_sent", "a/1", sent=last_ok_sent + 0.5),
        ev(8.0, "assign", "b/2", parts=[0]),
        ev(8.1, "rec", "b/2", p=0, o=3),
        ev(8.2, "commit", "b/2", offsets={"0": 4}),
        *([ev(9.0, "closing", "a/1")] if closing else []),
        ev(9.5, "commit_failed", "a/1", offsets={"0": 4}, error="KafkaError{code=_TIMED_OUT}"),
        ev(9.5, "revoke", "a/1", parts=[0]),
    ]


def test_checker_ends_ownership_of_a_member_closed_while_cut_off_at_its_fencing_bound() -> None:
    """a, closed cut off from its coordinator, revokes (it cannot know it was fenced): its
    heartbeat trace says the broker can have expired it from 1.6 + 6 s, so b at 8.0 is a
    zombie window and b's redone offset 3 is a's uncommitted work. Revoked outside a close,
    or with a heartbeat answered within the session before b took over, it stays an overlap
    and an unexplained duplicate."""
    summary = check(closed_while_cut_off(closing=True, last_ok_sent=1.6))
    assert summary.violations == {}, summary.examples
    assert summary.zombie_windows == 1 and "fenced_close" in summary.examples["zombie windows"][0]
    assert summary.duplicates_explained == 1
    assert check(closed_while_cut_off(closing=False, last_ok_sent=1.6)).violations == {
        "overlaps": 1,
        "duplicates_unexplained": 1,
    }
    assert check(closed_while_cut_off(closing=True, last_ok_sent=4.0)).violations == {
        "overlaps": 1,
        "duplicates_unexplained": 1,
    }


HEAD = "%7|{t}|HEARTBEAT|{inc}#consumer-1| [thrd:main]: "
SENT = HEAD + 'GroupCoordinator/3: ConsumerGroupHeartbeat of member id "m1", group id "g"\n'
ANSWER = HEAD + 'ConsumerGroupHeartbeat response received for member id "m1" with epoch {ep}\n'
FENCED = (
    HEAD + "ConsumerGroupHeartbeat failed due to: Broker: The member epoch is fenced by "
    "the group coordinator: will rejoin the group\n"
)


def test_checker_reads_librdkafkas_heartbeat_trace() -> None:
    """librdkafka's ``debug=cgrp,consumer`` lines give a confluent-kafka member's trace: each
    answer is to the latest request logged before it (one in flight); other lines and other
    incarnations' lines are apart."""
    lines = [
        SENT.format(t="100.100", inc="ck1/7"),
        ANSWER.format(t="100.250", inc="ck1/7", ep=1),
        '%7|100.300|CGRPOP|ck1/7#consumer-1| [thrd:main]: Group "g" received op ...\n',
        ANSWER.format(t="100.400", inc="ck1/8", ep=3),
        SENT.format(t="100.600", inc="ck1/7"),
        "%5|101.600|REQTMOUT|ck1/7#consumer-1| [thrd:GroupCoordinator]: Timed out ...\n",
        SENT.format(t="101.700", inc="ck1/7"),
        FENCED.format(t="101.750", inc="ck1/7"),
    ]
    trace = librdkafka_heartbeats(lines)
    assert [(e["ev"], e["inc"], e["t"], e["sent"], e.get("err")) for e in trace] == [
        ("hb_sent", "ck1/7", 100.1, 100.1, None),
        ("hb", "ck1/7", 100.25, 100.1, 0),
        ("hb", "ck1/8", 100.4, None, 0),
        ("hb_sent", "ck1/7", 100.6, 100.6, None),
        ("hb_sent", "ck1/7", 101.7, 101.7, None),
        ("hb", "ck1/7", 101.75, 101.7, 110),
    ]
    # with a trace, a confluent-kafka member fenced while running ends at its last heartbeat
    ck = librdkafka_heartbeats(
        [
            SENT.format(t="0.8", inc="a/1"),
            ANSWER.format(t="0.9", inc="a/1", ep=1),
            SENT.format(t="1.2", inc="a/1"),
            ANSWER.format(t="4.0", inc="a/1", ep=1),
        ]
    )
    assert check(fenced_while_running(7.5, ck)).violations == {}
    assert check(fenced_while_running(7.0, ck)).violations == {"overlaps": 1}


def test_checker_ends_ownership_of_a_member_fenced_by_a_heartbeat_at_that_heartbeat() -> None:
    """librdkafka timed out a's heartbeat sent at 1.7 (the broker read it and moved a to a new
    epoch; the answer was dropped); the next one, sent at 2.9, was answered
    FENCED_MEMBER_EPOCH: the broker can have fenced a from 1.7 on (not only one session after
    1.2). b from 3.0 is a zombie window; b at 1.65 an overlap (a's heartbeat sent at 1.2 was
    answered without error, and a committed at 1.5). Without the fencing answer, the session
    bound (7.2) stays."""
    lines = [
        SENT.format(t="1.2", inc="a/1"),
        ANSWER.format(t="1.25", inc="a/1", ep=1),
        SENT.format(t="1.7", inc="a/1"),
        SENT.format(t="2.9", inc="a/1"),
        FENCED.format(t="2.95", inc="a/1"),
    ]
    trace = librdkafka_heartbeats(lines)
    summary = check(fenced_while_running(3.0, trace))
    assert summary.violations == {}, summary.examples
    assert summary.zombie_windows == 1 and "fenced_running" in summary.examples["zombie windows"][0]
    assert check(fenced_while_running(1.65, trace)).violations == {"overlaps": 1}
    assert check(fenced_while_running(3.0, trace[:-1])).violations == {"overlaps": 1}


def test_checker_reads_when_a_stopped_or_killed_member_last_heartbeated_from_its_trace() -> None:
    """a's heartbeat sent at 1.2 was answered; the one sent at 1.7 hung (a paused replica held
    the coordinator's answers) until a was SIGSTOPped at 5.0 (or SIGKILLed at 9.0). The broker
    expired a one session after the last heartbeat it read: from 7.2 on at the earliest, not
    one session after the stop. b from 7.3 is a zombie window, b at 7.0 an overlap; without a
    trace the stop bounds it (5.0 + 6 s - 0.5 s) and b at 7.3 is an overlap."""
    trace = [
        ev(1.25, "hb", "a/1", err=0, sent=1.2),
        ev(5.5, "hb", "a/1", fail="KafkaTimeoutError: timed out", sent=1.7),
    ]

    def run(b_at: float, trace: list[dict[str, Any]], end: str) -> Any:
        events = [e for e in fenced_while_running(b_at, trace) if e["ev"] != "lost"]
        if end == "lost":
            events.append(ev(9.0, "lost", "a/1", parts=[0]))
            return check(events, [ev(5.0, "stop", "a/1"), ev(8.9, "cont", "a/1")])
        return check(events, [ev(9.0, "kill", "a/1")])

    for end in ("lost", "kill"):
        summary = run(7.3, trace, end)
        assert summary.violations == {}, (end, summary.examples)
        assert summary.zombie_windows == 1 and abs(summary.zombie_max_s - 1.7) < 1e-6, end
        assert run(7.0, trace, end).violations == {"overlaps": 1}, end
    assert run(7.3, [], "lost").violations == {"overlaps": 1}
