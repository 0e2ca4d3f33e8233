"""`MemberDriver` over a scripted transport: the request ordering, the shared lookups, the
error values it is fed, and the application-bound events it produces (sans I/O, virtual
time; the runtime runs the same driver over real connections in the other tests here)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from consumer_sdk.domain import (
    Coordinator,
    HeartbeatResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    PartitionResult,
)
from consumer_sdk.error_codes import ErrorCode as E
from consumer_sdk.membership import (
    CallbackCompleted,
    CallbacksNeeded,
    Close,
    CommitCompleted,
    CommitNeeded,
    ErrorEvent,
    Failure,
    FailureKind,
    GroupMembership,
    MembershipConfig,
    MemberState,
    Poll,
    Subscribe,
)
from consumer_sdk.membership.heartbeat import Backoff
from consumer_sdk.membership.requests import CommitKind
from consumer_sdk.runtime.driver import (
    Api,
    CommitDone,
    CoordinatorUnreachable,
    DriverConfig,
    FetchDone,
    MemberDriver,
    Outbound,
    SharedLookups,
)

COORD = Coordinator("g", 1, "broker-1", 9092)


@dataclass(frozen=True)
class Off:
    offset: int
    leader_epoch: int = -1
    metadata: str | None = None


class ScriptedTransport:
    """Records what the driver sends; the test answers each request by hand."""

    def __init__(self) -> None:
        self.sent: list[Outbound] = []
        self.conn: Hashable | None = ("conn", 1)
        # The group's session timeout (DescribeConfigs), asked once: kept apart.
        self.session_asks: list[Outbound] = []

    def send(self, request: Outbound) -> None:
        if request.api is Api.GROUP_SESSION_TIMEOUT:
            self.session_asks.append(request)
            return
        self.sent.append(request)

    def connection_id(self, coordinator: Coordinator) -> Hashable | None:
        return self.conn

    def take(self) -> list[Outbound]:
        out, self.sent = self.sent, []
        return out


def subscribe(d: MemberDriver, now: int) -> None:
    """Subscribe and poll: the first run takes the events in (the member joins), the
    application's next poll() runs it again."""
    d.submit(Subscribe(topics=("t",)))
    d.submit(Poll(now))
    d.run(now)


class CountingTransport(ScriptedTransport):
    """A scripted transport with the runtime's connection change counter (as
    `LoopTransport.conn_changes`), a connection per coordinator host, and its
    `connection_id` calls counted."""

    def __init__(self) -> None:
        super().__init__()
        self.conn_changes = [0]
        self.by_host: dict[str, Hashable | None] = {}
        self.asked = 0

    def connection_id(self, coordinator: Coordinator) -> Hashable | None:
        self.asked += 1
        return self.by_host.get(coordinator.host, self.conn)


def driver(
    shared: SharedLookups | None = None,
    wakes: list[int] | None = None,
    transport: ScriptedTransport | None = None,
) -> tuple[MemberDriver, ScriptedTransport]:
    rng = random.Random(3)
    core = GroupMembership(MembershipConfig(group_id="g"), rng=rng)
    transport = transport or ScriptedTransport()
    d = MemberDriver(
        DriverConfig("g", None, 100, 1000, 0, 30_000),
        core,
        transport,
        shared or SharedLookups(),
        lambda: (wakes if wakes is not None else []).append(1),
        lambda: Backoff(100, 1000, 0.0, rng),
    )
    return d, transport


def joined(
    now: int = 0, transport: ScriptedTransport | None = None
) -> tuple[MemberDriver, ScriptedTransport]:
    """A driver whose member is STABLE with no assignment at epoch 5."""
    d, t = driver(transport=transport)
    subscribe(d, 0)
    d.run(now)
    (find,) = t.take()
    assert find.api is Api.FIND_COORDINATOR and find.payload == "g"
    d.on_response(now, find, COORD)
    d.run(now)
    (hb,) = t.take()
    assert hb.api is Api.HEARTBEAT and hb.coordinator == COORD
    d.on_response(now, hb, HeartbeatResponse(0, 5, 1000, assignment=()))
    for _ in range(5):  # the application polls and runs what it is asked to; acks answered
        d.submit(Poll(now))
        for event in d.core.drain_background_events():
            if isinstance(event, CallbacksNeeded):
                d.submit(CallbackCompleted(event.callback_id))
            elif isinstance(event, CommitNeeded):
                d.submit(CommitCompleted(event.commit_id))
        d.run(now)
        for r in t.take():
            if r.api is Api.HEARTBEAT:
                d.on_response(now, r, HeartbeatResponse(0, 5, 1000))
    assert d.core.state is MemberState.STABLE and d.core.member_epoch == 5
    return d, t


def test_a_commit_made_before_the_leave_goes_out_first_on_the_coordinator() -> None:
    d, t = joined()
    t.take()
    d.commit(10, {("t", 0): Off(7)}, CommitKind.ASYNC, epoch=5)
    d.submit(Close())
    d.run(10)
    sent = t.take()
    apis = [r.api for r in sent]
    assert Api.OFFSET_COMMIT in apis and Api.HEARTBEAT in apis
    assert apis.index(Api.OFFSET_COMMIT) < apis.index(Api.HEARTBEAT)
    leave = sent[apis.index(Api.HEARTBEAT)]
    assert leave.payload.member_epoch == -1
    commit = sent[apis.index(Api.OFFSET_COMMIT)]
    assert commit.coordinator == leave.coordinator == COORD
    assert commit.payload.member_epoch == 5  # made in the group: its epoch, not the leave's


def test_a_commit_answer_comes_back_as_an_application_bound_event() -> None:
    d, t = joined()
    t.take()
    commit_id = d.commit(10, {("t", 0): Off(7)}, CommitKind.SYNC, commit_id=42)
    assert commit_id == 42
    d.run(10)
    (req,) = [r for r in t.take() if r.api is Api.OFFSET_COMMIT]
    d.on_response(20, req, (PartitionResult("t", 0),))
    (done,) = [e for e in d.outbox if isinstance(e, CommitDone)]
    assert done.result.commit_id == 42 and done.result.ok
    assert dict(done.result.committed) == {("t", 0): 7}


def test_members_of_one_group_share_one_coordinator_lookup() -> None:
    shared = SharedLookups()
    wakes: list[int] = []
    a, ta = driver(shared)
    b, tb = driver(shared, wakes)
    for d in (a, b):
        subscribe(d, 0)
        d.run(0)
    assert [r.api for r in ta.take()] == [Api.FIND_COORDINATOR]
    assert tb.take() == []  # waits for a's lookup instead of sending its own
    find = Outbound(Api.FIND_COORDINATOR, "g", None, 30_000)
    a.on_response(5, find, COORD)
    assert wakes  # b is woken by a's answer
    b.run(5)
    (hb,) = tb.take()
    assert hb.api is Api.HEARTBEAT and hb.coordinator == COORD


def test_the_coordinator_is_found_before_subscribe_so_the_join_goes_at_once() -> None:
    # As librdkafka and the Java client: the lookup is made from the start, so subscribe()
    # sends the join heartbeat in its first run instead of a FindCoordinator first.
    d, t = driver()
    d.run(0)
    (find,) = t.take()
    assert find.api is Api.FIND_COORDINATOR and find.payload == "g"
    d.on_response(3, find, COORD)
    d.run(3)
    assert t.take() == []  # no heartbeat while not subscribed
    subscribe(d, 10)
    (join,) = t.take()
    assert join.api is Api.HEARTBEAT and join.coordinator == COORD
    assert join.payload.member_epoch == 0


def test_a_closed_member_does_not_look_its_coordinator_up() -> None:
    d, t = driver()
    d.submit(Close())
    d.run(0)  # (the lookup ahead may go before the run takes the Close in)
    assert d.core.state is MemberState.UNSUBSCRIBED
    for find in t.take():
        d.on_failure(1, find, Failure(FailureKind.DISCONNECTED, "gone", -195))
    d.run(5_000)  # past any backoff
    assert t.take() == []


def test_failed_lookups_are_reported_once_with_the_boundarys_code() -> None:
    d, t = driver()
    subscribe(d, 0)
    now = 0
    reports = []
    for _ in range(4):
        d.run(now)
        (find,) = t.take()
        d.on_failure(now, find, Failure(FailureKind.TIMEOUT, "no answer", -185))
        reports += [e for e in d.outbox if isinstance(e, CoordinatorUnreachable)]
        d.outbox.clear()
        now += 2_000  # past any backoff
    assert len(reports) == 1
    assert reports[0].code == -185 and reports[0].transport
    assert "no answer" in reports[0].message


def test_an_offset_fetch_without_a_coordinator_fails_at_its_deadline() -> None:
    d, t = driver()
    d.fetch_offsets(1, OffsetFetchRequest("g", (("t", 0),)), deadline_ms=500)
    wait = d.run(0)
    assert 0 < wait <= 500
    assert [r.api for r in t.take()] == [Api.FIND_COORDINATOR]
    d.run(500)
    (done,) = d.outbox
    assert isinstance(done, FetchDone) and done.response is None
    assert done.failure is not None and done.failure.kind is FailureKind.TIMEOUT
    assert "coordinator was not found in time" in done.failure.message


def test_an_offset_fetch_answer_becomes_the_commit_floor() -> None:
    d, t = joined()
    t.take()
    d.fetch_offsets(1, OffsetFetchRequest("g", (("t", 0),)), deadline_ms=10_000)
    d.run(1)
    (req,) = [r for r in t.take() if r.api is Api.OFFSET_FETCH]
    d.on_response(2, req, OffsetFetchResponse(0, (PartitionResult("t", 0, offset=9),)))
    assert any(isinstance(e, FetchDone) and e.response is not None for e in d.outbox)
    d.commit(3, {("t", 0): Off(8)}, CommitKind.ASYNC)  # below what the group committed
    d.run(3)
    assert not [r for r in t.take() if r.api is Api.OFFSET_COMMIT]


def test_a_replaced_coordinator_connection_makes_the_next_heartbeat_full() -> None:
    d, t = joined()
    t.take()
    t.conn = ("conn", 2)  # the connection dropped and came back, nothing failed on it
    d.run(5_000)
    (hb,) = [r for r in t.take() if r.api is Api.HEARTBEAT]
    assert hb.payload.subscribed_topic_names == ("t",)  # every field again


def test_a_connection_replaced_during_quiet_beats_makes_the_next_heartbeat_full() -> None:
    """The heartbeat's lane (a stable member's timer run, only the heartbeat due) sends its
    plain heartbeat only on the connection the last one was answered on."""
    d, t = joined()
    t.take()
    plain, now, wait = _quiet_beats(d, t, 0, d.run(0), 4)  # the lane's plain heartbeats
    assert plain >= 3
    t.conn = ("conn", 2)  # the connection dropped and came back, nothing failed on it
    now += wait
    d.run(now)
    (hb,) = [r for r in t.take() if r.api is Api.HEARTBEAT]
    assert hb.payload.subscribed_topic_names == ("t",)  # every field again


def _quiet_beats(
    d: MemberDriver, t: ScriptedTransport, now: int, wait: int, n: int
) -> tuple[int, int, int]:
    """``n`` timer runs, each heartbeat answered quietly 2 ms later: (plain heartbeats
    sent, now, wait)."""
    plain = 0
    for _ in range(n):
        now += wait
        wait = d.run(now)
        for r in t.take():
            if r.api is Api.HEARTBEAT:
                plain += r.payload.subscribed_topic_names is None
                now += 2
                wait = d.on_response(now, r, HeartbeatResponse(0, 5, 1000))
    return plain, now, wait


def test_the_lanes_connection_check_holds_until_a_connection_changes() -> None:
    """With the transport's change counter, the lane asks `connection_id` once and then only
    after the counter moved: a connection replaced (the counter moved with it) during quiet
    beats still makes the next heartbeat full."""
    t = CountingTransport()
    d, _ = joined(transport=t)
    t.take()
    plain, now, wait = _quiet_beats(d, t, 0, d.run(0), 2)
    t.asked = 0
    plain, now, wait = _quiet_beats(d, t, now, wait, 4)
    # the lane asks no more (the full runs that poll the idle managers every few beats do)
    assert plain == 4 and t.asked <= 2
    t.conn = ("conn", 2)  # the connection dropped and came back, nothing failed on it
    t.conn_changes[0] += 1
    now += wait
    assert d._others_due > now + d._hb_period  # (the next run is the lane's)
    d.run(now)
    (hb,) = [r for r in t.take() if r.api is Api.HEARTBEAT]
    assert hb.payload.subscribed_topic_names == ("t",)  # every field again


def test_the_lanes_connection_check_is_asked_again_for_a_new_coordinator() -> None:
    """The lane's remembered `connection_id` is that coordinator's: once the group moved to
    another coordinator on another connection, its quiet beats take the lane again (asking
    once), with no connection change counted."""
    t = CountingTransport()
    d, _ = joined(transport=t)
    t.take()
    _, now, wait = _quiet_beats(d, t, 0, d.run(0), 3)
    moved = Coordinator("g", 2, "broker-2", 9092)
    t.by_host["broker-2"] = ("conn", 7)
    now += wait
    d.run(now)
    (hb,) = [r for r in t.take() if r.api is Api.HEARTBEAT]
    now += 2
    d.on_response(now, hb, HeartbeatResponse(E.NOT_COORDINATOR, 5, 1000))
    while True:  # look the coordinator up; its first heartbeat
        now += 1
        d.run(now)
        out = t.take()
        for find in [r for r in out if r.api is Api.FIND_COORDINATOR]:
            d.on_response(now, find, moved)
        beats = [r for r in out if r.api is Api.HEARTBEAT]
        if beats:
            (hb,) = beats
            assert hb.coordinator == moved
            now += 2
            wait = d.on_response(now, hb, HeartbeatResponse(0, 5, 1000))
            break
    _, now, wait = _quiet_beats(d, t, now, wait, 2)
    t.asked = 0
    plain, now, wait = _quiet_beats(d, t, now, wait, 4)
    # the lane, on the new coordinator's connection (full runs ask, see above)
    assert plain == 4 and t.asked <= 2


def _lane_in_flight(t: ScriptedTransport) -> tuple[MemberDriver, Outbound, int]:
    """A stable member whose lane is open, its heartbeat in flight: (driver, that heartbeat,
    now)."""
    d, _ = joined(transport=t)
    t.take()
    _, now, wait = _quiet_beats(d, t, 0, d.run(0), 6)
    while True:  # the next lane run (not one of the idle managers' full runs)
        now += wait
        wait = d.run(now)
        (hb,) = [r for r in t.take() if r.api is Api.HEARTBEAT]
        if d._lane_open:
            assert hb.payload.subscribed_topic_names is None
            return d, hb, now
        now += 2
        wait = d.on_response(now, hb, HeartbeatResponse(0, 5, 1000))


def test_an_event_while_the_lanes_heartbeat_is_in_flight_makes_its_answer_full() -> None:
    """The driver's lane skips the quiet answer's checks only while nothing else entered the
    driver since its heartbeat went out: an application event queued then makes the answer
    take the full path (run the member now)."""
    d, hb, now = _lane_in_flight(CountingTransport())
    d.submit(Subscribe(topics=("t", "u")))
    assert d.on_response(now + 2, hb, HeartbeatResponse(0, 5, 1000)) == 0
    d.run(now + 2)
    assert not d.core.app_events  # taken in


def test_an_event_for_the_application_pending_at_the_lanes_send_makes_its_answer_full() -> None:
    """The driver's lane opens only when `on_response`'s quiet-answer checks hold: an event
    for the application still pending (the host has not taken it) when the lane's heartbeat
    goes out makes its answer take the full path, as without the lane."""
    t = CountingTransport()
    d, hb, now = _lane_in_flight(t)
    now += 2
    wait = d.on_response(now, hb, HeartbeatResponse(0, 5, 1000))
    while not (d._others_due > now + wait + d._hb_period):  # up to a lane run
        now += wait
        d.run(now)
        (hb,) = t.take()
        now += 2
        wait = d.on_response(now, hb, HeartbeatResponse(0, 5, 1000))
    d._lane_open = False  # (as after any other entry: the lane opens again at its send)
    d.core.background_events.append(ErrorEvent(-1, "not taken yet", False))
    now += wait
    d.run(now)
    (hb,) = t.take()
    assert hb.payload.subscribed_topic_names is None  # the lane's heartbeat
    assert d.on_response(now + 2, hb, HeartbeatResponse(0, 5, 1000)) == 0  # the full path


def test_a_commit_awaiting_an_epoch_at_the_lanes_send_makes_its_answer_full() -> None:
    """The driver's lane opens only when no commit refused as stale waits for a newer epoch:
    the answer to a lane heartbeat sent while one waits takes the full path (run the member
    now, so the commit goes out again under the answer's epoch), as without the lane."""
    t = CountingTransport()
    d, hb, now = _lane_in_flight(t)
    now += 2
    wait = d.on_response(now, hb, HeartbeatResponse(0, 5, 1000))
    d.commit(now, {("t", 0): Off(7)}, CommitKind.SYNC, epoch=5)
    d.run(now)
    (req,) = [r for r in t.take() if r.api is Api.OFFSET_COMMIT]
    now += 2
    wait = d.on_response(now, req, (PartitionResult("t", 0, error_code=E.STALE_MEMBER_EPOCH),))
    assert d.commits.awaiting_epoch
    for _ in range(10):
        now += max(wait, 1)
        lane_run = d._others_due > now + d._hb_period
        wait = d.run(now)
        beats = [r for r in t.take() if r.api is Api.HEARTBEAT]
        if not beats:
            continue
        (hb,) = beats
        if lane_run and hb.payload.subscribed_topic_names is None:  # the lane's heartbeat
            assert d.commits.awaiting_epoch
            assert d.on_response(now + 2, hb, HeartbeatResponse(0, 5, 1000)) == 0
            return
        now += 2
        wait = d.on_response(now, hb, HeartbeatResponse(0, 5, 1000))
    raise AssertionError("no lane heartbeat went out while the commit waited for an epoch")


def test_a_poll_queued_after_a_quiet_answer_is_taken_in_by_the_next_run() -> None:
    """A `Poll` event (a stable member's poll as an event: the simulator's and the runtime's
    during a rebalance) queued between the lane's quiet answer and its next run: that run
    takes it in (it does not skip the lane's checks)."""
    t = CountingTransport()
    d, hb, now = _lane_in_flight(t)
    while True:
        now += 2
        wait = d.on_response(now, hb, HeartbeatResponse(0, 5, 1000))
        assert wait > 0
        now += wait
        if d._lane_open and d._others_due > now + d._hb_period:  # the next run: the lane's
            break
        d.run(now)
        (hb,) = t.take()
    d.submit(Poll(now))
    d.run(now)
    assert not d.core.app_events
    assert [r.api for r in t.take()] == [Api.HEARTBEAT]


def test_a_disconnected_heartbeat_forgets_the_coordinator_for_every_member() -> None:
    shared = SharedLookups()
    d, t = driver(shared)
    subscribe(d, 0)
    d.run(0)
    (find,) = t.take()
    d.on_response(0, find, COORD)
    assert shared.coordinators.known["g"] == COORD
    d.run(0)
    (hb,) = t.take()
    d.on_failure(1, hb, Failure(FailureKind.DISCONNECTED, "reset", E.NETWORK_EXCEPTION))
    assert "g" not in shared.coordinators.known
    assert d.coordinator.coordinator is None and not d.core.coordinator_known


def test_the_groups_session_timeout_is_asked_once_and_retried_after_a_failure() -> None:
    """DescribeConfigs of the group when the coordinator is first found (the bound of the
    zombie-record gate); a retriable failure asks again at the next coordinator found."""
    d, t = joined()
    [ask] = t.session_asks
    assert ask.payload == "g" and ask.coordinator is None
    d.on_failure(0, ask, Failure(FailureKind.DISCONNECTED, "gone"))
    assert d.core.session_timeout_ms == 45_000
    d._coordinator_found(0)
    d.run(0)  # the coordinator manager's next poll asks again
    [_, again] = t.session_asks
    d.on_response(0, again, 6000)
    assert d.core.session_timeout_ms == 6000
    assert d.snapshot().handout_deadline_ms is not None
    d._coordinator_found(0)
    d.run(0)
    assert len(t.session_asks) == 2


def test_a_stable_members_timer_run_polls_only_the_managers_due() -> None:
    """Between events, a stable member's heartbeat run polls the heartbeat's manager (the
    idle ones once per several beats); a commit makes the next run poll every manager, in
    order, the commit before the heartbeat."""
    d, t = joined()
    t.take()
    polled: list[str] = []

    class Counting:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def poll(self, now: int) -> Any:
            polled.append(type(self.inner).__name__)
            return self.inner.poll(now)

    d._managers = tuple(Counting(m) for m in d._managers)  # type: ignore[misc]
    now = 0
    runs: list[list[str]] = []
    wait = d.run(now)
    for _ in range(12):  # quiet beats: each answer only reschedules, each timer run sends
        now += wait
        polled.clear()
        wait = d.run(now)
        runs.append(list(polled))
        sent = t.take()
        if sent:
            (hb,) = sent
            assert hb.api is Api.HEARTBEAT
            now += 2
            wait = d.on_response(now, hb, HeartbeatResponse(0, 5, 1000))
            assert wait > 0  # quiet
    # (a run of the heartbeat's lane sends its plain heartbeat without its manager's poll)
    assert sum(r in ([], ["_HeartbeatRequests"]) for r in runs) >= 6, runs
    assert all(not r or r[-1] == "_HeartbeatRequests" for r in runs)
    polled.clear()
    d.commit(now, {("t", 0): Off(7)}, CommitKind.ASYNC, epoch=5)
    d.run(now)
    assert len(polled) == 5
    assert [r.api for r in t.take()] == [Api.OFFSET_COMMIT]


def _fast_path_trace(
    fast: bool, ending: str, polled: bool = False, answers_prev: bool = True
) -> tuple[list[Any], int]:
    """A stable member through quiet beats and everything that must leave them (a new epoch,
    a new interval, a pending commit, a commit refused as stale, a subscription change, then
    the ``ending``: a fencing error or an expired poll timer), answered the same way; with
    ``fast`` False the core's fast paths are
    switched off (its full `poll` and `on_heartbeat_response` every time). Returns what the
    host sees at each step, and how many heartbeats the fast paths handled. ``polled``: the
    application's polls reach the driver as the runtime's do (`MemberDriver.run`'s
    ``polled_ms``, which the heartbeat's lane takes in with its heartbeat) instead of as
    `Poll` events; with ``fast`` False, `stable_poll` is switched off too. The runs and
    answers get the last snapshot as the runtime passes it (``prev``), and the step takes
    the one the lane built (`MemberDriver.lane_snapshot`) where it did (counted in
    ``taken`` too); ``answers_prev`` False: the answers get none (their snapshot is then
    built by `MemberDriver.snapshot`, from what the answer left for it)."""
    d, t = joined()
    t.take()
    core = d.core
    taken = [0]
    if fast:
        beat, answer = core.stable_beat, core.quiet_answer

        def counted_beat(now: int, polled_ms: int = 0) -> Any:
            result = beat(now, polled_ms)
            taken[0] += result is not None
            return result

        def counted_answer(now: int, response: Any, request: Any) -> Any:
            result = answer(now, response, request)
            taken[0] += result is not None
            return result

        core.stable_beat, core.quiet_answer = counted_beat, counted_answer
    else:
        core.stable_beat = lambda now, polled_ms=0: None
        core.quiet_answer = lambda now, response, request: None
        if polled:
            core.stable_poll = lambda now: False
    trace: list[Any] = []
    snap = [d.snapshot()]
    now = 0
    epoch = 5
    interval = 1000
    commit_error = 0

    def step(label: str, wait: int) -> None:
        metrics = core.metrics.snapshot(now)
        lane = d.lane_snapshot  # as the runtime publishes it, after each call
        if lane is not None:
            d.lane_snapshot = None
            taken[0] += 1
            # (the runtime then hands nothing over: there must be nothing)
            assert not d.outbox and not core.background_events
        snap[0] = lane if lane is not None else d.snapshot(0, 0, snap[0])
        trace.append(
            (
                label,
                now,
                wait,
                snap[0],
                core.state,
                core.member_epoch,
                core.heartbeat_interval_ms,
                core.published(),
                [m for m in core.drain_background_events() if not isinstance(m, Poll)],
                [(type(e).__name__, getattr(e, "result", None)) for e in d.outbox],
                core._heartbeat._poll_deadline_ms,
                {k: v for k, v in metrics.items() if k.startswith(("heartbeat", "last-heart"))},
            )
        )
        d.outbox.clear()

    subscribed = False
    for beat_no in range(24):
        if beat_no == 4:
            epoch = 6  # the coordinator bumps the epoch: the next request carries it
        if beat_no == 7:
            interval = 700
        if beat_no == 10:
            d.commit(now, {("t", 0): Off(beat_no)}, CommitKind.ASYNC, epoch=epoch)
        if beat_no == 13:  # refused as stale: waits for a newer epoch
            commit_error = E.STALE_MEMBER_EPOCH
            d.commit(now, {("t", 0): Off(beat_no)}, CommitKind.SYNC, epoch=epoch)
        if beat_no == 19 and ending == "expire":  # no poll for max.poll.interval.ms
            now += 400_000
            wait = d.run(now)
        elif polled:
            wait = d.run(now, now, snap[0])  # the application polled between beats
        else:
            d.submit(Poll(now))  # the application polls between beats
            wait = d.run(now)
        step(f"run {beat_no}", wait)
        sent = t.take()
        if beat_no >= 15 and sent and not subscribed:  # while the heartbeat is in flight
            subscribed = True
            d.submit(Subscribe(topics=("t", "u")))
            step("subscribed", d.run(now))
            sent += t.take()
        for request in sent:
            trace.append(("sent", request.api, request.payload, request.coordinator))
            now += 3
            if request.api is Api.OFFSET_COMMIT:
                results = (PartitionResult("t", 0, error_code=commit_error),)
                commit_error = 0
                step("commit answered", d.on_response(now, request, results))
            elif request.api is Api.HEARTBEAT:
                fenced = ending == "fence" and beat_no >= 19 and core.state is MemberState.STABLE
                error = E.FENCED_MEMBER_EPOCH if fenced else 0
                response = HeartbeatResponse(error, epoch, interval)
                wait = d.on_response(now, request, response, snap[0] if answers_prev else None)
                step(f"answered {beat_no}", wait)
            else:
                step("other", d.on_failure(now, request, Failure(FailureKind.TIMEOUT, "x")))
        now += max(wait, 1)
    return trace, taken[0]


def test_the_stable_heartbeat_fast_path_changes_nothing_the_host_sees() -> None:
    """The core's per-heartbeat fast paths (`stable_beat`, `quiet_answer`) against its full
    `poll` and `on_heartbeat_response` on the same script: the same requests, waits,
    snapshots, states, events and metrics at every step, through quiet beats and whatever
    must leave them (a changed answer, a pending or refused commit, a new subscription, an
    error), and the fast paths did serve most of the quiet beats."""
    for ending in ("fence", "expire"):
        fast, taken = _fast_path_trace(True, ending)
        full, _ = _fast_path_trace(False, ending)
        assert taken >= 10
        assert [e[4] for e in fast if e[0] != "sent"][-1] is not MemberState.STABLE  # left
        assert len(fast) == len(full)
        for got, want in zip(fast, full, strict=True):
            assert got == want
        # The polls as the runtime hands them over, taken in by the lane with the heartbeat:
        # the same steps as the full path's `Poll` events.
        lane, taken = _fast_path_trace(True, ending, polled=True)
        full_polled, _ = _fast_path_trace(False, ending, polled=True)
        assert taken >= 10
        assert len(lane) == len(full) == len(full_polled)
        for got, want, polls in zip(lane, full, full_polled, strict=True):
            assert got == want == polls
        # The runs' lane builds its snapshot from the previous one only where that one was
        # published after the last answer: here the answers' are built by `snapshot`.
        mixed, taken = _fast_path_trace(True, ending, polled=True, answers_prev=False)
        assert taken >= 10
        assert mixed == full


def test_a_coordinator_refusing_heartbeats_is_retried_at_the_lookups_pace() -> None:
    """A new coordinator answers NOT_COORDINATOR while it takes the group over. As the Java
    client: each refusal looks the coordinator up again, at most one lookup every
    retry.backoff.ms (100 ms here), and the heartbeat goes as soon as it is found; the
    retries do not back off exponentially (they did: 0, 100, 200, 400, 800 ms, which left
    the member up to that long behind a coordinator that had become ready)."""
    d, t = joined()
    t.take()
    now = 5_000
    d.run(now)
    (hb,) = [r for r in t.take() if r.api is Api.HEARTBEAT]
    sent = [now]
    lookups = []
    while len(sent) < 7:
        assert now < 10_000, f"heartbeats sent at {sent}"
        now += 2
        d.on_response(now, hb, HeartbeatResponse(E.NOT_COORDINATOR, 5, 1000))
        while True:
            wait = d.run(now)
            out = t.take()
            for find in [r for r in out if r.api is Api.FIND_COORDINATOR]:
                lookups.append(now)
                now += 2
                d.on_response(now, find, COORD)
            beats = [r for r in out if r.api is Api.HEARTBEAT]
            if beats:
                (hb,) = beats
                sent.append(now)
                break
            if not out:
                now += max(wait, 1)
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    assert all(gap <= 110 for gap in gaps), gaps
    assert all(b - a >= 100 for a, b in itertools.pairwise(lookups)), lookups
