"""One network thread for many members: sockets and timers multiplexed with ``select.epoll``
(``selectors`` where there is none).

`NetworkLoop` runs a single thread that owns every shared broker connection of the
process and a heap of timers (each member's next due time). Members never block it: they
queue requests with `NetworkLoop.request` and get the outcome through a callback on the
loop thread. Connections are shared by the members whose connection settings and broker
address are equal (TLS and SASL settings included; ``client.id`` travels in each request
header, so it does not split connections). Connection setup (TCP, TLS, ApiVersions, SASL)
blocks, so it runs on a short-lived helper thread and the negotiated socket is handed over.

The process-wide loop is reference-counted: `NetworkLoop.acquire` starts it on first use
and `NetworkLoop.release` stops it (closing every connection) when its last user is gone,
so a closed member leaves no thread behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import itertools
import logging
import os
import random
import select
import selectors
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any, ClassVar

from consumer_sdk.backoff import Backoff
from consumer_sdk.errors import KafkaException, KafkaTransportError
from consumer_sdk.observability.log_routing import routed_logs
from consumer_sdk.protocol.connection import BrokerConnection, warm_schemas
from consumer_sdk.protocol.multiplex import Call, Done, MuxConnection
from consumer_sdk.protocol.security import ConnectionSettings

__all__ = ["NetworkLoop", "Timer", "on_loop_thread"]

log = logging.getLogger("consumer_sdk.runtime")

_MAX_SELECT_S = 1.0

#: How late a lax timer (`NetworkLoop.call_at` with ``lax=True``: the members' runs) may
#: fire so that it shares a wake-up with others (timer slack, as Linux's ``timer_slack_ns``).
#: The loop sleeps until the last lax timer due within this of the first one, and fires
#: every timer due by then: a timer with no other due within it (a process with one member)
#: and a timer already due fire on time. Heartbeats of many members in one process: one
#: wake-up for several (CPU per heartbeat: docs/benchmarks.md), each at most this late.
TIMER_SLACK_S = 0.02

# Readiness, as `select.epoll` reports it: an error or a hang-up counts as both (as in
# ``selectors``), so that the read or the write finds it.
_IN = getattr(select, "EPOLLIN", 1)
_OUT = getattr(select, "EPOLLOUT", 4)
_READABLE = ~_OUT
_WRITABLE = ~_IN


class _SelectorPoller:
    """``select.epoll``'s interface over ``selectors`` (where there is no epoll)."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()

    @staticmethod
    def _events(mask: int) -> int:
        return (selectors.EVENT_READ if mask & _IN else 0) | (
            selectors.EVENT_WRITE if mask & _OUT else 0
        )

    def register(self, fd: int, mask: int) -> None:
        self._selector.register(fd, self._events(mask))

    def modify(self, fd: int, mask: int) -> None:
        self._selector.modify(fd, self._events(mask))

    def unregister(self, fd: int) -> None:
        self._selector.unregister(fd)

    def poll(self, timeout: float) -> list[tuple[int, int]]:
        return [
            (
                key.fd,
                (_IN if ev & selectors.EVENT_READ else 0)
                | (_OUT if ev & selectors.EVENT_WRITE else 0),
            )
            for key, ev in self._selector.select(timeout)
        ]

    def close(self) -> None:
        self._selector.close()


#: Whether code that must not run on the network loop thread (it takes data-plane locks the
#: application thread holds across waits) asserts it: on in the test suite, where
#: ``CONSUMER_SDK_CHECK_THREADS=1``; it costs a thread-local read per entry.
check_threads = os.environ.get("CONSUMER_SDK_CHECK_THREADS", "") == "1"

_here = threading.local()


def on_loop_thread() -> bool:
    """Whether the calling thread runs a network loop."""
    return getattr(_here, "loop", False) is True


_warm_up_pid: int | None = None


def _warm_up_once() -> None:
    """Once per process (a forked child's pid differs: it checks again, for free), on the
    caller's thread: the imports a member's join would otherwise wait for (`warm_schemas`).

    Not on a helper thread: a member that subscribes right after its construction (the
    convergence bench's do) joined while the helper still imported, and the two competed
    for the GIL: scale-out on EmbeddedKafka took 0.61-0.64 s with the helper thread, 0.52 s
    with the imports done here, as when every schema was imported with the package."""
    global _warm_up_pid
    if _warm_up_pid == os.getpid():
        return
    _warm_up_pid = os.getpid()
    try:
        warm_schemas()
    except Exception:  # an import that fails here fails again, with its error, where used
        log.debug("schema warm-up failed", exc_info=True)


class Timer:
    """A scheduled callback; `cancel` it to drop it (lazy removal from the heap). ``armed``:
    in the loop's heap (False once popped: fired or dropped); a timer no longer armed may be
    armed again (`NetworkLoop.rearm`) instead of a new one. ``lax``: may fire up to
    `TIMER_SLACK_S` late (it is in the loop's heap of lax timers)."""

    __slots__ = ("armed", "callback", "cancelled", "lax", "when")

    def __init__(self, when: float, callback: Callable[[], None], lax: bool = False) -> None:
        self.when = when
        self.callback = callback
        self.cancelled = False
        self.armed = True
        self.lax = lax

    def cancel(self) -> None:
        self.cancelled = True


ConnKey = tuple[Hashable, str, int]


def _drop_cancelled(heap: list[tuple[float, int, Timer]]) -> None:
    """Pop the cancelled timers off ``heap``'s top: the loop does not wake for them."""
    while heap and heap[0][2].cancelled:
        heapq.heappop(heap)[2].armed = False


class NetworkLoop:
    """The shared network thread; see the module docstring."""

    _shared: ClassVar[NetworkLoop | None] = None
    _shared_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str = "consumer-sdk-network") -> None:
        self._name = name
        # The raw epoll where there is one: ``selectors`` adds Python calls per wake-up.
        self._poller: Any = select.epoll() if hasattr(select, "epoll") else _SelectorPoller()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._poller.register(self._wake_r.fileno(), _IN)
        # Watched sockets: file descriptor -> connection (the wake-up socket's is absent).
        self._by_fd: dict[int, MuxConnection] = {}
        self._fd_of: dict[MuxConnection, int] = {}
        self._calls: deque[Callable[[], None]] = deque()
        self._wake_pending = False
        self._wake_lock = threading.Lock()
        self._timers: list[tuple[float, int, Timer]] = []
        self._lax_timers: list[tuple[float, int, Timer]] = []  # (see `TIMER_SLACK_S`)
        self._seq = itertools.count()
        self._connections: dict[ConnKey, MuxConnection] = {}
        #: Bumped at every state change of any of the loop's connections (their shared
        #: ``changes``): while it holds, each `LoopTransport.connection_id` answer holds.
        self.conn_changes: list[int] = [0]
        self._registered: dict[MuxConnection, int] = {}  # conn -> epoll events
        self._dirty: set[MuxConnection] = set()
        self._shared_state: dict[object, Any] = {}
        self._expiry: dict[MuxConnection, Timer] = {}
        self._users = 0
        self._stopping = False
        self._rng = random.Random()
        self._thread: threading.Thread | None = None
        self._loop_thread_id: int | None = None
        self._pid = os.getpid()

    # -- process-wide instance ----------------------------------------------------------------

    @classmethod
    def acquire(cls) -> NetworkLoop:
        """The process-wide loop, started if needed; pair every call with `release`."""
        with cls._shared_lock:
            loop = cls._shared
            # A forked child inherits the parent's loop object but not its thread: it starts
            # its own (the parent's connections are the parent's).
            if loop is None or loop._stopping or loop._pid != os.getpid():
                loop = cls._shared = NetworkLoop()
            loop._users += 1
            loop._start()
        _warm_up_once()  # outside the lock: another member's start need not wait for it
        return loop

    def release(self) -> None:
        """Drop one user; the last one stops the thread and closes every connection."""
        with NetworkLoop._shared_lock:
            self._users -= 1
            if self._users > 0:
                return
            self._stopping = True
            if NetworkLoop._shared is self:
                NetworkLoop._shared = None
        self._stop()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()

    def _stop(self) -> None:
        self._stopping = True
        self._wakeup()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    @property
    def in_loop_thread(self) -> bool:
        return threading.get_ident() == self._loop_thread_id

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and not self._stopping

    # -- scheduling (thread-safe: call_soon; loop thread: call_at, request) -------------------

    def call_soon(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` on the loop thread (from any thread)."""
        self._calls.append(callback)
        if not self.in_loop_thread:
            self._wakeup()

    def _wakeup(self) -> None:
        with self._wake_lock:
            if self._wake_pending:
                return
            self._wake_pending = True
        with contextlib.suppress(OSError):  # full buffer: a wakeup is already pending
            self._wake_w.send(b"\0")

    def call_at(self, when: float, callback: Callable[[], None], lax: bool = False) -> Timer:
        """Run ``callback`` on the loop thread at monotonic time ``when`` (loop thread only);
        ``lax``: or up to `TIMER_SLACK_S` later, with other timers due by then."""
        timer = Timer(when, callback, lax)
        heapq.heappush(self._lax_timers if lax else self._timers, (when, next(self._seq), timer))
        return timer

    def rearm(self, timer: Timer, when: float) -> None:
        """Schedule ``timer`` (no longer ``armed``: it fired or was dropped) again at ``when``,
        uncancelled (loop thread only; a member's run writes this out inline)."""
        assert not timer.armed
        timer.when = when
        timer.cancelled = False
        timer.armed = True
        heapq.heappush(
            self._lax_timers if timer.lax else self._timers, (when, next(self._seq), timer)
        )

    def request(self, conn: MuxConnection, call: Call[Any], done: Done, timeout_s: float) -> None:
        """Send ``call`` over ``conn`` (from `connection`), connecting if needed;
        ``done(result, error)`` runs on the loop thread (loop thread only)."""
        deadline = time.monotonic() + timeout_s
        conn.submit(call, done, deadline)
        if conn.state == MuxConnection.NEW:
            self._connect(conn)
        # One expiry timer per connection, at its earliest deadline (not one per request).
        timer = self._expiry.get(conn)
        if timer is None or timer.cancelled or deadline < timer.when:
            self.watch_expiry(conn, deadline)
        self._dirty.add(conn)  # written at the end of this loop iteration, with the others

    def watch_expiry(self, conn: MuxConnection, deadline: float) -> None:
        """``conn``'s expiry timer at ``deadline``, earlier than its current one (loop thread
        only; `request` calls it, and a transport's hot path that writes `request` out)."""
        timer = self._expiry.get(conn)
        if timer is not None:
            timer.cancel()
        self._expiry[conn] = self.call_at(deadline, lambda: self._expire(conn))

    @staticmethod
    def connection_key(settings: ConnectionSettings) -> Hashable:
        """What decides connection sharing: every setting but ``client.id``, plus the SASL
        identity the connection authenticates with (the current user and password, or the
        OAUTHBEARER token source itself), which settings equality does not cover."""
        creds = settings.credentials.get() if settings.uses_sasl else None
        oauth = id(settings.oauth) if settings.oauth is not None else None
        return (dataclasses.replace(settings, client_id=""), creds, oauth)

    def connection(self, settings: ConnectionSettings, host: str, port: int) -> MuxConnection:
        """The shared connection for this address and these settings (loop thread only).
        The first member's settings (and its credentials holder) are the connection's."""
        key = (self.connection_key(settings), host, port)
        conn = self._connections.get(key)
        if conn is None:
            conn = self._connections[key] = MuxConnection(host, port, settings)
            conn.changes = self.conn_changes
        return conn

    def shared(self, key: object, factory: Callable[[], Any]) -> Any:
        """A per-process object shared by the members that use the same ``key`` (loop
        thread only), e.g. the topic names of one cluster."""
        value = self._shared_state.get(key)
        if value is None:
            value = self._shared_state[key] = factory()
        return value

    def connections(self) -> list[MuxConnection]:
        return list(self._connections.values())

    # -- connections ----------------------------------------------------------------------------

    def _backoff(self, failures: int, settings: ConnectionSettings) -> float:
        """Reconnect backoff (librdkafka's reconnect.backoff.ms, +-20% jitter)."""
        initial = max(settings.reconnect_backoff_ms, 1)
        backoff = Backoff(initial, max(settings.reconnect_backoff_max_ms, initial), 0.2, self._rng)
        return backoff.backoff_s(failures - 1)

    def _connect(self, conn: MuxConnection) -> None:
        conn.start_connecting()
        delay = max(conn.retry_at - time.monotonic(), 0.0)

        def setup() -> None:
            if delay:
                time.sleep(delay)
            bc = BrokerConnection(conn.host, conn.port, conn.settings)
            try:
                with routed_logs(conn.log_target):
                    bc.open()
            except KafkaException as exc:
                error = exc
                self.call_soon(lambda: self._connect_failed(conn, error))
                return
            except Exception as exc:  # unexpected: still fail the waiting requests
                error = KafkaTransportError(f"connect to {conn.host}:{conn.port} failed: {exc}")
                self.call_soon(lambda: self._connect_failed(conn, error))
                return
            self.call_soon(lambda: self._connected(conn, bc))

        threading.Thread(target=setup, name=f"{self._name}-connect", daemon=True).start()

    def _connected(self, conn: MuxConnection, bc: BrokerConnection) -> None:
        if self._stopping:
            bc.close()
            return
        conn.connected(bc)
        log.debug("shared connection to %s:%s ready", conn.host, conn.port)
        if conn.reauth_at is not None:
            generation = conn.generation
            self.call_at(conn.reauth_at, lambda: self._pause_for_reauth(conn, generation))
        self._update_interest(conn)

    # KIP-368: a SASL session with a lifetime is renewed on the same connection. New requests
    # are held back, those in flight are answered, then the exchange runs on a helper thread
    # (it blocks) and the socket comes back; a failure closes the connection like any other.

    def _pause_for_reauth(self, conn: MuxConnection, generation: int) -> None:
        if conn.generation == generation and conn.state == MuxConnection.READY:
            conn.paused = True
            self._update_interest(conn)

    def _start_reauth(self, conn: MuxConnection) -> None:
        sock = conn.sock
        assert sock is not None
        self._unregister(conn, sock)
        bc = conn.take_for_reauth()

        def run() -> None:
            try:
                with routed_logs(conn.log_target):
                    bc.reauthenticate()
            except KafkaException as exc:
                error = exc
                self.call_soon(lambda: self._reauth_failed(conn, error))
                return
            except Exception as exc:
                error = KafkaTransportError(
                    f"re-authentication with {conn.host}:{conn.port} failed: {exc}"
                )
                self.call_soon(lambda: self._reauth_failed(conn, error))
                return
            self.call_soon(lambda: self._connected(conn, bc))

        threading.Thread(target=run, name=f"{self._name}-reauth", daemon=True).start()

    def _reauth_failed(self, conn: MuxConnection, exc: KafkaException) -> None:
        with routed_logs(conn.log_target):
            log.info(
                "re-authentication with %s:%s failed: %s", conn.host, conn.port, exc.args[0].str()
            )
        conn.close(exc)  # the helper closed the socket; this fails the held-back requests

    def _connect_failed(self, conn: MuxConnection, exc: KafkaException) -> None:
        backoff = self._backoff(conn.failures + 1, conn.settings)
        with routed_logs(conn.log_target):
            log.info(
                "connect to %s:%s failed (%s); next attempt in %.0f ms",
                conn.host,
                conn.port,
                exc.args[0].str(),
                backoff * 1000,
            )
        conn.connect_failed(exc, backoff, time.monotonic())
        if not conn.idle and conn.state == MuxConnection.NEW:
            self._connect(conn)

    def _expire(self, conn: MuxConnection) -> None:
        self._expiry.pop(conn, None)
        next_deadline = conn.expire(time.monotonic())
        if next_deadline is not None:
            self._expiry[conn] = self.call_at(next_deadline, lambda: self._expire(conn))
        self._update_interest(conn)

    def _unregister(self, conn: MuxConnection, sock: socket.socket) -> None:
        if self._registered.pop(conn, None) is not None:
            fd = self._fd_of.pop(conn)
            self._by_fd.pop(fd, None)
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._poller.unregister(fd)

    def _update_interest(self, conn: MuxConnection) -> None:
        sock = conn.sock
        if sock is None:
            if self._registered.pop(conn, None) is not None:
                self._by_fd.pop(self._fd_of.pop(conn), None)
            return
        if conn.paused and conn.ready_for_reauth:
            self._start_reauth(conn)
            return
        current = self._registered.get(conn)
        if conn.wants_write:
            conn.flush()
            if conn.sock is None:
                self._update_interest(conn)
                return
        events = _IN | _OUT if conn.wants_write else _IN
        if current is None:
            conn.before_close = lambda s: self._unregister(conn, s)
            fd = sock.fileno()
            self._poller.register(fd, events)
            self._by_fd[fd] = conn
            self._fd_of[conn] = fd
            self._registered[conn] = events
        elif current != events:
            self._poller.modify(self._fd_of[conn], events)
            self._registered[conn] = events

    # -- the loop ------------------------------------------------------------------------------

    def _run(self) -> None:
        self._loop_thread_id = threading.get_ident()
        _here.loop = True
        try:
            while not self._stopping:
                self._run_once()
        except Exception:
            log.exception("the network loop failed")
        finally:
            self._shutdown()

    def _run_once(self) -> None:
        timeout = _MAX_SELECT_S
        if self._calls:
            timeout = 0.0
        elif self._timers or self._lax_timers:
            now = time.monotonic()
            wake = now + _MAX_SELECT_S
            timers = self._timers
            _drop_cancelled(timers)
            _drop_cancelled(self._lax_timers)
            if timers:
                wake = timers[0][0]
            if self._lax_timers:
                lax = self._lax_wake(now)
                if lax < wake:
                    wake = lax
            timeout = min(max(wake - now, 0.0), _MAX_SELECT_S)
        by_fd = self._by_fd
        for fd, mask in self._poller.poll(timeout):
            conn = by_fd.get(fd)
            if conn is None:  # the wake-up socket
                self._drain_wakeups()
                continue
            if mask & _READABLE:
                conn.on_readable()
            if mask & _WRITABLE:
                conn.flush()
            self._update_interest(conn)
        # (`_safely`, inline: once per callback and timer)
        calls = self._calls
        while calls:
            callback = calls.popleft()
            try:
                callback()
            except Exception:
                log.exception("network loop callback failed")
        now = time.monotonic()
        for timers in (self._timers, self._lax_timers):
            while timers and timers[0][0] <= now:
                _, _, timer = heapq.heappop(timers)
                timer.armed = False
                if not timer.cancelled:
                    try:
                        timer.callback()
                    except Exception:
                        log.exception("network loop callback failed")
        # Requests queued by callbacks and timers go out in one write per connection.
        while self._dirty:
            self._update_interest(self._dirty.pop())

    def _lax_wake(self, now: float) -> float:
        """When to wake for the lax timers: the first one's time if due, else the latest
        time of those due within `TIMER_SLACK_S` of it (they are at the heap's top: a walk
        of that subtree only). The top is not cancelled (`_drop_cancelled`), and cancelled
        timers in the walk count for nothing (a member that moved its run earlier is not made
        to wait for the run it cancelled)."""
        heap = self._lax_timers
        wake = heap[0][0]
        if wake <= now:
            return wake
        bound = wake + TIMER_SLACK_S
        size = len(heap)
        todo = [1, 2]
        while todo:
            i = todo.pop()
            if i < size:
                when, _, timer = heap[i]
                if when <= bound:
                    if when > wake and not timer.cancelled:
                        wake = when
                    todo.append(2 * i + 1)
                    todo.append(2 * i + 2)
        return wake

    def _safely(self, callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:
            log.exception("network loop callback failed")

    def _drain_wakeups(self) -> None:
        # Read first, then clear the flag: clearing first could swallow the byte of a wakeup
        # that set the flag in between, leaving the flag set with nothing left to read, and
        # every later wakeup would then be skipped.
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass
        with self._wake_lock:
            self._wake_pending = False

    def _shutdown(self) -> None:
        for conn in list(self._connections.values()):
            conn.close(None)
        self._connections.clear()
        self._registered.clear()
        while self._calls:  # completions queued by the closes
            self._safely(self._calls.popleft())
        try:
            self._poller.close()
        finally:
            self._wake_r.close()
            self._wake_w.close()
