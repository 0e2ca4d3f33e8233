"""The pure-Python bounds check in front of kio's native readers: a length prefix larger
than what remains of the frame is a ProtocolError naming the field, before kio allocates
(kio's native array readers allocate the claimed count up front; a 5-byte varint count
asks for 100+ GB and aborts the process). Valid frames pass: see the round-trip fuzz tests
in tests/reliability/test_fuzz_responses.py; the corruption fuzz runs in
tests/reliability/test_fuzz_native_abort.py."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import pytest
from kio.schema.api_versions.v3.response import ApiVersionsResponse as ApiVersionsV3
from kio.schema.consumer_group_heartbeat.v0.response import (
    ConsumerGroupHeartbeatResponse as HeartbeatV0,
)
from kio.schema.metadata.v12.response import MetadataResponse as MetadataV12
from kio.schema.response_header.v0.header import ResponseHeader as HeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as HeaderV1
from kio.schema.sasl_authenticate.v1.response import SaslAuthenticateResponse
from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse
from kio.serial._introspect import EntityField, EntityTupleField, classify_field

from consumer_sdk.domain import HeartbeatRequest
from consumer_sdk.errors import ProtocolError
from consumer_sdk.protocol.frame_guard import FrameBoundsError, check_frame, entity_walker
from consumer_sdk.protocol.framing import decode_api_versions_v0, decode_response
from consumer_sdk.protocol.heartbeat_codec import HeartbeatEncoder
from consumer_sdk.protocol.multiplex import HeartbeatCall
from tests.reliability.test_fuzz_responses import PARSED

CID = 7
HUGE_VARINT = b"\xff\xff\xff\xff\x7f"  # 34359738367: kio would allocate ~270 GB for its array
CID_FLEX = struct.pack(">i", CID) + b"\x00"  # response header v1: no tagged fields
CID_LEGACY = struct.pack(">i", CID)  # response header v0
# ConsumerGroupHeartbeat v0 up to the assignment: throttle, error code, null error message,
# member id "m", epoch 5, interval 500
HB_HEAD = CID_FLEX + b"\0\0\0\0" + b"\0\0" + b"\x00" + b"\x02m" + b"\0\0\0\5" + b"\0\0\1\xf4"
UUID = bytes(range(16))


def _hb_with_assignment(topic_partitions: bytes) -> bytes:
    return HB_HEAD + b"\x01" + topic_partitions + b"\x00" + b"\x00"


def test_valid_heartbeat_with_assignment_decodes() -> None:
    frame = _hb_with_assignment(b"\x02" + UUID + b"\x03" + b"\0\0\0\1\0\0\0\2" + b"\x00")
    resp = decode_response(frame, HeartbeatV0, CID)
    assert resp.assignment is not None
    assert resp.assignment.topic_partitions[0].partitions == (1, 2)


CASES: list[tuple[str, bytes, type[Any], str]] = [
    (
        "entity array count",
        _hb_with_assignment(HUGE_VARINT + b"\0" * 40),
        HeartbeatV0,
        r"Assignment\.topic_partitions: array of 34359738366 elements needs at least",
    ),
    (
        "int32 array count",
        _hb_with_assignment(b"\x02" + UUID + HUGE_VARINT + b"\0" * 40),
        HeartbeatV0,
        r"TopicPartitions\.partitions: array of 34359738366 elements needs 137438953464 bytes",
    ),
    (
        "compact string length",
        CID_FLEX + b"\0" * 6 + HUGE_VARINT + b"x" * 40,
        HeartbeatV0,
        r"ConsumerGroupHeartbeatResponse\.error_message: length 34359738366 exceeds",
    ),
    (
        "string one byte past the end",
        CID_FLEX + b"\0" * 6 + b"\x00" + b"\x05abc",
        HeartbeatV0,
        r"ConsumerGroupHeartbeatResponse\.member_id: length 4 exceeds the 3 bytes",
    ),
    (
        "fixed-width fields truncated",
        HB_HEAD[:-3],
        HeartbeatV0,
        r"ConsumerGroupHeartbeatResponse fields: frame ends 3 bytes early",
    ),
    (
        "varint longer than 5 bytes",
        CID_FLEX + b"\0" * 6 + b"\xff" * 6 + b"\x00" * 40,
        HeartbeatV0,
        r"error_message: varint longer than 5 bytes",
    ),
    (
        "array inside known tagged field",
        CID_LEGACY + b"\0\0" + b"\x01" + b"\0\0\0\0" + b"\x01" + b"\x00\x05" + HUGE_VARINT,
        ApiVersionsV3,
        r"ApiVersionsResponse\.supported_features: array of 34359738366 elements",
    ),
    (
        "tagged field size",
        CID_LEGACY + b"\0\0" + b"\x01" + b"\0\0\0\0" + b"\x01" + b"\x09" + HUGE_VARINT,
        ApiVersionsV3,
        r"ApiVersionsResponse tagged fields: tag 9 size 34359738367 exceeds the 0 bytes",
    ),
    (
        "tagged field count",
        CID_LEGACY + b"\0\0" + b"\x01" + b"\0\0\0\0" + HUGE_VARINT,
        ApiVersionsV3,
        r"ApiVersionsResponse tagged fields: 34359738367 tagged fields need at least",
    ),
    (
        "header tagged field size",
        struct.pack(">i", CID) + b"\x01\x00" + HUGE_VARINT,
        HeartbeatV0,
        r"ResponseHeader tagged fields: tag 0 size 34359738367 exceeds",
    ),
    (
        "legacy array count",
        CID_LEGACY + b"\0\0" + b"\x7f\xff\xff\xff" + b"\0" * 40,
        SaslHandshakeResponse,
        r"SaslHandshakeResponse\.mechanisms: array of 2147483647 elements needs at least "
        r"4294967294 bytes, 40 remain",
    ),
    (
        "legacy string length",
        CID_LEGACY + b"\0\0" + b"\0\0\0\1" + b"\x7f\xff" + b"PLAIN",
        SaslHandshakeResponse,
        r"SaslHandshakeResponse\.mechanisms: length 32767 exceeds the 5 bytes",
    ),
    (
        "negative legacy string length",
        CID_LEGACY + b"\0\0" + b"\0\0\0\1" + b"\xff\xfe" + b"PLAIN",
        SaslHandshakeResponse,
        r"SaslHandshakeResponse\.mechanisms: negative length -2",
    ),
    (
        "legacy bytes length",
        CID_LEGACY + b"\0\0" + b"\xff\xff" + b"\x7f\xff\xff\xff" + b"\0" * 8,
        SaslAuthenticateResponse,
        r"SaslAuthenticateResponse\.auth_bytes: length 2147483647 exceeds the 8 bytes",
    ),
]


@pytest.mark.parametrize(
    ("frame", "response_type", "match"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_oversized_length_is_a_protocol_error_naming_the_field(
    frame: bytes, response_type: type[Any], match: str
) -> None:
    name = f"cannot decode {response_type.__name__} v{response_type.__version__}: "
    with pytest.raises(FrameBoundsError, match=name + ".*" + match):
        decode_response(frame, response_type, CID)


def test_api_versions_v0_fallback_is_checked() -> None:
    frame = CID_LEGACY + b"\0\x23" + b"\x7f\xff\xff\xff" + b"\0" * 6
    with pytest.raises(
        ProtocolError, match=r"ApiVersionsResponse\.api_keys: array of 2147483647 elements"
    ):
        decode_api_versions_v0(frame)


def test_shared_network_loop_heartbeat_decode_is_checked() -> None:
    call = HeartbeatCall(HeartbeatRequest("g", "m", 0), HeartbeatEncoder(), None)
    with pytest.raises(ProtocolError, match=r"Assignment\.topic_partitions: array of"):
        call.decode(_hb_with_assignment(HUGE_VARINT + b"\0" * 40), CID)


def test_entity_arrays_of_every_parsed_type_have_a_nonzero_minimal_element() -> None:
    """The count check assumes each element takes at least one byte; an entity encoding to
    zero bytes would make it reject valid arrays (so its bound would need rethinking)."""
    from consumer_sdk.protocol.frame_guard import _entity_plan

    seen: set[type[Any]] = set()

    def visit(entity_type: type[Any]) -> None:
        if entity_type in seen:
            return
        seen.add(entity_type)
        entity_walker(entity_type)
        for field in dataclasses.fields(entity_type):
            match classify_field(field):
                case EntityTupleField(inner):
                    assert _entity_plan(inner)[1] >= 1, f"{entity_type.__name__}.{field.name}"
                    visit(inner)
                case EntityField(inner):
                    visit(inner)

    for response_type, _ in PARSED:
        visit(response_type)
    visit(HeaderV0)
    visit(HeaderV1)
    assert len(seen) > 40


def test_check_frame_accepts_a_trailing_tag_buffer_and_an_exact_fit() -> None:
    # throttle, no brokers, null cluster id, controller 1, no topics, no tagged fields
    body = b"\0\0\0\0" + b"\x01" + b"\x00" + b"\0\0\0\1" + b"\x01" + b"\x00"
    check_frame(CID_FLEX + body, HeaderV1, MetadataV12)
    assert decode_response(CID_FLEX + body, MetadataV12, CID).controller_id == 1
    check_frame(CID_FLEX + body + b"\x00", HeaderV1, MetadataV12)  # extra bytes tolerated
    with pytest.raises(FrameBoundsError):
        check_frame(CID_FLEX + body[:-1], HeaderV1, MetadataV12)
