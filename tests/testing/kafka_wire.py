"""Hand-built Kafka requests for poking EmbeddedKafka's brokers over raw sockets."""

from __future__ import annotations

import socket
import struct
import time

_CLIENT_ID = b"embedded-kafka-tests"


def _request_header(api_key: int, version: int, correlation_id: int, flexible: bool) -> bytes:
    header = struct.pack(">hhih", api_key, version, correlation_id, len(_CLIENT_ID)) + _CLIENT_ID
    return header + (b"\x00" if flexible else b"")  # empty tagged fields (header v2)


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("connection closed by broker")
        data += chunk
    return data


def send_request(
    address: tuple[str, int], frame_body: bytes, timeout: float = 5.0
) -> tuple[bytes, float]:
    """Send one size-prefixed request; return (response body after size, elapsed seconds)."""
    with socket.create_connection(address, timeout=timeout) as sock:
        started = time.monotonic()
        sock.sendall(struct.pack(">i", len(frame_body)) + frame_body)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        return _recv_exact(sock, size), time.monotonic() - started


def api_versions(
    address: tuple[str, int], timeout: float = 5.0
) -> tuple[int, dict[int, tuple[int, int]], float]:
    """ApiVersions v0: (error_code, {api_key: (min, max)}, elapsed seconds)."""
    response, elapsed = send_request(address, _request_header(18, 0, 7, False), timeout)
    correlation_id, error_code, count = struct.unpack_from(">ihi", response, 0)
    assert correlation_id == 7
    versions = {}
    for i in range(count):
        key, low, high = struct.unpack_from(">hhh", response, 10 + 6 * i)
        versions[key] = (low, high)
    return error_code, versions, elapsed


def _compact_str(value: str | None) -> bytes:
    if value is None:
        return b"\x00"
    data = value.encode()
    assert len(data) < 127
    return bytes([len(data) + 1]) + data


def consumer_group_heartbeat_v1(group: str, member_id: str, member_epoch: int) -> bytes:
    """A ConsumerGroupHeartbeat v1 request frame (no size prefix) subscribing to nothing."""
    body = (
        _compact_str(group)
        + _compact_str(member_id)
        + struct.pack(">i", member_epoch)
        + _compact_str(None)  # InstanceId
        + _compact_str(None)  # RackId
        + struct.pack(">i", 30000)  # RebalanceTimeoutMs
        + b"\x00"  # SubscribedTopicNames: null
        + _compact_str(None)  # SubscribedTopicRegex
        + _compact_str(None)  # ServerAssignor
        + b"\x00"  # TopicPartitions: null
        + b"\x00"  # tagged fields
    )
    return _request_header(68, 1, 11, True) + body


def send_without_answer(address: tuple[str, int], frame_body: bytes, timeout: float = 5.0) -> None:
    """Send one request and wait until the broker closes the connection (or timeout)."""
    with socket.create_connection(address, timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(frame_body)) + frame_body)
        try:
            while sock.recv(4096):
                pass
        except OSError:
            pass
