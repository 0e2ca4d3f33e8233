"""`LoopTransport.send`'s heartbeat path: a plain heartbeat sent again reuses its call's
encoded body and waiter (`MuxConnection.send_heartbeat`) only when its last send was
answered, on a connection not paused, at the same version; each other case is submitted
again (a real socket pair; the loop is not started, the test plays its part)."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from typing import Any

import pytest

from consumer_sdk.domain import Coordinator, HeartbeatRequest
from consumer_sdk.errors import KafkaException
from consumer_sdk.protocol.multiplex import MuxConnection, VersionCache
from consumer_sdk.protocol.security import ConnectionSettings
from consumer_sdk.runtime.driver import Api, Outbound
from consumer_sdk.runtime.netloop import NetworkLoop
from consumer_sdk.runtime.transport import LoopTransport

_PREFIX = struct.Struct(">ihhi")
COORD = Coordinator("g", 1, "broker", 9092)


class Setup:
    def __init__(self, loop: NetworkLoop) -> None:
        self.outcomes: list[tuple[Any, KafkaException | None]] = []
        self.transport = LoopTransport(
            loop,
            ConnectionSettings(),
            [("broker", 9092)],
            lambda _req, res, err: self.outcomes.append((res, err)),
        )
        self.conn = self.transport._conn("broker", 9092)
        ours, self.broker = socket.socketpair()
        ours.setblocking(False)
        self.conn.sock = ours
        self.conn.versions = VersionCache({68: (0, 1)})
        self.conn.state = MuxConnection.READY
        self.out = Outbound(Api.HEARTBEAT, HeartbeatRequest("g", "m", 5), COORD, 5_000)

    def frames(self) -> list[tuple[int, int, bytes]]:
        """(version, correlation id, body) of each request frame written so far."""
        self.conn.flush()
        self.broker.setblocking(False)
        try:
            data = self.broker.recv(65536)
        except BlockingIOError:
            return []
        out = []
        while data:
            size, _api, version, cid = _PREFIX.unpack_from(data)
            out.append((version, cid, data[12 : 4 + size]))
            data = data[4 + size :]
        return out


@pytest.fixture(name="s")
def setup() -> Iterator[Setup]:
    loop = NetworkLoop("test-resend")
    s = Setup(loop)
    try:
        yield s
    finally:
        s.broker.close()
        loop._shutdown()


def test_a_heartbeat_sent_again_after_its_answer_reuses_its_waiter_and_body(s: Setup) -> None:
    s.transport.send(s.out)
    (first,) = s.conn.waiters()
    s.conn._in_flight.clear()  # (answered)
    s.transport.send(s.out)
    (again,) = s.conn.waiters()
    assert again is first and again.correlation_id == first.correlation_id
    sent = s.frames()
    assert [v for v, _, _ in sent] == [1, 1] and sent[0][2] == sent[1][2]
    assert sent[1][1] == sent[0][1] + 1


def test_a_heartbeat_sent_again_while_in_flight_gets_its_own_waiter(s: Setup) -> None:
    s.transport.send(s.out)
    s.transport.send(s.out)  # no answer yet
    waiters = s.conn.waiters()
    assert len(waiters) == 2 and waiters[0] is not waiters[1]
    assert len(s.frames()) == 2


def test_a_heartbeat_sent_again_on_a_paused_connection_waits(s: Setup) -> None:
    s.transport.send(s.out)
    s.conn._in_flight.clear()  # (answered)
    s.conn.paused = True  # (KIP-368: held back until re-authenticated)
    s.transport.send(s.out)
    assert len(s.frames()) == 1
    assert len(s.conn._queued) == 1


def test_a_heartbeat_sent_again_after_the_version_changed_is_encoded_again(s: Setup) -> None:
    s.transport.send(s.out)
    s.conn._in_flight.clear()  # (answered)
    s.conn.versions = VersionCache({68: (0, 0)})  # (reconnected to an older broker)
    s.transport.send(s.out)
    assert [v for v, _, _ in s.frames()] == [1, 0]


def test_a_heartbeat_that_could_not_be_encoded_fails_again(s: Setup) -> None:
    s.conn.versions = VersionCache({})  # (a broker without KIP-848)
    s.transport.send(s.out)
    s.transport.send(s.out)
    assert s.frames() == []
    assert len(s.outcomes) == 2 and all(err is not None for _, err in s.outcomes)


def test_a_heartbeat_its_version_cannot_carry_fails_again(s: Setup) -> None:
    """A regex subscription to a broker with ConsumerGroupHeartbeat v0 only: the version is
    known, the body could not be encoded; sent again, it fails again (nothing written)."""
    s.conn.versions = VersionCache({68: (0, 0)})
    s.out = Outbound(
        Api.HEARTBEAT,
        HeartbeatRequest("g", "m", 0, subscribed_topic_regex="t.*"),
        COORD,
        5_000,
    )
    s.transport.send(s.out)
    s.transport.send(s.out)
    assert s.frames() == []
    assert len(s.outcomes) == 2 and all(err is not None for _, err in s.outcomes)
