"""The chaos soak driver: a 3-node cluster, a continuous producer, member processes and faults.

It hosts a 3-node cluster (``--broker mock``: EmbeddedKafka, librdkafka's mock; ``--broker
real``: `consumer_sdk.testing.KafkaCluster`, Apache Kafka from ``KAFKA_HOME``),
produces to one topic continuously, runs K SDK member processes and at least one
confluent-kafka ``group.protocol=consumer`` member process in one group, and at random kills
members (SIGKILL, then restarts them), pauses them past the session timeout (SIGSTOP ...
SIGCONT) and restarts them gracefully. Broker faults depend on the backend: the mock moves the
group coordinator by decree and takes a broker down briefly; the real cluster stops the
coordinator's node (the group moves to another node), SIGKILLs a node and SIGSTOPs one past
the session timeout, one node at a time (the 3-voter quorum survives one), restarting it in
the background. It samples the group's committed offsets every second (OffsetFetch without
member fields, from the driver). At the end it stops the faults and the producer, lets the
members catch up and commit, closes them with SIGTERM, and checks the logs with
`consumer_sdk.chaos.analysis`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from consumer_sdk.chaos.analysis import Summary, analyze, read_jsonl, read_member_events

log = logging.getLogger("consumer_sdk.chaos")

MEMBER_ACTIONS = ("kill", "pause", "restart")
#: broker faults per backend: the mock injects them by decree; the real cluster has only
#: process faults (error codes a real broker cannot be made to send stay the mock's job)
BROKER_ACTIONS = {
    "mock": ("coordinator", "broker_down"),
    "real": ("coordinator", "node_kill", "node_pause"),
    # network faults between hosts (`consumer_sdk.testing.netns`): a member cut from its
    # coordinator both ways or one way, a member cut from every broker, the coordinator's
    # node cut from the other brokers
    "netns": ("net_coord", "net_coord_one_way", "net_isolate", "net_coord_cut"),
}
ACTIONS = MEMBER_ACTIONS + BROKER_ACTIONS["mock"]
#: how long a short run may go past --duration to run every kind of fault once
OVERTIME_S = 120.0


@dataclass
class MemberProc:
    name: str
    impl: str
    proc: subprocess.Popen[bytes]
    stderr: IO[bytes]
    stopped: bool = False

    @property
    def incarnation(self) -> str:
        return f"{self.name}/{self.proc.pid}"

    def alive(self) -> bool:
        return self.proc.poll() is None


class Driver:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.workdir = Path(args.workdir or tempfile.mkdtemp(prefix="consumer-sdk-chaos-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "members").mkdir(exist_ok=True)
        self.group = "chaos-group"
        self.topic = "chaos-topic"
        self.members: dict[str, MemberProc] = {}
        self._members_lock = threading.RLock()
        self._log_file = (self.workdir / "driver.jsonl").open("a", encoding="utf-8")
        self._log_lock = threading.Lock()
        self._stop_producing = threading.Event()
        self._stop_sampling = threading.Event()
        self.acked = 0
        self.produce_errors = 0
        self.samples: list[tuple[float, dict[int, int]]] = []
        self.kafka: Any = None
        self.coordinator = 1
        # real backend: the node being faulted and restarted in the background (one at a time)
        self._node_fault: threading.Thread | None = None
        self._node_errors: list[str] = []

    # -- logging ------------------------------------------------------------------------------

    def event(self, ev: str, **fields: Any) -> None:
        record = {"t": time.time(), "ev": ev, **fields}
        with self._log_lock:
            self._log_file.write(json.dumps(record) + "\n")
            self._log_file.flush()
        log.info("%s %s", ev, fields)

    # -- members ------------------------------------------------------------------------------

    def spawn(self, name: str, impl: str) -> MemberProc:
        stderr = (self.workdir / "members" / f"{name}.stderr").open("ab")
        prefix = self.kafka.exec_prefix(name) if self.args.broker == "netns" else []
        argv = [
            *prefix,
            sys.executable,
            "-m",
            "consumer_sdk.chaos",
            "member",
            "--impl",
            impl,
            "--name",
            name,
            "--bootstrap",
            self.kafka.bootstrap_servers,
            "--group",
            self.group,
            "--topic",
            self.topic,
            "--log",
            str(self.workdir / "members" / f"{name}.jsonl"),
            "--close-timeout",
            str(self.args.close_timeout),
        ]
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,
        )
        member = MemberProc(name, impl, proc, stderr)
        with self._members_lock:
            self.members[name] = member
        self.event("spawn", inc=member.incarnation, impl=impl)
        return member

    def _running(self) -> list[MemberProc]:
        with self._members_lock:
            return [m for m in self.members.values() if m.alive() and not m.stopped]

    def terminate(self, member: MemberProc) -> bool:
        """SIGTERM and wait for a clean exit (close() inside); SIGKILL if it does not come."""
        if member.stopped:
            self.resume(member)
        if not member.alive():
            return True
        member.proc.send_signal(signal.SIGTERM)
        try:
            member.proc.wait(self.args.close_timeout + 5.0)
            self.event("exited", inc=member.incarnation, status=member.proc.returncode)
            return True
        except subprocess.TimeoutExpired:
            self.event("close_timeout", inc=member.incarnation)
            self.kill(member, reason="close timeout")
            return False

    def kill(self, member: MemberProc, reason: str = "chaos") -> None:
        with contextlib.suppress(ProcessLookupError):
            member.proc.send_signal(signal.SIGKILL)
        member.proc.wait(10)
        self.event("kill", inc=member.incarnation, reason=reason)
        member.stopped = False

    def resume(self, member: MemberProc) -> None:
        if member.stopped and member.alive():
            with contextlib.suppress(ProcessLookupError):
                member.proc.send_signal(signal.SIGCONT)
            self.event("cont", inc=member.incarnation)
        member.stopped = False

    # -- background work ----------------------------------------------------------------------

    def _produce(self) -> None:
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": self.kafka.bootstrap_servers,
                "linger.ms": 5,
                "acks": "all",
                "message.timeout.ms": 120_000,
            }
        )

        def delivered(err: Any, msg: Any) -> None:
            if err is None:
                self.acked += 1
            else:
                self.produce_errors += 1

        period = 0.05
        per_tick = max(1, int(self.args.rate * period))
        seq = 0
        next_at = time.monotonic()
        while not self._stop_producing.is_set():
            for _ in range(per_tick):
                try:
                    producer.produce(self.topic, value=str(seq).encode(), on_delivery=delivered)
                    seq += 1
                except BufferError:
                    break
            producer.poll(0)
            next_at += period
            self._stop_producing.wait(max(next_at - time.monotonic(), 0))
        producer.flush(60)
        self.event("producer_done", sent=seq, acked=self.acked, errors=self.produce_errors)

    def _sample_committed(self) -> None:
        from consumer_sdk.domain import OffsetFetchRequest
        from consumer_sdk.protocol.client import ClusterClient

        partitions = tuple((self.topic, p) for p in range(self.args.partitions))
        with ClusterClient({"bootstrap.servers": self.kafka.bootstrap_servers}) as client:
            while not self._stop_sampling.is_set():
                try:
                    response = client.offset_fetch(
                        OffsetFetchRequest(self.group, partitions, None, -1, False), 2.0
                    )
                    if response.error_code == 0:
                        sample = {
                            r.partition: r.offset for r in response.partitions if r.error_code == 0
                        }
                        self.samples.append((time.time(), sample))
                except Exception as exc:  # broker down or coordinator moving: skip this one
                    log.debug("committed-offset sample failed: %s", exc)
                self._stop_sampling.wait(self.args.sample_interval)

    def end_offsets(self) -> dict[int, int]:
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer(
            {"bootstrap.servers": self.kafka.bootstrap_servers, "group.id": "chaos-watermarks"}
        )
        try:
            return {
                p: int(consumer.get_watermark_offsets(TopicPartition(self.topic, p), 10.0)[1])
                for p in range(self.args.partitions)
            }
        finally:
            consumer.close()

    # -- chaos ----------------------------------------------------------------------------------

    def _pause_for(self, member: MemberProc, seconds: float) -> None:
        member.proc.send_signal(signal.SIGSTOP)
        member.stopped = True
        self.event("stop", inc=member.incarnation, seconds=seconds)

        def later() -> None:
            time.sleep(seconds)
            with self._members_lock:
                if member.stopped:
                    self.resume(member)

        threading.Thread(target=later, daemon=True).start()

    def act(self, action: str) -> None:
        running = self._running()
        session_s = self.args.session_timeout_ms / 1000
        if action in ("kill", "pause", "restart"):
            if len(running) < 2:
                self.event("skipped", action=action, reason="fewer than 2 running members")
                return
            member = self.rng.choice(running)
            if action == "kill":
                self.kill(member)
                time.sleep(self.rng.uniform(0.5, 2.0))
                self.spawn(member.name, member.impl)
                self.event("restart", name=member.name, after="kill")
            elif action == "pause":
                self._pause_for(member, session_s + self.rng.uniform(1.5, 3.0))
            else:
                self.terminate(member)
                self.spawn(member.name, member.impl)
                self.event("restart", name=member.name, after="close")
        elif self.args.broker == "real":
            self._act_real(action)
        elif self.args.broker == "netns":
            self._act_net(action)
        elif action == "coordinator":
            target = self.rng.choice(
                [b for b in range(1, self.args.brokers + 1) if b != self.coordinator]
            )
            self.kafka.set_group_coordinator(self.group, target)
            self.coordinator = target
            self.event("coordinator", broker=target)
        elif action == "broker_down":
            broker = self.rng.randint(1, self.args.brokers)
            seconds = self.rng.uniform(1.0, min(2.5, session_s / 2))
            self.kafka.broker_down(broker)
            self.event(
                "broker_down",
                broker=broker,
                seconds=seconds,
                coordinator=broker == self.coordinator,
            )
            time.sleep(seconds)
            self.kafka.broker_up(broker)
            self.event("broker_up", broker=broker)

    def _watch_coordinator(self) -> None:
        """Log the group's coordinator (FindCoordinator through the live nodes) whenever it
        changes: a node fault cuts members off if the node was the coordinator at any time
        while it was down, which the check made just before the fault can miss (leadership
        of ``__consumer_offsets`` moves while nodes stop, start and get fenced)."""
        last: int | None = None
        while not self._stop_sampling.is_set():
            try:
                node = self.kafka.coordinator_for(self.group, timeout=5.0)
            except Exception:  # no coordinator right now (a node down, leadership moving)
                node = None
            if node is not None and node != last:
                self.event("coordinator_seen", node=node)
                last = node
            self._stop_sampling.wait(0.5)

    def node_fault_running(self) -> bool:
        return self._node_fault is not None and self._node_fault.is_alive()

    def _act_real(self, action: str) -> None:
        """A process fault on one node of the real cluster; the node comes back in the
        background (the quorum of 3 survives one node down, so one fault at a time)."""
        session_s = self.args.session_timeout_ms / 1000
        coordinator = self.kafka.coordinator_for(self.group, timeout=30.0)
        if action == "coordinator":
            node, down_s = coordinator, self.rng.uniform(2.0, 5.0)
        else:
            # half of the time the coordinator's node, so the group moves by crash and hang too
            others = [n for n in self.kafka.node_ids if n != coordinator]
            node = coordinator if self.rng.random() < 0.5 else self.rng.choice(others)
            down_s = (
                session_s + self.rng.uniform(1.0, 3.0)
                if action == "node_pause"
                else self.rng.uniform(2.0, 5.0)
            )
        fields = {"node": node, "coordinator": node == coordinator, "seconds": down_s}

        def fault() -> None:
            try:
                if action == "coordinator":
                    self.event("coordinator", how="stop", broker=node, seconds=down_s)
                    self.kafka.stop_node(node)
                    self.event("node_stopped", node=node)
                elif action == "node_kill":
                    self.kafka.kill_node(node)
                    self.event("node_kill", **fields)
                else:
                    self.kafka.pause_node(node)
                    self.event("node_pause", **fields)
                time.sleep(down_s)
                if action == "node_pause":
                    self.kafka.resume_node(node)
                    self.event("node_resume", node=node)
                else:
                    self.kafka.start_node(node)
                    self.event("node_started", node=node)
            except Exception as exc:  # reported as a violation-free failure of the run
                self._node_errors.append(f"{action} node {node}: {exc}")
                self.event("node_fault_failed", action=action, node=node, error=str(exc))

        self._node_fault = threading.Thread(target=fault, name=f"chaos-{action}", daemon=True)
        self._node_fault.start()

    def _act_net(self, action: str) -> None:
        """A network fault between hosts for the session + 1-3 s (or, one time in four, a
        shorter one that fences nobody); healed in the background (one at a time)."""
        session_s = self.args.session_timeout_ms / 1000
        net = self.kafka
        coordinator = net.coordinator_for(self.group, timeout=30.0)
        coord_host = net.broker_host(coordinator)
        member = self.rng.choice(sorted(self.members))
        seconds = (
            self.rng.uniform(1.0, session_s / 2)
            if self.rng.random() < 0.25
            else session_s + self.rng.uniform(1.0, 3.0)
        )
        if action == "net_coord_cut":
            seconds = max(seconds, 12.0)  # past the broker session: the controller fences it
        fields: dict[str, Any] = {"node": coordinator, "seconds": seconds}

        def fault() -> None:
            try:
                if action == "net_coord":
                    net.partition(member, coord_host)
                    fields["member"] = member
                elif action == "net_coord_one_way":
                    net.partition(member, coord_host, one_way=True)
                    fields["member"] = member
                elif action == "net_isolate":
                    net.isolate(member)
                    fields["member"] = member
                else:
                    for node in net.broker_ids:
                        if node != coordinator:
                            net.partition(coord_host, net.broker_host(node))
                self.event(action, **fields)
                time.sleep(seconds)
                net.heal()
                self.event("net_heal")
            except Exception as exc:  # reported as a violation-free failure of the run
                self._node_errors.append(f"{action}: {exc}")
                self.event("node_fault_failed", action=action, error=str(exc))

        self._node_fault = threading.Thread(target=fault, name=f"chaos-{action}", daemon=True)
        self._node_fault.start()

    def _next_action(self, schedule: list[str], actions: tuple[str, ...]) -> str:
        """The next scheduled action; a broker fault waits (member faults go first) while
        a node is still down from the previous one."""
        busy = self.args.broker in ("real", "netns") and self.node_fault_running()
        for i, action in enumerate(schedule):
            if not (busy and action not in MEMBER_ACTIONS):
                return schedule.pop(i)
        choices = [a for a in actions if not (busy and a not in MEMBER_ACTIONS)]
        return self.rng.choice(choices)

    # -- the run --------------------------------------------------------------------------------

    def _start_cluster(self) -> Any:
        a = self.args
        if a.broker == "netns":
            from consumer_sdk.testing.netns import NetnsCluster

            hosts = [f"sdk{i + 1}" for i in range(a.members)]
            hosts += [f"ck{i + 1}" for i in range(a.ck_members)]
            return NetnsCluster(
                brokers=a.brokers,
                hosts=hosts,
                kafka_home=a.kafka_home,
                heartbeat_interval_ms=a.heartbeat_interval_ms,
                session_timeout_ms=a.session_timeout_ms,
            )
        if a.broker == "real":
            from consumer_sdk.testing import KafkaCluster

            return KafkaCluster(
                nodes=a.brokers,
                kafka_home=a.kafka_home,
                heartbeat_interval_ms=a.heartbeat_interval_ms,
                session_timeout_ms=a.session_timeout_ms,
            )
        from consumer_sdk.testing import EmbeddedKafka

        return EmbeddedKafka(
            brokers=a.brokers,
            heartbeat_interval_ms=a.heartbeat_interval_ms,
            session_timeout_ms=a.session_timeout_ms,
        )

    def _create_topic(self) -> None:
        try:
            self.kafka.create_topic(self.topic, partitions=self.args.partitions)
        except Exception as exc:
            # a real broker may have created it on a first attempt the admin client retried
            if getattr(exc, "code", None) != 36 or self.kafka.topics().get(self.topic) != (
                self.args.partitions
            ):
                raise

    def run(self) -> Summary:
        self.kafka = self._start_cluster()
        try:
            if self.args.broker == "netns":  # the driver's own clients on the ctl host
                summary: Summary = self.kafka.call(self._run)
                return summary
            return self._run()
        finally:
            with self._members_lock:
                for member in self.members.values():
                    if member.alive():
                        self.kill(member, reason="teardown")
                    member.stderr.close()
            if self._node_fault is not None:
                self._node_fault.join(120)
            self.kafka.close()
            self._log_file.close()

    def _run(self) -> Summary:
        a = self.args
        self._create_topic()
        if a.broker == "mock":
            self.kafka.set_group_coordinator(self.group, self.coordinator)
        self.event("start", bootstrap=self.kafka.bootstrap_servers, args=vars(a))
        producer = threading.Thread(target=self._produce, name="chaos-producer", daemon=True)
        sampler = threading.Thread(target=self._sample_committed, name="chaos-sampler", daemon=True)
        producer.start()
        sampler.start()
        if a.broker in ("real", "netns"):
            threading.Thread(
                target=self._watch_coordinator, name="chaos-coordinator", daemon=True
            ).start()
        for i in range(a.members):
            self.spawn(f"sdk{i + 1}", "sdk")
        for i in range(a.ck_members):
            self.spawn(f"ck{i + 1}", "ck")

        # Every kind of fault early on, then at random. The chaos lasts --duration and, in a
        # short run, on until every kind ran once (a broker fault waits for the previous one
        # to heal), bounded by OVERTIME_S.
        actions = MEMBER_ACTIONS + BROKER_ACTIONS[a.broker]
        schedule = list(actions)
        self.rng.shuffle(schedule)
        deadline = time.monotonic() + a.duration
        time.sleep(min(5.0, a.duration / 6))  # let the group form
        while time.monotonic() < (deadline + OVERTIME_S if schedule else deadline):
            self.act(self._next_action(schedule, actions))
            pause = self.rng.uniform(a.min_gap, a.max_gap)
            end = deadline + OVERTIME_S if schedule else deadline
            time.sleep(max(min(pause, end - time.monotonic()), 0))
        if schedule:
            self._node_errors.append(f"faults never run: {', '.join(schedule)}")

        # Calm down: no more faults, every member running, producer stopped.
        self.event("chaos_done")
        if self._node_fault is not None:
            self._node_fault.join(180)  # every node back before the end
            if self._node_fault.is_alive():
                self._node_errors.append("a node did not come back within 180 s")
        with self._members_lock:
            for member in list(self.members.values()):
                if member.stopped:
                    self.resume(member)
                if not member.alive():
                    self.spawn(member.name, member.impl)
        self._stop_producing.set()
        producer.join(90)
        ends = self.end_offsets()
        self.event("end_offsets", offsets=ends)
        settle_deadline = time.monotonic() + a.settle_timeout
        while time.monotonic() < settle_deadline:
            latest = self.samples[-1][1] if self.samples else {}
            if all(latest.get(p, -1) >= end for p, end in ends.items()):
                break
            time.sleep(0.5)
        self.event("settled", caught_up=time.monotonic() < settle_deadline)

        with self._members_lock:
            members = list(self.members.values())
        for member in members:
            self.terminate(member)
        time.sleep(a.sample_interval * 1.5)  # one more committed-offset sample after closing
        self._stop_sampling.set()
        sampler.join(10)
        # kept so that a run can be checked again offline (analysis.analyze)
        (self.workdir / "committed_samples.json").write_text(json.dumps(self.samples))
        self.event("done")
        self._log_file.flush()

        member_events = read_member_events(self.workdir / "members")
        summary = analyze(
            member_events,
            read_jsonl(self.workdir / "driver.jsonl"),
            ends,
            list(self.samples),
            session_s=a.session_timeout_ms / 1000,
            close_timeout_s=a.close_timeout,
            acked_by_producer=self.acked,
            overlap_tolerance_s=a.overlap_tolerance,
            heartbeat_interval_s=a.heartbeat_interval_ms / 1000,
        )
        summary.broker = a.broker
        summary.fault_errors = len(self._node_errors)
        summary.examples["fault errors"] = list(self._node_errors)
        return summary


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m consumer_sdk.chaos",
        description="Chaos soak: SDK and confluent-kafka members under kills, pauses, restarts, "
        "coordinator moves and broker outages, with end-to-end delivery checks.",
    )
    p.add_argument(
        "--duration",
        type=float,
        default=600.0,
        help="seconds of chaos (600); at least until every kind of fault ran once",
    )
    p.add_argument(
        "--broker",
        choices=("mock", "real", "netns"),
        default="mock",
        help="mock: a 3-broker EmbeddedKafka (decreed coordinator moves, broker outages); "
        "real: a 3-node Apache Kafka KafkaCluster from --kafka-home / KAFKA_HOME (node stop, "
        "SIGKILL and SIGSTOP); netns: the same Kafka with every broker and member on its own "
        "host (network namespace; needs root), with network faults between hosts (mock)",
    )
    p.add_argument(
        "--kafka-home",
        default=None,
        help="Kafka distribution for --broker real (default: $KAFKA_HOME)",
    )
    p.add_argument("--members", type=int, default=3, help="SDK member processes (3)")
    p.add_argument(
        "--ck-members",
        type=int,
        default=1,
        help="confluent-kafka group.protocol=consumer member processes (1)",
    )
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--brokers", type=int, default=3)
    p.add_argument("--rate", type=float, default=200.0, help="records produced per second")
    p.add_argument("--heartbeat-interval-ms", type=int, default=500)
    p.add_argument("--session-timeout-ms", type=int, default=6000)
    p.add_argument("--close-timeout", type=float, default=10.0)
    p.add_argument("--min-gap", type=float, default=3.0, help="min seconds between faults")
    p.add_argument("--max-gap", type=float, default=7.0, help="max seconds between faults")
    p.add_argument("--sample-interval", type=float, default=1.0)
    p.add_argument("--settle-timeout", type=float, default=90.0)
    p.add_argument("--overlap-tolerance", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--workdir", default=None, help="where logs go (default: a new temp dir)")
    p.add_argument("--json", action="store_true", help="print the summary as JSON too")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "member":
        from consumer_sdk.chaos.member import member_main

        return member_main(argv[1:])
    args = parser().parse_args(argv)
    if args.members < 1 or args.ck_members < 1:
        parser().error("--members and --ck-members must be at least 1")
    if args.broker in ("real", "netns") and args.brokers != 3:
        parser().error("--broker real runs 3 nodes (--brokers 3): node faults need a quorum")
    if args.broker in ("real", "netns") and not (args.kafka_home or os.environ.get("KAFKA_HOME")):
        parser().error(
            "--broker real needs --kafka-home or KAFKA_HOME (an Apache Kafka >= 4.0 distribution)"
        )
    if args.seed is None:
        args.seed = int.from_bytes(os.urandom(4), "big")
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    driver = Driver(args)
    sys.stdout.write(
        f"chaos ({args.broker} broker): {args.duration:.0f}s, {args.members} SDK + "
        f"{args.ck_members} confluent-kafka "
        f"members, seed {args.seed}, logs in {driver.workdir}\n"
    )
    sys.stdout.flush()
    summary = driver.run()
    (driver.workdir / "summary.json").write_text(json.dumps(summary.to_dict(), indent=2))
    sys.stdout.write(summary.format() + "\n")
    if args.json:
        sys.stdout.write(json.dumps(summary.to_dict()) + "\n")
    return 1 if summary.violations else 0
