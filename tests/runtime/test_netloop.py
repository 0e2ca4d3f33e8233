"""The shared network loop over real sockets: many members on one thread and one connection
per broker, commits, leaves, coordinator moves, TLS and SASL, against EmbeddedKafka."""

from __future__ import annotations

import multiprocessing
import select
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from consumer_sdk import GroupMember, KafkaError, KafkaException, TopicPartition
from consumer_sdk.config import ConsumerConfig
from consumer_sdk.domain import OffsetFetchRequest
from consumer_sdk.membership import (
    CallbackCompleted,
    CallbackKind,
    CallbacksNeeded,
    Close,
    CommitCompleted,
    CommitNeeded,
    ErrorEvent,
    GroupMembership,
    LeaveCompleted,
    MemberState,
    Subscribe,
)
from consumer_sdk.membership.requests import CommitKind
from consumer_sdk.protocol.client import ClusterClient
from consumer_sdk.runtime.member_network import MemberNetwork
from consumer_sdk.runtime.netloop import NetworkLoop, Timer, _SelectorPoller
from consumer_sdk.runtime.offsets import OffsetAndMetadata, committed_offsets
from consumer_sdk.testing import EmbeddedKafka, wait_until

Partition = tuple[str, int]


class App:
    """The application side of one member, as a facade runs it: posts polls, runs the
    callbacks the core asks for (recording ownership), completes pre-rebalance commits."""

    def __init__(self, net: MemberNetwork) -> None:
        self.net = net
        self.owned: set[Partition] = set()
        self.left = False
        self.closing = False
        self.errors: list[ErrorEvent] = []

    def close(self) -> None:
        self.closing = True
        self.net.submit(Close())

    def poll(self) -> None:
        if not self.closing:
            self.net.note_poll()
        for event in self.net.drain_background_events():
            if isinstance(event, CallbacksNeeded):
                parts = set(event.partitions)
                if event.kind is CallbackKind.ASSIGNED:
                    self.owned |= parts
                else:
                    self.owned -= parts
                self.net.submit(CallbackCompleted(event.callback_id))
            elif isinstance(event, CommitNeeded):
                self.net.submit(CommitCompleted(event.commit_id))
            elif isinstance(event, LeaveCompleted):
                self.left = True
            elif isinstance(event, ErrorEvent):
                self.errors.append(event)


def member(
    bootstrap: str, group: str, loop: NetworkLoop | None = None, **extra: Any
) -> MemberNetwork:
    conf = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False, **extra}
    return MemberNetwork(ConsumerConfig.from_mapping(conf), loop=loop)


def poll_until(apps: list[App], done: Any, what: str, timeout: float = 30.0) -> None:
    def step() -> bool:
        for app in apps:
            app.poll()
        return bool(done())

    wait_until(step, timeout=timeout, interval=0.02, description=what)


def close_all(apps: list[App], timeout: float = 10.0) -> None:
    for app in apps:
        if not app.closing:
            app.close()
    poll_until(apps, lambda: all(a.left for a in apps), "every member left", timeout)
    for app in apps:
        app.net.stop()


@pytest.fixture(scope="module")
def kafka() -> Iterator[EmbeddedKafka]:
    with EmbeddedKafka(brokers=3, heartbeat_interval_ms=300, session_timeout_ms=6000) as k:
        yield k


def cover(apps: list[App], topic: str, partitions: int) -> bool:
    owned = [a.owned for a in apps]
    union = set().union(*owned)
    return sum(map(len, owned)) == partitions and union == {(topic, p) for p in range(partitions)}


def test_many_members_one_thread_one_connection_per_broker(kafka: EmbeddedKafka) -> None:
    kafka.create_topic("nl-many", partitions=24)
    kafka.clear_requests()
    threads_before = threading.active_count()
    apps = [
        App(member(kafka.bootstrap_servers, "nl-many", **{"client.id": f"c{i % 2}"}))
        for i in range(8)
    ]
    try:
        for app in apps:
            app.net.submit(Subscribe(topics=("nl-many",)))
        poll_until(
            apps,
            lambda: (
                all(a.net.state is MemberState.STABLE for a in apps) and cover(apps, "nl-many", 24)
            ),
            "8 members stable, partitions covered",
        )
        loop = apps[0].net._loop
        assert all(a.net._loop is loop for a in apps)
        # One network thread for all of them (connection-setup helpers are gone by now).
        wait_until(
            lambda: threading.active_count() <= threads_before + 1,
            timeout=10,
            description="only the loop thread is left",
        )
        # Different client ids share: one connection per broker address in use.
        addresses = [(c.host, c.port) for c in loop.connections()]
        assert len(addresses) == len(set(addresses)) <= 3 + 1
        assert len({a.net.member_id for a in apps}) == 8
        # Members of one group share coordinator lookups and topic metadata.
        counts = kafka.request_counts()
        assert counts.get(10, 0) < 8 and counts.get(3, 0) < 8, counts
        # Heartbeats keep flowing on the shared connections.
        beats = sum(a.net.core.metrics.snapshot(0)["heartbeat-total"] for a in apps)
        poll_until(
            apps,
            lambda: (
                sum(a.net.core.metrics.snapshot(0)["heartbeat-total"] for a in apps) >= beats + 16
            ),
            "more heartbeats",
        )
        # One leaves: the others take its partitions over.
        leaving, rest = apps[0], apps[1:]
        leaving.close()
        poll_until(apps, lambda: leaving.left and cover(rest, "nl-many", 24), "hand-over")
        leaving.net.stop()
    finally:
        close_all(apps[1:])
    wait_until(
        lambda: not loop.running, timeout=10, description="the loop stopped with its last user"
    )


def test_stable_members_heartbeat_at_the_broker_interval(kafka: EmbeddedKafka) -> None:
    """A quiet answer only reschedules the heartbeat (no full run of the member): the next
    one still goes at the broker's interval (300 ms here), not at the in-flight wait that
    was scheduled when it was sent (the larger retry.backoff.max.ms, 1000 ms)."""
    kafka.create_topic("nl-pace", partitions=2)
    apps = [App(member(kafka.bootstrap_servers, "nl-pace")) for _ in range(2)]
    try:
        for app in apps:
            app.net.submit(Subscribe(topics=("nl-pace",)))
        poll_until(
            apps,
            lambda: (
                all(a.net.state is MemberState.STABLE for a in apps) and cover(apps, "nl-pace", 2)
            ),
            "2 members stable",
        )
        assert all(a.net.core.heartbeat_interval_ms == 300 for a in apps)

        def beats() -> list[float]:
            return [a.net.core.metrics.snapshot(0)["heartbeat-total"] for a in apps]

        before, start = beats(), time.monotonic()
        poll_until(apps, lambda: time.monotonic() - start >= 4.0, "a 4 s window")
        sent = [after - b for after, b in zip(beats(), before, strict=True)]
        # About 13 each at 300 ms; 4 at the 1000 ms in-flight wait.
        assert all(n >= 8 for n in sent), sent
        assert all(a.net.state is MemberState.STABLE for a in apps)
        # Runs that are not its timer's (wake-ups) leave the member's timer in the heap once:
        # only a timer that fired is armed again, a pending one is moved or kept.
        net = apps[0].net
        loop = net._loop
        counted: list[int] = []
        done = threading.Event()

        def wake_runs() -> None:
            for _ in range(3):
                net._run()
                timer = net._timer
                counted.append(sum(1 for _, _, t in loop._lax_timers if t is timer and t.armed))
            done.set()

        loop.call_soon(wake_runs)
        assert done.wait(10)
        assert counted == [1, 1, 1]
    finally:
        close_all(apps)


def test_commits_sync_and_async_land_on_the_coordinator(kafka: EmbeddedKafka) -> None:
    kafka.create_topic("nl-commit", partitions=2)
    kafka.produce("nl-commit", [b"x"] * 20)
    app = App(member(kafka.bootstrap_servers, "nl-commit"))
    try:
        app.net.submit(Subscribe(topics=("nl-commit",)))
        poll_until(
            [app], lambda: app.net.state is MemberState.STABLE and len(app.owned) == 2, "joined"
        )
        result = app.net.commit_sync(
            {("nl-commit", 0): OffsetAndMetadata(7)}, 10.0, CommitKind.SYNC
        )
        assert result.ok and result.committed == {("nl-commit", 0): 7}
        commit_id = app.net.commit(
            {("nl-commit", 1): OffsetAndMetadata(3, -1, "meta")}, CommitKind.ASYNC
        )
        results: list[Any] = []
        poll_until(
            [app],
            lambda: (
                results.extend(app.net.drain_results())
                or any(r.commit_id == commit_id for r in results)
            ),
            "async commit done",
        )
        assert all(r.ok for r in results)
        with ClusterClient({"bootstrap.servers": kafka.bootstrap_servers}) as client:
            found = committed_offsets(
                client.offset_fetch(
                    OffsetFetchRequest("nl-commit", (("nl-commit", 0), ("nl-commit", 1))), 10.0
                )
            )
        assert {p: o.offset if o else None for p, o in found.items()} == {
            ("nl-commit", 0): 7,
            ("nl-commit", 1): 3,
        }
        # Never backwards through this member: a lower offset is skipped, not sent.
        lower = app.net.commit_sync({("nl-commit", 0): OffsetAndMetadata(2)}, 5.0, CommitKind.SYNC)
        assert lower.ok and lower.committed == {}
    finally:
        close_all([app])


def test_members_over_the_selectors_poller_where_there_is_no_epoll(kafka: EmbeddedKafka) -> None:
    """The loop waits on ``select.epoll`` where there is one, else on ``selectors`` through
    `_SelectorPoller`: members join, commit and leave over the fallback too."""
    kafka.create_topic("nl-poller", partitions=2)
    loop = NetworkLoop("nl-poller")
    loop._poller.close()
    loop._poller = _SelectorPoller()
    loop._poller.register(loop._wake_r.fileno(), select.EPOLLIN)
    loop._start()
    apps = [App(member(kafka.bootstrap_servers, "nl-poller", loop=loop)) for _ in range(2)]
    try:
        for app in apps:
            app.net.submit(Subscribe(topics=("nl-poller",)))
        poll_until(apps, lambda: cover(apps, "nl-poller", 2), "both partitions owned")
        result = apps[0].net.commit_sync(
            {p: OffsetAndMetadata(5) for p in apps[0].owned}, 10.0, CommitKind.SYNC
        )
        assert result.ok and set(result.committed) == apps[0].owned
        assert isinstance(loop._poller, _SelectorPoller)
        assert loop._by_fd and set(loop._by_fd.values()) <= set(loop.connections())
        close_all(apps)
    finally:
        loop._stop()


def test_coordinator_moves_and_broker_down_keep_the_member(kafka: EmbeddedKafka) -> None:
    kafka.create_topic("nl-move", partitions=3)
    app = App(member(kafka.bootstrap_servers, "nl-move"))
    try:
        app.net.submit(Subscribe(topics=("nl-move",)))
        poll_until(
            [app], lambda: app.net.state is MemberState.STABLE and len(app.owned) == 3, "joined"
        )
        first = app.net.coordinator.coordinator
        assert first is not None
        target = 1 if first.node_id != 1 else 2
        kafka.set_group_coordinator("nl-move", target)
        poll_until(
            [app],
            lambda: (c := app.net.coordinator.coordinator) is not None and c.node_id == target,
            "found the new coordinator",
        )
        epoch = app.net.member_epoch
        beats = app.net.core.metrics.snapshot(0)["heartbeat-total"]
        poll_until(
            [app],
            lambda: app.net.core.metrics.snapshot(0)["heartbeat-total"] > beats + 3,
            "heartbeats to the new coordinator",
        )
        assert app.net.state is MemberState.STABLE and app.net.member_epoch >= epoch
        assert len(app.owned) == 3
    finally:
        close_all([app])


def test_members_with_different_security_do_not_share(kafka: EmbeddedKafka) -> None:
    kafka.create_topic("nl-sec", partitions=2)
    a = App(member(kafka.bootstrap_servers, "nl-sec-a"))
    b = App(member(kafka.bootstrap_servers, "nl-sec-b", **{"socket.timeout.ms": 45_000}))
    apps = [a, b]
    try:
        for app in apps:
            app.net.submit(Subscribe(topics=("nl-sec",)))
        poll_until(apps, lambda: all(x.net.state is MemberState.STABLE for x in apps), "joined")
        loop = a.net._loop
        by_settings: dict[Any, set[tuple[str, int]]] = {}
        for c in loop.connections():
            by_settings.setdefault(c.settings, set()).add((c.host, c.port))
        assert len(by_settings) == 2  # same addresses, two connection sets
    finally:
        close_all(apps)


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl for certificates")
def test_tls_and_sasl_members_over_the_shared_loop(kafka: EmbeddedKafka, tmp_path: Any) -> None:
    from consumer_sdk.testing.tls_proxy import TlsProxy, make_certificates

    certs = make_certificates(tmp_path, ("localhost", "127.0.0.1"), name="nl")
    kafka.create_topic("nl-tls", partitions=2)
    kafka.set_group_coordinator("nl-tls", 1)  # the proxies front broker 1
    kafka.set_group_coordinator("nl-tls-bad", 1)
    users = {"alice": "pw-Secret-123", "bob": "pw-Other-456"}
    with (
        TlsProxy(kafka.broker_address(1), certs=certs, advertised_host="localhost") as tls_px,
        TlsProxy(
            kafka.broker_address(1), certs=certs, sasl_users=users, advertised_host="localhost"
        ) as sasl_px,
    ):
        common = {"ssl.ca.location": str(certs.ca)}
        tls_app = App(
            member(f"localhost:{tls_px.port}", "nl-tls", **{"security.protocol": "SSL"}, **common)
        )
        sasl_app = App(
            member(
                f"localhost:{sasl_px.port}",
                "nl-tls",
                **{
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanism": "SCRAM-SHA-256",
                    "sasl.username": "alice",
                    "sasl.password": "pw-Secret-123",
                },
                **common,
            )
        )
        bob = App(
            member(
                f"localhost:{sasl_px.port}",
                "nl-tls",
                **{
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanism": "SCRAM-SHA-256",
                    "sasl.username": "bob",
                    "sasl.password": "pw-Other-456",
                },
                **common,
            )
        )
        bad = App(
            member(
                f"localhost:{sasl_px.port}",
                "nl-tls-bad",
                **{
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanism": "PLAIN",
                    "sasl.username": "alice",
                    "sasl.password": "wrong",
                },
                **common,
            )
        )
        apps = [tls_app, sasl_app, bob]
        try:
            for app in [*apps, bad]:
                app.net.submit(Subscribe(topics=("nl-tls",)))
            poll_until(
                [*apps, bad],
                lambda: (
                    all(x.net.state is MemberState.STABLE for x in apps)
                    and cover(apps, "nl-tls", 2)
                    and bool(bad.errors)
                ),
                "TLS and SASL joined",
            )
            assert "SASL" in bad.errors[0].message and bad.net.state is not MemberState.STABLE
            loop = tls_app.net._loop
            protocols = {c.settings.security_protocol for c in loop.connections()}
            assert {"SSL", "SASL_SSL"} <= protocols
            assert tls_px.handshake_failures == []
            # Same mechanism, different users: never one connection for both identities.
            scram = [
                c
                for c in loop.connections()
                if c.settings.sasl_mechanism == "SCRAM-SHA-256" and c.port == sasl_px.port
            ]
            assert sorted(c.settings.credentials.get()[0] or "" for c in scram) == ["alice", "bob"]
        finally:
            bad.close()
            close_all(apps)
            poll_until([bad], lambda: bad.left, "the failing member closed")
            bad.net.stop()


def test_loop_is_released_by_its_last_user() -> None:
    loop = NetworkLoop.acquire()
    again = NetworkLoop.acquire()
    assert again is loop and loop.running
    loop.release()
    assert loop.running
    again.release()
    wait_until(lambda: not loop.running, timeout=5, description="loop stopped")
    assert NetworkLoop.acquire() is not loop
    NetworkLoop._shared.release()  # type: ignore[union-attr]


def test_slow_coordinator_times_out_the_shared_connection_and_members_recover(
    kafka: EmbeddedKafka,
) -> None:
    """Responses delayed past the heartbeat request timeout (5 s here): the timed-out request
    closes the shared connection and fails every request on it; the members back off,
    reconnect and stay in the group once the broker answers promptly again."""
    kafka.create_topic("nl-slow", partitions=4)
    apps = [App(member(kafka.bootstrap_servers, "nl-slow")) for _ in range(2)]
    try:
        for app in apps:
            app.net.submit(Subscribe(topics=("nl-slow",)))
        poll_until(
            apps,
            lambda: (
                all(a.net.state is MemberState.STABLE for a in apps) and cover(apps, "nl-slow", 4)
            ),
            "joined",
        )
        coordinator = apps[0].net.coordinator.coordinator
        assert coordinator is not None
        conn = apps[0].net._conn(coordinator.host, coordinator.port)
        generation = conn.generation
        ids = [a.net.member_id for a in apps]
        kafka.set_rtt(coordinator.node_id, 5600)
        try:
            poll_until(
                apps,
                lambda: conn.generation > generation or conn.state != "READY",
                "the timed-out connection was closed",
                timeout=30,
            )
        finally:
            kafka.set_rtt(coordinator.node_id, 0)
        poll_until(
            apps,
            lambda: (
                conn.state == "READY"
                and conn.generation > generation
                and all(a.net.state is MemberState.STABLE for a in apps)
                and cover(apps, "nl-slow", 4)
            ),
            "recovered",
            timeout=60,
        )
        assert [a.net.member_id for a in apps] == ids
    finally:
        close_all(apps)


def test_no_wakeup_is_lost(monkeypatch: pytest.MonkeyPatch) -> None:
    """Callbacks queued from other threads always wake the loop: with no timers and an
    unbounded select, a lost wakeup would leave a callback waiting forever."""
    from consumer_sdk.runtime import netloop

    monkeypatch.setattr(netloop, "_MAX_SELECT_S", 3600.0)
    loop = NetworkLoop("test-wakeups")
    loop._users = 1
    loop._start()
    failures: list[int] = []

    def hammer(offset: int) -> None:
        for i in range(1500):
            done = threading.Event()
            loop.call_soon(done.set)
            if not done.wait(30):
                failures.append(offset + i)
                return

    threads = [threading.Thread(target=hammer, args=(n * 10_000,)) for n in range(3)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert failures == []
    finally:
        loop.release()


def test_a_fired_timer_is_armed_again_and_a_pending_one_is_not() -> None:
    """`NetworkLoop.rearm` (a member's run re-arms its own timer): a timer is ``armed`` while
    in the heap, including once cancelled, and re-armed only after the loop popped it; it
    then fires again, once per arming."""
    loop = NetworkLoop("test-rearm")
    loop._users = 1
    loop._start()
    fired: list[float] = []
    again = threading.Event()
    try:
        first = threading.Event()
        timers: list[Timer] = []

        def fire() -> None:
            fired.append(time.monotonic())
            if len(fired) == 1:
                first.set()
            else:
                again.set()

        def arm() -> None:
            timers.append(loop.call_at(time.monotonic() + 0.01, fire))

        loop.call_soon(arm)
        assert first.wait(10)
        seen: list[bool] = []

        def rearm() -> None:
            timer = timers[0]
            seen.append(timer.armed)  # popped and fired
            loop.rearm(timer, time.monotonic() + 0.01)
            seen.append(timer.armed)
            pending = loop.call_at(time.monotonic() + 60, fire)
            pending.cancel()
            seen.append(pending.armed)  # cancelled, still in the heap

        loop.call_soon(rearm)
        assert again.wait(10)
        assert seen == [False, True, True]
        assert len(fired) == 2
    finally:
        loop.release()


def test_lax_timers_due_within_the_slack_share_one_wake_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Lax timers (the members' runs) may fire up to `TIMER_SLACK_S` late to share a wake-up:
    two members due half a slack apart run in one, neither early. A lax timer with no other
    due within the slack fires on time, so does one already due, and an exact timer keeps
    its time. (The slack is 200 ms here, so that a busy machine's scheduling delays stay
    well below the half slack the checks allow.)"""
    from consumer_sdk.runtime import netloop

    monkeypatch.setattr(netloop, "TIMER_SLACK_S", 0.2)
    slack = netloop.TIMER_SLACK_S
    loop = NetworkLoop("test-slack")
    loop._users = 1
    loop._start()
    fired: dict[str, float] = {}
    due: dict[str, float] = {}
    done = threading.Event()

    def at(name: str, when: float, lax: bool) -> None:
        due[name] = when

        def fire() -> None:
            fired[name] = time.monotonic()
            if len(fired) == len(due):
                done.set()

        loop.call_at(when, fire, lax=lax)

    def arm() -> None:
        now = time.monotonic()
        at("first", now + 0.2, True)
        at("second", now + 0.2 + slack / 2, True)
        at("exact", now + 0.6, False)
        at("late", now + 1.2, True)

    try:
        loop.call_soon(arm)
        assert done.wait(10)
        for name, when in due.items():
            assert fired[name] >= when, name  # never early
        # one wake-up for both: the first waited for the second, within its slack
        assert abs(fired["first"] - fired["second"]) < slack / 4, (fired, due)
        assert fired["first"] - due["first"] < slack + 0.05
        assert fired["exact"] - due["exact"] < slack / 2
        assert fired["late"] - due["late"] < slack / 2  # alone: no wait
        # A lax timer due when the loop next sleeps fires at once, not a slack later: a
        # member's run that asks to run again now (armed from a timer, after the loop read
        # its clock for this round of timers).
        ran = threading.Event()
        times: list[float] = []

        def again() -> None:
            times.append(time.monotonic())
            ran.set()

        def run_now() -> None:
            times.append(time.monotonic())
            loop.call_at(times[0], again, lax=True)

        loop.call_soon(lambda: loop.call_at(time.monotonic() + 0.05, run_now, lax=True))
        assert ran.wait(10)
        assert times[1] - times[0] < slack / 2, times
        # A cancelled timer is no company: a run moved earlier (the later one cancelled, still
        # in the heap, within the slack) fires at its own time, alone.
        moved = threading.Event()
        at_times: list[float] = []

        def move() -> None:
            now = time.monotonic()
            loop.call_at(now + 0.15 + slack / 2, lambda: None, lax=True).cancel()
            at_times.append(now + 0.15)
            loop.call_at(
                at_times[0], lambda: (at_times.append(time.monotonic()), moved.set()), True
            )

        loop.call_soon(move)
        assert moved.wait(10)
        assert 0 <= at_times[1] - at_times[0] < slack / 2, at_times
    finally:
        loop.release()


def test_a_cancelled_timer_does_not_wake_the_loop() -> None:
    """A cancelled exact timer (a connection's request expiry moved) at the top of the heap
    is dropped, not slept for: the loop's next sleep is its longest, the timer never fires,
    and a timer armed after it keeps its time."""
    from consumer_sdk.runtime import netloop

    loop = NetworkLoop("test-cancelled")
    loop._users = 1
    timeouts: list[float] = []
    poll = loop._poller.poll

    def recorded(timeout: float) -> Any:
        timeouts.append(timeout)
        return poll(timeout)

    loop._poller = _PollerProxy(loop._poller, recorded)
    loop._start()
    fired = threading.Event()
    armed = threading.Event()
    try:

        def arm() -> None:
            loop.call_at(time.monotonic() + 0.3, fired.set).cancel()
            timeouts.clear()
            armed.set()

        loop.call_soon(arm)
        assert armed.wait(10)
        assert not fired.wait(0.6)  # past its time: it never fired
        # the sleep after the cancel was the longest one, not until the cancelled time
        assert timeouts and timeouts[0] > netloop._MAX_SELECT_S - 0.01, timeouts
        assert not loop._timers
        later = threading.Event()
        when: list[float] = []
        loop.call_soon(
            lambda: (
                when.append(time.monotonic() + 0.1),
                loop.call_at(when[0], lambda: (when.append(time.monotonic()), later.set())),
            )
        )
        assert later.wait(10)
        assert when[1] >= when[0]
    finally:
        loop.release()


class _PollerProxy:
    """The loop's poller with its ``poll`` replaced (the rest passed through)."""

    def __init__(self, poller: Any, poll: Any) -> None:
        self._poller = poller
        self.poll = poll

    def __getattr__(self, name: str) -> Any:
        return getattr(self._poller, name)


# -- the GroupMember facade on the shared loop ---------------------------------------------------


def _network_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("consumer-sdk-")]


def _facade(kafka: EmbeddedKafka, group: str, **extra: Any) -> GroupMember:
    return GroupMember(
        {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": group,
            "enable.auto.commit": False,
            **extra,
        }
    )


def _poll_members(members: list[GroupMember], done: Any, what: str, timeout: float = 30) -> None:
    def step() -> bool:
        for m in members:
            m.poll(0)
        return bool(done())

    wait_until(step, timeout=timeout, interval=0.02, description=what)


def test_group_members_share_one_network_thread_and_leave_none_behind(
    kafka: EmbeddedKafka,
) -> None:
    kafka.create_topic("nl-facade", partitions=8)
    assert not any(n == "consumer-sdk-network" for n in _network_threads())
    members = [_facade(kafka, "nl-facade") for _ in range(8)]
    try:
        for m in members:
            m.subscribe(["nl-facade"])
        _poll_members(
            members,
            lambda: (
                all(m.state is MemberState.STABLE for m in members)
                and sum(len(m.assignment()) for m in members) == 8
            ),
            "all stable",
        )
        names = _network_threads()
        assert names.count("consumer-sdk-network") == 1, names
        assert not any("heartbeat" in n for n in names), "no thread per member"
    finally:
        for m in members:
            m.close(5)
    wait_until(
        lambda: not _network_threads(),
        timeout=10,
        description=f"no SDK thread left after close: {_network_threads()}",
    )


def test_one_members_failure_on_the_loop_spares_the_others(kafka: EmbeddedKafka) -> None:
    """An exception in one member's loop-side work fails that member with a clear error; the
    loop goes on heartbeating for the others."""
    kafka.create_topic("nl-isolate", partitions=2)
    good, bad = _facade(kafka, "nl-isolate"), _facade(kafka, "nl-isolate")
    try:
        for m in (good, bad):
            m.subscribe(["nl-isolate"])
        _poll_members(
            [good, bad],
            lambda: good.state is MemberState.STABLE and bad.state is MemberState.STABLE,
            "both stable",
        )

        def broken(*args: Any) -> None:
            raise RuntimeError("injected response-handling bug")

        class _Broken(GroupMembership):  # (slotted: a method is patched through its class)
            __slots__ = ()
            on_heartbeat_response = broken

        bad._net.core.__class__ = _Broken
        bad._net.core.quiet_answer = broken  # (a quiet answer's fast path)
        with pytest.raises(KafkaException, match="injected response-handling bug") as info:
            wait_until(
                lambda: bad.poll(0.05) or False,
                timeout=10,
                interval=0,
                description="the failed member's poll raises",
            )
        assert info.value.args[0].code() == KafkaError._FATAL
        with pytest.raises(KafkaException, match="failed on the network loop"):
            bad.commit(offsets=[TopicPartition("nl-isolate", 0, 1)], asynchronous=False)
        beats = good.metrics()["heartbeat-total"]
        # The broker fences the silent member after its session; the loop serves the other.
        _poll_members(
            [good],
            lambda: (
                good.metrics()["heartbeat-total"] >= beats + 3
                and len(good.assignment()) == 2
                and good.state is MemberState.STABLE
            ),
            "the other member heartbeats and takes over both partitions",
            timeout=40,
        )
    finally:
        bad.close(1)
        good.close(5)
    wait_until(lambda: not _network_threads(), timeout=10, description="no SDK thread left")


def _member_in_child(bootstrap: str, out: Any) -> None:
    member = GroupMember(
        {"bootstrap.servers": bootstrap, "group.id": "nl-fork", "enable.auto.commit": False}
    )
    try:
        member.subscribe(["nl-fork"])
        wait_until(
            lambda: (member.poll(0.05), member.state is MemberState.STABLE)[1],
            timeout=30,
            interval=0,
            description="child member stable",
        )
        out.send(len(member.assignment()))
    finally:
        member.close(5)


def test_a_forked_child_runs_its_own_loop(kafka: EmbeddedKafka) -> None:
    """A process forked while the parent's loop runs gets its own loop (the parent's thread
    does not exist in the child)."""
    kafka.create_topic("nl-fork", partitions=1)
    parent = _facade(kafka, "nl-fork-parent")
    try:
        parent.subscribe(["nl-fork"])
        _poll_members([parent], lambda: parent.state is MemberState.STABLE, "parent stable")
        ctx = multiprocessing.get_context("fork")
        recv, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_member_in_child, args=(kafka.bootstrap_servers, send))
        child.start()
        assert recv.poll(60), "the forked child's member never became stable"
        assert recv.recv() == 1
        child.join(30)
        assert child.exitcode == 0
        _poll_members([parent], lambda: parent.state is MemberState.STABLE, "parent stable")
    finally:
        parent.close(5)


_WARM_UP_PROBE = """
import sys
from consumer_sdk.runtime.netloop import NetworkLoop
wanted = ["kio.schema.api_versions.v4.request", "kio.schema.consumer_group_heartbeat.v1.request",
          "kio.schema.find_coordinator.v6.response", "kio.schema.offset_fetch.v6.response",
          "kio.schema.api_versions.v0.response"]
print(sorted(m for m in wanted if m in sys.modules))
loop = NetworkLoop.acquire()
print(sorted(m for m in wanted if m not in sys.modules))
loop.release()
"""


def test_the_loop_imports_the_join_paths_schemas_when_it_starts() -> None:
    """The kio schemas are imported on first use; taking the loop imports those of a
    member's join (newest versions first, then the older ones an older broker or the mock
    negotiates), so they are not paid between a subscription and its first heartbeat."""
    out = subprocess.run(
        [sys.executable, "-c", _WARM_UP_PROBE], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    before, missing = out.stdout.splitlines()
    assert before == "[]", "imported before the loop started: the probe proves nothing"
    assert missing == "[]", f"not imported when the loop was taken: {missing}"
