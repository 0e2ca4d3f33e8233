"""The simulator: clean runs, determinism, replay, and catching deliberately broken cores."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.membership import GroupMembership, MembershipConfig, MembershipManager
from consumer_sdk.membership.heartbeat import HeartbeatRequestManager
from consumer_sdk.membership.reconciler import AssignedPartition, Reconciler
from consumer_sdk.runtime.driver import MemberDriver
from consumer_sdk.simulation import (
    SimConfig,
    Simulation,
    Trace,
    TraceEvent,
    replay,
    shrink,
)
from consumer_sdk.simulation.cli import main
from consumer_sdk.simulation.schedule import windows
from consumer_sdk.simulation.shrink import format_failure


def small(seed: int, faults: str, **changes: object) -> SimConfig:
    config = SimConfig(
        members=6,
        partitions=36,
        minutes=4,
        seed=seed,
        faults=faults,
        churn_ms=90_000,
        quiet_ms=150_000,
    )
    return replace(config, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize("faults", ["none", "default", "heavy"])
@pytest.mark.parametrize("seed", range(5))
def test_real_core_runs_clean(seed: int, faults: str) -> None:
    report = Simulation(small(seed, faults)).run()
    assert report.ok, report.summary()
    assert report.checkpoints == 1
    assert report.checks > 50
    assert report.heartbeats > 100
    assert report.virtual_ms == 240_000
    # Every partition ended up owned exactly once (checked at the checkpoint), and the group
    # converged at least once.
    assert report.convergence_hb


def test_bigger_group_with_heavy_faults_and_range_assignor() -> None:
    config = replace(small(11, "heavy"), members=30, partitions=150, minutes=6, assignor="range")
    report = Simulation(config).run()
    assert report.ok, report.summary()
    assert sum(report.events_by_kind.values()) > 30
    assert report.messages_lost > 0


def test_uncoalesced_polls_also_run_clean() -> None:
    report = Simulation(small(3, "default", coalesce_polls=False)).run()
    assert report.ok, report.summary()
    coalesced = Simulation(small(3, "default")).run()
    assert report.core_calls > coalesced.core_calls


def test_same_seed_same_run() -> None:
    a = Simulation(small(7, "heavy")).run()
    b = Simulation(small(7, "heavy")).run()
    assert a.trace.to_json() == b.trace.to_json()
    assert a.to_dict(timing=False) == b.to_dict(timing=False)
    c = Simulation(small(8, "heavy")).run()
    assert c.trace.to_json() != a.trace.to_json()


def test_trace_round_trips_and_replays_identically(tmp_path: object) -> None:
    report = Simulation(small(2, "default")).run()
    trace = Trace.from_json(report.trace.to_json())
    assert trace == report.trace
    again = replay(trace)
    assert again.to_dict(timing=False) == report.to_dict(timing=False)


def test_windows_end_with_a_quiet_checkpoint() -> None:
    cfg = SimConfig(minutes=60)
    ws = windows(cfg)
    assert len(ws) == 6
    for start, churn_end, checkpoint in ws:
        assert start < churn_end and checkpoint - churn_end >= cfg.quiet_ms
    assert windows(small(0, "none")) == [(0, 90_000, 240_000)]


# --------------------------------------------------------------------------------------------
# Deliberately broken copies of the core (the real core files are never touched)
# --------------------------------------------------------------------------------------------


class _KeepsRevokedPartitions(Reconciler):
    """Bug: acks the new assignment but never drops revoked partitions from what it holds."""

    __slots__ = ()

    def apply_owned(
        self, assigned: frozenset[AssignedPartition], added: frozenset[AssignedPartition]
    ) -> None:
        Reconciler.apply_owned(self, assigned | self.owned, added)


class _AcksWhileHolding(MembershipManager):
    """Bug: acks (sends TopicPartitions) even while it holds partitions the ack lacks."""

    __slots__ = ()  # (the same layout: ``keeps_revoked`` swaps a manager's class to this)

    @property
    def holds_unacked_partitions(self) -> bool:
        return False


def keeps_revoked(config: MembershipConfig, rng: random.Random) -> GroupMembership:
    """A copy of the core that keeps consuming revoked partitions after acking their
    revocation (the coordinator then hands them to another member)."""
    core = GroupMembership(config, rng=rng)
    core._manager._rec = _KeepsRevokedPartitions()
    core._manager.__class__ = _AcksWhileHolding
    return core


class _PanicsOnLoad(HeartbeatRequestManager):
    """Bug: treats the retriable COORDINATOR_LOAD_IN_PROGRESS as fatal."""

    def _on_error_response(self, now_ms: int, response: object, stale: bool) -> None:
        code = response.error_code  # type: ignore[attr-defined]
        if code == ErrorCode.COORDINATOR_LOAD_IN_PROGRESS:
            self._m.transition_to_fatal(now_ms, code, "panic")
            return
        super()._on_error_response(now_ms, response, stale)  # type: ignore[arg-type]


def panics_on_load(config: MembershipConfig, rng: random.Random) -> GroupMembership:
    core = GroupMembership(config, rng=rng)
    core._heartbeat = _PanicsOnLoad(core._manager, core.metrics, rng)
    return core


Factory = Callable[[MembershipConfig, random.Random], GroupMembership]


@pytest.mark.parametrize("seed", [0, 1])
def test_simulator_catches_a_member_that_keeps_revoked_partitions(seed: int) -> None:
    config = small(seed, "default")
    report = Simulation(config, core_factory=keeps_revoked).run()
    assert not report.ok
    violation = report.violations[0]
    assert violation.kind in {"double-ownership", "zombie-commit", "owned-not-held"}
    text = format_failure(report)
    assert f"seed {seed}" in text and report.trace.to_json() in text

    # The trace replays the same failure...
    again = replay(Trace.from_json(report.trace.to_json()), core_factory=keeps_revoked)
    assert [str(v) for v in again.violations] == [str(v) for v in report.violations]
    # ...shrinks to fewer events that still fail...
    small_trace, small_report = shrink(report.trace, core_factory=keeps_revoked, budget=25)
    assert not small_report.ok
    assert len(small_trace.events) < len(report.trace.events)
    assert small_trace.config.minutes <= config.minutes
    # ...and the real core passes the very same trace.
    assert replay(small_trace).ok


def test_simulator_catches_a_member_that_turns_a_retriable_error_fatal() -> None:
    events = (
        TraceEvent(0, "join", 0),
        TraceEvent(100, "join", 1),
        TraceEvent(30_000, "inject", 1, (int(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS), 1)),
    )
    config = small(5, "none", members=2)
    assert Simulation(config, events=events).run().ok
    report = Simulation(config, events=events, core_factory=panics_on_load).run()
    assert [v.kind for v in report.violations] == ["unexpected-fatal"]
    assert "COORDINATOR_LOAD_IN_PROGRESS" in report.violations[0].message


def test_shrink_refuses_a_passing_trace() -> None:
    report = Simulation(small(0, "none")).run()
    with pytest.raises(ValueError, match="does not fail"):
        shrink(report.trace)


def test_cli_runs_and_reports(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        [
            "--members",
            "4",
            "--partitions",
            "16",
            "--minutes",
            "3",
            "--seed",
            "3",
            "--faults",
            "none",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "violations         0" in out
    assert "convergence" in out and "invariant checks" in out


# --------------------------------------------------------------------------------------------
# A deliberately broken request ordering in the driver the runtime runs
# --------------------------------------------------------------------------------------------


class _SendsCommitsLast(MemberDriver):
    """Bug: polls its commit manager after the heartbeat's (so an asynchronous commit made
    in on_revoke of close() goes out after the leave)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        # a stable sort: every manager in its place but the commits', moved last
        self._managers = tuple(
            sorted(self._managers, key=lambda m: type(m).__name__ == "_CommitRequests")
        )


def test_simulator_catches_a_driver_that_sends_commits_after_the_leave() -> None:
    """The simulator runs the runtime's driver: a defect in its request ordering (commits of
    a run sent after its heartbeat) shows as commits reaching the coordinator after the
    member's leave, while the real driver passes the same trace."""
    events = (
        TraceEvent(0, "join", 0),
        TraceEvent(100, "join", 1),
        TraceEvent(60_000, "leave", 0),
        TraceEvent(120_000, "leave", 1),
    )
    config = small(5, "none", members=2)
    assert Simulation(config, events=events).run().ok
    report = Simulation(config, events=events, driver_factory=_SendsCommitsLast).run()
    assert report.violations
    assert {v.kind for v in report.violations} == {"commit-after-leave"}


def test_link_draws_are_randint_draws() -> None:
    """The links' fast draw is ``randint``'s own (same values, same generator state after),
    so a seed replays the same latencies whichever of the two a version uses."""
    from consumer_sdk.simulation.host import _randint

    for lo, hi in [(1, 20), (1, 100), (50, 500), (100, 3_000), (0, 1), (7, 8)]:
        a, b = random.Random(f"link/{lo}/{hi}"), random.Random(f"link/{lo}/{hi}")
        assert [_randint(a, lo, hi) for _ in range(500)] == [b.randint(lo, hi) for _ in range(500)]
        assert a.random() == b.random()


def test_a_quiet_heartbeat_answer_does_not_run_the_driver_again() -> None:
    """As in the runtime's loop, an answer that changes nothing leaves the member's next run
    at its heartbeat's due time: about one driver run per heartbeat in a quiet group (two
    when every answer ran the driver again), with the same report."""
    runs = [0]

    class _Counting(MemberDriver):
        def run(self, now: int) -> int:
            runs[0] += 1
            return super().run(now)

    report = Simulation(small(3, "none"), driver_factory=_Counting).run()
    assert report.ok, report.summary()
    assert report.heartbeats > 200
    assert runs[0] < 1.6 * report.heartbeats
