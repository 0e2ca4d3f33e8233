"""`MuxConnection.send_heartbeat`: a host's heartbeat call sent again reuses its encoded body
and its waiter only once its last send was answered (over a real socket pair)."""

from __future__ import annotations

import socket
import struct
from typing import Any

from consumer_sdk.domain import HeartbeatRequest
from consumer_sdk.errors import KafkaException
from consumer_sdk.protocol.heartbeat_codec import HeartbeatEncoder
from consumer_sdk.protocol.multiplex import HeartbeatCall, MuxConnection, VersionCache
from consumer_sdk.protocol.security import ConnectionSettings

_PREFIX = struct.Struct(">ihhi")


def _ready() -> tuple[MuxConnection, socket.socket]:
    ours, broker = socket.socketpair()
    ours.setblocking(False)
    conn = MuxConnection("broker", 9092, ConnectionSettings())
    conn.sock = ours
    conn.versions = VersionCache({68: (0, 1)})
    conn.state = MuxConnection.READY
    return conn, broker


def _frames(data: bytes) -> list[tuple[int, int, bytes]]:
    """(version, correlation id, body) of each request frame in ``data``."""
    out = []
    while data:
        size, _api, version, cid = _PREFIX.unpack_from(data)
        out.append((version, cid, data[12 : 4 + size]))
        data = data[4 + size :]
    return out


def test_a_heartbeat_sent_again_while_its_last_send_is_in_flight_gets_its_own_waiter() -> None:
    conn, broker = _ready()
    outcomes: list[tuple[Any, KafkaException | None]] = []

    def done(result: Any, error: KafkaException | None) -> None:
        outcomes.append((result, error))

    call = HeartbeatCall(HeartbeatRequest("g", "m", 5), HeartbeatEncoder(), "c")
    conn.submit(call, done, 1e12)  # the first send encodes the body
    conn.send_heartbeat(call, done, 1e12)  # again before an answer: a waiter of its own
    waiters = conn.waiters()
    assert len(waiters) == 2 and waiters[0] is not waiters[1]
    assert [w.correlation_id for w in waiters] == [1, 2]
    conn.flush()
    sent = _frames(broker.recv(65536))
    assert [cid for _, cid, _ in sent] == [1, 2]
    assert sent[0][2] == sent[1][2]  # the same body, a new correlation id
    conn.close(None)  # both fail, each once
    assert len(outcomes) == 2 and all(e is not None for _, e in outcomes)
    broker.close()


def test_a_heartbeat_sent_again_after_its_answer_reuses_its_waiter_and_body() -> None:
    conn, broker = _ready()
    call = HeartbeatCall(HeartbeatRequest("g", "m", 5), HeartbeatEncoder(), "c")

    def done(result: Any, error: KafkaException | None) -> None:
        pass

    conn.submit(call, done, 1e12)
    (first,) = conn.waiters()
    conn._in_flight.clear()  # (answered)
    conn.send_heartbeat(call, done, 2e12)
    (again,) = conn.waiters()
    assert again is first and again.correlation_id == 2 and again.deadline == 2e12
    conn.flush()
    sent = _frames(broker.recv(65536))
    assert [(v, cid) for v, cid, _ in sent] == [(1, 1), (1, 2)] and sent[0][2] == sent[1][2]
    conn.close(None)
    broker.close()
