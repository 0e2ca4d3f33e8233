"""The core's per-heartbeat fast paths (`GroupMembership.stable_beat`, `quiet_answer`,
`stable_poll`) against its full `poll`, `on_heartbeat_response` and `handle(Poll)`: at every
step of a script a copy of the core takes the full path; where the fast path answers, both
must agree on the request, the wait and every field they touched; where it declines it must
have done nothing (the full path then runs)."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest

from consumer_sdk.domain import HeartbeatRequest, HeartbeatResponse
from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.membership import GroupMembership, MemberState, Poll
from consumer_sdk.membership.metrics import MembershipMetrics

from .harness import INTERVAL, T1, T2, Driver, cfg, err, ok


def _fields(core: GroupMembership, now: int) -> Any:
    """Everything the two paths may change, as comparable values."""
    hb = core._heartbeat
    timing = hb._timing
    m = core._manager
    return (
        core.published(),
        core.metrics.snapshot(now),
        [(r.request, r.kind, r.sent_ms, r.generation) for r in hb._in_flight],
        hb._regular_count,
        hb._confirmed_sent_ms,
        hb._unreleased_since_ms,
        hb._sent,
        hb._poll_deadline_ms,
        {k: getattr(timing, k) for k in type(timing).__slots__ if k != "_backoff"},
        m._now,
        m._epoch,
        m._generation,
        list(core.background_events),
    )


def _twin(core: GroupMembership) -> GroupMembership:
    """A copy of ``core`` with its own event queue (a bound ``deque.append`` is copied as
    is) and no state-change hook."""
    twin = copy.deepcopy(core)
    twin._manager._emit_event = twin.background_events.append
    twin._manager._on_state_change = None
    return twin


class Checked(Driver):
    """A harness driver whose heartbeats and answers try the fast paths first."""

    fast = 0
    fast_polls = 0
    declined_polls = 0

    def hb(self) -> HeartbeatRequest | None:
        core, now = self.core, self.now
        before = _fields(core, now)
        twin = _twin(core)
        full = twin.poll(now)
        beat = core.stable_beat(now)
        if beat is None:
            assert _fields(core, now) == before  # declined: nothing done
            return core.poll(now).request
        self.fast += 1
        assert beat == (full.request, full.next_poll_ms)
        assert _fields(core, now) == _fields(twin, now)
        return beat[0]

    def app_poll(self) -> None:
        core, now = self.core, self.now
        before = _fields(core, now)
        twin = _twin(core)
        twin.handle(Poll(now), now)
        if not core.stable_poll(now):
            assert _fields(core, now) == before  # declined: nothing done
            self.declined_polls += 1
            core.handle(Poll(now), now)
            return
        self.fast_polls += 1
        assert _fields(core, now) == _fields(twin, now)

    def respond(self, response: HeartbeatResponse, request: HeartbeatRequest | None = None) -> None:
        core, now = self.core, self.now
        in_flight = core._heartbeat._in_flight
        sent = request if request is not None else (in_flight[0].request if in_flight else None)
        before = _fields(core, now)
        twin = _twin(core)
        twin.on_heartbeat_response(now, response, sent)
        answered = None if sent is None else core.quiet_answer(now, response, sent)
        if answered is None:
            assert _fields(core, now) == before
            core.on_heartbeat_response(now, response, sent)
            return
        self.fast += 1
        assert answered[0] == twin.time_until_next_poll(now)
        assert answered[1] == twin.published()[8]  # the handout deadline
        assert _fields(core, now) == _fields(twin, now)


def _beat(d: Driver, response: HeartbeatResponse) -> None:
    d.advance(INTERVAL)
    d.app_poll()
    req = d.hb()
    if req is not None:
        d.advance(3)
        d.respond(response, req)
    d.run_all()


def test_the_fast_paths_agree_with_the_full_ones() -> None:
    checked = Checked(cfg())
    checked.join_stable({T1: [0, 1]})
    for _ in range(3):
        _beat(checked, ok(1))
    _beat(checked, ok(2))  # a new epoch
    _beat(checked, ok(2, interval=3000))  # a new interval
    _beat(checked, ok(2, {T1: [0, 1], T2: [0]}))  # a new assignment: reconcile, ack
    for _ in range(4):
        _beat(checked, ok(2))
    checked.subscribe("t1", "t2", "t3")  # a subscription change, sent again
    for _ in range(3):
        _beat(checked, ok(2))
    _beat(checked, err(ErrorCode.COORDINATOR_NOT_AVAILABLE))  # an error: full, then retried
    checked.core.on_coordinator_known(checked.now)  # (the host finds it again)
    for _ in range(3):
        _beat(checked, ok(2))
    assert checked.state is MemberState.STABLE
    checked.advance(checked.config.rebalance_timeout_ms + INTERVAL)  # no poll for that long
    checked.hb()  # the poll timer expired: the full path leaves the group
    assert checked.state is not MemberState.STABLE
    assert checked.fast >= 15
    assert checked.fast_polls >= 10 and checked.declined_polls >= 1
    checked.app_poll()  # STALE now: declined (the full path handles it)
    assert checked.state is not MemberState.STABLE


class CheckedPolled(Checked):
    """`Checked` whose heartbeats take the application's poll in with them
    (`stable_beat(now, polled_ms)`, as the driver's lane does), checked against
    ``handle(Poll)`` then the full `poll`."""

    polled_beats = 0

    def hb_polled(self) -> HeartbeatRequest | None:
        core, now = self.core, self.now
        before = _fields(core, now)
        twin = _twin(core)
        twin.handle(Poll(now), now)
        full = twin.poll(now)
        beat = core.stable_beat(now, now)
        if beat is None:
            assert _fields(core, now) == before  # declined: nothing done
            if not core.stable_poll(now):  # the driver's `note_poll`, then the full way
                core.handle(Poll(now), now)
            return core.poll(now).request
        self.fast += 1
        self.polled_beats += 1
        assert beat == (full.request, full.next_poll_ms)
        assert _fields(core, now) == _fields(twin, now)
        return beat[0]


def test_a_poll_taken_in_with_the_heartbeat_agrees_with_the_poll_then_the_heartbeat(
    caplog: Any,
) -> None:
    d = CheckedPolled(cfg())
    d.join_stable({T1: [0, 1]})

    def beat(response: HeartbeatResponse) -> None:
        d.advance(INTERVAL)
        req = d.hb_polled()
        if req is not None:
            d.advance(3)
            d.respond(response, req)
        d.run_all()

    for _ in range(3):
        beat(ok(1))
    beat(ok(2))  # a new epoch: declined, then the plain heartbeat again
    for _ in range(3):
        beat(ok(2))
    assert d.polled_beats >= 5
    # Polled again only after the poll timer ran out: the poll restarts it, and warns once
    # (the fast path declines: `stable_poll`'s warning comes from the full way).
    d.advance(d.config.rebalance_timeout_ms + INTERVAL)
    caplog.clear()
    with caplog.at_level("WARNING", logger="consumer_sdk.membership"):
        beat(ok(2))
    warned = [r for r in caplog.records if "exceeded max.poll.interval.ms" in r.getMessage()]
    assert len(warned) == 2  # the twin's (the full path's) and the core's own
    assert d.state is MemberState.STABLE  # the poll came before the expired timer was read
    beat(ok(2))
    assert d.state is MemberState.STABLE


def _lane_open(d: Checked) -> GroupMembership:
    """``d``'s core after a few beats (the fast paths' where they answer): its lane is open."""
    fast = d.fast
    for _ in range(3):
        _beat(d, ok(1))
    assert d.fast > fast
    core = d.core
    assert core._heartbeat._lane is not None
    return core


_ENTRIES: dict[str, Any] = {
    "poll": lambda d: d.core.poll(d.now),
    "handle(Poll)": lambda d: d.core.handle(Poll(d.now), d.now),
    "subscribe": lambda d: d.subscribe("t1", "t2"),
    "on_heartbeat_response": lambda d: d.respond(ok(1)),
    "on_heartbeat_failure": lambda d: d.fail(),
    "on_metadata": lambda d: d.metadata(),
    "on_coordinator_known": lambda d: d.core.on_coordinator_known(d.now, changed=True),
    "on_coordinator_unknown": lambda d: d.core.on_coordinator_unknown(d.now),
    "on_coordinator_connection_lost": lambda d: d.core.on_coordinator_connection_lost(),
}


@pytest.mark.parametrize("entry", sorted(_ENTRIES))
def test_every_entry_but_the_fast_paths_closes_the_lane(entry: str) -> None:
    """The lane skips checks of what only another entry can change: each entry closes it,
    and the next beat checks in full (the fast paths and `stable_poll` keep it open)."""
    d = Checked(cfg())
    d.join_stable({T1: [0, 1]})
    core = _lane_open(d)
    assert core.stable_poll(d.now)
    assert core._heartbeat._lane is not None
    _ENTRIES[entry](d)
    assert core._heartbeat._lane is None


def test_after_a_failed_lane_heartbeat_the_next_one_is_full() -> None:
    """A lane heartbeat that timed out: the next heartbeat carries every field again (the
    lane must not send the plain one it has open), as the full path does."""
    d = Checked(cfg())
    d.join_stable({T1: [0, 1]})
    _lane_open(d)
    d.advance(INTERVAL)
    sent = d.hb()  # (checked against the full path: the lane's plain heartbeat)
    assert sent is not None and sent.topic_partitions is None
    d.advance(3)
    d.fail()
    for _ in range(3):
        d.advance(INTERVAL)
        retry = d.hb()  # checked against the full path at each step
        if retry is not None:
            break
    assert retry is not None and retry.topic_partitions is not None
    d.advance(3)
    d.respond(ok(1), retry)
    for _ in range(2):
        _beat(d, ok(1))
    assert d.fast >= 3


def test_with_the_coordinator_lost_the_lane_sends_nothing() -> None:
    d = Checked(cfg())
    d.join_stable({T1: [0, 1]})
    core = _lane_open(d)
    core.on_coordinator_unknown(d.now)
    d.advance(INTERVAL)
    assert d.hb() is None  # (checked against the full path: nothing to send)


def test_the_lanes_metrics_read_late_equal_those_recorded_at_once() -> None:
    """The lane notes its heartbeats and `MembershipMetrics.settle` files them: read after
    many quiet beats (more than `MembershipMetrics.LANE_NOTES`, past the 60 s window) and
    right after a full-path answer (a new epoch) or send (a new subscription) while notes
    were pending, every metric and the published last answer equal those of a member
    whose heartbeats all take the full path."""
    lane, full = Driver(cfg()), Driver(cfg())
    for d in (lane, full):
        d.join_stable({T1: [0, 1]})
    taken = 0
    epoch = 1
    for beat_no in range(150):
        if beat_no == 99:
            epoch = 2  # a new epoch: that answer takes the full path
        for d in (lane, full):
            if beat_no == 125:
                d.subscribe("t1", "t2")  # the next heartbeat takes the full path
            d.advance(INTERVAL)
            fast = d is lane and d.core.stable_beat(d.now, d.now)  # (polled just now)
            if not fast:
                d.app_poll()
            request = fast[0] if fast else d.must_hb()
            d.advance(3 + beat_no % 7)
            if not (d is lane and d.core.quiet_answer(d.now, ok(epoch), request)):
                d.respond(ok(epoch), request)
            else:
                taken += 1
            d.run_all()
        # (unread, the notes are filed every `LANE_NOTES` heartbeats: they stay bounded)
        assert len(lane.core.metrics.lane_sent) <= MembershipMetrics.LANE_NOTES
        if beat_no in (60, 99, 125, 149):
            assert lane.core.published() == full.core.published()
            assert lane.core.metrics.snapshot(lane.now) == full.core.metrics.snapshot(full.now)
    assert taken > 2 * MembershipMetrics.LANE_NOTES


def test_the_lanes_unread_metrics_stay_within_their_window() -> None:
    """A stable member whose metrics nobody reads keeps, as when each heartbeat is recorded
    at once, only the last window's samples (plus the notes not filed yet): filing the
    lane's notes expires what fell out of the window, so a long-lived member does not
    grow."""
    d = Driver(cfg())
    d.join_stable({T1: [0, 1]})
    taken = 0
    for _ in range(300):  # 1,500 s of quiet beats, 25 windows
        d.advance(INTERVAL)
        fast = d.core.stable_beat(d.now, d.now)
        if not fast:
            d.app_poll()
        request = fast[0] if fast else d.must_hb()
        d.advance(3)
        if d.core.quiet_answer(d.now, ok(1), request):
            taken += 1
        else:
            d.respond(ok(1), request)
        d.run_all()
    assert taken > 250
    metrics = d.core.metrics
    bound = 60_000 // INTERVAL + MembershipMetrics.LANE_NOTES + 1
    assert len(metrics._heartbeats._samples) <= bound
    assert len(metrics._heartbeat_response_time._samples) <= bound


def test_the_lanes_debug_line_follows_the_level_as_it_changes(caplog: Any) -> None:
    """The lane asks the logger's cached answer before calling ``isEnabledFor``: a level
    turned on (or off) between beats applies from the next beat, as with the call."""
    d = Checked(cfg())
    d.join_stable({T1: [0, 1]})
    _lane_open(d)
    logger = logging.getLogger("consumer_sdk.membership")
    lines = []
    for level in (logging.INFO, logging.DEBUG, logging.INFO, logging.DEBUG):
        caplog.clear()
        with caplog.at_level(level, logger="consumer_sdk.membership"):
            assert logger.isEnabledFor(logging.DEBUG) is (level == logging.DEBUG)
            fast = d.fast
            _beat(d, ok(1))
            assert d.fast == fast + 2  # both through the fast paths
        lines.append(sum("Sending REGULAR heartbeat" in r.getMessage() for r in caplog.records))
    assert lines == [0, 2, 0, 2]  # (with DEBUG on: the lane's and its full-path twin's)


def test_a_copied_core_notes_its_lane_in_its_own_metrics() -> None:
    """The lane's notes go to the metrics of the core that took the beat: a deep copy (the
    tests' twins, a host that snapshots a core) must not write into the original's."""
    d = Checked(cfg())
    d.join_stable({T1: [0, 1]})
    core = _lane_open(d)
    twin = _twin(core)
    d.advance(INTERVAL)
    beat = twin.stable_beat(d.now)
    assert beat is not None
    assert twin.metrics.lane_sent and not core.metrics.lane_sent
