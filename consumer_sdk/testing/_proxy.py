"""Plumbing shared by the test proxies: a loopback listener, tracked socket pairs, close."""

from __future__ import annotations

import contextlib
import socket
import threading
from typing import Any


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    """Exactly ``n`` bytes from ``sock``, or None if the peer closed first."""
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return bytes(data)


class ProxyBase:
    """Listens on ``host``:0 and accepts connections on a daemon thread (``_on_accept``).

    Subclasses register the sockets of each proxied connection with `_track`;
    `close` stops accepting at once and closes every tracked socket.
    """

    def __init__(self, host: str, thread_name: str) -> None:
        self._listener = socket.create_server((host, 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        self._closed = False
        self._thread = threading.Thread(target=self._accept_loop, name=thread_name, daemon=True)

    def _start(self) -> None:
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._on_accept(client)

    def _on_accept(self, client: socket.socket) -> None:
        raise NotImplementedError

    def _track(self, *socks: socket.socket) -> None:
        with self._lock:
            self._sockets.update(socks)

    def _close_pair(self, *socks: socket.socket) -> None:
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                s.close()
            with self._lock:
                self._sockets.discard(s)

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._lock:
            socks = list(self._sockets)
        self._close_pair(*socks)
        self._thread.join(timeout=2)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
