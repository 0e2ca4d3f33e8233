"""Stalls and crash-restarts on the real broker (the session-wide single node, session 6 s):

- a member SIGSTOPped past the session timeout hands the application no record of the
  partitions it lost once it resumes (zombie records), as the confluent-kafka member in the
  same group (the oracle) does not;
- a static member SIGKILLed and restarted at once is refused with UNRELEASED_INSTANCE_ID
  until the broker expires its old incarnation, retries meanwhile, and rejoins without a
  fatal error; a second live member with the same instance id still ends fatal, and the
  incumbent is not disturbed.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from consumer_sdk import Consumer
from consumer_sdk.testing import wait_until
from tests.realkafka.test_faults import INTERVAL_S, SESSION_S, Group, Proc

pytestmark = pytest.mark.realkafka

#: Freezes per member kind (ZOMBIE_FREEZES=12 reproduces the issue's 12-freeze measurement).
FREEZES = int(os.environ.get("ZOMBIE_FREEZES", "2"))


@pytest.fixture
def group(real_kafka: Any, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Group]:
    g = Group(real_kafka, tmp_path, request.node.name.split("[")[0].replace("test_", "")[:20])
    try:
        yield g
    finally:
        g.close()


def test_the_sdk_learns_the_groups_session_timeout(real_kafka: Any) -> None:
    """DescribeConfigs of the group: the bound of the zombie-record gate is the broker's."""
    topic = f"st-{os.urandom(3).hex()}"
    real_kafka.create_topic(topic, partitions=1)
    c = Consumer({"bootstrap.servers": real_kafka.bootstrap_servers, "group.id": f"{topic}-g"})
    try:
        c.subscribe([topic])
        wait_until(lambda: c.poll(0.1) is None and c.assignment(), 60, 0.0, "an assignment")
        wait_until(lambda: c._net.core.session_timeout_ms == 6000, 10, 0.1, "session 6000 ms")
    finally:
        c.close()


def _zombie_records(g: Group, victim: Proc, owned: set[int], t_cont: float) -> int:
    """Records of ``owned`` the victim handed out after SIGCONT and before it was assigned
    the partition again."""
    events = g.events(victim)
    again: dict[int, float] = {}
    for e in events:
        if e["ev"] == "assign" and e["t"] > t_cont:
            for p in e["parts"]:
                again.setdefault(p, e["t"])
    return sum(
        1
        for e in events
        if e["ev"] == "rec"
        and e["t"] > t_cont
        and e["p"] in owned
        and e["t"] < again.get(e["p"], float("inf"))
    )


def _freeze_each(
    g: Group, members: list[Proc], victims: list[Proc], freezes: int = FREEZES
) -> dict[str, list[int]]:
    """With records produced throughout, SIGSTOP each victim ``freezes`` times for the session +
    2 s (the others take its partitions), SIGCONT it and wait for its ``on_lost`` and the
    group balanced again; the zombie records of each freeze, per member kind. Then every
    record processed and committed, every member alive, and the chaos checker's invariants
    (nothing lost, no overlap, only redone work duplicated, commits never back)."""
    g.produce(300)
    g.wait_balanced(members)
    g.wait_consumed_and_committed()
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            g.produce(20)
            stop.wait(0.05)

    producer = threading.Thread(target=produce, daemon=True)
    producer.start()
    zombies: dict[str, list[int]] = {v.impl: [] for v in victims}
    try:
        for _ in range(freezes):
            for victim in victims:
                owned = g.owned(victim)
                assert owned
                t_stop = g.pause(victim)
                g.wait_balanced([p for p in members if p is not victim], timeout=90)
                time.sleep(max(t_stop + SESSION_S + 2.0 - time.time(), 0))
                t_cont = g.resume(victim)
                wait_until(
                    lambda v=victim, t=t_cont: [  # type: ignore[misc]
                        e for e in g.events(v) if e["ev"] == "lost" and e["t"] > t
                    ],
                    30,
                    0.1,
                    f"{victim.name}: on_lost after SIGCONT",
                )
                g.wait_balanced(members, timeout=90)
                time.sleep(2 * INTERVAL_S)  # records it would hand out keep coming meanwhile
                zombies[victim.impl].append(_zombie_records(g, victim, owned, t_cont))
    finally:
        stop.set()
        producer.join(60)
    ends = g.wait_consumed_and_committed()
    assert all(p.alive() for p in members), g.stderr()
    g.close()
    summary = g.check(ends)
    print(f"\nzombie records after {freezes} freezes each: {zombies}; {summary.duplicates} redone")
    return zombies


def test_no_zombie_records_after_a_stall_past_the_session(group: Group) -> None:
    """An SDK member and a confluent-kafka member, each frozen past the session while records
    keep coming (`_freeze_each`): after SIGCONT neither hands out a record of the partitions
    the others took meanwhile (the SDK holds records back until a heartbeat answer confirms
    its membership; this one reports it fenced)."""
    members = [group.spawn("sdk1", "sdk"), group.spawn("sdk2", "sdk"), group.spawn("ck1", "ck")]
    zombies = _freeze_each(group, members, [members[0], members[2]])
    assert zombies["sdk"] == [0] * FREEZES, zombies


def test_asyncio_faces_fenced_by_a_stall_lose_their_partitions_and_rejoin(group: Group) -> None:
    """The asyncio faces on the real broker, in one group with a sync SDK member:
    `consumer_sdk.aio.AIOConsumer` and confluent-kafka's ``AIOConsumer`` (the oracle), each
    frozen past the session (`_freeze_each`): each learns it was fenced (its ``on_lost``
    coroutine runs) and rejoins, the SDK's hands out no record of the partitions it lost,
    and the group's invariants hold (its ``on_revoke`` coroutines commit on the hand-overs)."""
    aio = "tests.realkafka.aio_member"
    members = [
        group.spawn("aio1", "aio", module=aio),
        group.spawn("sdk1", "sdk"),
        group.spawn("ckaio1", "ckaio", module=aio),
    ]
    zombies = _freeze_each(group, members, [members[0], members[2]], freezes=1)
    assert zombies["aio"] == [0], zombies


def test_static_member_killed_and_restarted_at_once_rejoins(group: Group) -> None:
    """kill -9 of a static SDK member and an immediate restart with the same
    group.instance.id: the joins are refused (UNRELEASED_INSTANCE_ID) until the broker
    expires the old incarnation, then it is in the group again, without a fatal error,
    within about one session timeout of the kill."""
    g = group
    g.produce(120)
    static = ("--instance-id", "inst-1")
    first = g.spawn("s1", "sdk", static)
    ck = g.spawn("ck1", "ck")
    g.wait_balanced([first, ck])
    g.wait_consumed_and_committed()
    old = g.owned(first)
    t_kill = g.kill(first)
    second = g.spawn("s1", "sdk", static)
    t_assigned = wait_until(
        lambda: next(
            (e["t"] for e in g.events(second) if e["ev"] == "assign" and e["parts"]), None
        ),
        SESSION_S + 30,
        0.1,
        "the restarted static member assigned again",
    )
    assert second.alive(), g.stderr()
    errors = [e for e in g.events(second) if e["ev"] == "error"]
    assert not errors, errors
    g.produce(60)
    g.wait_balanced([second, ck])
    ends = g.wait_consumed_and_committed()
    new = g.owned(second)
    g.close()
    g.check(ends)
    took = t_assigned - t_kill
    print(
        f"\nstatic member kill -9 + restart: assigned again {took:.2f}s after the kill "
        f"(session {SESSION_S}s); partitions before {sorted(old)}, after {sorted(new)}"
    )
    assert took <= SESSION_S + 10, took


def test_live_duplicate_instance_id_still_ends_fatal(group: Group) -> None:
    """A second live member with a taken group.instance.id retries for the session timeout
    plus a margin, then fails fatally saying why; the incumbent keeps its partitions and
    gets no callback."""
    g = group
    g.produce(60)
    static = ("--instance-id", "inst-dup")
    incumbent = g.spawn("s1", "sdk", static)
    g.wait_balanced([incumbent])
    t_dup = time.time()
    duplicate = g.spawn("s2", "sdk", static)
    code = duplicate.popen.wait(SESSION_S + 30)
    assert code == 3, g.stderr()  # the chaos member's exit status for a fatal error
    [fatal] = [e for e in g.events(duplicate) if e["ev"] == "error" and e["fatal"]]
    assert "UNRELEASED_INSTANCE_ID" in fatal["error"] or "111" in fatal["error"], fatal
    assert "still in use by a live member" in fatal["error"], fatal
    took = fatal["t"] - t_dup
    assert took >= SESSION_S, took  # retried first
    callbacks = [e for e in g.events(incumbent) if e["ev"] in ("revoke", "lost") and e["t"] > t_dup]
    assert not callbacks and incumbent.alive(), callbacks
    print(f"\nlive duplicate: fatal after {took:.2f}s: {fatal['error']}")
