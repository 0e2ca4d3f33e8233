"""Process faults on a real 3-node Apache Kafka: the group coordinator's node stopped, killed
and paused past the session timeout; a member SIGKILLed; a member SIGSTOPped past the session
timeout. One module-wide cluster; every node is running again after each test.

Members are processes (``tests/realkafka/fault_member.py``: the chaos soak's member, which
logs every callback, record and commit, plus every heartbeat of an SDK member), two SDK
members and a confluent-kafka ``group.protocol=consumer`` member in every group (the oracle).
The chaos checker (`consumer_sdk.chaos.analysis.analyze`) then checks the logs: nothing
lost, no partition owned by two members at once (ownership timeline from the callbacks), only
the uncommitted work of killed or fenced members redone, committed offsets never going back
and everything committed at the end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from consumer_sdk.chaos.analysis import Summary, analyze, read_jsonl
from consumer_sdk.testing import wait_until

pytestmark = pytest.mark.realkafka

ROOT = Path(__file__).resolve().parents[2]
SESSION_S = 6.0  # the real_kafka_cluster fixture's group.consumer.session.timeout.ms
INTERVAL_S = 0.5  # and heartbeat interval
PARTITIONS = 6
CLOSE_TIMEOUT_S = 10.0


class CoordinatorMoving(Exception):
    """OffsetFetch answered by a node that is no longer (or not yet) the group's coordinator."""


@dataclass
class Proc:
    name: str
    impl: str
    popen: subprocess.Popen[bytes]
    log: Path
    stopped: bool = False

    @property
    def inc(self) -> str:
        return f"{self.name}/{self.popen.pid}"

    def alive(self) -> bool:
        return self.popen.poll() is None


class Group:
    """Member processes of one group on one topic, the faults done to them, and the checks."""

    def __init__(self, kafka: Any, tmp_path: Path, name: str) -> None:
        self.kafka = kafka
        self.dir = tmp_path
        self.topic = f"{name}-{uuid.uuid4().hex[:6]}"
        self.group = f"{name}-g-{uuid.uuid4().hex[:6]}"
        self.procs: list[Proc] = []
        self.driver_events: list[dict[str, Any]] = []
        self.samples: list[tuple[float, dict[int, int]]] = []
        self._produced = 0
        self._stop_sampling = threading.Event()
        from consumer_sdk.protocol.client import ClusterClient

        self._client = ClusterClient({"bootstrap.servers": kafka.bootstrap_servers})
        self._client_lock = threading.Lock()
        try:
            kafka.create_topic(self.topic, partitions=PARTITIONS)
        except Exception as exc:  # created by a first attempt that the admin client retried
            if getattr(exc, "code", None) != 36:
                raise
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    # -- data ---------------------------------------------------------------------------------

    def produce(self, n: int) -> None:
        start = self._produced
        self._produced += n
        self.kafka.produce(
            self.topic, [(str(i), str(i)) for i in range(start, start + n)], timeout=90
        )

    def end_offsets(self) -> dict[int, int]:
        from confluent_kafka import Consumer, TopicPartition

        c = Consumer({"bootstrap.servers": self.kafka.bootstrap_servers, "group.id": "wm"})
        try:
            return {
                p: int(c.get_watermark_offsets(TopicPartition(self.topic, p), 10)[1])
                for p in range(PARTITIONS)
            }
        finally:
            c.close()

    def _committed(self) -> dict[int, int]:
        """OffsetFetch through the SDK's client (librdkafka's AdminClient crashes on some
        OffsetFetch errors while the coordinator moves: a NULL consumer group in
        rd_kafka_handle_OffsetFetch)."""
        from consumer_sdk.domain import OffsetFetchRequest

        partitions = tuple((self.topic, p) for p in range(PARTITIONS))
        with self._client_lock:
            response = self._client.offset_fetch(
                OffsetFetchRequest(self.group, partitions, None, -1, False), 5.0
            )
        if response.error_code in (14, 15, 16):  # LOAD_IN_PROGRESS, NOT_AVAILABLE, NOT_COORDINATOR
            raise CoordinatorMoving(response.error_code)
        if response.error_code != 0:
            raise RuntimeError(f"OffsetFetch error {response.error_code}")
        return {
            r.partition: r.offset
            for r in response.partitions
            if r.error_code == 0 and r.offset >= 0
        }

    def _sample(self) -> None:
        while not self._stop_sampling.is_set():
            with contextlib.suppress(Exception):  # a node down or moving: skip this sample
                self.samples.append((time.time(), self._committed()))
            self._stop_sampling.wait(0.5)

    # -- members ------------------------------------------------------------------------------

    def spawn(
        self,
        name: str,
        impl: str,
        extra: tuple[str, ...] = (),
        prefix: tuple[str, ...] = (),
        bootstrap: str | None = None,
        module: str = "tests.realkafka.fault_member",
    ) -> Proc:
        """Start a member process (``prefix``: e.g. ``ip netns exec NS`` to run it there;
        ``bootstrap``: other bootstrap servers than the cluster's; ``module``: the member's
        program, e.g. ``tests.realkafka.aio_member`` for the asyncio faces)."""
        log = self.dir / f"{name}.jsonl"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(
                [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
            ),
        }
        stderr = (self.dir / f"{name}.stderr").open("ab")
        popen = subprocess.Popen(
            [
                *prefix,
                sys.executable,
                "-m",
                module,
                "--impl",
                impl,
                "--name",
                name,
                "--bootstrap",
                bootstrap or self.kafka.bootstrap_servers,
                "--group",
                self.group,
                "--topic",
                self.topic,
                "--log",
                str(log),
                "--close-timeout",
                str(CLOSE_TIMEOUT_S),
                *extra,
            ],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
        stderr.close()
        proc = Proc(name, impl, popen, log)
        self.procs.append(proc)
        return proc

    def events(self, proc: Proc | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for p in [proc] if proc else self.procs:
            if p.log.exists():
                out.extend(e for e in read_jsonl(p.log) if e["inc"] == p.inc)
        return sorted(out, key=lambda e: e["t"])

    def owned(self, proc: Proc) -> set[int]:
        parts: set[int] = set()
        for e in self.events(proc):
            if e["ev"] == "assign":
                parts.update(e["parts"])
            elif e["ev"] in ("revoke", "lost"):
                parts.difference_update(e["parts"])
        return parts

    def balanced(self, procs: list[Proc]) -> bool:
        """Every partition owned by exactly one of ``procs``, each owning at least one."""
        owned = [self.owned(p) for p in procs]
        flat = sorted(x for o in owned for x in o)
        return flat == list(range(PARTITIONS)) and all(owned)

    def wait_balanced(self, procs: list[Proc], timeout: float = 90.0) -> float:
        wait_until(
            lambda: self.balanced(procs),
            timeout,
            0.1,
            f"every partition owned once by {[p.name for p in procs]}",
        )
        return time.time()

    def processed(self) -> set[tuple[int, int]]:
        return {(e["p"], e["o"]) for e in self.events() if e["ev"] == "rec"}

    def wait_consumed_and_committed(self, timeout: float = 120.0) -> dict[int, int]:
        ends = self.end_offsets()
        wanted = {(p, o) for p, end in ends.items() for o in range(end)}
        wait_until(lambda: wanted <= self.processed(), timeout, 0.2, "every record processed")
        wait_until(lambda: self._committed_or_none() == ends, timeout, 0.2, f"committed == {ends}")
        return ends

    def _committed_or_none(self) -> dict[int, int] | None:
        """`_committed`, or None while the group's coordinator is moving (the client has
        forgotten the old one and finds the new one on the next call)."""
        try:
            return self._committed()
        except CoordinatorMoving:
            return None

    def kill(self, proc: Proc) -> float:
        t = time.time()
        proc.popen.send_signal(signal.SIGKILL)
        proc.popen.wait(10)
        self.driver_events.append({"t": t, "ev": "kill", "inc": proc.inc})
        return t

    def pause(self, proc: Proc) -> float:
        t = time.time()
        proc.popen.send_signal(signal.SIGSTOP)
        proc.stopped = True
        self.driver_events.append({"t": t, "ev": "stop", "inc": proc.inc})
        return t

    def resume(self, proc: Proc) -> float:
        t = time.time()
        proc.popen.send_signal(signal.SIGCONT)
        proc.stopped = False
        self.driver_events.append({"t": t, "ev": "cont", "inc": proc.inc})
        return t

    def close(self) -> None:
        """SIGTERM every member (close() inside), SIGKILL what does not exit. Idempotent."""
        if self._stop_sampling.is_set():
            return
        for p in self.procs:
            if p.alive():
                if p.stopped:
                    p.popen.send_signal(signal.SIGCONT)
                p.popen.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.popen.wait(CLOSE_TIMEOUT_S + 10)
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait(10)
                self.driver_events.append({"t": time.time(), "ev": "close_timeout", "inc": p.inc})
        time.sleep(1.0)  # one more committed-offset sample after the closes
        self._stop_sampling.set()
        self._sampler.join(15)
        self._client.close()

    def check(self, ends: dict[int, int], overlap_tolerance_s: float = 0.0) -> Summary:
        summary = analyze(
            self.events(),
            self.driver_events,
            ends,
            list(self.samples),
            session_s=SESSION_S,
            close_timeout_s=CLOSE_TIMEOUT_S,
            heartbeat_interval_s=INTERVAL_S,
            overlap_tolerance_s=overlap_tolerance_s,
        )
        summary.broker = "real"
        report = summary.format()
        assert summary.violations == {}, report
        assert summary.lost == 0 and summary.overlaps == 0, report
        assert summary.duplicates == summary.duplicates_explained + summary.duplicates_librdkafka, (
            report
        )
        assert summary.committed_regressions == 0 and summary.uncommitted_at_end == 0, report
        return summary

    def stderr(self) -> str:
        return "\n".join(
            f"--- {p.name}\n" + (self.dir / f"{p.name}.stderr").read_text()[-2000:]
            for p in self.procs
        )


@pytest.fixture
def group(
    real_kafka_cluster: Any, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Group]:
    kafka = real_kafka_cluster
    g = Group(kafka, tmp_path, request.node.name.split("[")[0].replace("test_", "")[:20])
    try:
        yield g
    finally:
        g.close()
        for node in kafka.node_ids:  # the next test starts on a whole cluster
            if node in kafka.running_nodes():
                kafka.resume_node(node)
            else:
                kafka.start_node(node)


def lost_events(g: Group, impl: str, after: float) -> list[dict[str, Any]]:
    names = {p.inc for p in g.procs if p.impl == impl}
    return [e for e in g.events() if e["ev"] == "lost" and e["inc"] in names and e["t"] > after]


@pytest.mark.parametrize("fault", ["stop", "kill", "pause"])
def test_coordinator_node_fault(group: Group, fault: str) -> None:
    """The coordinator's node stopped (controlled shutdown), SIGKILLed, or SIGSTOPped for
    twice the session timeout (past the broker's own 9 s session with the controller too):
    every member finds the new coordinator (commits succeed there), nothing is lost, no
    partition is owned twice, and the SDK members fare as the confluent-kafka member."""
    g, kafka = group, group.kafka
    g.produce(300)
    members = [g.spawn("sdk1", "sdk"), g.spawn("sdk2", "sdk"), g.spawn("ck1", "ck")]
    g.wait_balanced(members)
    g.wait_consumed_and_committed()
    old = kafka.coordinator_for(g.group)
    t_fault = time.time()
    producer = threading.Thread(target=g.produce, args=(300,))
    if fault == "stop":
        kafka.stop_node(old)
        g.driver_events.append({"t": t_fault, "ev": "coordinator", "how": "stop", "node": old})
    elif fault == "kill":
        kafka.kill_node(old)
        g.driver_events.append({"t": t_fault, "ev": "node_kill", "node": old, "coordinator": True})
    else:
        kafka.pause_node(old)
        g.driver_events.append({"t": t_fault, "ev": "node_pause", "node": old, "coordinator": True})
    producer.start()
    moved = lambda: (c := kafka.coordinator_for(g.group)) != old and c  # noqa: E731
    if fault == "pause":
        # Paused past the session timeout and until the controller has fenced the node and
        # moved the group: when the paused node is also the active controller, the new
        # controller restarts the 9 s broker session on election, so 2x6 s is not always enough.
        time.sleep(2 * SESSION_S)
        new = wait_until(moved, 60, 0.5, "the group on another node while the old one is paused")
        kafka.resume_node(old)
    else:
        new = wait_until(moved, 60, 0.5, "the group on another node")
    producer.join(120)
    ends = g.wait_consumed_and_committed()
    assert all(p.alive() for p in members), g.stderr()
    for p in members:  # every member committed through the new coordinator
        commits = [e for e in g.events(p) if e["ev"] == "commit" and e["t"] > t_fault]
        assert commits, f"{p.name} committed nothing after the fault"
    g.wait_balanced(members)
    sdk_lost, ck_lost = lost_events(g, "sdk", t_fault), lost_events(g, "ck", t_fault)
    g.close()
    summary = g.check(ends)
    print(
        f"\n{fault}: coordinator {old} -> {new}; lost callbacks sdk={len(sdk_lost)} "
        f"ck={len(ck_lost)}; zombie windows {summary.zombie_windows} "
        f"(max {summary.zombie_max_s:.2f}s)\n{summary.format()}"
    )


def _first_assign_of(g: Group, parts: set[int], after: float) -> float:
    return min(
        e["t"]
        for e in g.events()
        if e["ev"] == "assign" and e["t"] > after and set(e["parts"]) & parts
    )


def test_member_sigkill_the_others_take_over_after_the_session(group: Group) -> None:
    """An SDK member, then a confluent-kafka member, SIGKILLed: nobody gets their partitions
    before the broker expires the session; then the survivors (both kinds) take them over,
    as fast for the dead SDK member as for the dead confluent-kafka one."""
    g = group
    g.produce(300)
    members = [
        g.spawn("sdk1", "sdk"),
        g.spawn("sdk2", "sdk"),
        g.spawn("ck1", "ck"),
        g.spawn("ck2", "ck"),
    ]
    g.wait_balanced(members)
    g.wait_consumed_and_committed()
    takeover: dict[str, float] = {}
    for victim in (members[0], members[2]):
        survivors = [p for p in members if p.alive() and p is not victim]
        orphaned = g.owned(victim)
        assert orphaned
        t_kill = g.kill(victim)
        g.produce(100)
        g.wait_balanced(survivors, timeout=90)
        first = _first_assign_of(g, orphaned, t_kill)
        # the broker's session (less the last heartbeat's head start) runs out first
        assert first - t_kill >= SESSION_S - INTERVAL_S - 0.2, (victim.name, first - t_kill)
        takeover[victim.impl] = (
            max(e["t"] for e in g.events() if e["ev"] == "assign" and set(e["parts"]) & orphaned)
            - t_kill
        )
    ends = g.wait_consumed_and_committed()
    g.close()
    summary = g.check(ends)
    print(
        f"\ntakeover after SIGKILL: sdk member {takeover['sdk']:.2f}s, confluent-kafka member "
        f"{takeover['ck']:.2f}s (session {SESSION_S}s); {summary.duplicates} redone"
    )
    for impl, seconds in takeover.items():
        assert seconds <= SESSION_S + 15, (impl, takeover)
    assert abs(takeover["sdk"] - takeover["ck"]) <= 4 * INTERVAL_S + 2.0, takeover


def test_member_sigstop_past_the_session_is_fenced_and_rejoins(group: Group) -> None:
    """An SDK member, then a confluent-kafka member, SIGSTOPped for the session timeout plus
    3 s: the others take its partitions; on SIGCONT the SDK member's next heartbeat (old
    epoch) is rejected as fenced, on_lost runs with exactly what it owned, it rejoins at
    epoch 0 with the same member id and gets a higher epoch; the confluent-kafka member
    also reports the loss and rejoins."""
    g = group
    g.produce(300)
    members = [g.spawn("sdk1", "sdk"), g.spawn("sdk2", "sdk"), g.spawn("ck1", "ck")]
    g.wait_balanced(members)
    g.wait_consumed_and_committed()
    for victim in (members[0], members[2]):
        owned = g.owned(victim)
        assert owned
        before = [e for e in g.events(victim) if e["ev"] == "hb" and e.get("code") == 0]
        t_stop = g.pause(victim)
        g.produce(100)
        g.wait_balanced([p for p in members if p is not victim], timeout=90)
        assert _first_assign_of(g, owned, t_stop) - t_stop >= SESSION_S - INTERVAL_S - 0.2
        time.sleep(max(t_stop + SESSION_S + 3.0 - time.time(), 0))
        t_cont = g.resume(victim)

        def lost_after(v: Proc = victim, t: float = t_cont) -> list[dict[str, Any]]:
            return [e for e in g.events(v) if e["ev"] == "lost" and e["t"] > t]

        lost = wait_until(lost_after, 30, 0.1, "on_lost after SIGCONT")
        assert set(lost[0]["parts"]) == owned, (victim.name, lost[0], owned)
        g.wait_balanced(members, timeout=90)  # rejoined and balanced again
        rejoined = [e for e in g.events(victim) if e["ev"] == "assign" and e["t"] > lost[0]["t"]]
        assert rejoined, f"{victim.name} got no partitions after rejoining"
        if victim.impl == "sdk":
            old_epoch = before[-1]["got"]
            answered = [
                e for e in g.events(victim) if e["ev"] == "hb" and e["t"] > t_cont and "code" in e
            ]
            fenced, rejoin = answered[0], answered[1]
            assert fenced["sent"] == old_epoch and fenced["code"] in (25, 110), answered[:3]
            assert rejoin["sent"] == 0 and rejoin["code"] == 0, answered[:3]
            assert rejoin["got"] > old_epoch, answered[:3]
            assert lost[0]["t"] <= rejoin["t"], "on_lost ran before the rejoin was answered"
            assert rejoined[0]["mid"] == lost[0]["mid"], "same member id after the rejoin"
            assert rejoined[0]["ep"] >= rejoin["got"]
            print(
                f"\nsdk1 after SIGCONT: heartbeat epoch {fenced['sent']} -> error "
                f"{fenced['code']}; on_lost {sorted(owned)} at +{lost[0]['t'] - t_cont:.2f}s; "
                f"rejoin epoch 0 -> {rejoin['got']} at +{rejoin['t'] - t_cont:.2f}s"
            )
        else:
            print(
                f"ck1 after SIGCONT: on_lost {sorted(owned)} at +{lost[0]['t'] - t_cont:.2f}s, "
                f"assigned again at +{rejoined[0]['t'] - t_cont:.2f}s"
            )
    ends = g.wait_consumed_and_committed()
    g.close()
    g.check(ends)


def test_coordinator_move_is_retried_with_backoff_not_a_warning_storm(
    real_kafka_cluster: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """While the group's new coordinator loads ``__consumer_offsets`` (NOT_COORDINATOR /
    COORDINATOR_LOAD_IN_PROGRESS), in-process SDK members retry with backoff and log each
    episode once, not a WARNING per attempt."""
    import logging

    from tests.runtime.harness import Member, Timeline, config

    kafka = real_kafka_cluster
    topic, group = f"lc-load-{uuid.uuid4().hex[:6]}", f"lc-load-g-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, partitions=2)
    caplog.set_level(logging.DEBUG, logger="consumer_sdk")
    members = [Member(f"m{i}", config(kafka, group), [topic], Timeline()) for i in range(2)]
    node = -1
    try:
        wait_until(lambda: all(len(m.owned) == 1 for m in members), 60, 0.1, "a 1/1 split")
        node = kafka.coordinator_for(group)
        caplog.clear()
        kafka.stop_node(node)
        moved = kafka.coordinator_for(group)
        assert moved != node
        time.sleep(3 * INTERVAL_S)  # the members find the new coordinator and heartbeat there
        wait_until(
            lambda: all(m.consumer.state.name == "STABLE" for m in members),
            60,
            0.1,
            "both members stable on the new coordinator",
        )
        records = [r for r in caplog.records if r.name.startswith("consumer_sdk")]
        failures = [
            r
            for r in records
            if "Heartbeat failed" in r.getMessage() or "FindCoordinator failed" in r.getMessage()
        ]
        loud = [r.getMessage() for r in failures if r.levelno >= logging.INFO]
        # Per member: at most one transport episode (WARNING) and one coordinator-load
        # episode (INFO); retries log at DEBUG.
        assert len(loud) <= 2 * len(members) * 2, loud
        warnings = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
        assert len(warnings) <= 2 * len(members), warnings
        print(
            f"\ncoordinator {node} -> {moved}: {len(failures)} failed attempts logged, "
            f"{len(loud)} at INFO or above, {len(warnings)} warnings"
        )
        assert all(len(m.owned) == 1 for m in members) and not any(m.errors for m in members)
    finally:
        for m in members:
            m.stop()
        if node >= 0 and node not in kafka.node_pids():
            kafka.start_node(node)
