"""The facade as a host drives it: queued events, tracing hook, background events, logging."""

from __future__ import annotations

import logging
import random

import pytest

from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.membership import (
    AssignmentChanged,
    CallbackCompleted,
    CallbackKind,
    CallbacksNeeded,
    GroupMembership,
    MemberState,
    Poll,
    StateChanged,
    Subscribe,
)

from .harness import INTERVAL, NAMES, T1, Driver, cfg, err, ok, stable

S = MemberState


def test_single_threaded_host_loop_with_queued_events() -> None:
    traced: list[StateChanged] = []
    core = GroupMembership(cfg(), rng=random.Random(1), on_state_change=traced.append)
    now = 0
    core.on_coordinator_known(now)
    core.on_metadata(now, NAMES)
    core.submit(Subscribe(("t1",)))
    core.submit(Poll(now))
    result = core.poll(now)  # processes the queue, then returns the join heartbeat
    assert result.request is not None and result.request.member_epoch == 0
    assert result.next_poll_ms > 0
    core.on_heartbeat_response(now, ok(1, {T1: [0]}), result.request)
    events = core.drain_background_events()
    assert core.drain_background_events() == []
    callbacks = [e for e in events if isinstance(e, CallbacksNeeded)]
    assert [c.kind for c in callbacks] == [CallbackKind.ASSIGNED]
    assert AssignmentChanged((("t1", 0),)) in events
    core.submit(CallbackCompleted(callbacks[0].callback_id))
    ack = core.poll(now).request
    assert ack is not None and ack.topic_partitions is not None
    assert core.state is S.STABLE
    # The tracing hook sees exactly the StateChanged events of the queue.
    queued = [e for e in events + core.drain_background_events() if isinstance(e, StateChanged)]
    assert traced == queued
    assert [t.new for t in traced] == [S.JOINING, S.RECONCILING, S.ACKNOWLEDGING, S.STABLE]


def test_state_changed_events_for_fatal_and_leaving() -> None:
    d = stable()
    d.unsubscribe()
    d.run_callbacks()
    d.must_hb()
    d.drain()
    news = [e.new for e in d.seen if isinstance(e, StateChanged)][-3:]
    assert news == [S.PREPARE_LEAVING, S.LEAVING, S.UNSUBSCRIBED]
    d2 = stable()
    d2.advance(INTERVAL)
    d2.must_hb()
    d2.respond(err(ErrorCode.GROUP_MAX_SIZE_REACHED))
    d2.drain()
    last = [e for e in d2.seen if isinstance(e, StateChanged)][-1]
    assert (last.old, last.new, last.reason) == (S.STABLE, S.FATAL, "GROUP_MAX_SIZE_REACHED")


def test_unknown_callback_and_commit_ids_are_ignored() -> None:
    from consumer_sdk.membership import CommitCompleted

    d = stable()
    d.core.handle(CallbackCompleted(999), d.now)
    d.core.handle(CommitCompleted(999), d.now)
    assert d.state is S.STABLE


def test_request_can_be_matched_explicitly_out_of_order() -> None:
    d = drive_to_leaving_with_two_in_flight()
    regular, leave = (
        d.core._heartbeat._in_flight[0].request,
        d.core._heartbeat._in_flight[1].request,
    )
    d.respond(ok(-1), leave)  # the leave's answer comes first
    assert d.core.leave_in_progress is False
    d.respond(ok(1), regular)
    assert d.core.in_flight_heartbeats == 0


def drive_to_leaving_with_two_in_flight() -> Driver:
    d = stable()
    d.advance(INTERVAL)
    d.must_hb()
    d.unsubscribe()
    d.run_callbacks()
    d.must_hb()
    assert d.core.in_flight_heartbeats == 2
    return d


def test_logging_prefix_levels_and_poll_timer_message(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="consumer_sdk.membership")
    d = Driver(cfg(client_id="app-1", rebalance_timeout_ms=10_000))
    d.metadata()
    d.join("t1")
    transition = next(r for r in caplog.records if "Transitioned" in r.getMessage())
    assert transition.levelno == logging.INFO
    assert transition.getMessage().startswith(
        "[Consumer clientId=app-1, groupId=group, memberId=member-1, epoch=0] "
    )
    caplog.clear()
    d.respond(err(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
    # A coordinator-load episode logs once at INFO (no WARNING), its retries at DEBUG.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    (info,) = [r for r in caplog.records if r.levelno == logging.INFO]
    assert "COORDINATOR_LOAD_IN_PROGRESS" in info.getMessage()
    assert "retrying with backoff" in info.getMessage()
    caplog.clear()
    d.advance(2_000)
    d.must_hb()
    d.respond(err(ErrorCode.COORDINATOR_LOAD_IN_PROGRESS))
    assert [r.levelno for r in caplog.records if "COORDINATOR_LOAD" in r.getMessage()] == [
        logging.DEBUG
    ]
    d.app_poll()
    d.advance(15_000)
    caplog.clear()
    d.app_poll()  # 5 s late
    assert any(
        "exceeded max.poll.interval.ms by about 5000 ms" in r.getMessage() for r in caplog.records
    )
