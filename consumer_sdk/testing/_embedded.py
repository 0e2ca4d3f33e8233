"""EmbeddedKafka: librdkafka's mock cluster in a child process (see `consumer_sdk.testing`)."""

from __future__ import annotations

import base64
import collections
import contextlib
import importlib.resources
import importlib.util
import itertools
import json
import logging
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

logger = logging.getLogger("consumer_sdk.testing")

__all__ = ["EmbeddedKafka", "EmbeddedKafkaError", "MockRequest"]

_STDERR_RING = 200
_STDERR_TAIL = 50
_CLOSE_TIMEOUT_S = 5.0
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_INT16 = (-(2**15), 2**15 - 1)
_INT32 = (-(2**31), 2**31 - 1)

Payload = bytes | bytearray | memoryview | str | None


class EmbeddedKafkaError(RuntimeError):
    """An EmbeddedKafka operation failed, or its child process is gone.

    ``code`` is the mock's Kafka/librdkafka error code when a mock call returned one
    (e.g. 36 TOPIC_ALREADY_EXISTS); ``returncode`` is the child's exit status when it
    died (negative: killed by that signal); ``stderr_tail`` holds its last stderr lines.
    """

    def __init__(
        self,
        message: str,
        *,
        code: int | None = None,
        returncode: int | None = None,
        stderr_tail: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.returncode = returncode
        self.stderr_tail = list(stderr_tail)


class MockRequest(NamedTuple):
    """One request seen by the mock: ``(api_key, timestamp_us, broker_id)``.

    ``timestamp_us`` is librdkafka's monotonic clock in microseconds (not wall time).
    """

    api_key: int
    timestamp_us: int
    broker_id: int


def _describe_returncode(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"was killed by {name} (returncode {returncode})"
    return f"exited with code {returncode}"


class _Child:
    """The child process, its pipes and reader threads (no reference to EmbeddedKafka)."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            close_fds=True,
            start_new_session=True,  # a Ctrl-C aimed at the test run is the parent's to handle
        )
        self.pid = self.proc.pid
        self.owner_pid = os.getpid()
        self.stderr_ring: collections.deque[str] = collections.deque(maxlen=_STDERR_RING)
        self.replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.eof = threading.Event()
        self.write_lock = threading.Lock()
        self.killed = False
        self._shut = False
        self._stdout_thread = threading.Thread(
            target=self._read_stdout, name=f"embedded-kafka-{self.pid}-stdout", daemon=True
        )
        self._stderr_thread = threading.Thread(
            target=self._read_stderr, name=f"embedded-kafka-{self.pid}-stderr", daemon=True
        )
        self._stdout_thread.start()
        self._stderr_thread.start()

    def _read_stdout(self) -> None:
        stream = self.proc.stdout
        assert stream is not None
        try:
            for raw in stream:
                try:
                    message = json.loads(raw)
                except ValueError:
                    self.stderr_ring.append("[stdout] " + raw.decode("utf-8", "replace").rstrip())
                    continue
                if isinstance(message, dict):
                    self.replies.put(message)
        except (OSError, ValueError):
            pass
        finally:
            self.eof.set()
            self.replies.put(None)

    def _read_stderr(self) -> None:
        stream = self.proc.stderr
        assert stream is not None
        with contextlib.suppress(OSError, ValueError):
            for raw in stream:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                self.stderr_ring.append(line)
                logger.debug("[embedded-kafka pid %d] %s", self.pid, line)

    def send(self, message: dict[str, Any]) -> None:
        stdin = self.proc.stdin
        assert stdin is not None
        data = (json.dumps(message) + "\n").encode()
        with self.write_lock:
            stdin.write(data)
            stdin.flush()

    def running(self) -> bool:
        return self.proc.poll() is None and not self.eof.is_set()

    def tail(self, lines: int = _STDERR_TAIL) -> list[str]:
        return list(self.stderr_ring)[-lines:]

    def death_error(self, prefix: str = "") -> EmbeddedKafkaError:
        """Describe the child's death (waits briefly for its exit status and stderr)."""
        try:
            returncode: int | None = self.proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            # stdout closed but the process lingers: it is of no further use.
            self.proc.kill()
            returncode = self.proc.wait(timeout=5.0)
        self._stderr_thread.join(timeout=2.0)
        assert returncode is not None
        tail = self.tail()
        how = _describe_returncode(returncode)
        message = f"{prefix}embedded Kafka child process (pid {self.pid}) {how}"
        if self.killed:
            message += " after EmbeddedKafka.kill()"
        if tail:
            message += f"; last {len(tail)} stderr line(s):\n" + "\n".join(tail)
        else:
            message += "; it wrote nothing to stderr"
        return EmbeddedKafkaError(message, returncode=returncode, stderr_tail=tail)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.killed = True
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5.0)

    def shutdown(self, timeout: float = _CLOSE_TIMEOUT_S) -> None:
        """Stop the child: ask politely, then SIGTERM, then SIGKILL. Idempotent, bounded."""
        if self._shut or os.getpid() != self.owner_pid:  # a fork inherited the handle
            return
        self._shut = True
        if self.proc.poll() is None and not self.eof.is_set():
            with contextlib.suppress(OSError, ValueError):
                self.send({"id": -1, "cmd": "close", "args": {}})
        for stop in (None, self.proc.terminate, self.proc.kill):
            if stop is not None and self.proc.poll() is None:
                with contextlib.suppress(OSError):
                    stop()
            try:
                self.proc.wait(timeout=timeout if stop is None else 2.0)
                break
            except subprocess.TimeoutExpired:
                continue
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        self._stdout_thread.join(timeout=2.0)
        self._stderr_thread.join(timeout=2.0)
        logger.debug("embedded Kafka child %d stopped (returncode %s)", self.pid, self.proc.poll())


def _child_command() -> list[str]:
    """argv prefix that runs ``_mock_child`` without importing consumer_sdk in the child."""
    if not sys.executable:
        raise EmbeddedKafkaError("cannot start EmbeddedKafka: sys.executable is empty")
    script = Path(__file__).with_name("_mock_child.py")
    # -u: unbuffered; -P: do not put the script's directory on sys.path.
    if script.is_file():
        return [sys.executable, "-u", "-P", str(script)]
    source = importlib.resources.files(__package__).joinpath("_mock_child.py").read_text()
    return [sys.executable, "-u", "-P", "-c", source]


def _child_env() -> dict[str, str]:
    spec = importlib.util.find_spec("confluent_kafka")
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedKafkaError("cannot start EmbeddedKafka: confluent-kafka is not installed")
    site_dir = os.path.dirname(os.path.abspath(next(iter(spec.submodule_search_locations))))
    env = dict(os.environ)
    paths = [site_dir, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


# -- argument validation (bad input can abort the mock, so it is checked here) ------------


def _int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}")
    return int(value)


def _text(name: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"{name} must not be empty")
    if "\x00" in value:
        raise ValueError(f"{name} must not contain NUL characters")
    return value


def _topic(value: object) -> str:
    topic = _text("topic", value)
    if not _TOPIC_RE.match(topic) or topic in (".", ".."):
        raise ValueError(
            f"invalid topic name {topic!r}: use 1-249 characters from [A-Za-z0-9._-], "
            "not '.' or '..'"
        )
    return topic


def _b64(name: str, value: Payload) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = value.encode("utf-8")
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"{name} must be bytes, str or None, not {type(value).__name__}")
    return base64.b64encode(bytes(value)).decode("ascii")


class EmbeddedKafka:
    """A real Kafka-protocol cluster for tests: librdkafka's mock cluster in a child process.

    The mock speaks the Kafka wire protocol on loopback (brokers ``1..brokers``), including
    KIP-848 ``ConsumerGroupHeartbeat`` v1, and offers fault injection. It runs in a child
    process because malformed requests can trip asserts that abort the hosting process;
    once the child is gone every call raises `EmbeddedKafkaError` carrying its exit
    status and last stderr lines. Invalid arguments raise ``ValueError``/``TypeError``
    before anything reaches the child.

    ``heartbeat_interval_ms``/``session_timeout_ms`` set the KIP-848 group settings (mock
    defaults: 3000/30000). ``debug`` is a librdkafka debug context list for the mock (e.g.
    ``"mock"``) whose output lands in the child's stderr (see `stderr_tail`).
    Request tracking is always on; it also sees the short-lived clients that
    `produce` and `topics` use. Thread-safe; one command runs at a time.
    """

    def __init__(
        self,
        brokers: int = 3,
        *,
        heartbeat_interval_ms: int | None = None,
        session_timeout_ms: int | None = None,
        debug: str | None = None,
        start_timeout: float = 30.0,
        command_timeout: float = 30.0,
        librdkafka_path: str | None = None,
    ) -> None:
        self._broker_count = _int("brokers", brokers, 1, 64)
        if heartbeat_interval_ms is not None:
            _int("heartbeat_interval_ms", heartbeat_interval_ms, 1, _INT32[1])
        if session_timeout_ms is not None:
            _int("session_timeout_ms", session_timeout_ms, 1, _INT32[1])
        self._command_timeout = float(command_timeout)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closed = False
        config = {
            "brokers": self._broker_count,
            "heartbeat_interval_ms": heartbeat_interval_ms,
            "session_timeout_ms": session_timeout_ms,
            "debug": debug,
            "librdkafka_path": librdkafka_path,
        }
        started = time.monotonic()
        try:
            child = _Child([*_child_command(), json.dumps(config)], _child_env())
        except OSError as exc:
            raise EmbeddedKafkaError(f"cannot start EmbeddedKafka child process: {exc}") from exc
        self._child = child
        self._finalizer = weakref.finalize(self, child.shutdown)
        try:
            ready = self._await_ready(start_timeout)
        except BaseException:
            self._closed = True
            self._finalizer()
            raise
        self._bootstrap: str = ready["bootstrap"]
        self.librdkafka_version: str = ready.get("librdkafka", "")
        """Version of the librdkafka hosting the mock."""
        self._addresses = [
            (host, int(port))
            for host, _, port in (item.rpartition(":") for item in self._bootstrap.split(","))
        ]
        logger.info(
            "EmbeddedKafka started: %d broker(s) at %s (pid %d, librdkafka %s, %.2fs)",
            self._broker_count,
            self._bootstrap,
            child.pid,
            self.librdkafka_version,
            time.monotonic() - started,
        )

    def _await_ready(self, timeout: float) -> dict[str, Any]:
        child = self._child
        try:
            message = child.replies.get(timeout=timeout)
        except queue.Empty:
            child.shutdown(timeout=1.0)
            raise EmbeddedKafkaError(
                f"EmbeddedKafka child (pid {child.pid}) did not become ready within "
                f"{timeout:.0f}s; last stderr lines:\n" + "\n".join(child.tail()),
                stderr_tail=child.tail(),
            ) from None
        if message is None:
            raise child.death_error("cannot start EmbeddedKafka: ")
        if message.get("event") != "ready":
            child.shutdown(timeout=2.0)
            tail = child.tail()
            raise EmbeddedKafkaError(
                f"cannot start EmbeddedKafka: {message.get('error', message)}"
                + ("\nchild stderr:\n" + "\n".join(tail) if tail else ""),
                returncode=child.proc.poll(),
                stderr_tail=tail,
            )
        return message

    # -- plumbing ----------------------------------------------------------------------------

    def _call(self, cmd: str, _wait: float | None = None, **args: Any) -> Any:
        wait = self._command_timeout if _wait is None else _wait
        with self._lock:
            self.ensure_alive()
            child = self._child
            request_id = next(self._ids)
            try:
                child.send({"id": request_id, "cmd": cmd, "args": args})
            except (OSError, ValueError):
                raise child.death_error(f"{cmd}: ") from None
            deadline = time.monotonic() + wait
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise EmbeddedKafkaError(
                        f"{cmd} got no answer from the EmbeddedKafka child (pid {child.pid}) "
                        f"within {wait:.1f}s; last stderr lines:\n" + "\n".join(child.tail(20)),
                        stderr_tail=child.tail(),
                    )
                try:
                    reply = child.replies.get(timeout=remaining)
                except queue.Empty:
                    continue
                if reply is None:
                    child.replies.put(None)  # keep EOF visible to later calls
                    raise child.death_error(f"{cmd}: ")
                if reply.get("id") != request_id:
                    logger.debug("discarding stale EmbeddedKafka reply %r", reply)
                    continue
                if reply.get("ok"):
                    return reply.get("result")
                raise EmbeddedKafkaError(str(reply.get("error")), code=reply.get("code"))

    def _broker(self, broker_id: object, *, allow_all: bool = False) -> int:
        if allow_all and broker_id == -1:
            return -1
        return _int("broker_id", broker_id, 1, self._broker_count)

    def ensure_alive(self) -> None:
        """Raise `EmbeddedKafkaError` if closed or if the child process has died."""
        if self._closed:
            raise EmbeddedKafkaError("EmbeddedKafka is closed")
        if not self._child.running():
            raise self._child.death_error()

    def death_error(self) -> EmbeddedKafkaError | None:
        """The error describing an unexpected child death; None if alive, closed or killed."""
        if self._closed or self._child.killed or self._child.running():
            return None
        return self._child.death_error()

    # -- properties ----------------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """``"127.0.0.1:p1,127.0.0.1:p2,..."``, broker 1 first."""
        return self._bootstrap

    @property
    def broker_count(self) -> int:
        return self._broker_count

    @property
    def pid(self) -> int:
        """The child process id."""
        return self._child.pid

    @property
    def alive(self) -> bool:
        """True while not closed and the child process is running."""
        return not self._closed and self._child.running()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def stderr_tail(self) -> list[str]:
        """The child's last stderr lines (librdkafka logs, ``debug`` output)."""
        return self._child.tail(_STDERR_RING)

    def broker_address(self, broker_id: int) -> tuple[str, int]:
        """``(host, port)`` of broker ``broker_id`` (1-based)."""
        return self._addresses[self._broker(broker_id) - 1]

    # -- topics and data ----------------------------------------------------------------------

    def create_topic(
        self, topic: str, partitions: int = 1, replication_factor: int | None = None
    ) -> None:
        """Create ``topic``; ``replication_factor`` defaults to ``min(3, brokers)``.

        Raises EmbeddedKafkaError (code 36) if it exists. Note the mock does not recompute
        KIP-848 assignments when topics appear or disappear.
        """
        _topic(topic)
        _int("partitions", partitions, 1, 100_000)
        if replication_factor is None:
            replication_factor = min(3, self._broker_count)
        _int("replication_factor", replication_factor, 1, self._broker_count)
        self._call(
            "create_topic",
            topic=topic,
            partitions=partitions,
            replication_factor=replication_factor,
        )

    def delete_topic(self, topic: str) -> None:
        """Delete ``topic`` (EmbeddedKafkaError code 3 if unknown). Groups are not updated.

        Needs confluent-kafka 2.15 or newer (older librdkafka has no mock topic deletion).
        """
        self._call("delete_topic", topic=_topic(topic))

    def topics(self) -> dict[str, int]:
        """``{topic: partition_count}`` from a Metadata request (needs a reachable broker)."""
        result = self._call("list_topics")
        return {str(k): int(v) for k, v in result.items()}

    def produce(
        self,
        topic: str,
        values: Iterable[Payload | tuple[Payload, Payload]] | bytes | bytearray | str,
        key: Payload = None,
        partition: int | None = None,
        *,
        headers: Mapping[str, Payload] | Sequence[tuple[str, Payload]] | None = None,
        timeout: float = 10.0,
    ) -> int:
        """Produce ``values`` (bytes, str as UTF-8, or None) and return the count delivered.

        Each item may also be a ``(key, value)`` tuple overriding ``key``. A lone bytes/str
        is one message. ``partition=None`` uses the default partitioner. Uses a short-lived
        producer in the child (acks from the mock, flushed within ``timeout``); an unknown
        topic is auto-created by the mock (4 partitions). Raises EmbeddedKafkaError if any
        message is not delivered.
        """
        _topic(topic)
        if partition is not None:
            _int("partition", partition, 0, _INT32[1])
        if isinstance(values, bytes | bytearray | memoryview | str):
            values = [values]
        default_key = _b64("key", key)
        messages: list[tuple[str | None, str | None]] = []
        for item in values:
            if isinstance(item, tuple):
                if len(item) != 2:
                    raise ValueError("a tuple item must be (key, value)")
                messages.append((_b64("key", item[0]), _b64("value", item[1])))
            else:
                messages.append((default_key, _b64("value", item)))
        header_items = headers.items() if isinstance(headers, Mapping) else (headers or ())
        encoded_headers = [
            (_text("header name", name), _b64("header value", value) or "")
            for name, value in header_items
        ]
        if not messages:
            return 0
        delivered = self._call(
            "produce",
            _wait=timeout + 15.0,
            topic=topic,
            messages=messages,
            partition=partition,
            headers=encoded_headers or None,
            flush_timeout=float(timeout),
        )
        return int(delivered)

    def partition_set_leader(self, topic: str, partition: int, broker_id: int) -> None:
        """Move the leader (bumps the leader epoch); ``broker_id=-1`` makes it leaderless."""
        _topic(topic)
        _int("partition", partition, 0, _INT32[1])
        self._call(
            "partition_set_leader",
            topic=topic,
            partition=partition,
            broker_id=self._broker(broker_id, allow_all=True),
        )

    def set_topic_error(self, topic: str, error: int) -> None:
        """Make Metadata responses report ``error`` for an existing ``topic`` (0 clears)."""
        self._call("set_topic_error", topic=_topic(topic), error=_int("error", error, *_INT16))

    # -- brokers and coordinators ---------------------------------------------------------

    def set_group_coordinator(self, group: str, broker_id: int) -> None:
        """Make ``broker_id`` the coordinator of ``group`` (FindCoordinator answers it)."""
        self._call(
            "set_group_coordinator",
            group=_text("group", group),
            broker_id=self._broker(broker_id),
        )

    def broker_down(self, broker_id: int) -> None:
        """Close the broker's listener and connections (``-1``: all). Nothing fails over."""
        self._call("broker_down", broker_id=self._broker(broker_id, allow_all=True))

    def broker_up(self, broker_id: int) -> None:
        """Reopen the broker's listener on the same port (``-1``: all)."""
        self._call("broker_up", broker_id=self._broker(broker_id, allow_all=True))

    def set_rtt(self, broker_id: int, ms: int) -> None:
        """Delay every response of ``broker_id`` (``-1``: all) by ``ms``."""
        self._call(
            "set_rtt",
            broker_id=self._broker(broker_id, allow_all=True),
            ms=_int("ms", ms, 0, _INT32[1] // 1000),
        )

    # -- error injection -------------------------------------------------------------------

    def push_request_errors(self, api_key: int, errors: Sequence[int]) -> None:
        """Queue errors for the next requests of ``api_key`` from any client to any broker.

        ``-195`` (``_TRANSPORT``) closes the connection instead of answering.
        """
        self._call(
            "push_request_errors",
            api_key=_int("api_key", api_key, 0, _INT16[1]),
            errors=[_int("error", e, *_INT16) for e in errors],
        )

    def clear_request_errors(self, api_key: int) -> None:
        """Drop the errors still queued by `push_request_errors` for ``api_key``."""
        self._call("clear_request_errors", api_key=_int("api_key", api_key, 0, _INT16[1]))

    def push_broker_errors(
        self, broker_id: int, api_key: int, errors: Sequence[tuple[int, int] | int]
    ) -> None:
        """Queue ``(error, rtt_ms)`` answers for ``api_key`` on one broker only.

        Takes precedence over `push_request_errors`; ``(0, ms)`` just delays one
        response. A bare int means ``(error, 0)``.
        """
        pairs: list[tuple[int, int]] = []
        for entry in errors:
            err, rtt = (entry, 0) if isinstance(entry, int) else entry
            pairs.append((_int("error", err, *_INT16), _int("rtt_ms", rtt, 0, 3_600_000)))
        self._call(
            "push_broker_errors",
            broker_id=self._broker(broker_id),
            api_key=_int("api_key", api_key, 0, _INT16[1]),
            errors=pairs,
        )

    def pending_broker_errors(self, broker_id: int, api_key: int) -> int:
        """How many `push_broker_errors` entries are still queued."""
        return int(
            self._call(
                "pending_broker_errors",
                broker_id=self._broker(broker_id),
                api_key=_int("api_key", api_key, 0, _INT16[1]),
            )
        )

    def set_api_version(self, api_key: int, min_version: int, max_version: int) -> None:
        """Change the advertised version range of ``api_key``; ``(-1, -1)`` hides it.

        Clients cache ApiVersions per connection. Raising a range above the mock's own
        can crash the child (its handlers do not parse other versions).
        """
        self._call(
            "set_api_version",
            api_key=_int("api_key", api_key, 0, _INT16[1]),
            min_version=_int("min_version", min_version, -1, _INT16[1]),
            max_version=_int("max_version", max_version, -1, _INT16[1]),
        )

    # -- KIP-848 groups ----------------------------------------------------------------------

    def set_heartbeat_interval(self, ms: int) -> None:
        """Group heartbeat interval sent to members (applies from their next heartbeat)."""
        self._call("set_heartbeat_interval", ms=_int("ms", ms, 1, _INT32[1]))

    def set_session_timeout(self, ms: int) -> None:
        """Session timeout after which silent members are removed (checked every 1 s)."""
        self._call("set_session_timeout", ms=_int("ms", ms, 1, _INT32[1]))

    def set_target_assignment(
        self,
        group: str,
        assignment: Mapping[str, Iterable[tuple[str, int]]] | None,
        *,
        validate: bool = True,
    ) -> None:
        """Replace the automatic assignor of ``group`` with ``{member_id: [(topic, p)]}``.

        ``None`` returns to automatic assignment. The group must already exist (else the
        mock silently ignores this), unknown member ids are skipped, and members left out
        keep their current target. ``validate`` checks topics/partitions exist first.
        """
        _text("group", group)
        payload: list[tuple[str, list[tuple[str, int]]]] | None = None
        if assignment is not None:
            payload = []
            owner: dict[tuple[str, int], str] = {}
            for member_id, partitions in assignment.items():
                _text("member_id", member_id)
                entries: list[tuple[str, int]] = []
                for entry in partitions:
                    topic, partition = entry
                    tp = (_topic(topic), _int("partition", partition, 0, _INT32[1]))
                    if tp in owner:
                        raise ValueError(
                            f"{tp[0]}[{tp[1]}] is assigned to both {owner[tp]!r} and {member_id!r}"
                        )
                    owner[tp] = member_id
                    entries.append(tp)
                payload.append((member_id, entries))
        self._call(
            "set_target_assignment", group=group, assignment=payload, validate=bool(validate)
        )

    # -- request tracking --------------------------------------------------------------------

    def requests(self, api_key: int | None = None) -> list[MockRequest]:
        """Requests seen since start or `clear_requests`, in arrival order.

        The mock keeps every request until cleared: in long sessions, clear between
        scenarios to keep these calls cheap.
        """
        if api_key is not None:
            _int("api_key", api_key, 0, _INT16[1])
        return [MockRequest(*r) for r in self._call("requests", api_key=api_key)]

    def request_counts(self) -> dict[int, int]:
        """``{api_key: count}`` since start or `clear_requests`."""
        return {int(k): int(n) for k, n in self._call("request_counts")}

    def clear_requests(self) -> None:
        """Forget tracked requests (resets `requests` and `request_counts`)."""
        self._call("clear_requests")

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Destroy the cluster and stop the child (bounded; idempotent; never raises)."""
        if self._closed:
            return
        self._closed = True
        # Wait for an in-flight command briefly; the shutdown is safe without the lock.
        acquired = self._lock.acquire(timeout=1.0)
        try:
            self._finalizer()
        finally:
            if acquired:
                self._lock.release()
        logger.info("EmbeddedKafka (pid %d) closed", self._child.pid)

    def kill(self) -> None:
        """SIGKILL the child (to test the death path); later calls raise, close() works."""
        self._child.kill()

    def __enter__(self) -> EmbeddedKafka:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("alive" if self._child.running() else "dead")
        return (
            f"EmbeddedKafka(brokers={self._broker_count}, bootstrap={self._bootstrap!r}, "
            f"pid={self._child.pid}, {state})"
        )
