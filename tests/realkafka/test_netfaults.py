"""Network faults between hosts, on a real 3-node Apache Kafka whose brokers and members run
in their own network namespaces (`consumer_sdk.testing.netns.NetnsCluster`): a member cut
from its group coordinator both ways and one way, a member cut from every broker, and the
coordinator's node cut from the other brokers. Two SDK members and a confluent-kafka
``group.protocol=consumer`` member (the oracle) in the group, each on its own host; records
keep coming during every fault. The chaos checker then checks the logs: nothing lost, no
partition owned twice beyond the zombie bound (a member cut off cannot know it was fenced
before it reaches the coordinator again), only uncommitted work of fenced members redone,
committed offsets never going back, every member back in the group after healing. And the
SDK member cut off hands out no record once a session has passed since its last confirmed
heartbeat (membership.stall).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from consumer_sdk.chaos.analysis import analyze
from consumer_sdk.testing.netns import NetnsCluster, netns_available
from tests.realkafka.test_faults import INTERVAL_S, SESSION_S, Group, Proc

pytestmark = pytest.mark.realkafka

#: Seen once on this bed, at the first rebalance: a confluent-kafka owner's on_revoke (a
#: synchronous commit inside) ended 0.011 s after the next owner's on_assign, i.e. librdkafka
#: released the partition before its callback returned. Not the SDK's; tolerated here.
OVERLAP_TOLERANCE_S = 0.05


def _check(g: Group, ends: dict[int, int]) -> Any:
    """The checker's invariants, except overlaps whose earlier owner is the confluent-kafka
    member: the checker estimates when the broker fenced it from librdkafka's debug trace,
    and a confluent-kafka member fenced while its coordinator's node was cut off has been
    seen reporting on_lost 3.6 s after the SDK member got its partitions (listed, not
    failed: the oracle, not the SDK)."""
    summary = analyze(
        g.events(),
        g.driver_events,
        ends,
        list(g.samples),
        session_s=SESSION_S,
        close_timeout_s=10.0,
        heartbeat_interval_s=INTERVAL_S,
        overlap_tolerance_s=OVERLAP_TOLERANCE_S,
    )
    summary.broker = "real"
    report = summary.format()
    oracle = [x for x in summary.examples.get("overlaps", []) if x.split(": ", 1)[1][:2] == "ck"]
    assert summary.overlaps == len(oracle), report
    violations = {k: v for k, v in summary.violations.items() if k != "overlaps"}
    assert violations == {}, report
    assert summary.duplicates == summary.duplicates_explained + summary.duplicates_librdkafka, (
        report
    )
    if oracle:
        print("overlaps after a confluent-kafka owner:", oracle)
    return summary


#: How long each fault lasts: past the session timeout (members are fenced) and, for the
#: coordinator node's cut, past the broker session (9 s: the controller fences the node).
FAULT_S = {"coord-both": SESSION_S + 3, "coord-one-way": SESSION_S + 3, "isolated": SESSION_S + 3}
FAULT_S["coordinator-cut"] = 12.0


@pytest.fixture(scope="module")
def net() -> Iterator[NetnsCluster]:
    why = netns_available()
    if why is not None:
        pytest.skip(why)
    with NetnsCluster(brokers=3, hosts=("m1", "m2", "m3"), slow_links=True) as bed:
        yield bed


def _records_after(g: Group, victim: Proc, owned: set[int], start: float, end: float) -> int:
    return sum(
        1 for e in g.events(victim) if e["ev"] == "rec" and e["p"] in owned and start < e["t"] < end
    )


def _apply(net: NetnsCluster, fault: str, victim_host: str, coordinator: int) -> None:
    coord_host = net.broker_host(coordinator)
    if fault == "coord-both":
        net.partition(victim_host, coord_host)
    elif fault == "coord-one-way":
        net.partition(victim_host, coord_host, one_way=True)
    elif fault == "isolated":
        net.isolate(victim_host)
    else:  # the coordinator's node cut from the other brokers (members still reach it)
        for node in net.broker_ids:
            if node != coordinator:
                net.partition(coord_host, net.broker_host(node))


def test_network_faults(net: NetnsCluster, tmp_path: Path) -> None:
    results: dict[str, str] = {}
    net.call(lambda: _run(net, tmp_path, results), timeout_s=900)
    print("\n" + "\n".join(f"{k}: {v}" for k, v in results.items()))


def _run(net: NetnsCluster, tmp_path: Path, results: dict[str, str]) -> None:
    g = Group(net, tmp_path, "netfaults")
    try:
        hosts = {"sdk1": "m1", "sdk2": "m2", "ck1": "m3"}
        members = [
            g.spawn(name, name[:-1] if name != "ck1" else "ck", prefix=tuple(net.exec_prefix(h)))
            for name, h in hosts.items()
        ]
        g.produce(300)
        g.wait_balanced(members, timeout=120)
        g.wait_consumed_and_committed()
        stop = threading.Event()

        def produce() -> None:
            while not stop.is_set():
                g.produce(20)
                stop.wait(0.1)

        producer = threading.Thread(target=produce, daemon=True)
        producer.start()
        victim = members[0]
        try:
            for fault, duration in FAULT_S.items():
                coordinator = net.coordinator_for(g.group)
                owned = g.owned(victim)
                t_fault = time.time()
                g.driver_events.append({"t": t_fault, "ev": "net", "fault": fault})
                _apply(net, fault, "m1", coordinator)
                time.sleep(duration)
                net.heal()
                t_heal = time.time()
                g.wait_balanced(members, timeout=120)
                lost = [e for e in g.events(victim) if e["ev"] == "lost" and e["t"] > t_fault]
                again = min(
                    (
                        e["t"]
                        for e in g.events(victim)
                        if e["ev"] == "assign" and e["t"] > t_fault and set(e["parts"]) & owned
                    ),
                    default=float("inf"),
                )
                end = min([again, *(e["t"] for e in lost)], default=again)
                zombie = _records_after(g, victim, owned, t_fault + SESSION_S + INTERVAL_S, end)
                results[fault] = (
                    f"coordinator node {coordinator}; sdk1 owned {sorted(owned)}; on_lost "
                    f"{'yes' if lost else 'no'}; records handed out past the session bound "
                    f"before healing: {zombie}; back in {time.time() - t_heal:.1f}s after heal; "
                    f"coordinator then {net.coordinator_for(g.group)}"
                )
                if fault != "coordinator-cut":
                    assert zombie == 0, results[fault]
        finally:
            stop.set()
            producer.join(60)
        ends = g.wait_consumed_and_committed(timeout=180)
        assert all(p.alive() for p in members), g.stderr()
        g.close()
        summary = _check(g, ends)
        results["checker"] = summary.format().replace("\n", "; ")
    finally:
        g.close()


def test_slow_link_and_connection_resets(net: NetnsCluster, tmp_path: Path) -> None:
    """An SDK member that reaches every broker through the fault-injecting proxy
    (`NetnsCluster.slow_bootstrap_servers`), another SDK member and a confluent-kafka member
    directly: the coordinator's link slowed by 1 s each way for 10 s, then every connection
    to it reset. Heartbeats are answered late but within the session: the SDK member is not
    fenced and gets no callback, records keep coming; the checker's invariants hold."""
    results: dict[str, str] = {}
    net.call(lambda: _run_slow(net, tmp_path, results), timeout_s=600)
    print("\n" + "\n".join(f"{k}: {v}" for k, v in results.items()))


def _run_slow(net: NetnsCluster, tmp_path: Path, results: dict[str, str]) -> None:
    g = Group(net, tmp_path, "slowlink")
    try:
        slow = net.slow_bootstrap_servers
        members = [
            g.spawn("sdk1", "sdk", prefix=tuple(net.exec_prefix("m1")), bootstrap=slow),
            g.spawn("sdk2", "sdk", prefix=tuple(net.exec_prefix("m2"))),
            # direct: through the slowed proxy librdkafka itself is sometimes fenced
            # (docs/reliability.md), which is not what this test checks
            g.spawn("ck1", "ck", prefix=tuple(net.exec_prefix("m3"))),
        ]
        g.produce(300)
        g.wait_balanced(members, timeout=120)
        g.wait_consumed_and_committed()
        coordinator = net.coordinator_for(g.group)
        t_fault = time.time()
        net.slow(coordinator, 1.0)
        g.produce(200)
        time.sleep(10.0)
        during = {
            p.name: sum(
                1 for e in g.events(p) if e["ev"] == "rec" and t_fault + 1 < e["t"] <= time.time()
            )
            for p in members
        }
        net.reset(coordinator)
        net.heal()
        g.produce(100)
        ends = g.wait_consumed_and_committed(timeout=120)
        callbacks = [
            (e["inc"], e["ev"])
            for e in g.events()
            if e["ev"] in ("revoke", "lost") and e["t"] > t_fault
        ]
        results["slow 1 s + reset"] = (
            f"coordinator node {coordinator}; records processed while slow {during}; "
            f"callbacks after the fault {callbacks}"
        )
        assert not [c for c in callbacks if c[0].startswith("sdk1")], results
        assert all(p.alive() for p in members), g.stderr()
        g.close()
        try:
            summary = _check(g, ends)
        finally:
            print("\n".join(f"{k}: {v}" for k, v in results.items()))
        results["checker"] = summary.format().replace("\n", "; ")
    finally:
        g.close()
