"""Fuzzing of every response the SDK parses (hypothesis): any bytes give a ProtocolError or a
value, never another exception; any well-formed response round-trips and converts to the
domain types; the ApiVersions downgrade and the SASL exchanges survive arbitrary input."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import io
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsV0
from kio.schema.offset_commit.v9.response import OffsetCommitResponse as OffsetCommitV9
from kio.schema.sasl_authenticate.v1.response import SaslAuthenticateResponse
from kio.schema.sasl_handshake.v1.response import SaslHandshakeResponse
from kio.serial import entity_writer
from kio.static.primitive import i32

from consumer_sdk.errors import ProtocolError
from consumer_sdk.protocol import messages as m
from consumer_sdk.protocol.connection import _API_VERSIONS, BrokerConnection
from consumer_sdk.protocol.framing import (
    MAX_SESSION_LIFETIME_MS,
    api_versions_error_code,
    decode_response,
)
from consumer_sdk.protocol.sasl import PlainClient, SaslError, ScramClient
from consumer_sdk.protocol.security import ConnectionSettings

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


def _response(mod: Any) -> type[Any]:
    return next(v for k, v in vars(mod).items() if k.endswith("Response") and isinstance(v, type))


#: (response type, converter to domain types or None) for every response the SDK decodes
PARSED: list[tuple[type[Any], Any]] = [
    *((_response(r), m.heartbeat_from_kio) for _, r in m._HB.values()),
    *((_response(r), lambda x: m.find_coordinator_from_kio("g", x)) for _, r in m._FC.values()),
    *((_response(r), m.metadata_from_kio) for _, r in m._MD.values()),
    *((_response(r), m.offset_fetch_from_kio) for _, r in m._OF.values()),
    *((_response(r), m.consumer_group_describe_from_kio) for _, r in m._CGD.values()),
    (OffsetCommitV9, m.offset_commit_from_kio),
    *((_response(r), None) for _, r in _API_VERSIONS.values()),
    (SaslHandshakeResponse, None),
    (SaslAuthenticateResponse, None),
]
IDS = [f"{t.__name__}-v{t.__version__}" for t, _ in PARSED]


def frame_of(response: Any, correlation_id: int) -> bytes:
    buf = io.BytesIO()
    header = type(response).__header_schema__
    if type(response).__api_key__ == 18:  # ApiVersions always answers with header v0
        from kio.schema.response_header.v0.header import ResponseHeader as header
    entity_writer(header)(buf, header(correlation_id=i32(correlation_id)))
    entity_writer(type(response))(buf, response)
    return buf.getvalue()


def test_every_parsed_response_type_is_covered() -> None:
    apis = {t.__api_key__ for t, _ in PARSED}
    assert apis == {3, 8, 9, 10, 17, 18, 36, 68, 69}
    assert len(PARSED) >= 22


def _as_decoded(response: Any) -> Any:
    """What the decoder returns for ``response``: SaslAuthenticate's session lifetime is
    clamped into [0, MAX_SESSION_LIFETIME_MS]."""
    if not isinstance(response, SaslAuthenticateResponse):
        return response
    ms = response.session_lifetime // datetime.timedelta(milliseconds=1)
    clamped = min(max(ms, 0), MAX_SESSION_LIFETIME_MS)
    return dataclasses.replace(response, session_lifetime=datetime.timedelta(milliseconds=clamped))


@pytest.mark.parametrize(
    ("lifetime_ms", "expected_ms"),
    [(0, 0), (3_600_000, 3_600_000), (-5, 0), (2**63 - 1, MAX_SESSION_LIFETIME_MS)],
)
def test_sasl_session_lifetime_of_any_int64_decodes(lifetime_ms: int, expected_ms: int) -> None:
    """A broker may send up to Long.MAX_VALUE (connections.max.reauth.ms): still a response."""
    body = struct.pack(">ihhiq", 7, 0, -1, 0, lifetime_ms)
    decoded = decode_response(body, SaslAuthenticateResponse, 7)
    assert decoded.session_lifetime == datetime.timedelta(milliseconds=expected_ms)


@pytest.mark.parametrize(("response_type", "convert"), PARSED, ids=IDS)
def test_arbitrary_bytes_raise_only_protocol_error(response_type: type[Any], convert: Any) -> None:
    @FUZZ
    @given(st.binary(max_size=300), st.integers(0, 2**31 - 1))
    def run(payload: bytes, cid: int) -> None:
        try:
            decoded = decode_response(struct.pack(">i", cid) + payload, response_type, cid)
        except ProtocolError:
            return
        if convert is not None:
            convert(decoded)  # a body that decodes must also convert

    run()


@pytest.mark.parametrize(("response_type", "convert"), PARSED, ids=IDS)
def test_well_formed_responses_round_trip_and_convert(
    response_type: type[Any], convert: Any
) -> None:
    @FUZZ
    @given(st.from_type(response_type), st.integers(0, 2**31 - 1), st.data())
    def run(response: Any, cid: int, data: st.DataObject) -> None:
        frame = frame_of(response, cid)
        assert decode_response(frame, response_type, cid) == _as_decoded(response)
        if convert is not None:
            convert(response)
        # and every truncation of it is a ProtocolError (or still a value), nothing else
        cut = data.draw(st.integers(0, len(frame)))
        with contextlib.suppress(ProtocolError):
            decode_response(frame[:cut], response_type, cid)

    run()


@FUZZ
@given(st.binary(max_size=200), st.integers(0, 4))
def test_api_versions_downgrade_survives_any_frame(payload: bytes, rejected: int) -> None:
    conn = BrokerConnection("127.0.0.1", 1, ConnectionSettings())
    frame = struct.pack(">i", 1) + payload
    with contextlib.suppress(ProtocolError):
        api_versions_error_code(frame)
    try:
        version = conn._downgrade_api_versions(frame, rejected)
    except ProtocolError as exc:
        assert rejected == 0 and "rejected ApiVersions v0" in str(exc)
        return
    assert 0 <= version < rejected


@FUZZ
@given(st.from_type(ApiVersionsV0), st.integers(1, 4))
def test_api_versions_downgrade_reads_the_brokers_range(response: Any, rejected: int) -> None:
    conn = BrokerConnection("127.0.0.1", 1, ConnectionSettings())
    version = conn._downgrade_api_versions(frame_of(response, 1), rejected)
    offered = {int(k.api_key): int(k.max_version) for k in response.api_keys}
    assert version == min(offered.get(18, 0), rejected - 1)


@FUZZ
@given(st.binary(max_size=200), st.binary(max_size=200), st.sampled_from(["256", "512"]))
def test_scram_client_survives_any_server_message(first: bytes, final: bytes, bits: str) -> None:
    client = ScramClient(f"SCRAM-SHA-{bits}", "user", "pencil", lambda: "fixednonce")
    client.first()
    try:
        client.step(first)
        client.step(final)
    except SaslError as exc:
        assert "pencil" not in str(exc)


@FUZZ
@given(st.text(max_size=40), st.binary(max_size=100))
def test_scram_client_rejects_tampered_server_first_messages(nonce: str, salt: bytes) -> None:
    import base64

    client = ScramClient("SCRAM-SHA-256", "user", "pencil", lambda: "abc")
    client.first()
    message = f"r={nonce},s={base64.b64encode(salt).decode()},i=4096".encode()
    if nonce.startswith("abc") and "," not in nonce:
        assert client.step(message) is not None
    else:
        with pytest.raises(SaslError, match=r"invalid server nonce|malformed"):
            client.step(message)


def test_plain_needs_no_server_message() -> None:
    assert PlainClient("u", "p").step(b"\xff anything") is None
