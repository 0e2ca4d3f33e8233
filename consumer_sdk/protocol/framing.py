"""Kafka wire framing: 4-byte length prefix, request/response headers, kio bodies.

Pure functions and a pure incremental frame reader, so they can be fuzzed without sockets.
Request header v1 (non-flexible APIs) or v2 (flexible) comes from the kio schema of the body;
response header v0 or v1 likewise, except ApiVersions which always answers with header v0.
"""

from __future__ import annotations

import io
import struct
from typing import TYPE_CHECKING, Any, TypeVar

from kio.schema.response_header.v0.header import ResponseHeader as ResponseHeaderV0
from kio.schema.response_header.v1.header import ResponseHeader as ResponseHeaderV1
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i16, i32
from kio.static.protocol import RequestPayload, ResponsePayload

from consumer_sdk.errors import ProtocolError
from consumer_sdk.protocol.frame_guard import FrameBoundsError, check_frame

if TYPE_CHECKING:
    from kio.schema.api_versions.v0.response import ApiVersionsResponse as _ApiVersionsV0

__all__ = [
    "API_VERSIONS_KEY",
    "DEFAULT_MAX_FRAME_BYTES",
    "CorrelationIdMismatch",
    "FrameReader",
    "api_versions_error_code",
    "decode_api_versions_v0",
    "decode_response",
    "encode_request",
    "parse_frame_length",
    "peek_correlation_id",
]

R = TypeVar("R", bound=ResponsePayload)

DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024
API_VERSIONS_KEY = 18
_LENGTH = struct.Struct(">i")
_I64 = struct.Struct(">q")
_SASL_AUTHENTICATE_KEY = 36
# kio turns SaslAuthenticate's session_lifetime_ms into a timedelta and fails above this (its
# microseconds overflow an int64). A broker sends up to Long.MAX_VALUE (e.g. a huge
# connections.max.reauth.ms): that is "re-authenticate never", so larger values are clamped.
MAX_SESSION_LIFETIME_MS = (2**63 - 1) // 1000


class CorrelationIdMismatch(ProtocolError):
    """A response carried a correlation id other than the one awaited."""


def encode_request(request: RequestPayload, correlation_id: int, client_id: str | None) -> bytes:
    """Serialize ``request`` with its header and the 4-byte length prefix."""
    header_type = request.__header_schema__
    header = header_type(
        request_api_key=i16(request.__api_key__),
        request_api_version=i16(request.__version__),
        correlation_id=i32(correlation_id),
        client_id=client_id,
    )
    buf = io.BytesIO()
    buf.write(b"\0\0\0\0")
    entity_writer(header_type)(buf, header)
    entity_writer(type(request))(buf, request)
    data = buf.getbuffer()
    _LENGTH.pack_into(data, 0, len(data) - 4)
    return bytes(data)


def parse_frame_length(prefix: bytes, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> int:
    """Decode a 4-byte length prefix; reject negative or oversized lengths."""
    if len(prefix) != 4:
        raise ProtocolError(f"truncated frame: length prefix has {len(prefix)} of 4 bytes")
    length: int = _LENGTH.unpack(prefix)[0]
    if length < 4:
        raise ProtocolError(f"invalid frame length {length}: a response holds at least 4 bytes")
    if length > max_frame_bytes:
        raise ProtocolError(
            f"frame length {length} exceeds the limit of {max_frame_bytes} bytes "
            "(garbled stream or receive.message.max.bytes too small)"
        )
    return length


def peek_correlation_id(frame: bytes) -> int:
    """The correlation id at the start of a response frame (every header version starts with it)."""
    if len(frame) < 4:
        raise ProtocolError("truncated frame: no room for a correlation id")
    cid: int = _LENGTH.unpack_from(frame, 0)[0]
    return cid


def _response_header_type(response_type: type[Any]) -> type[Any]:
    if response_type.__api_key__ == API_VERSIONS_KEY or not response_type.__flexible__:
        return ResponseHeaderV0
    return ResponseHeaderV1


def decode_response(frame: bytes, response_type: type[R], expected_correlation_id: int) -> R:
    """Parse one response frame (without its length prefix) as ``response_type``.

    Raises `CorrelationIdMismatch` or `ProtocolError`; never anything else.
    """
    correlation_id = peek_correlation_id(frame)
    if correlation_id != expected_correlation_id:
        raise CorrelationIdMismatch(
            f"response correlation id {correlation_id} does not match the awaited request "
            f"{expected_correlation_id}"
        )
    name = response_type.__name__
    if response_type.__api_key__ == _SASL_AUTHENTICATE_KEY and response_type.__version__ == 1:
        frame = _clamp_session_lifetime(frame)
    header_type = _response_header_type(response_type)
    _check_bounds(frame, header_type, response_type)
    try:
        _, offset = entity_reader(header_type)(frame, 0)
        body, _ = entity_reader(response_type)(frame, offset)
    except Exception as exc:  # kio raises several decode and validation errors
        raise ProtocolError(
            f"cannot decode {name} v{response_type.__version__}: {type(exc).__name__}: {exc}"
        ) from exc
    # Like the Java client, tolerate bytes after the body (some brokers, e.g. librdkafka's
    # mock, append an extra tag buffer); a body that does not parse is still an error.
    return body


def _check_bounds(frame: bytes, header_type: type[Any], body_type: type[Any]) -> None:
    """Bounds-check every length prefix before kio's native readers see the frame: they
    allocate an array from its claimed length up front, and a failed allocation aborts the
    process instead of raising."""
    try:
        check_frame(frame, header_type, body_type)
    except FrameBoundsError as exc:
        raise FrameBoundsError(
            f"cannot decode {body_type.__name__} v{body_type.__version__}: {exc.detail}"
        ) from None


def _clamp_session_lifetime(frame: bytes) -> bytes:
    """SaslAuthenticate v1 ends with session_lifetime_ms (int64, no tagged fields): clamp it
    into the range the decoder represents (negative: 0, no re-authentication)."""
    if len(frame) < 4 + 2 + 2 + 4 + 8:
        return frame
    (lifetime,) = _I64.unpack_from(frame, len(frame) - 8)
    clamped = min(max(lifetime, 0), MAX_SESSION_LIFETIME_MS)
    if clamped == lifetime:
        return frame
    return frame[:-8] + _I64.pack(clamped)


def api_versions_error_code(frame: bytes) -> int:
    """The error code of an ApiVersions response frame (header v0, then ErrorCode int16)."""
    if len(frame) < 6:
        raise ProtocolError("truncated ApiVersions response: no room for an error code")
    return int(struct.unpack_from(">h", frame, 4)[0])


def decode_api_versions_v0(frame: bytes) -> _ApiVersionsV0:
    """Read an ApiVersions response body as v0.

    A broker that does not support the requested ApiVersions version answers
    UNSUPPORTED_VERSION with a v0 body listing its ranges.
    """
    # Imported here: only a broker that rejects our ApiVersions version needs it.
    from kio.schema.api_versions.v0.response import ApiVersionsResponse as _ApiVersionsV0

    _check_bounds(frame, ResponseHeaderV0, _ApiVersionsV0)
    try:
        _, offset = entity_reader(ResponseHeaderV0)(frame, 0)
        body, _ = entity_reader(_ApiVersionsV0)(frame, offset)
    except Exception as exc:
        raise ProtocolError(f"cannot decode ApiVersionsResponse v0: {exc}") from exc
    return body


class FrameReader:
    """Incremental splitter of a byte stream into response frames (without length prefixes)."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._buf = bytearray()
        self._max = max_frame_bytes

    def feed(self, data: bytes) -> list[bytes]:
        """Append ``data``; return every complete frame. Raises ProtocolError on a bad length."""
        buf = self._buf
        buf += data
        frames: list[bytes] = []
        pos, end = 0, len(buf)
        try:
            while end - pos >= 4:
                length: int = _LENGTH.unpack_from(buf, pos)[0]
                if length < 4 or length > self._max:
                    parse_frame_length(bytes(buf[pos : pos + 4]), self._max)  # raises
                stop = pos + 4 + length
                if stop > end:
                    break
                frames.append(bytes(buf[pos + 4 : stop]))
                pos = stop
        finally:
            del buf[:pos]  # once per call, not per frame
        return frames

    @property
    def pending(self) -> int:
        """Bytes buffered towards an incomplete frame."""
        return len(self._buf)
