"""Property test: whatever members send, no partition is ever held by two members at once."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumer_sdk.coordinator import CoordinatorConfig, GroupCoordinator
from consumer_sdk.error_codes import ErrorCode as E
from tests.coordinator.support import Client

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


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(op, max_size=60), st.sampled_from((0, 1_000)))
def test_no_partition_is_ever_held_by_two_members(
    ops: list[tuple[object, ...]], interval: int
) -> None:
    c = GroupCoordinator(CoordinatorConfig(assignment_interval_ms=interval), {"t": 4, "u": 3})
    clients = {
        name: Client(
            c,
            name,
            topics=("t", "u") if name != "m2" else ("t",),
            instance_id="i0" if name.startswith("s") else None,
            rebalance_timeout_ms=30_000,
        )
        for name in MEMBERS
    }
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
            if kind == "join":
                r = client.join(now)
            elif kind == "ack":
                r = client.ack(now)
            elif kind == "delta":
                r = client.hb(now)
            elif kind == "lie":
                tid = c.topics.topic_id("t")
                assert tid is not None and isinstance(step[2], set)
                r = client.hb(now, owned={(tid, p) for p in step[2]})
            elif kind == "stale":
                r = client.full(now, owned=client.assignment, epoch=max(0, client.epoch - 1))
            elif kind == "leave":
                assert isinstance(step[2], int)
                r = client.leave(now, epoch=step[2] if client.instance_id else -1)
            else:
                client.topics = ("u",) if client.topics != ("u",) else ("t", "u")
                r = client.full(now, owned=client.assignment)
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
