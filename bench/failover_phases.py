"""Where a coordinator failover's time goes: this SDK vs confluent-kafka, phase by phase.

    python -m bench.failover_phases --pairs N [--fault stop|kill] [--only sdk|confluent]
                                    [--members 5] [--partitions 20] [--out F.json]

One real 3-node Apache Kafka (``KafkaCluster``, ``KAFKA_HOME``; heartbeat interval 500 ms,
session 3 s, as bench/convergence.py). Each run is the failover step of
`bench.convergence.run_scenarios` alone, in its earlier shape (run_scenarios now lets the
new member subscribe at a random moment after the fault): ``--members`` members own
``--partitions`` partitions, a new member subscribes and at that moment the group
coordinator's node gets a controlled shutdown (in a thread; ``--fault kill``: SIGKILL); the
node is started again afterwards. The SDK and confluent-kafka (``group.protocol=consumer``)
alternate, in interleaved order.

Every member is traced on one wall clock: the SDK through `MemberNetwork.heartbeat_trace` and
its FindCoordinator answers; librdkafka through its ``debug=cgrp,consumer`` lines on stderr.
Per run it prints, in ms from the fault's start (min..max over members):

- ``err``: the first failed heartbeat (NOT_COORDINATOR, transport, timeout);
- ``fc``: the FindCoordinator answer naming the new coordinator (and how many answered an
  error first, COORDINATOR_NOT_AVAILABLE and such);
- ``hb``: the first heartbeat answered without error after that (and the number of
  COORDINATOR_LOAD_IN_PROGRESS answers on the way);
- ``found->sent``: from that FindCoordinator answer to the first heartbeat sent to the new
  node (backoff left from failures at the old one);
- ``cb``: from the heartbeat answer that brought the new member its partitions to its
  ``on_assign`` (the application thread's reaction time);
- ``join``: the new member's first assignment; ``conv``: the assignment complete and
  exclusive again (what bench/convergence.py measures).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._member_proc import ownership_callbacks

HEARTBEAT_MS, SESSION_MS = 500, 3000


# -- member process ---------------------------------------------------------------------------


def _member(
    kind: str, bootstrap: str, group: str, topic: str, log_file: str, sync: str = ""
) -> None:
    """One member; JSON lines on stdout: constructed, ready, owned, and (SDK) hb / fc trace
    events. ``sync``: subscribe only on a "subscribe" line from stdin (as the convergence
    benchmark's members do: members started together subscribe together), else at once."""
    lock = threading.Lock()

    def emit(event: dict[str, Any]) -> None:
        event.setdefault("at", time.time())
        with lock:
            sys.stdout.write(json.dumps(event) + "\n")
            sys.stdout.flush()

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
    }
    on_assign, on_revoke = ownership_callbacks(emit)
    consumer: Any
    if kind == "sdk":
        if log_file:
            fmt = "%(created).3f %(name)s %(levelname)s %(message)s"
            logging.basicConfig(filename=log_file, level=logging.DEBUG, format=fmt)
        from consumer_sdk import Consumer
        from consumer_sdk.runtime.driver import Api
        from consumer_sdk.runtime.member_network import MemberNetwork

        original = MemberNetwork._on_outcome

        def on_outcome(self: Any, request: Any, result: Any, error: Any) -> None:
            if request.api is Api.FIND_COORDINATOR:
                if error is not None:
                    emit({"ev": "fc", "fail": f"{type(error).__name__}: {error}"})
                else:
                    emit({"ev": "fc", "node": result.node_id, "err": result.error_code})
            original(self, request, result, error)

        MemberNetwork._on_outcome = on_outcome  # type: ignore[method-assign]
        consumer = Consumer(conf)
        net = consumer._net

        def traced(request: Any, sent: float, response: Any, error: Any) -> None:
            known = net.coordinator.coordinator
            event: dict[str, Any] = {
                "ev": "hb",
                "sent": sent,
                "node": None if known is None else known.node_id,
            }
            if error is not None:
                event["fail"] = f"{type(error).__name__}: {error}"
            else:
                event["err"] = response.error_code
            emit(event)

        net.heartbeat_trace = traced
    else:
        import confluent_kafka

        consumer = confluent_kafka.Consumer(
            {**conf, "group.protocol": "consumer", "debug": "cgrp,consumer"}
        )
    emit({"ev": "constructed"})
    if sync and sys.stdin.readline().strip() != "subscribe":
        consumer.close()
        return
    consumer.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
    emit({"ev": "ready"})
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.is_set():
        consumer.poll(0.05)
    consumer.close()


# -- librdkafka's debug lines -----------------------------------------------------------------

_RDK_LINE = re.compile(r"^%\d\|(\d+\.\d+)\|(\w+)\|[^|]*\| (.*)$")
_RDK_HB_SENT = re.compile(r"/(\d+): ConsumerGroupHeartbeat of member id")
_RDK_COORD = re.compile(r"coordinator is \S+ id (-?\d+)")
_RDK_FC_ERR = re.compile(r"FindCoordinator response error: (\w+)")
_RDK_HB_FAIL = re.compile(r"ConsumerGroupHeartbeat failed due to (?:coordinator \([^)]*\) )?(.*)")


def _librdkafka_events(path: Path) -> list[dict[str, Any]]:
    """hb / fc events (the SDK members' shape) from one librdkafka stderr log."""
    events: list[dict[str, Any]] = []
    sent: tuple[float, int] | None = None
    for line in path.read_text(errors="replace").splitlines():
        match = _RDK_LINE.match(line)
        if not match:
            continue
        at, text = float(match.group(1)), match.group(3)
        if hb := _RDK_HB_SENT.search(text):
            sent = (at, int(hb.group(1)))
        elif "ConsumerGroupHeartbeat response received" in text and sent is not None:
            events.append({"ev": "hb", "sent": sent[0], "node": sent[1], "err": 0, "at": at})
            sent = None
        elif (fail := _RDK_HB_FAIL.search(text)) and sent is not None:
            reason = fail.group(1)
            code = 14 if "loading in progress" in reason else None
            event = {"ev": "hb", "sent": sent[0], "node": sent[1], "at": at}
            if code is not None:
                event["err"] = code
            elif "Broker: Not coordinator" in reason:
                event["err"] = 16
            elif "Coordinator not available" in reason:
                event["err"] = 15
            else:
                event["fail"] = reason
            events.append(event)
            sent = None
        elif coord := _RDK_COORD.search(text):
            events.append({"ev": "fc", "node": int(coord.group(1)), "err": 0, "at": at})
        elif fc_err := _RDK_FC_ERR.search(text):
            events.append({"ev": "fc", "node": -1, "err": fc_err.group(1), "at": at})
        elif "querying for coordinator" in text:
            events.append({"ev": "fc_sent", "at": at, "why": text.split(": ")[-1]})
    return events


def settle() -> None:
    """Wait 1.5-2 s: the next step starts at a random phase of the heartbeat timers."""
    time.sleep(1.5 + (time.time() % 0.5))


# -- one run ----------------------------------------------------------------------------------


@dataclass
class _Proc:
    popen: subprocess.Popen[str]
    stderr_path: Path
    events: list[dict[str, Any]] = field(default_factory=list)
    owned: set[int] = field(default_factory=set)
    ready: threading.Event = field(default_factory=threading.Event)
    constructed: threading.Event = field(default_factory=threading.Event)


class _Run:
    def __init__(self, kind: str, kafka: Any, partitions: int, workdir: Path) -> None:
        self.kind, self.kafka, self.partitions, self.workdir = kind, kafka, partitions, workdir
        self.topic = f"fo-{kind}-{uuid.uuid4().hex[:6]}"
        self.group = f"fo-{kind}-{uuid.uuid4().hex[:6]}"
        self.procs: list[_Proc] = []
        self.lock = threading.Lock()
        kafka.create_topic(self.topic, partitions=partitions)

    def spawn(self, n: int, sdk_logs: bool, sync: bool = False) -> list[_Proc]:
        """``n`` member processes; with ``sync`` they wait for `subscribe`."""
        new = []
        for _ in range(n):
            i = len(self.procs)
            err_path = self.workdir / f"{self.group}-{i}.stderr"
            log_file = str(self.workdir / f"{self.group}-{i}.log") if sdk_logs else ""
            with open(err_path, "w") as err:
                popen = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "bench.failover_phases",
                        "member",
                        self.kind,
                        self.kafka.bootstrap_servers,
                        self.group,
                        self.topic,
                        log_file,
                        "sync" if sync else "",
                    ],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=err,
                    text=True,
                    cwd=Path(__file__).resolve().parent.parent,
                )
            proc = _Proc(popen, err_path)
            threading.Thread(target=self._read, args=(proc,), daemon=True).start()
            self.procs.append(proc)
            new.append(proc)
        return new

    def _read(self, proc: _Proc) -> None:
        assert proc.popen.stdout is not None
        for line in proc.popen.stdout:
            event: dict[str, Any] = json.loads(line)
            with self.lock:
                proc.events.append(event)
                if event["ev"] == "ready":
                    proc.ready.set()
                elif event["ev"] == "constructed":
                    proc.constructed.set()
                elif event["ev"] == "owned":
                    proc.owned = set(event["owned"])

    def subscribe(self, procs: list[_Proc]) -> None:
        """Subscribe members spawned with ``sync``, once all are constructed, at once."""
        for p in procs:
            if not p.constructed.wait(60):
                raise TimeoutError("a member process did not start")
        for p in procs:
            assert p.popen.stdin is not None
            p.popen.stdin.write("subscribe\n")
            p.popen.stdin.flush()

    def converged(self) -> bool:
        with self.lock:
            owned = [x for p in self.procs for x in p.owned]
            return sorted(owned) == list(range(self.partitions)) and all(
                p.owned for p in self.procs
            )

    def wait_converged(self, timeout: float = 120.0) -> float:
        deadline = time.monotonic() + timeout
        while not self.converged():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.kind}: no convergence within {timeout:.0f}s")
            time.sleep(0.005)
        return time.time()

    def close(self) -> None:
        for p in self.procs:
            if p.popen.stdin and not p.popen.stdin.closed:
                with contextlib.suppress(BrokenPipeError):
                    p.popen.stdin.close()
        for p in self.procs:
            try:
                p.popen.wait(20)
            except subprocess.TimeoutExpired:
                p.popen.kill()
                p.popen.wait(5)


def _phases(run: _Run, t0: float, old_node: int, joiner: _Proc, t_conv: float) -> dict[str, Any]:
    """Per-phase times (ms from ``t0``) from every member's events."""

    def ms(t: float | None) -> float | None:
        return None if t is None else round((t - t0) * 1000, 1)

    first_err, fc_ok, hb_ok = [], [], []
    timelines: list[list[dict[str, Any]]] = []
    gaps: list[float] = []  # the new coordinator found -> the first heartbeat sent to it
    fc_errors = load_retries = hb_fails = 0
    reasons: dict[str, int] = {}
    for proc in run.procs:
        if run.kind == "sdk":
            with run.lock:
                events = list(proc.events)
        else:
            events = _librdkafka_events(proc.stderr_path)
        after = [e for e in events if e["at"] >= t0]
        timelines.append(
            [
                {**e, "at": ms(e["at"]), **({"sent": ms(e["sent"])} if "sent" in e else {})}
                for e in events
                if e["at"] >= t0 - 1.0
            ]
        )
        err_at = fc_at = ok_at = gap_at = None
        for e in after:
            if (
                fc_at is not None
                and gap_at is None
                and e["ev"] == "hb"
                and e.get("node") not in (None, old_node)
                and e["sent"] >= fc_at
            ):
                gap_at = e["sent"]
            if e["ev"] == "hb" and (e.get("fail") or e.get("err")):
                hb_fails += 1
                why = e.get("fail") or str(e.get("err"))
                why = {
                    "14": "LOAD_IN_PROGRESS",
                    "15": "COORD_NOT_AVAILABLE",
                    "16": "NOT_COORDINATOR",
                }.get(why, why[:60])
                reasons[why] = reasons.get(why, 0) + 1
                if e.get("err") == 14:
                    load_retries += 1
                if err_at is None:
                    err_at = e["at"]
            elif e["ev"] == "fc":
                if e.get("err") == 0 and e.get("node") != old_node:
                    fc_at = fc_at or e["at"]
                elif e.get("err") != 0 or e.get("fail"):
                    fc_errors += 1
            elif (
                e["ev"] == "hb"
                and e.get("err") == 0
                and ok_at is None
                and (err_at is not None or e.get("node") not in (None, old_node))
            ):
                ok_at = e["at"]
        if err_at is not None:
            first_err.append(ms(err_at))
        if fc_at is not None:
            fc_ok.append(ms(fc_at))
        if ok_at is not None:
            hb_ok.append(ms(ok_at))
        if gap_at is not None and fc_at is not None:
            gaps.append(round((gap_at - fc_at) * 1000, 1))
    joined = next(
        (e["at"] for e in joiner.events if e["ev"] == "owned" and e["owned"] and e["at"] >= t0),
        None,
    )
    # From the heartbeat answer that brought the new member its partitions to its on_assign.
    answers = [
        e["at"] for e in timelines[run.procs.index(joiner)] if e["ev"] == "hb" and e.get("err") == 0
    ]
    joined_ms = ms(joined)
    # The new member's subscribe() and its join heartbeat (the first one sent after it).
    subscribed = ms(next((e["at"] for e in joiner.events if e["ev"] == "ready"), None))
    join_sent = min(
        (
            e["sent"]
            for e in timelines[run.procs.index(joiner)]
            if e["ev"] == "hb" and subscribed is not None and e["sent"] >= subscribed
        ),
        default=None,
    )
    before = [a for a in answers if joined_ms is not None and a <= joined_ms]
    callback = round(joined_ms - before[-1], 1) if joined_ms is not None and before else None
    return {
        "err": first_err,
        "fc": fc_ok,
        "hb": hb_ok,
        "join": ms(joined),
        "subscribed": subscribed,
        "join_sent": join_sent,
        "conv": ms(t_conv),
        "callback": callback,
        "gap": gaps,
        "fc_errors": fc_errors,
        "load_retries": load_retries,
        "hb_fails": hb_fails,
        "reasons": reasons,
        "timelines": timelines,
    }


def run_once(
    kind: str,
    kafka: Any,
    members: int,
    partitions: int,
    workdir: Path,
    sdk_logs: bool,
    fault: str = "stop",
    join_after: float | None = None,
) -> dict[str, Any]:
    """The failover step once for ``kind``; the stopped node is started again after.
    ``join_after`` (s): the new member subscribes that long after the fault begins (the
    convergence benchmark's step), else (None) as it begins."""
    run = _Run(kind, kafka, partitions, workdir)
    try:
        first = run.spawn(members, sdk_logs)
        for p in first:
            if not p.ready.wait(60):
                raise TimeoutError("members did not start")
        run.wait_converged()
        settle()
        old = kafka.coordinator_for(run.group)
        (joiner,) = run.spawn(1, sdk_logs, sync=join_after is not None)
        if join_after is None and not joiner.ready.wait(60):
            raise TimeoutError("the new member did not start")
        if join_after is not None and not joiner.constructed.wait(60):
            raise TimeoutError("the new member did not start")
        t0 = time.time()
        action = kafka.stop_node if fault == "stop" else kafka.kill_node
        stopper = threading.Thread(target=action, args=(old,), daemon=True)
        stopper.start()
        if join_after is not None:  # bench/convergence.py's shape: a moment after the fault
            time.sleep(max(t0 + join_after - time.time(), 0.0))
            run.subscribe([joiner])
        t_conv = run.wait_converged()
        time.sleep(1.0)  # late events (answers in flight)
        out = _phases(run, t0, old, joiner, t_conv)
        out["old_node"] = old
        stopper.join(120)
        out["stop_s"] = round(time.time() - t0, 1)
    finally:
        run.close()
    kafka.start_node(old)
    return out


def _span(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{min(values):.0f}..{max(values):.0f}"


def _line(kind: str, r: dict[str, Any]) -> str:
    return (
        f"{kind:<9} conv {r['conv']:7.0f}  join {r['join'] or -1:7.0f}"
        f"  (subscribed {r['subscribed']}, join sent {r['join_sent']})"
        f"  err {_span(r['err']):>11}"
        f"  fc {_span(r['fc']):>11} ({r['fc_errors']} err)  hb {_span(r['hb']):>11}"
        f"  ({r['load_retries']} load)  found->sent {_span(r['gap'])}  cb {r['callback']}"
        f"  {r['reasons']}"
    )


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "member":
        _member(*args[1:7])
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.failover_phases")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--members", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=20)
    parser.add_argument("--only", choices=("sdk", "confluent"))
    parser.add_argument(
        "--fault",
        choices=("stop", "kill"),
        default="stop",
        help="the coordinator's node: controlled shutdown (the benchmark's) or SIGKILL",
    )
    parser.add_argument(
        "--join",
        choices=("fault", "random"),
        default="fault",
        help="the new member subscribes as the fault begins, or (as bench/convergence.py "
        "does) at a random moment of the heartbeat interval after it, the same in a pair",
    )
    parser.add_argument("--sdk-logs", action="store_true", help="SDK members log at DEBUG")
    parser.add_argument("--workdir", help="keep the members' logs here")
    parser.add_argument("--out", help="write every run's phases here (JSON)")
    ns = parser.parse_args(args)
    from consumer_sdk.testing import KafkaCluster

    workdir = Path(ns.workdir or tempfile.mkdtemp(prefix="failover-phases-"))
    workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, list[dict[str, Any]]] = {"sdk": [], "confluent": []}
    with KafkaCluster(
        nodes=3, heartbeat_interval_ms=HEARTBEAT_MS, session_timeout_ms=SESSION_MS
    ) as kafka:
        rng = random.Random(0)
        for i in range(ns.pairs):
            kinds = ("sdk", "confluent") if i % 2 == 0 else ("confluent", "sdk")
            join_after = rng.uniform(0.0, HEARTBEAT_MS / 1000) if ns.join == "random" else None
            for kind in kinds:
                if ns.only and kind != ns.only:
                    continue
                r = run_once(
                    kind,
                    kafka,
                    ns.members,
                    ns.partitions,
                    workdir,
                    ns.sdk_logs,
                    ns.fault,
                    join_after,
                )
                results[kind].append(r)
                print(_line(kind, r), flush=True)
    print(f"logs: {workdir}")
    for kind, runs in results.items():
        if not runs:
            continue
        row = {
            k: statistics.mean([r[k] for r in runs if r[k] is not None] or [float("nan")])
            for k in ("conv", "join", "callback")
        }
        for k in ("err", "fc", "hb", "gap"):
            maxes = [max(r[k]) for r in runs if r[k]]
            row[f"{k}_last"] = statistics.mean(maxes) if maxes else float("nan")
        print(
            f"{kind:<9} mean over {len(runs)}: conv {row['conv']:.0f} ms, join {row['join']:.0f}"
            f", answer->on_assign {row['callback']:.0f}, last member's first error "
            f"{row['err_last']:.0f}, new coordinator found "
            f"{row['fc_last']:.0f}, answered there {row['hb_last']:.0f}, longest wait from "
            f"found to sent {row['gap_last']:.0f}"
        )
    if results["sdk"] and results["confluent"]:
        sdk = statistics.mean(r["conv"] for r in results["sdk"])
        ck = statistics.mean(r["conv"] for r in results["confluent"])
        print(f"failover convergence sdk/confluent = {sdk / ck:.2f} (means, {ns.pairs} pairs)")
    if ns.out:
        Path(ns.out).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
