"""A fault-injecting TCP proxy for Kafka connections (tests of bad broker responses).

It listens on 127.0.0.1 (or ``host``), forwards every connection to one upstream broker, and
can corrupt the next response frames: truncate them, garble their bodies, change their
correlation id, announce an oversized length, or drop the connection. Faults can target one
API key. It can also slow the link (``delay_s``: every frame, each way, waits that long
after it was read; the frames of one connection and direction go one at a time) and reset
every connection (`reset_connections`).
"""

from __future__ import annotations

import logging
import random
import socket
import struct
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

from consumer_sdk.testing._proxy import ProxyBase, recv_exact

__all__ = ["FaultKind", "FaultyProxy"]

log = logging.getLogger("consumer_sdk.testing")

FaultKind = Literal["truncate", "garble", "wrong_correlation_id", "oversize_length", "disconnect"]
_KINDS = ("truncate", "garble", "wrong_correlation_id", "oversize_length", "disconnect")


@dataclass
class _Fault:
    kind: FaultKind
    api_key: int | None
    remaining: int


class FaultyProxy(ProxyBase):
    """``with FaultyProxy("127.0.0.1", port) as proxy: proxy.address ...``"""

    def __init__(
        self, upstream_host: str, upstream_port: int, *, seed: int = 0, host: str = "127.0.0.1"
    ) -> None:
        super().__init__(host, "faulty-proxy")
        self.host = host
        #: Added latency: each frame goes on this long after it arrived (0: none).
        self.delay_s = 0.0
        self.upstream = (upstream_host, upstream_port)
        self._faults: deque[_Fault] = deque()
        self._rng = random.Random(seed)
        self.injected: list[tuple[FaultKind, int]] = []
        self.connections_accepted = 0
        self._start()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def reset_connections(self) -> None:
        """Drop every proxied connection now (clients see a reset and reconnect)."""
        with self._lock:
            socks = list(self._sockets)
        self._close_pair(*socks)

    def _hold(self, arrived: float) -> None:
        delay = self.delay_s
        if delay > 0:
            time.sleep(max(arrived + delay - time.monotonic(), 0.0))

    def inject(self, kind: FaultKind, *, api_key: int | None = None, count: int = 1) -> None:
        """Corrupt the next ``count`` responses (to requests of ``api_key``, if given)."""
        if kind not in _KINDS:
            raise ValueError(f"unknown fault kind {kind!r}; expected one of {', '.join(_KINDS)}")
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        with self._lock:
            self._faults.append(_Fault(kind, api_key, count))

    def pending_faults(self) -> int:
        with self._lock:
            return sum(f.remaining for f in self._faults)

    def _take_fault(self, api_key: int) -> FaultKind | None:
        with self._lock:
            for fault in self._faults:
                if fault.api_key is None or fault.api_key == api_key:
                    fault.remaining -= 1
                    if fault.remaining == 0:
                        self._faults.remove(fault)
                    self.injected.append((fault.kind, api_key))
                    return fault.kind
        return None

    def _on_accept(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=5)
            upstream.settimeout(None)
        except OSError:
            client.close()
            return
        with self._lock:
            self.connections_accepted += 1
        self._track(client, upstream)
        pending: deque[int] = deque()
        cond = threading.Condition()
        threading.Thread(
            target=self._pump_requests, args=(client, upstream, pending, cond), daemon=True
        ).start()
        threading.Thread(
            target=self._pump_responses, args=(client, upstream, pending, cond), daemon=True
        ).start()

    def _pump_requests(
        self,
        client: socket.socket,
        upstream: socket.socket,
        pending: deque[int],
        cond: threading.Condition,
    ) -> None:
        try:
            while True:
                prefix = recv_exact(client, 4)
                if prefix is None:
                    break
                (length,) = struct.unpack(">i", prefix)
                body = recv_exact(client, length) if length > 0 else b""
                if body is None:
                    break
                self._hold(time.monotonic())
                api_key = struct.unpack_from(">h", body, 0)[0] if len(body) >= 2 else -1
                with cond:
                    pending.append(api_key)
                    cond.notify_all()
                upstream.sendall(prefix + body)
        except OSError:
            pass
        finally:
            self._close_pair(client, upstream)

    def _pump_responses(
        self,
        client: socket.socket,
        upstream: socket.socket,
        pending: deque[int],
        cond: threading.Condition,
    ) -> None:
        try:
            while True:
                prefix = recv_exact(upstream, 4)
                if prefix is None:
                    break
                (length,) = struct.unpack(">i", prefix)
                body = recv_exact(upstream, length)
                if body is None:
                    break
                self._hold(time.monotonic())
                with cond:
                    cond.wait_for(lambda: bool(pending), timeout=5)
                    api_key = pending.popleft() if pending else -1
                fault = self._take_fault(api_key)
                if fault is None:
                    client.sendall(prefix + body)
                    continue
                log.info("proxy: injecting %s into a response to API %s", fault, api_key)
                if fault == "disconnect":
                    break
                if fault == "truncate":
                    client.sendall(prefix + body[: max(len(body) // 2, 1)])
                    break
                if fault == "oversize_length":
                    client.sendall(struct.pack(">i", 0x7FFFFFF0) + body)
                    break
                if fault == "wrong_correlation_id":
                    cid = struct.unpack_from(">i", body, 0)[0]
                    client.sendall(prefix + struct.pack(">i", cid + 7919) + body[4:])
                    continue
                garbled = bytearray(body)
                for i in range(4, len(garbled)):
                    garbled[i] = self._rng.randrange(256)
                client.sendall(prefix + bytes(garbled))
        except OSError:
            pass
        finally:
            self._close_pair(client, upstream)

    def __enter__(self) -> FaultyProxy:
        return self
