"""A minimal scripted Kafka peer on 127.0.0.1 for API versions the embedded cluster lacks.

It decodes real request headers and answers with kio-encoded responses over a real socket:
ApiVersions (the advertised ranges are configurable) and FindCoordinator v4-v6 (batched).
"""

from __future__ import annotations

import contextlib
import datetime
import io
import socket
import struct
import threading
from typing import Any

from kio.schema.api_versions.v3.response import ApiVersion, ApiVersionsResponse
from kio.schema.errors import ErrorCode
from kio.schema.find_coordinator.v4 import response as fc4
from kio.schema.response_header.v0.header import ResponseHeader as H0
from kio.schema.response_header.v1.header import ResponseHeader as H1
from kio.schema.types import BrokerId
from kio.serial import entity_writer
from kio.static.primitive import i16, i32, i32Timedelta


class StubBroker:
    def __init__(self, ranges: dict[int, tuple[int, int]], coordinator_port: int = 9999) -> None:
        self.ranges = ranges
        self.coordinator_port = coordinator_port
        self.requests: list[tuple[int, int]] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            while True:
                prefix = conn.recv(4, socket.MSG_WAITALL)
                if len(prefix) < 4:
                    return
                body = conn.recv(struct.unpack(">i", prefix)[0], socket.MSG_WAITALL)
                api_key, version, cid = struct.unpack_from(">hhi", body, 0)
                self.requests.append((api_key, version))
                reply = self._reply(api_key, version, cid)
                if reply is None:
                    return
                conn.sendall(struct.pack(">i", len(reply)) + reply)

    def _reply(self, api_key: int, version: int, cid: int) -> bytes | None:
        buf = io.BytesIO()
        zero = i32Timedelta.parse(datetime.timedelta(0))
        if api_key == 18:
            entity_writer(H0)(buf, H0(correlation_id=i32(cid)))
            lo, hi = self.ranges[18]
            if version > hi:
                # What a real broker does: an UNSUPPORTED_VERSION error with a v0 body.
                buf.write(struct.pack(">hi", 35, 1) + struct.pack(">hhh", 18, lo, hi))
                return buf.getvalue()
            response: Any = ApiVersionsResponse(
                error_code=ErrorCode.none,
                api_keys=tuple(
                    ApiVersion(api_key=i16(k), min_version=i16(a), max_version=i16(b))
                    for k, (a, b) in sorted(self.ranges.items())
                ),
                throttle_time=zero,
            )
            entity_writer(ApiVersionsResponse)(buf, response)
            return buf.getvalue()
        if api_key == 10 and version >= 4:
            entity_writer(H1)(buf, H1(correlation_id=i32(cid)))
            body = fc4.FindCoordinatorResponse(
                throttle_time=zero,
                coordinators=(
                    fc4.Coordinator(
                        key="g-batched",
                        node_id=BrokerId(7),
                        host="127.0.0.1",
                        port=i32(self.coordinator_port),
                        error_code=ErrorCode.none,
                        error_message=None,
                    ),
                ),
            )
            entity_writer(fc4.FindCoordinatorResponse)(buf, body)
            return buf.getvalue()
        return None

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            self._server.close()
