"""Framing and response parsing: round trips and fuzzing (no crash, no hang on any bytes)."""

from __future__ import annotations

import contextlib
import datetime
import io
import struct
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.consumer_group_heartbeat.v1.response import ConsumerGroupHeartbeatResponse
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.schema.find_coordinator.v4.response import FindCoordinatorResponse
from kio.schema.metadata.v12.response import MetadataResponse
from kio.schema.offset_fetch.v6.response import OffsetFetchResponse
from kio.schema.response_header.v1.header import ResponseHeader
from kio.serial import entity_writer
from kio.static.primitive import i32, i32Timedelta

from consumer_sdk.domain import HeartbeatRequest, TopicIdPartitions
from consumer_sdk.errors import ProtocolError
from consumer_sdk.protocol import messages as m
from consumer_sdk.protocol.framing import (
    CorrelationIdMismatch,
    FrameReader,
    decode_response,
    encode_request,
    parse_frame_length,
)

RESPONSE_TYPES = [
    ConsumerGroupHeartbeatResponse,
    MetadataResponse,
    FindCoordinatorResponse,
    OffsetFetchResponse,
]
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def frame_of(response: object, correlation_id: int) -> bytes:
    buf = io.BytesIO()
    entity_writer(ResponseHeader)(buf, ResponseHeader(correlation_id=i32(correlation_id)))
    entity_writer(type(response))(buf, response)  # type: ignore[arg-type]
    return buf.getvalue()


@FUZZ
@given(st.from_type(ConsumerGroupHeartbeatResponse), st.integers(0, 2**31 - 1))
def test_heartbeat_response_round_trip(response: ConsumerGroupHeartbeatResponse, cid: int) -> None:
    assert decode_response(frame_of(response, cid), ConsumerGroupHeartbeatResponse, cid) == response


@FUZZ
@given(st.from_type(MetadataResponse))
def test_metadata_response_round_trip_and_domain_lookup(response: MetadataResponse) -> None:
    decoded = decode_response(frame_of(response, 7), MetadataResponse, 7)
    assert decoded == response
    md = m.metadata_from_kio(decoded)
    for topic in md.topics:
        if topic.topic_id.int != 0 and md.topic_by_id(topic.topic_id) is topic:
            assert md.topic_name(topic.topic_id) == topic.name


@FUZZ
@given(st.sampled_from(RESPONSE_TYPES), st.binary(max_size=512), st.integers(0, 2**31 - 1))
def test_arbitrary_bytes_raise_only_protocol_error(
    response_type: type, payload: bytes, cid: int
) -> None:
    frame = struct.pack(">i", cid) + payload
    with contextlib.suppress(ProtocolError):
        decode_response(frame, response_type, cid)


@FUZZ
@given(st.from_type(ConsumerGroupHeartbeatResponse), st.data())
def test_corrupted_valid_frames_raise_only_protocol_error(
    response: ConsumerGroupHeartbeatResponse, data: st.DataObject
) -> None:
    frame = bytearray(frame_of(response, 3))
    cut = data.draw(st.integers(4, len(frame)))
    flips = data.draw(st.lists(st.tuples(st.integers(4, len(frame) - 1), st.integers(0, 255))))
    for index, value in flips:
        frame[index] = value
    with contextlib.suppress(ProtocolError):
        decode_response(bytes(frame[:cut]), ConsumerGroupHeartbeatResponse, 3)


def test_truncated_frame_is_a_protocol_error() -> None:
    response = ConsumerGroupHeartbeatResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        error_code=KioErrorCode.none,
        member_epoch=i32(3),
        heartbeat_interval=i32Timedelta.parse(datetime.timedelta(milliseconds=500)),
    )
    frame = frame_of(response, 11)
    with pytest.raises(ProtocolError, match="cannot decode ConsumerGroupHeartbeatResponse"):
        decode_response(frame[:-3], ConsumerGroupHeartbeatResponse, 11)


def test_wrong_correlation_id_is_named() -> None:
    frame = struct.pack(">i", 42) + b"\0" * 16
    with pytest.raises(CorrelationIdMismatch, match=r"correlation id 42 does not match .* 41"):
        decode_response(frame, ConsumerGroupHeartbeatResponse, 41)


@pytest.mark.parametrize(
    ("prefix", "message"),
    [
        (struct.pack(">i", -5), "invalid frame length -5"),
        (struct.pack(">i", 2), "invalid frame length 2"),
        (struct.pack(">i", 1 << 30), "exceeds the limit"),
        (b"\0\0", "truncated frame"),
    ],
)
def test_bad_length_prefixes(prefix: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=message):
        parse_frame_length(prefix)


@FUZZ
@given(
    st.lists(st.binary(min_size=4, max_size=64), min_size=1, max_size=8),
    st.lists(st.integers(1, 40), min_size=1, max_size=50),
)
def test_frame_reader_reassembles_any_chunking(frames: list[bytes], cuts: list[int]) -> None:
    stream = b"".join(struct.pack(">i", len(f)) + f for f in frames)
    reader = FrameReader()
    out: list[bytes] = []
    pos = 0
    for size in cuts * (len(stream) // max(sum(cuts), 1) + 1):
        out += reader.feed(stream[pos : pos + size])
        pos += size
        if pos >= len(stream):
            break
    out += reader.feed(stream[pos:])
    assert out == frames
    assert reader.pending == 0


@FUZZ
@given(st.binary(max_size=2048))
def test_frame_reader_on_garbage_never_hangs(data: bytes) -> None:
    reader = FrameReader(max_frame_bytes=4096)
    try:
        frames = reader.feed(data)
    except ProtocolError:
        return
    assert sum(len(f) + 4 for f in frames) + reader.pending == len(data)


def test_heartbeat_request_encodes_flexible_header_v2() -> None:
    topic = uuid.uuid4()
    request = HeartbeatRequest(
        group_id="g",
        member_id="m" * 22,
        member_epoch=0,
        rebalance_timeout_ms=30_000,
        subscribed_topic_names=("orders",),
        subscribed_topic_regex="",
        topic_partitions=(TopicIdPartitions(topic, (0, 1)),),
    )
    payload, _ = m.heartbeat_call(request, 1)
    data = encode_request(payload, 99, "client-1")
    assert struct.unpack_from(">i", data, 0)[0] == len(data) - 4
    api_key, version, cid = struct.unpack_from(">hhi", data, 4)
    assert (api_key, version, cid) == (68, 1, 99)
    # header v2: client id as a classic (non-compact) string, then an empty tag buffer
    assert data[12:14] == struct.pack(">h", 8) and data[14:22] == b"client-1" and data[22] == 0


def test_regex_needs_heartbeat_v1() -> None:
    request = HeartbeatRequest("g", "m", 0, subscribed_topic_regex="^o.*")
    with pytest.raises(ValueError, match="regex subscription needs ConsumerGroupHeartbeat v1"):
        m.heartbeat_call(request, 0)
