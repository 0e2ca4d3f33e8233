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
        "g",
        "a",
        0,
        rebalance_timeout_ms=300_000,
        subscribed_topic_names=("t",),
        subscribed_topic_regex="",
        topic_partitions=(TopicIdPartitions(uuid.uuid4(), (0, 1)),),
    )
    payload, _ = m.heartbeat_call(full, 1)
    assert encoder.encode(full, 1, 9, None) == encode_request(payload, 9, None)


def test_unsupported_version_is_named() -> None:
    with pytest.raises(ValueError, match="v2 is not supported"):
        HeartbeatEncoder().encode(HeartbeatRequest("g", "m", 0), 2, 1, None)


def _response_frame(cid: int, epoch: int, interval_ms: int = 3000, error: int = 0) -> bytes:
    """A ConsumerGroupHeartbeat v1 response frame (no length prefix), written by kio."""
    import datetime
    import io
    import struct

    from kio.schema.errors import ErrorCode as KioErrorCode
    from kio.serial import entity_writer
    from kio.static.primitive import i32, i32Timedelta

    _, response_type = m.heartbeat_call(HeartbeatRequest("g", "m", 0), 1)
    body = response_type(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        error_code=KioErrorCode(error),
        error_message=None,
        member_id="member-1",
        member_epoch=i32(epoch),
        heartbeat_interval=i32Timedelta.parse(datetime.timedelta(milliseconds=interval_ms)),
        assignment=None,
    )
    buf = io.BytesIO()
    entity_writer(response_type)(buf, body)
    return struct.pack(">i", cid) + b"\x00" + buf.getvalue()


def test_repeated_heartbeat_responses_decode_like_fresh_ones() -> None:
    """A response equal byte for byte to an earlier one (after the correlation id) reuses its
    decoded value; any changed field decodes afresh; the correlation id is still checked."""
    from consumer_sdk.protocol.framing import CorrelationIdMismatch
    from consumer_sdk.protocol.multiplex import HeartbeatCall, VersionCache

    versions = VersionCache({m.API_CONSUMER_GROUP_HEARTBEAT: (0, 1)})
    encoder = HeartbeatEncoder()

    def decode(cid: int, frame: bytes) -> object:
        call = HeartbeatCall(HeartbeatRequest("g", "member-1", 5), encoder, None)
        call.encode(versions, cid)  # picks the version the answer is decoded with
        return call.decode(frame, cid)

    first = decode(1, _response_frame(1, epoch=5))
    again = decode(2, _response_frame(2, epoch=5))
    assert again == first
    assert again is first  # reused, not decoded again
    assert (first.member_epoch, first.heartbeat_interval_ms, first.error_code) == (5, 3000, 0)
    bumped = decode(3, _response_frame(3, epoch=6))
    assert bumped.member_epoch == 6
    slower = decode(4, _response_frame(4, epoch=6, interval_ms=5000))
    assert slower.heartbeat_interval_ms == 5000
    fenced = decode(5, _response_frame(5, epoch=6, error=110))
    assert fenced.error_code == 110
    call = HeartbeatCall(HeartbeatRequest("g", "member-1", 5), encoder, None)
    call.encode(versions, 7)
    with pytest.raises(CorrelationIdMismatch):
        call.decode(_response_frame(6, epoch=5), 7)  # cached bytes, wrong correlation id
