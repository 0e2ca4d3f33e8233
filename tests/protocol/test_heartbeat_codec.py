"""The fast heartbeat encoder writes exactly what kio writes, for any request."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumer_sdk.domain import HeartbeatRequest, TopicIdPartitions
from consumer_sdk.protocol import messages as m
from consumer_sdk.protocol.framing import encode_request
from consumer_sdk.protocol.heartbeat_codec import HeartbeatEncoder

text = st.text(max_size=40)
maybe_text = st.none() | text
int32 = st.integers(-(2**31), 2**31 - 1)
topic_partitions = st.tuples(
    st.builds(
        TopicIdPartitions,
        st.uuids(),
        st.lists(st.integers(0, 2**31 - 1), max_size=20).map(tuple),
    )
)
requests = st.builds(
    HeartbeatRequest,
    group_id=text,
    member_id=text,
    member_epoch=int32,
    instance_id=maybe_text,
    rack_id=maybe_text,
    rebalance_timeout_ms=st.sampled_from([-1, 0, 45_000]) | st.integers(0, 2**31 - 1),
    subscribed_topic_names=st.none() | st.lists(text.filter(bool), max_size=5).map(tuple),
    subscribed_topic_regex=maybe_text,
    server_assignor=maybe_text,
    topic_partitions=st.none()
    | st.lists(topic_partitions, max_size=4).map(lambda ts: tuple(t[0] for t in ts)),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests, st.integers(0, 2**31 - 1), maybe_text, st.sampled_from([0, 1]))
def test_matches_kio_byte_for_byte(
    request: HeartbeatRequest, cid: int, client_id: str | None, version: int
) -> None:
    encoder = HeartbeatEncoder()
    if version == 0 and request.subscribed_topic_regex:
        with pytest.raises(ValueError, match="regex subscription needs"):
            encoder.encode(request, version, cid, client_id)
        return
    payload, _ = m.heartbeat_call(request, version)
    expected = encode_request(payload, cid, client_id)
    assert encoder.encode(request, version, cid, client_id) == expected
    # Cached parts are reused: a second encode of the same member gives the same bytes.
    assert encoder.encode(request, version, cid, client_id) == expected


def test_cached_head_and_tail_follow_member_identity_and_epoch() -> None:
    encoder = HeartbeatEncoder()
    for member in ("a", "bb"):
        for epoch in (1, 2, -1):
            for instance in (None, "static-1"):
                r = HeartbeatRequest("g", member, epoch, instance_id=instance)
                payload, _ = m.heartbeat_call(r, 1)
                assert encoder.encode(r, 1, 42, "cid") == encode_request(payload, 42, "cid")
    full = HeartbeatRequest(
        "g", "a", 0, rebalance_timeout_ms=300_000, subscribed_topic_names=("t",),
        subscribed_topic_regex="", topic_partitions=(TopicIdPartitions(uuid.uuid4(), (0, 1)),),
    )  # fmt: skip
    payload, _ = m.heartbeat_call(full, 1)
    assert encoder.encode(full, 1, 9, None) == encode_request(payload, 9, None)


def test_unsupported_version_is_named() -> None:
    with pytest.raises(ValueError, match="v2 is not supported"):
        HeartbeatEncoder().encode(HeartbeatRequest("g", "m", 0), 2, 1, None)
