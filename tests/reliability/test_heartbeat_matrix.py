"""Fault matrix: every ConsumerGroupHeartbeat error of the Java client's policy, injected on
the coordinator while the member is JOINING, RECONCILING, STABLE and LEAVING.

Each case runs on its own 1-broker EmbeddedKafka (heartbeat interval 500 ms), with one
``GroupMember`` driven by the test thread. The error is injected on the coordinator only
(``push_broker_errors(1, 68, ...)``):

- JOINING: queued before ``subscribe()``, so the first heartbeat (epoch 0) gets it;
- RECONCILING: queued from inside the first ``on_assign``, which blocks until the member has
  reacted, so the heartbeat is answered while the reconciliation is still running;
- STABLE: queued right after a heartbeat was answered;
- LEAVING: queued from inside ``on_revoke`` of ``unsubscribe()``, so the leave heartbeat
  (epoch -1) gets it.

:func:`expected_outcome` is the table the assertions follow (docs/reliability.md prints it).
Backoff and rediscovery are measured on the mock's own request timestamps.
"""

from __future__ import annotations

from typing import Any

import pytest

from consumer_sdk import GroupMember, KafkaException, MemberState
from consumer_sdk.testing import EmbeddedKafka
from tests.reliability.support import (
    FIND_COORDINATOR,
    HB,
    App,
    Callbacks,
    HeartbeatSpy,
    config,
    hb_timestamps_ms,
    timed_close,
    wait_for,
)

CODES: dict[str, int] = {
    "NOT_COORDINATOR": 16,
    "COORDINATOR_NOT_AVAILABLE": 15,
    "COORDINATOR_LOAD_IN_PROGRESS": 14,
    "TOPIC_AUTHORIZATION_FAILED": 29,
    "FENCED_MEMBER_EPOCH": 110,
    "UNKNOWN_MEMBER_ID": 25,
    "GROUP_ID_NOT_FOUND": 69,
    "GROUP_AUTHORIZATION_FAILED": 30,
    "INVALID_REQUEST": 42,
    "GROUP_MAX_SIZE_REACHED": 81,
    "UNSUPPORTED_ASSIGNOR": 112,
    "UNSUPPORTED_VERSION": 35,
    "UNRELEASED_INSTANCE_ID": 111,
    "FENCED_INSTANCE_ID": 82,
    "INVALID_REGULAR_EXPRESSION": 128,
    "CLUSTER_AUTHORIZATION_FAILED": 31,  # "any other code"
    "UNKNOWN_SERVER_ERROR": -1,
}
STATES = ("JOINING", "RECONCILING", "STABLE", "LEAVING")
REDISCOVER = {"NOT_COORDINATOR", "COORDINATOR_NOT_AVAILABLE"}
FENCING = {"FENCED_MEMBER_EPOCH", "UNKNOWN_MEMBER_ID"}

INTERVAL_MS = 500
#: retry.backoff.ms 100 with jitter 0.2, plus scheduling slack
FIRST_BACKOFF_MS = (75.0, 175.0)
CLOSE_TIMEOUT_S = 5.0


def expected_outcome(state: str, name: str) -> str:
    """What the member does (the Java client's heartbeat error policy), as asserted below.

    - ``rediscover``: FindCoordinator again, then the heartbeat retried at once, as Java (the
      lookup waits retry.backoff.ms after its previous answer, which paces repeated errors;
      unit-tested in tests/membership/test_heartbeat_timing.py and tests/runtime/
      test_driver.py), no callback;
    - ``backoff``: heartbeat retried after the first backoff step (about 100 ms);
    - ``surfaced``: ``poll()`` raises the (non-fatal) error; state kept; retried with backoff;
    - ``fenced``: ``on_lost`` for owned partitions, rejoin at epoch 0 with the same member id;
    - ``fatal``: ``poll()`` raises a fatal error with the code, FATAL, ``on_lost`` for owned
      partitions, no further heartbeats; ``close()`` returns;
    - ``left``: the leave completes (UNSUBSCRIBED), nothing is raised, no retry;
    - ``left+surfaced``: left, and the error is raised once (non-fatal);
    - ``left+fatal``: the leave completes, then FATAL and the error is raised.
    """
    if state == "LEAVING":
        if name in REDISCOVER | FENCING | {"COORDINATOR_LOAD_IN_PROGRESS", "GROUP_ID_NOT_FOUND"}:
            return "left"
        if name == "TOPIC_AUTHORIZATION_FAILED":
            return "left+surfaced"
        return "left+fatal"
    if name in REDISCOVER:
        return "rediscover"
    if name == "COORDINATOR_LOAD_IN_PROGRESS":
        return "backoff"
    if name == "TOPIC_AUTHORIZATION_FAILED":
        return "surfaced"
    if name in FENCING:
        return "fenced"
    return "fatal"


CASES = [pytest.param(state, name, id=f"{state}-{name}") for state in STATES for name in CODES]


class Case:
    """One member on its own cluster, with its spy, callbacks and app driver."""

    def __init__(self, kafka: EmbeddedKafka, state: str, name: str) -> None:
        self.kafka = kafka
        self.state = state
        self.name = name
        self.code = CODES[name]
        self.topic = "fm"
        kafka.create_topic(self.topic, partitions=2, replication_factor=1)
        self.member = GroupMember(config(kafka, f"fm-{state}-{name}".lower()))
        self.spy = HeartbeatSpy(self.member)
        self.app = App(self.member)
        self.cb = Callbacks()
        self.member_id = self.member.member_id

    def inject(self) -> None:
        self.kafka.push_broker_errors(1, HB, [(self.code, 0)])

    def reacted(self) -> bool:
        """The member has handled the injected error (or is blocked in a terminal state)."""
        if self.member.state in (MemberState.FATAL, MemberState.FENCED):
            return True
        index = self.spy.index_of_error(self.code)
        return index is not None and self.spy.answered_after(index) > 0

    def error_index(self) -> int:
        index = self.spy.index_of_error(self.code)
        assert index is not None, f"no heartbeat answered {self.name}: {self.spy.snapshot()}"
        return index

    def drive_to_error(self) -> None:
        if self.state == "JOINING":
            self.inject()
            self.cb.subscribe(self.member, [self.topic])
        elif self.state == "RECONCILING":

            def hook(parts: Any) -> None:
                assert self.member.state is MemberState.RECONCILING
                self.inject()
                wait_for(self.reacted, timeout=10, what=f"the member reacting to {self.name}")

            self.cb.assign_hook = hook
            self.cb.subscribe(self.member, [self.topic])
        else:
            self.cb.subscribe(self.member, [self.topic])
            self.app.poll_until(
                lambda: self.member.state is MemberState.STABLE and self.member.assignment(),
                what="a stable member with partitions",
            )
            # Align with a fresh answer: the next regular heartbeat is a full interval away.
            seen = self.spy.count()
            self.app.poll_until(
                lambda: self.spy.count() > seen and self.spy.snapshot()[-1].done > 0,
                what="the next heartbeat",
            )
            if self.state == "STABLE":
                self.inject()
            else:
                self.cb.revoke_hook = lambda parts: self.inject()
                try:
                    self.member.unsubscribe(timeout=CLOSE_TIMEOUT_S)
                except KafkaException as exc:
                    self.app.errors.append(exc)
        self.app.poll_until(
            lambda: self.spy.index_of_error(self.code) is not None,
            what=f"the heartbeat answered with {self.name}",
        )


@pytest.mark.parametrize(("state", "name"), CASES)
def test_heartbeat_error(embedded_kafka_factory: Any, state: str, name: str) -> None:
    kafka: EmbeddedKafka = embedded_kafka_factory(
        brokers=1, heartbeat_interval_ms=INTERVAL_MS, session_timeout_ms=6000
    )
    case = Case(kafka, state, name)
    outcome = expected_outcome(state, name)
    try:
        case.drive_to_error()
        index = case.error_index()
        call = case.spy.snapshot()[index]
        if state == "LEAVING":
            assert call.epoch == -1, f"the error did not hit the leave heartbeat: {call}"
        else:
            assert call.state.name == state, f"the error hit a {call.state.name} heartbeat"
        CHECKS[outcome.split("+")[0]](case, index, outcome)
    finally:
        took = timed_close(case.member, CLOSE_TIMEOUT_S)
    assert took < CLOSE_TIMEOUT_S + 0.5, f"close() took {took:.1f}s"
    with pytest.raises(KafkaException, match="closed"):
        case.member.poll(0)


# -- checks per outcome ------------------------------------------------------------------------


def _owned_before_error(case: Case) -> bool:
    return case.state in ("RECONCILING", "STABLE")


def _mock_gap_after(case: Case, index: int) -> float:
    """ms between the failing heartbeat and the next one, on the mock's clock."""
    stamps = wait_for(
        lambda: (s := hb_timestamps_ms(case.kafka)) and len(s) > index + 1 and s,
        what="the retried heartbeat at the broker",
    )
    return stamps[index + 1] - stamps[index]


def _becomes_stable(case: Case) -> None:
    case.app.poll_until(
        lambda: case.member.state is MemberState.STABLE and len(case.member.assignment()) == 2,
        what="the member stable with both partitions",
    )


def check_rediscover(case: Case, index: int, outcome: str) -> None:
    error_at = hb_timestamps_ms(case.kafka)[index]
    gap = _mock_gap_after(case, index)
    # No backoff step: the retry waits only for the FindCoordinator round trip (slack for a
    # loaded machine, still below a backoff of retry.backoff.ms plus its slack).
    assert gap < FIRST_BACKOFF_MS[1], f"retry after {gap:.0f} ms"
    retry_at = error_at + gap
    lookups = [
        r
        for r in case.kafka.requests(FIND_COORDINATOR)
        if error_at < r.timestamp_us / 1000 <= retry_at
    ]
    assert lookups, "the coordinator was not looked up again before the retry"
    _becomes_stable(case)
    assert "lost" not in case.cb.kinds() and case.app.errors == []


def check_backoff(case: Case, index: int, outcome: str) -> None:
    gap = _mock_gap_after(case, index)
    assert FIRST_BACKOFF_MS[0] <= gap <= FIRST_BACKOFF_MS[1], f"retry after {gap:.0f} ms"
    _becomes_stable(case)
    assert "lost" not in case.cb.kinds() and case.app.errors == []


def check_surfaced(case: Case, index: int, outcome: str) -> None:
    case.app.poll_until(lambda: case.code in case.app.error_codes(), what="poll() raising it")
    error = next(e for e in case.app.errors if e.args[0].code() == case.code)
    assert not error.args[0].fatal()
    assert case.name in error.args[0].str()
    gap = _mock_gap_after(case, index)
    assert gap >= FIRST_BACKOFF_MS[0], f"retry after {gap:.0f} ms: expected a backoff"
    _becomes_stable(case)
    assert "lost" not in case.cb.kinds()
    assert case.member.member_id == case.member_id


def check_fenced(case: Case, index: int, outcome: str) -> None:
    case.app.poll_until(
        lambda: any(c.epoch == 0 for c in case.spy.snapshot()[index + 1 :]),
        what="a rejoin heartbeat at epoch 0",
    )
    _becomes_stable(case)
    lost = case.cb.parts("lost")
    if _owned_before_error(case):
        assert lost == [(("fm", 0), ("fm", 1))], case.cb.events
    else:
        assert lost == [], "nothing was owned, so no on_lost"
    assert case.member.member_id == case.member_id, "a rejoin keeps the member id (KIP-1082)"
    assert case.app.errors == []
    gap = _mock_gap_after(case, index)
    assert gap < INTERVAL_MS / 2, f"rejoin after {gap:.0f} ms: expected no backoff"


def _assert_fatal_raised(case: Case) -> KafkaException:
    case.app.poll_until(lambda: case.app.fatal_errors(), what="a fatal error from poll()")
    error = case.app.fatal_errors()[0]
    assert error.args[0].code() == case.code
    if case.code == CODES["UNSUPPORTED_VERSION"]:
        assert "group.protocol=classic" in error.args[0].str()
    elif case.code > 0:
        assert case.name in error.args[0].str()
    assert case.member.state is MemberState.FATAL
    with pytest.raises(KafkaException) as again:
        case.member.poll(0)
    assert again.value.args[0].code() == case.code, "the member stays failed"
    return error


def _no_more_heartbeats_after(case: Case, index: int) -> None:
    count = case.spy.count()
    case.app.poll_for(INTERVAL_MS / 1000 * 1.5)
    assert case.spy.count() == count == index + 1, "FATAL is terminal: no further heartbeats"


def check_fatal(case: Case, index: int, outcome: str) -> None:
    _assert_fatal_raised(case)
    if _owned_before_error(case):
        assert case.cb.parts("lost") == [(("fm", 0), ("fm", 1))], case.cb.events
    else:
        assert case.cb.parts("lost") == []
    _no_more_heartbeats_after(case, index)


def check_left(case: Case, index: int, outcome: str) -> None:
    if outcome == "left+fatal":
        _assert_fatal_raised(case)
    else:
        case.app.poll_for(INTERVAL_MS / 1000 * 1.5)
        assert case.member.state is MemberState.UNSUBSCRIBED
        if outcome == "left+surfaced":
            assert case.app.error_codes() == [case.code]
            assert not case.app.errors[0].args[0].fatal()
        else:
            assert case.app.errors == []
    assert case.cb.parts("revoke") == [(("fm", 0), ("fm", 1))]
    assert "lost" not in case.cb.kinds()
    leaves = [c for c in case.spy.snapshot() if c.epoch == -1]
    assert len(leaves) == 1, "the leave heartbeat is sent once and never retried"
    _no_more_heartbeats_after(case, index)


CHECKS = {
    "rediscover": check_rediscover,
    "backoff": check_backoff,
    "surfaced": check_surfaced,
    "fenced": check_fenced,
    "fatal": check_fatal,
    "left": check_left,
}


def test_outcome_table_covers_every_case() -> None:
    table = {(s, n): expected_outcome(s, n) for s in STATES for n in CODES}
    assert len(table) == len(STATES) * len(CODES)
    assert {o.split("+")[0] for o in table.values()} == set(CHECKS)
    assert table[("STABLE", "FENCED_MEMBER_EPOCH")] == "fenced"
    assert table[("LEAVING", "GROUP_ID_NOT_FOUND")] == "left"
    assert table[("JOINING", "GROUP_ID_NOT_FOUND")] == "fatal"
