"""`MuxConnection.changes`: counted at every state change, shared among a loop's connections
(a member driver's heartbeat lane asks `connection_id` again only once it moved)."""

from __future__ import annotations

import socket

from consumer_sdk.errors import KafkaTransportError
from consumer_sdk.protocol.connection import BrokerConnection
from consumer_sdk.protocol.multiplex import MuxConnection
from consumer_sdk.protocol.security import ConnectionSettings
from consumer_sdk.runtime.netloop import NetworkLoop
from consumer_sdk.runtime.transport import LoopTransport


def _connected(conn: MuxConnection) -> socket.socket:
    """``conn`` takes over a real socket (its blocking setup's outcome); the broker's end."""
    ours, broker = socket.socketpair()
    conn.connected(BrokerConnection.adopt("broker", 9092, conn.settings, ours, 1, {68: (0, 1)}))
    return broker


def test_every_state_change_moves_the_counter() -> None:
    conn = MuxConnection("broker", 9092, ConnectionSettings())
    seen = [conn.changes[0]]

    def moved() -> bool:
        seen.append(conn.changes[0])
        return seen[-1] > seen[-2]

    conn.start_connecting()
    assert moved()
    conn.connect_failed(KafkaTransportError("refused"), 0.1, 0.0)
    assert moved()
    conn.start_connecting()
    assert moved()
    broker = _connected(conn)
    assert conn.state == MuxConnection.READY and moved()
    conn.paused = True
    sasl = conn.take_for_reauth()
    assert moved()
    conn.connected(sasl)  # re-authenticated: ready again on the same socket
    assert conn.state == MuxConnection.READY and moved()
    conn.close(KafkaTransportError("reset"))
    assert moved()
    broker.close()


def test_a_loops_connections_and_transports_share_one_counter() -> None:
    loop = NetworkLoop("test-changes")  # (not started: its state only)
    try:
        settings = ConnectionSettings()
        transport = LoopTransport(loop, settings, [("broker", 9092)], lambda *_: None)
        one = loop.connection(settings, "broker", 9092)
        two = loop.connection(settings, "other", 9092)
        assert one.changes is two.changes is loop.conn_changes is transport.conn_changes
        before = loop.conn_changes[0]
        two.start_connecting()
        assert loop.conn_changes[0] == before + 1
        transport.drop_connections()  # (new credentials: other connections from now on)
        assert loop.conn_changes[0] == before + 2
    finally:
        loop._shutdown()
