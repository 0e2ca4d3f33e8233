"""Random interleavings of responses, errors, timeouts and application calls (hypothesis).

Two or three members share a scripted coordinator. After every step the cluster checks:

- no IllegalTransition escapes (it would raise out of the step);
- a live member never holds, with its ASSIGNED callback done, a partition that the
  coordinator has given to another member;
- every ack (TopicPartitions non-null) is the member's current, reconciled assignment, made of
  partitions whose ASSIGNED callback completed;
- FATAL is terminal: no heartbeat after it, and the member never leaves it.

Afterwards the faults stop, and every member that still wants to be in the group must settle
in STABLE with the partitions spread without overlap.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumer_sdk.membership import CloseOption, MemberState

from .cluster import Cluster, Member
from .coordinator import ScriptedCoordinator

S = MemberState

OUTCOMES = [
    "answer",
    "answer",
    "answer",
    "lost",
    "drop",
    "NOT_COORDINATOR",
    "COORDINATOR_NOT_AVAILABLE",
    "COORDINATOR_LOAD_IN_PROGRESS",
    "FENCED_MEMBER_EPOCH",
    "UNKNOWN_MEMBER_ID",
    "TOPIC_AUTHORIZATION_FAILED",
    "GROUP_AUTHORIZATION_FAILED",
]
ACTIONS = [
    "settle",
    "settle",
    "settle",
    "advance",
    "advance",
    "bg_poll",
    "bg_poll",
    "bg_poll",
    "deliver",
    "deliver",
    "deliver",
    "deliver",
    "app_poll",
    "app_poll",
    "callback",
    "callback",
    "commit",
    "metadata",
    "coordinator",
    "tick",
    "subscribe",
    "unsubscribe",
    "close",
    "add_topic",
]
SUBSCRIPTIONS: list[tuple[tuple[str, ...], str | None]] = [
    (("t1",), None),
    (("t1", "t2"), None),
    ((), "t.*"),
]


def _step(c: Cluster, data: st.DataObject, members: list[Member], closed: set[str]) -> None:
    action = data.draw(st.sampled_from(ACTIONS), label="action")
    m = members[data.draw(st.integers(0, len(members) - 1), label="member")]
    if action == "settle":
        # A fault-free stretch: brings members to STABLE, so faults hit every state.
        c.settle(rounds=data.draw(st.integers(1, 8), label="rounds"), step_ms=100)
    elif action == "advance":
        c.advance(data.draw(st.sampled_from([0, 10, 100, 1000, 5000, 25_000]), label="ms"))
    elif action == "bg_poll":
        if data.draw(st.booleans(), label="wait until due?"):
            c.advance(min(m.core.time_until_next_poll(c.now), 5000))
        c.background_poll(m)
    elif action == "deliver":
        busy = [x for x in members if x.in_flight]
        if busy:
            target = busy[data.draw(st.integers(0, len(busy) - 1), label="busy member")]
            c.deliver(target, data.draw(st.sampled_from(OUTCOMES), label="outcome"))
    elif action == "app_poll":
        c.app_poll(m)
    elif action == "callback":
        c.run_callback(m, data.draw(st.sampled_from([None, None, None, "boom"]), label="error"))
    elif action == "commit":
        c.complete_commit(m, data.draw(st.sampled_from([None, "failed"]), label="error"))
    elif action == "metadata":
        c.metadata(m)
    elif action == "coordinator":
        c.coordinator_found(m)
    elif action == "tick":
        c.tick()
    elif action == "subscribe" and m.name not in closed:
        topics, pattern = data.draw(st.sampled_from(SUBSCRIPTIONS), label="subscription")
        c._sync(m).subscribe(*topics, pattern=pattern)
    elif action == "unsubscribe" and m.name not in closed:
        c._sync(m).unsubscribe()
    elif action == "close" and m.name not in closed and data.draw(st.booleans(), label="close?"):
        c._sync(m).close(data.draw(st.sampled_from(list(CloseOption)), label="option"))
        closed.add(m.name)
    elif action == "add_topic" and len(c.coordinator.topics) < 4:
        c.coordinator.add_topic(f"t{len(c.coordinator.topics) + 1}", 2)
    c.check()


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_random_interleavings_keep_the_invariants(data: st.DataObject) -> None:
    interval = data.draw(st.sampled_from([100, 1000, 5000]), label="interval")
    c = Cluster(ScriptedCoordinator({"t1": 4, "t2": 2}, heartbeat_interval_ms=interval))
    count = data.draw(st.integers(2, 3), label="members")
    auto_commit = data.draw(st.booleans(), label="auto_commit")
    static = data.draw(st.booleans(), label="static")
    members = []
    for i in range(count):
        topics, pattern = data.draw(st.sampled_from(SUBSCRIPTIONS), label="subscription")
        members.append(
            c.add(
                "abc"[i],
                *topics,
                pattern=pattern,
                auto_commit=auto_commit,
                rebalance_timeout_ms=20_000,
                group_instance_id=f"inst-{i}" if static else None,
            )
        )
    closed: set[str] = set()
    for _ in range(data.draw(st.integers(20, 100), label="steps")):
        _step(c, data, members, closed)

    # Faults stop: whoever still wants to be in the group gets there, without overlap.
    for m in members:
        while m.in_flight:
            c.deliver(m)
    # Long enough for a departed static member's session (45 s) to expire and the group to
    # rebalance after it.
    c.settle(rounds=80, step_ms=1000)
    owners: dict[tuple[str, int], str] = {}
    for m in members:
        state = m.core.state
        wants_group = m.name not in closed and m.core._manager.subscription_fields is not None
        if state is S.FATAL or not wants_group:
            continue
        assert state is S.STABLE, (m.name, state)
        for tp in m.core.fetchable_partitions:
            assert tp not in owners, (tp, owners.get(tp), m.name)
            owners[tp] = m.name
