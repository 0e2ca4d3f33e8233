"""`LoopTransport`: a member driver's requests over the network loop's shared connections.

Loop thread only. It turns each `Outbound` into the wire call (``protocol.multiplex``),
sends it over the shared `MuxConnection` of its destination (a bootstrap server, tried in
turn after failures, or the group coordinator) and hands the outcome, response or
exception, to ``deliver`` on the loop thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Hashable
from functools import partial
from typing import Any

from consumer_sdk.domain import Coordinator, HeartbeatRequest
from consumer_sdk.errors import KafkaException, KafkaTransportError
from consumer_sdk.protocol import messages as m
from consumer_sdk.protocol.heartbeat_codec import HeartbeatEncoder
from consumer_sdk.protocol.multiplex import Call, HeartbeatCall, KioCall, MuxConnection
from consumer_sdk.protocol.security import ConnectionSettings
from consumer_sdk.runtime.driver import Api, Outbound
from consumer_sdk.runtime.netloop import NetworkLoop

__all__ = ["Deliver", "HeartbeatTrace", "LoopTransport"]

log = logging.getLogger("consumer_sdk.runtime")

_ENCODER = HeartbeatEncoder()  # used on the loop thread only

#: ``deliver(request, response, error)``: exactly one of response and error is set.
Deliver = Callable[[Outbound, Any, KafkaException | None], None]
#: Diagnostics: ``(request, sent wall-clock time, response or None, error or None)``.
HeartbeatTrace = Callable[[HeartbeatRequest, float, Any, KafkaException | None], None]
LogTarget = logging.Logger | logging.LoggerAdapter[logging.Logger]


class LoopTransport:
    """The real `Transport` of the runtime; see the module docstring."""

    __slots__ = (
        "_auto_create",
        "_bootstrap",
        "_bootstrap_index",
        "_client_id",
        "_deliver",
        "_hb_call",
        "_hb_request",
        "_logger",
        "_loop",
        "conn_changes",
        "conns",
        "heartbeat_sent",
        "heartbeat_trace",
        "settings",
    )

    def __init__(
        self,
        loop: NetworkLoop,
        settings: ConnectionSettings,
        bootstrap: list[tuple[str, int]],
        deliver: Deliver,
        logger: LogTarget | None = None,
        *,
        allow_auto_create_topics: bool = False,
    ) -> None:
        self._auto_create = allow_auto_create_topics
        self._loop = loop
        self.settings = settings
        self._client_id = settings.client_id
        self._bootstrap = bootstrap
        self._bootstrap_index = 0
        self._deliver = deliver
        self._logger = logger
        self.conns: dict[tuple[str, int], MuxConnection] = {}
        #: The loop's connections' change counter (see `MemberDriver.run`'s lane): while
        #: ``conn_changes[0]`` holds and ``conns`` is not cleared, `connection_id` answers
        #: each coordinator as before.
        self.conn_changes: list[int] = loop.conn_changes
        self.heartbeat_trace: HeartbeatTrace | None = None
        #: Diagnostics: called with each heartbeat request as it is handed to its connection.
        self.heartbeat_sent: Callable[[HeartbeatRequest], None] | None = None
        # The last heartbeat sent on the hot path, and its call and outcome callback.
        self._hb_request: Outbound | None = None
        self._hb_call: tuple[HeartbeatCall, Callable[[Any, KafkaException | None], None]]

    def _conn(self, host: str, port: int) -> MuxConnection:
        conn = self.conns.get((host, port))
        if conn is None:
            conn = self.conns[(host, port)] = self._loop.connection(self.settings, host, port)
            if conn.log_target is None:
                conn.log_target = self._logger
        return conn

    def drop_connections(self) -> None:
        """Forget the connections used so far: the next requests get the loop's connection
        for the current settings (new credentials: another connection)."""
        self.conns.clear()
        self.conn_changes[0] += 1  # `connection_id` may answer otherwise now

    def connection_id(self, coordinator: Coordinator) -> Hashable | None:
        conn = self.conns.get((coordinator.host, coordinator.port))
        if conn is None:
            conn = self._conn(coordinator.host, coordinator.port)
        if conn.state != MuxConnection.READY:
            return None
        return (id(conn), conn.generation)

    def send(self, request: Outbound) -> None:
        api = request.api
        coordinator = request.coordinator
        if (
            api is Api.HEARTBEAT
            and coordinator is not None
            and self.heartbeat_sent is None
            and self.heartbeat_trace is None
        ):  # the hot path: what the general one below does for it, inline
            conn = self.conns.get((coordinator.host, coordinator.port))
            if conn is None:
                conn = self._conn(coordinator.host, coordinator.port)
            # A stable member sends the same `Outbound` again while its request holds (one at
            # a time: the driver sends the next once this one's outcome came): its call, with
            # the encoded frame, serves again.
            if request is self._hb_request:
                hb_call, hb_done = self._hb_call
            else:
                hb_call = HeartbeatCall(request.payload, _ENCODER, self._client_id)
                hb_done = partial(self._deliver, request)
                self._hb_request, self._hb_call = request, (hb_call, hb_done)
            # `self._loop.request(conn, hb_call, hb_done, timeout)`, inline (once per beat)
            loop = self._loop
            if conn.state is not MuxConnection.READY:
                loop.request(conn, hb_call, hb_done, request.timeout_ms / 1000)
                return
            deadline = time.monotonic() + request.timeout_ms / 1000
            conn.send_heartbeat(hb_call, hb_done, deadline)
            timer = loop._expiry.get(conn)
            if timer is None or timer.cancelled or deadline < timer.when:
                loop.watch_expiry(conn, deadline)
            loop._dirty.add(conn)
            return
        done: Callable[[Any, KafkaException | None], None]
        if api is Api.FIND_COORDINATOR or api is Api.METADATA or api is Api.GROUP_SESSION_TIMEOUT:
            host, port = self._bootstrap[self._bootstrap_index % len(self._bootstrap)]
            done = self._from_any_broker(request)
        else:
            if coordinator is None:
                error = KafkaTransportError("the group coordinator is unknown")
                self._loop.call_soon(lambda: self._deliver(request, None, error))
                return
            host, port = coordinator.host, coordinator.port
            trace = self.heartbeat_trace
            if api is Api.HEARTBEAT and self.heartbeat_sent is not None:
                self.heartbeat_sent(request.payload)
            if api is Api.HEARTBEAT and trace is not None:
                done = self._traced(request, trace, time.time())
            else:
                done = self._from_coordinator(request)
        conn = self._conn(host, port)
        self._loop.request(conn, self._call(request), done, request.timeout_ms / 1000)

    def _from_any_broker(self, request: Outbound) -> Callable[[Any, KafkaException | None], None]:
        def done(response: Any, error: KafkaException | None) -> None:
            if error is not None:
                self._bootstrap_index += 1  # try the next bootstrap server
            self._deliver(request, response, error)

        return done

    def _from_coordinator(self, request: Outbound) -> Callable[[Any, KafkaException | None], None]:
        return partial(self._deliver, request)

    def _traced(
        self, request: Outbound, trace: HeartbeatTrace, sent: float
    ) -> Callable[[Any, KafkaException | None], None]:
        def done(response: Any, error: KafkaException | None) -> None:
            try:
                trace(request.payload, sent, response, error)
            except Exception:
                log.exception("heartbeat trace failed")
            self._deliver(request, response, error)

        return done

    def _call(self, request: Outbound) -> Call[Any]:
        api, payload, client_id = request.api, request.payload, self._client_id
        if api is Api.HEARTBEAT:
            return HeartbeatCall(payload, _ENCODER, client_id)
        if api is Api.OFFSET_COMMIT:
            return KioCall(
                m.API_OFFSET_COMMIT,
                lambda v: m.offset_commit_call(payload, v),
                m.offset_commit_from_kio,
                client_id,
            )
        if api is Api.OFFSET_FETCH:
            return KioCall(
                m.API_OFFSET_FETCH,
                lambda v: m.offset_fetch_call(payload, v),
                m.offset_fetch_from_kio,
                client_id,
            )
        if api is Api.FIND_COORDINATOR:
            return KioCall(
                m.API_FIND_COORDINATOR,
                lambda v: m.find_coordinator_call(payload, v),
                lambda r: m.find_coordinator_from_kio(payload, r),
                client_id,
            )
        if api is Api.GROUP_SESSION_TIMEOUT:
            return KioCall(
                m.API_DESCRIBE_CONFIGS,
                lambda v: m.group_session_timeout_call(payload, v),
                m.group_session_timeout_from_kio,
                client_id,
            )
        topics = None if payload is None else list(payload)
        auto_create = self._auto_create
        return KioCall(
            m.API_METADATA,
            lambda v: m.metadata_call(topics, v, auto_create),
            m.metadata_from_kio,
            client_id,
        )
