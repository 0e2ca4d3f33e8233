"""Property test: whatever members send, no partition is ever held by two members at once."""

from __future__ import annotations

from collections.abc import Iterable

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from consumer_sdk.coordinator import CoordinatorConfig, GroupCoordinator
from consumer_sdk.domain import HeartbeatRequest, HeartbeatResponse
from consumer_sdk.error_codes import ErrorCode as E
from tests.coordinator.support import Client, IdPartition

MEMBERS = ("m0", "m1", "m2", "s0")

op = st.one_of(
    st.tuples(st.just("join"), st.sampled_from(MEMBERS)),
    st.tuples(st.just("ack"), st.sampled_from(MEMBERS)),
    st.tuples(st.just("delta"), st.sampled_from(MEMBERS)),
    st.tuples(st.just("lie"), st.sampled_from(MEMBERS), st.sets(st.integers(0, 7), max_size=8)),
    st.tuples(st.just("stale"), st.sampled_from(MEMBERS)),
    st.tuples(st.just("leave"), st.sampled_from(MEMBERS), st.sampled_from((-1, -2))),
    st.tuples(st.just("resubscribe"), st.sampled_from(MEMBERS)),
    st.tuples(st.just("tick"), st.integers(0, 70_000)),
    st.tuples(st.just("grow"), st.sampled_from(("t", "u"))),
    st.tuples(st.just("replace"), st.integers(0, 3)),
)


def make_clients(c: GroupCoordinator, kind: type[Client] = Client) -> dict[str, Client]:
    """The group's members: m2 subscribes to t only, s0 is static."""
    return {
        name: kind(
            c,
            name,
            topics=("t", "u") if name != "m2" else ("t",),
            instance_id="i0" if name.startswith("s") else None,
            rebalance_timeout_ms=30_000,
        )
        for name in MEMBERS
    }


def member_step(
    c: GroupCoordinator, client: Client, step: tuple[object, ...], now: int
) -> HeartbeatResponse:
    """One member's request for a step of `op` naming that member."""
    kind = step[0]
    if kind == "join":
        return client.join(now)
    if kind == "ack":
        return client.ack(now)
    if kind == "delta":
        return client.hb(now)
    if kind == "lie":
        tid = c.topics.topic_id("t")
        assert tid is not None and isinstance(step[2], set)
        return client.hb(now, owned={(tid, p) for p in step[2]})
    if kind == "stale":
        return client.full(now, owned=client.assignment, epoch=max(0, client.epoch - 1))
    if kind == "leave":
        assert isinstance(step[2], int)
        return client.leave(now, epoch=step[2] if client.instance_id else -1)
    assert kind == "resubscribe", step
    client.topics = ("u",) if client.topics != ("u",) else ("t", "u")
    return client.full(now, owned=client.assignment)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, max_size=60), st.sampled_from((0, 1_000)))
def test_no_partition_is_ever_held_by_two_members(
    ops: list[tuple[object, ...]], interval: int
) -> None:
    c = GroupCoordinator(CoordinatorConfig(assignment_interval_ms=interval), {"t": 4, "u": 3})
    clients = make_clients(c)
    incarnation = 0
    now = 0
    epochs: dict[str, int] = {}
    for step in ops:
        now += 100
        kind = step[0]
        if kind == "tick":
            assert isinstance(step[1], int)
            now += step[1]
            c.tick(now)
        elif kind == "grow":
            assert isinstance(step[1], str)
            c.add_partitions(now, step[1], 1)
        elif kind == "replace":
            # A new incarnation of the static member (new member id, same instance id).
            incarnation += 1
            clients["s0"] = Client(
                c, f"s0-{incarnation}", instance_id="i0", rebalance_timeout_ms=30_000
            )
        else:
            assert isinstance(step[1], str)
            client = clients[step[1]]
            r = member_step(c, client, step, now)
            sent_epoch = client.last_request_epoch
            assert (r.error_code == E.INVALID_REQUEST and sent_epoch == 0) or r.error_code in {
                0,
                E.UNKNOWN_MEMBER_ID,
                E.FENCED_MEMBER_EPOCH,
                E.UNRELEASED_INSTANCE_ID,
                E.FENCED_INSTANCE_ID,
                E.GROUP_ID_NOT_FOUND,
            }, r
        assert c.check_exclusive("g") == []
        d = c.describe("g")
        held: dict[object, str] = {}
        for m in d.members:
            for tp in m.holds:
                assert tp not in held, f"{tp} held by {held[tp]} and {m.member_id}"
                held[tp] = m.member_id
            # A member's epoch never goes back, except a static member leaving with -2.
            if m.member_epoch >= 0:
                assert m.member_epoch >= epochs.get(m.member_id, 0)
                assert m.member_epoch <= d.assignment_epoch
            epochs[m.member_id] = m.member_epoch
        assert d.assignment_epoch <= d.group_epoch


class _ReusingClient(Client):
    """Sends the very same plain heartbeat object again while its epoch holds, as the real
    member does (see `HeartbeatRequestManager._build_plain`)."""

    plain: HeartbeatRequest | None = None

    def hb(
        self, now: int, owned: Iterable[IdPartition] | None = None, epoch: int | None = None
    ) -> HeartbeatResponse:
        if owned is not None or epoch is not None:
            return super().hb(now, owned, epoch)
        if self.plain is None or self.plain.member_epoch != self.epoch:
            self.plain = HeartbeatRequest(
                self.group_id, self.member_id, self.epoch, instance_id=self.instance_id
            )
        return self.send(now, self.plain)


member = st.sampled_from(MEMBERS)
differential_op = st.one_of(
    st.tuples(st.just("join"), member),
    st.tuples(st.just("ack"), member),
    st.tuples(st.just("delta"), member),
    st.tuples(st.just("lie"), member, st.sets(st.integers(0, 7), max_size=8)),
    st.tuples(st.just("stale"), member),
    st.tuples(st.just("leave"), member, st.sampled_from((-1, -2))),
    st.tuples(st.just("resubscribe"), member),
    st.tuples(st.just("tick"), st.integers(0, 70_000)),
    st.tuples(st.just("grow"), st.sampled_from(("t", "u"))),
    st.tuples(st.just("replace"), st.integers(0, 3)),
    st.tuples(st.just("inject"), member),
    st.tuples(st.just("failover"), st.integers(0, 2_000)),
    st.tuples(st.just("unload"), st.just(0)),
    st.tuples(st.just("load"), st.integers(0, 2_000)),
    st.tuples(st.just("lost"), member),
    # Every member in the group heartbeats once (an ack after an assignment, else plain),
    # as members do between faults: most of these take the coordinator's shortcut.
    *[st.tuples(st.just("round"), st.integers(0, 2_000))] * 6,
)
#: Every member joins, then heartbeats until the group is stable.
WARM_UP = [("join", name) for name in MEMBERS] + [("round", 100)] * 4


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(differential_op, max_size=60), st.sampled_from((0, 1_000)))
# m0's answer at the next epoch is lost: its plain request of the epoch before is fenced.
@example([("delta", "m0"), ("resubscribe", "m2"), ("lost", "m0"), ("delta", "m0")], 0)
def test_a_reused_plain_request_is_answered_as_a_fresh_copy(
    ops: list[tuple[object, ...]], interval: int
) -> None:
    """The coordinator's shortcut for a plain heartbeat (the same request object again, or an
    equal new one) answers, and changes the group, exactly as the full path does (the
    reference coordinator, shortcut off)."""
    config = CoordinatorConfig(assignment_interval_ms=interval)
    coordinators = [GroupCoordinator(config, {"t": 4, "u": 3}) for _ in range(3)]
    coordinators[2]._shortcut = False

    kinds: tuple[type[Client], ...] = (_ReusingClient, Client, Client)
    clients = [make_clients(c, kind) for c, kind in zip(coordinators, kinds, strict=True)]
    now = 0
    incarnation = 0
    for step in WARM_UP + ops:
        now += 100
        kind = step[0]
        if kind == "replace":
            incarnation += 1
        outcomes = []
        for c, cs, client_kind in zip(coordinators, clients, kinds, strict=True):
            outcome: object = None
            if kind == "tick":
                assert isinstance(step[1], int)
                outcome = c.tick(now + step[1])
            elif kind == "grow":
                assert isinstance(step[1], str)
                c.add_partitions(now, step[1], 1)
            elif kind == "failover":
                assert isinstance(step[1], int)
                c.unload(now)
                c.load(now + 50, step[1])
            elif kind == "unload":
                c.unload(now)
            elif kind == "load":
                assert isinstance(step[1], int)
                c.load(now, step[1])
            elif kind == "replace":
                cs["s0"] = client_kind(
                    c, f"s0-{incarnation}", instance_id="i0", rebalance_timeout_ms=30_000
                )
            elif kind == "round":
                assert isinstance(step[1], int)
                outcome = [
                    client.ack(now + step[1])
                    if client.last is not None and client.last.assignment is not None
                    else client.hb(now + step[1])
                    for client in cs.values()
                    if client.epoch > 0
                ]
            else:
                assert isinstance(step[1], str)
                client = cs[step[1]]
                if kind == "inject":
                    c.inject_error(client.member_id, E.NOT_COORDINATOR)
                elif kind == "lost":
                    # A plain heartbeat whose answer never arrives: the client keeps its epoch.
                    epoch, last = client.epoch, client.last
                    outcome = client.hb(now)
                    client.epoch, client.last = epoch, last
                else:
                    outcome = member_step(c, client, step, now)
            outcomes.append((outcome, c.describe("g"), c.next_timer_ms()))
        if kind in ("tick", "round"):
            assert isinstance(step[1], int)
            now += step[1]
        assert outcomes[0] == outcomes[2], step
        assert outcomes[1] == outcomes[2], step
