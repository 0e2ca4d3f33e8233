"""KafkaCluster: a real Apache Kafka (>= 4.0, KRaft) started from a distribution directory.

Each node is a combined broker+controller JVM launched directly
(``java -cp "$KAFKA_HOME/libs/*" kafka.Kafka server.properties``) in its own process group,
listening on free ports of 127.0.0.1, with its data in a temporary directory::

    from consumer_sdk.testing import KafkaCluster

    with KafkaCluster(nodes=3, heartbeat_interval_ms=500, session_timeout_ms=6000) as kafka:
        kafka.create_topic("orders", partitions=6)
        kafka.produce("orders", [b"v1", b"v2"])
        kafka.stop_node(kafka.coordinator_for("my-group"))
        ...  # point clients at kafka.bootstrap_servers

The distribution comes from ``kafka_home=`` or the ``KAFKA_HOME`` environment variable,
Java from ``JAVA_HOME`` or the ``java`` on ``PATH``. ``close()`` always returns and leaves no
JVM behind; a finalizer (also run at interpreter exit) kills the nodes of a cluster that was
never closed, and on Linux a node also dies with the thread that started it when that is the
main thread (``PR_SET_PDEATHSIG``), so even a SIGKILLed test run leaves no broker behind.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import ctypes
import ctypes.util
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

logger = logging.getLogger("consumer_sdk.testing")

__all__ = [
    "DockerKafka",
    "GroupDescription",
    "GroupMemberDescription",
    "KafkaCluster",
    "KafkaClusterError",
    "docker_unavailable_reason",
    "find_java",
    "kafka_distribution_version",
    "leaked_kafka_jvms",
]

Payload = bytes | bytearray | memoryview | str | None

_MIN_KAFKA = (4, 0)
_MIN_JAVA = 17
_LOG_TAIL = 40
_READY_MARK = "Kafka Server started"
_OWNER_PROPERTY = "consumer_sdk.testing.owner"
_RESERVED_LISTENERS = frozenset({"PLAINTEXT", "CONTROLLER"})
_PROTOCOLS = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})
_LISTENER_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
# broker defaults of the KIP-848 group timings (the min/max bounds are widened around them)
_DEFAULT_HEARTBEAT_MS = 5000
_DEFAULT_SESSION_MS = 45000
_MAX_HEARTBEAT_MS = 15000
_MAX_SESSION_MS = 60000
# the helper's own clients: node stops are expected, their disconnect logs are noise
_QUIET = {"log_level": 2, "log.connection.close": False}


class KafkaClusterError(RuntimeError):
    """A KafkaCluster could not start, or an operation on it failed.

    ``code`` is the Kafka error code when the broker answered with one (e.g. 36
    TOPIC_ALREADY_EXISTS); ``log_tail`` holds the last log lines of a node that failed.
    """

    def __init__(
        self, message: str, *, code: int | None = None, log_tail: Sequence[str] = ()
    ) -> None:
        super().__init__(message)
        self.code = code
        self.log_tail = list(log_tail)


@dataclass(frozen=True)
class GroupMemberDescription:
    """One member as the group coordinator describes it (ConsumerGroupDescribe)."""

    member_id: str
    instance_id: str | None
    rack: str | None
    client_id: str
    client_host: str
    member_epoch: int
    subscribed_topics: tuple[str, ...]
    subscribed_regex: str | None
    #: ``{topic: partitions}`` the member owns / will own (topic names resolved from ids)
    assignment: dict[str, tuple[int, ...]]
    target_assignment: dict[str, tuple[int, ...]]

    @property
    def partitions(self) -> set[tuple[str, int]]:
        """The owned partitions as ``{(topic, partition)}``."""
        return {(t, p) for t, parts in self.assignment.items() for p in parts}


@dataclass(frozen=True)
class GroupDescription:
    """A consumer group as the coordinator describes it (``state`` is e.g. ``"Stable"``)."""

    group_id: str
    state: str
    group_epoch: int
    assignment_epoch: int
    assignor: str
    coordinator: int
    members: list[GroupMemberDescription] = field(default_factory=list)

    def member(self, member_id: str) -> GroupMemberDescription | None:
        """The member with ``member_id`` or None."""
        return next((m for m in self.members if m.member_id == member_id), None)


# -- prerequisites ----------------------------------------------------------------------------

_JAVA_VERSIONS: dict[str, int] = {}


def find_java(java_home: str | os.PathLike[str] | None = None) -> str:
    """The java executable (``java_home``, else ``JAVA_HOME``, else PATH), checked to be 17+."""
    home = java_home if java_home is not None else os.environ.get("JAVA_HOME") or None
    if home is not None:
        java = Path(home) / "bin" / "java"
        if not java.is_file() or not os.access(java, os.X_OK):
            raise KafkaClusterError(
                f"no Java found: {java} does not exist or is not executable "
                f"(JAVA_HOME={os.fspath(home)!r}); Kafka 4.x needs Java {_MIN_JAVA}+"
            )
        path = str(java)
    else:
        found = shutil.which("java")
        if found is None:
            raise KafkaClusterError(
                f"no Java found: set JAVA_HOME or put a Java {_MIN_JAVA}+ 'java' on PATH "
                "(Kafka 4.x brokers need it)"
            )
        path = found
    major = _JAVA_VERSIONS.get(path)
    if major is None:
        major = _java_major(path)
        _JAVA_VERSIONS[path] = major
    if major < _MIN_JAVA:
        raise KafkaClusterError(f"{path} is Java {major}; Kafka 4.x needs Java {_MIN_JAVA}+")
    return path


def _java_major(java: str) -> int:
    try:
        out = subprocess.run(
            [java, "-version"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KafkaClusterError(f"cannot run {java} -version: {exc}") from exc
    text = out.stderr + out.stdout
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        raise KafkaClusterError(f"cannot tell the Java version of {java} from: {text.strip()!r}")
    major = int(match.group(1))
    if major == 1 and match.group(2):  # "1.8.0_..." style
        major = int(match.group(2))
    return major


_JAR_VERSION_RES = (
    re.compile(r"^kafka_\d+\.\d+-(\d+)\.(\d+)\.(\d+)[^/]*?\.jar$"),
    re.compile(r"^kafka-server-(\d+)\.(\d+)\.(\d+)[^/]*?\.jar$"),
)
_NOT_MAIN_JAR = re.compile(r"-(test|sources|javadoc|scaladoc|test-sources)\.jar$")


def kafka_distribution_version(kafka_home: str | os.PathLike[str]) -> tuple[int, int, int]:
    """The Kafka version of a distribution directory, from its ``libs/`` jars.

    Raises KafkaClusterError naming the problem when ``kafka_home`` is not a Kafka
    distribution.
    """
    home = Path(kafka_home)
    if not home.is_dir():
        raise KafkaClusterError(
            f"KAFKA_HOME={os.fspath(kafka_home)!r} is not a directory "
            "(expected an Apache Kafka 4.x distribution: bin/, config/, libs/)"
        )
    libs = home / "libs"
    if not libs.is_dir():
        raise KafkaClusterError(
            f"KAFKA_HOME={os.fspath(kafka_home)!r} has no libs/ directory: not a Kafka "
            "distribution (download and extract kafka_2.13-4.x.tgz and point KAFKA_HOME at it)"
        )
    for pattern in _JAR_VERSION_RES:
        for jar in sorted(libs.iterdir()):
            match = pattern.match(jar.name)
            if match and not _NOT_MAIN_JAR.search(jar.name):
                return (int(match.group(1)), int(match.group(2)), int(match.group(3)))
    raise KafkaClusterError(
        f"KAFKA_HOME={os.fspath(kafka_home)!r} has no kafka_2.13-X.Y.Z.jar or "
        "kafka-server-X.Y.Z.jar in libs/: not a Kafka distribution"
    )


def _check_kafka_home(kafka_home: str | os.PathLike[str] | None) -> Path:
    home = kafka_home if kafka_home is not None else os.environ.get("KAFKA_HOME") or None
    if home is None:
        raise KafkaClusterError(
            "no Kafka distribution: pass kafka_home= or set KAFKA_HOME to an extracted "
            "Apache Kafka 4.x download (https://kafka.apache.org/downloads)"
        )
    version = kafka_distribution_version(home)
    if version[:2] < _MIN_KAFKA:
        raise KafkaClusterError(
            f"KAFKA_HOME={os.fspath(home)!r} is Kafka {'.'.join(map(str, version))}; "
            f"KafkaCluster needs Kafka >= {'.'.join(map(str, _MIN_KAFKA))} "
            "(KRaft and the KIP-848 consumer group protocol)"
        )
    return Path(home).resolve()


def _free_ports(count: int) -> list[int]:
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [int(s.getsockname()[1]) for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _kafka_uuid() -> str:
    """A random Kafka ``Uuid`` string (URL-safe base64, no padding), e.g. a cluster id.

    Never one starting with ``-`` (as Kafka's own ``Uuid.randomUuid``): the storage tool's
    argument parser would read it as an option (``--cluster-id: expected one argument``).
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


# -- process bookkeeping ----------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1
_prctl: Any = None
if sys.platform.startswith("linux"):  # pragma: no branch - resolved once, in the parent
    with contextlib.suppress(OSError, AttributeError, TypeError):
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        _prctl = _libc.prctl


def _die_with_parent() -> None:  # runs in the forked child before exec: no allocation
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


_ALL_PROCS: dict[int, subprocess.Popen[bytes]] = {}
_ALL_PROCS_LOCK = threading.Lock()


def _alive(proc: subprocess.Popen[bytes]) -> bool:
    return proc.poll() is None


def leaked_kafka_jvms() -> list[int]:
    """Pids of KafkaCluster JVMs started by this process that are still running.

    Uses both the launched ``Popen`` objects and, on Linux, a scan of ``/proc`` for JVMs
    tagged with this process's pid, so it also finds nodes whose cluster object is gone.
    """
    pids: set[int] = set()
    with _ALL_PROCS_LOCK:
        procs = list(_ALL_PROCS.values())
    pids.update(p.pid for p in procs if _alive(p))
    marker = f"-D{_OWNER_PROPERTY}={os.getpid()}".encode()
    proc_dir = Path("/proc")
    if proc_dir.is_dir():
        for entry in proc_dir.iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                if marker not in cmdline.split(b"\0"):
                    continue
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            state = stat.rsplit(")", 1)[-1].split()[0:1]
            if state != ["Z"]:
                pids.add(int(entry.name))
    return sorted(pids)


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    if proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _terminate_all(procs: Sequence[subprocess.Popen[bytes]], timeout: float) -> list[int]:
    """SIGTERM every process group at once, SIGKILL what is left after ``timeout``.

    Returns the pids that had to be SIGKILLed. Never raises; interrupted by Ctrl-C it
    SIGKILLs at once and re-raises.
    """
    live = [p for p in procs if _alive(p)]
    for proc in live:  # a stopped JVM cannot act on SIGTERM
        _signal_group(proc, signal.SIGCONT)
        _signal_group(proc, signal.SIGTERM)
    killed: list[int] = []
    try:
        deadline = time.monotonic() + timeout
        while any(_alive(p) for p in live) and time.monotonic() < deadline:
            time.sleep(0.1)
    except BaseException:
        for proc in live:
            _signal_group(proc, signal.SIGKILL)
        raise
    finally:
        for proc in live:
            if _alive(proc):
                killed.append(proc.pid)
                _signal_group(proc, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
    return killed


def _finalize(procs: list[subprocess.Popen[bytes]], owner_pid: int) -> None:
    if os.getpid() != owner_pid:  # a forked child inherited the list: not its JVMs
        return
    if any(_alive(p) for p in procs):
        logger.warning("KafkaCluster was not closed: stopping its %d node(s)", len(procs))
        _terminate_all(procs, timeout=10.0)


# -- nodes ------------------------------------------------------------------------------------


@dataclass
class _Node:
    node_id: int
    port: int
    controller_port: int
    extra_ports: dict[str, int]
    directory: Path
    proc: subprocess.Popen[bytes] | None = None
    launches: int = 0
    paused: bool = False

    @property
    def config(self) -> Path:
        return self.directory / "server.properties"

    @property
    def console(self) -> Path:
        return self.directory / "logs" / "console.log"

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail(self, lines: int = _LOG_TAIL) -> list[str]:
        ring: collections.deque[str] = collections.deque(maxlen=lines)
        with contextlib.suppress(OSError), self.console.open("rb") as f:
            for raw in f:
                ring.append(raw.decode("utf-8", "replace").rstrip("\n"))
        return list(ring)

    def ready(self) -> bool:
        with contextlib.suppress(OSError), self.console.open("rb") as f:
            return _READY_MARK.encode() in f.read()
        return False


# COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR: retried.
_COORDINATOR_MOVING = frozenset({14, 15, 16})


class _ClusterOps:
    """Topic, data and group operations over a bootstrap address (shared by the backends)."""

    _lock: threading.RLock
    _admin: Any
    _producer: Any

    @property
    def bootstrap_servers(self) -> str:
        raise NotImplementedError

    def _check_open(self) -> None:
        raise NotImplementedError

    def _live_bootstrap(self) -> str:
        return self.bootstrap_servers

    def _default_replication(self) -> int:
        return 1

    # -- clients ----------------------------------------------------------------------------

    def admin(self) -> Any:
        """A shared ``confluent_kafka.admin.AdminClient`` for this cluster."""
        self._check_open()
        with self._lock:
            if self._admin is None:
                from confluent_kafka.admin import AdminClient

                self._admin = AdminClient({**_QUIET, "bootstrap.servers": self.bootstrap_servers})
            return self._admin

    def _result(self, future: Any, what: str, timeout: float) -> Any:
        from confluent_kafka import KafkaException

        try:
            return future.result(timeout)
        except KafkaException as exc:
            err = exc.args[0]
            raise KafkaClusterError(f"{what}: {err.str()}", code=err.code()) from exc
        except TimeoutError as exc:  # concurrent.futures.TimeoutError is TimeoutError
            raise KafkaClusterError(f"{what}: no answer within {timeout:.0f}s") from exc

    # -- topics and data --------------------------------------------------------------------

    def create_topic(
        self,
        topic: str,
        partitions: int = 1,
        replication_factor: int | None = None,
        *,
        config: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> None:
        """Create ``topic`` and wait until every partition has a leader.

        ``replication_factor`` defaults to ``min(3, nodes)``. Raises KafkaClusterError
        (code 36) if the topic exists.
        """
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        _check_topic(topic)
        if partitions < 1:
            raise ValueError(f"partitions must be >= 1, got {partitions}")
        rf = replication_factor if replication_factor is not None else self._default_replication()
        new = NewTopic(topic, partitions, rf, config=dict(config or {}))
        [future] = self.admin().create_topics([new], operation_timeout=timeout).values()
        self._result(future, f"create topic {topic!r}", timeout)
        self._await_partitions(topic, partitions, timeout)

    def _await_partitions(self, topic: str, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            with contextlib.suppress(Exception):
                md = self.admin().list_topics(topic, timeout=5).topics.get(topic)
                if (
                    md is not None
                    and md.error is None
                    and len(md.partitions) >= count
                    and all(p.leader >= 0 for p in md.partitions.values())
                ):
                    return
            if time.monotonic() >= deadline:
                raise KafkaClusterError(
                    f"topic {topic!r}: {count} partition(s) with leaders not seen within "
                    f"{timeout:.0f}s"
                )
            time.sleep(0.1)

    def delete_topic(self, topic: str, timeout: float = 30.0) -> None:
        """Delete ``topic`` (KafkaClusterError code 3 if unknown) and wait until it is gone."""
        _check_topic(topic)
        [future] = self.admin().delete_topics([topic], operation_timeout=timeout).values()
        self._result(future, f"delete topic {topic!r}", timeout)
        deadline = time.monotonic() + timeout
        while topic in self.topics():
            if time.monotonic() >= deadline:
                raise KafkaClusterError(f"topic {topic!r} still listed {timeout:.0f}s after delete")
            time.sleep(0.1)

    def add_partitions(self, topic: str, total: int, timeout: float = 30.0) -> None:
        """Grow ``topic`` to ``total`` partitions (CreatePartitions) and wait for leaders."""
        from confluent_kafka.admin import NewPartitions  # type: ignore[attr-defined]

        _check_topic(topic)
        [future] = (
            self.admin()
            .create_partitions([NewPartitions(topic, total)], operation_timeout=timeout)
            .values()
        )
        self._result(future, f"grow topic {topic!r} to {total} partitions", timeout)
        self._await_partitions(topic, total, timeout)

    def topics(self) -> dict[str, int]:
        """``{topic: partition_count}`` of the non-internal topics."""
        try:
            md = self.admin().list_topics(timeout=10)
        except Exception as exc:
            raise KafkaClusterError(f"list topics: {exc}") from exc
        return {
            name: len(t.partitions)
            for name, t in md.topics.items()
            if not name.startswith("__") and t.error is None
        }

    def produce(
        self,
        topic: str,
        values: Iterable[Payload | tuple[Payload, Payload]] | bytes | bytearray | str,
        key: Payload = None,
        partition: int | None = None,
        *,
        headers: Mapping[str, Payload] | Sequence[tuple[str, Payload]] | None = None,
        timeout: float = 30.0,
    ) -> int:
        """Produce ``values`` (acks=all) and return the count delivered.

        Same shape as `EmbeddedKafka.produce`: bytes, str (UTF-8) or None values, or
        ``(key, value)`` tuples overriding ``key``; a lone bytes/str is one message. Raises
        KafkaClusterError if any message is not delivered within ``timeout``.
        """
        _check_topic(topic)
        if isinstance(values, bytes | bytearray | memoryview | str):
            values = [values]
        header_items = headers.items() if isinstance(headers, Mapping) else (headers or ())
        hdrs = [(str(n), _bytes(v)) for n, v in header_items] or None
        from confluent_kafka import KafkaError, KafkaException

        producer = self._get_producer()
        deadline = time.monotonic() + timeout
        errors: list[str] = []
        delivered = 0

        def on_delivery(err: Any, _msg: Any) -> None:
            nonlocal delivered
            if err is not None:
                errors.append(str(err))
            else:
                delivered += 1

        count = 0
        for item in values:
            if isinstance(item, tuple):
                if len(item) != 2:
                    raise ValueError("a tuple item must be (key, value)")
                k, v = item
            else:
                k, v = key, item
            kwargs: dict[str, Any] = {
                "value": _bytes(v),
                "key": _bytes(k),
                "on_delivery": on_delivery,
            }
            if partition is not None:
                kwargs["partition"] = partition
            if hdrs:
                kwargs["headers"] = hdrs
            while True:
                try:
                    producer.produce(topic, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.1)
                except KafkaException as exc:
                    # a partition added a moment ago: refresh the producer's metadata
                    if exc.args[0].code() != KafkaError._UNKNOWN_PARTITION:
                        raise
                    if time.monotonic() >= deadline:
                        raise KafkaClusterError(
                            f"produce to {topic!r}: partition {partition} unknown after "
                            f"{timeout:.0f}s"
                        ) from exc
                    with contextlib.suppress(KafkaException):
                        producer.list_topics(topic, timeout=2)
                    time.sleep(0.05)
            count += 1
        remaining = producer.flush(timeout)
        if errors or remaining or delivered != count:
            raise KafkaClusterError(
                f"produce to {topic!r}: {delivered}/{count} delivered"
                + (f"; errors: {sorted(set(errors))}" if errors else "")
                + (f"; {remaining} still queued after {timeout:.0f}s" if remaining else "")
            )
        return delivered

    def _get_producer(self) -> Any:
        self._check_open()
        with self._lock:
            if self._producer is None:
                from confluent_kafka import Producer

                self._producer = Producer(
                    {
                        **_QUIET,
                        "bootstrap.servers": self.bootstrap_servers,
                        "acks": "all",
                        "linger.ms": 5,
                    }
                )
            return self._producer

    # -- groups -----------------------------------------------------------------------------

    def coordinator_for(self, group: str, timeout: float = 30.0) -> int:
        """The node id of ``group``'s coordinator (FindCoordinator, retried while loading)."""
        from consumer_sdk.errors import KafkaException as SdkKafkaException
        from consumer_sdk.protocol.client import ClusterClient

        self._check_open()
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        with ClusterClient({"bootstrap.servers": self._live_bootstrap()}) as client:
            while time.monotonic() < deadline:
                try:
                    return int(client.find_coordinator(group, timeout_s=5).node_id)
                except SdkKafkaException as exc:
                    last = exc
                    time.sleep(0.1)
        raise KafkaClusterError(f"no coordinator for group {group!r} within {timeout:.0f}s: {last}")

    def describe_group(self, group: str, timeout: float = 30.0) -> GroupDescription:
        """ConsumerGroupDescribe of a KIP-848 group: state, epochs, members with their
        instance id, rack and assignment (topic names). KafkaClusterError (code 69
        GROUP_ID_NOT_FOUND) for an unknown group."""
        from consumer_sdk.errors import BrokerResponseError
        from consumer_sdk.errors import KafkaException as SdkKafkaException
        from consumer_sdk.protocol.client import ClusterClient

        self._check_open()
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        with ClusterClient({"bootstrap.servers": self._live_bootstrap()}) as client:
            while time.monotonic() < deadline:
                try:
                    raw = client.describe_group(group, timeout_s=5)
                    coordinator = client.coordinator(group)
                    names = dict(client.topic_names())
                    ids = {
                        tid
                        for m in raw["members"]
                        for a in (m["assignment"], m["target_assignment"])
                        for tid in a
                    }
                    if not ids <= names.keys():
                        client.metadata(timeout_s=5)
                        names = dict(client.topic_names())
                    break
                except BrokerResponseError as exc:
                    if exc.code == 69:  # GROUP_ID_NOT_FOUND
                        raise KafkaClusterError(f"no group {group!r}", code=69) from exc
                    if not exc.args[0].retriable() and exc.code not in (14, 15, 16):
                        raise KafkaClusterError(
                            f"describe {group!r}: {exc}", code=exc.code
                        ) from exc
                    last = exc
                except SdkKafkaException as exc:
                    last = exc
                time.sleep(0.1)
            else:
                raise KafkaClusterError(
                    f"describe {group!r}: no answer within {timeout:.0f}s: {last}"
                )

        def by_name(assignment: Mapping[uuid.UUID, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
            return {names.get(tid, str(tid)): parts for tid, parts in assignment.items()}

        return GroupDescription(
            group_id=raw["group_id"],
            state=raw["state"],
            group_epoch=raw["group_epoch"],
            assignment_epoch=raw["assignment_epoch"],
            assignor=raw["assignor"],
            coordinator=coordinator.node_id if coordinator is not None else -1,
            members=[
                GroupMemberDescription(
                    member_id=m["member_id"],
                    instance_id=m["instance_id"],
                    rack=m["rack_id"],
                    client_id=m["client_id"],
                    client_host=m["client_host"],
                    member_epoch=m["member_epoch"],
                    subscribed_topics=tuple(m["subscribed_topic_names"]),
                    subscribed_regex=m["subscribed_topic_regex"],
                    assignment=by_name(m["assignment"]),
                    target_assignment=by_name(m["target_assignment"]),
                )
                for m in raw["members"]
            ],
        )

    def committed(self, group: str, timeout: float = 30.0) -> dict[tuple[str, int], int]:
        """``{(topic, partition): offset}`` committed by ``group`` (OffsetFetch for all of the
        group's partitions, through this SDK's protocol client). A coordinator that is moving
        or loading (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS)
        or unreachable is retried until ``timeout``."""
        # Not AdminClient.list_consumer_group_offsets: librdkafka 2.16 crashed the process in
        # it (SIGSEGV) when the group's coordinator moved during the call.
        from consumer_sdk.domain import OffsetFetchRequest
        from consumer_sdk.errors import KafkaException as SdkKafkaException
        from consumer_sdk.protocol.client import ClusterClient

        self._check_open()
        deadline = time.monotonic() + timeout
        last: object = None
        request = OffsetFetchRequest(group, None, require_stable=False)
        with ClusterClient({"bootstrap.servers": self._live_bootstrap()}) as client:
            while time.monotonic() < deadline:
                try:
                    response = client.offset_fetch(request, timeout_s=5)
                except SdkKafkaException as exc:  # transport, timeout, coordinator lookup
                    last = exc
                else:
                    if response.error_code == 0:
                        return {
                            (r.topic, r.partition): r.offset
                            for r in response.partitions
                            if r.error_code == 0 and r.offset >= 0
                        }
                    if response.error_code not in _COORDINATOR_MOVING:
                        raise KafkaClusterError(
                            f"committed offsets of {group!r}: OffsetFetch failed with error "
                            f"{response.error_code}",
                            code=response.error_code,
                        )
                    last = f"error {response.error_code} (coordinator moving or loading)"
                time.sleep(0.1)
        raise KafkaClusterError(
            f"committed offsets of {group!r}: no answer within {timeout:.0f}s: {last}"
        )


class KafkaCluster(_ClusterOps):
    """A real Kafka >= 4.0 cluster of ``nodes`` combined broker+controller JVMs (KRaft).

    Args:
        nodes: 1 or 3 (a static 3-voter quorum survives one node down).
        kafka_home: distribution directory; defaults to ``$KAFKA_HOME``.
        java_home: defaults to ``$JAVA_HOME``, else ``java`` on PATH.
        heartbeat_interval_ms / session_timeout_ms: the broker's KIP-848 group timings
            (``group.consumer.*``; the min/max bounds are widened so short values are valid).
        listeners: extra client listeners ``{name: security_protocol}`` (``SSL``,
            ``SASL_PLAINTEXT``, ``SASL_SSL``, ``PLAINTEXT``), each on its own free port of every
            node; see `bootstrap_for`. Inter-broker traffic stays on PLAINTEXT.
        server_properties: extra ``server.properties`` entries appended to every node's
            config (they win over the defaults), e.g. ``ssl.keystore.location`` or
            ``listener.name.sasl_ssl.plain.sasl.jaas.config``.
        advertised_host: the host clients are told to use (listeners bind 127.0.0.1).
        heap_mb: each JVM's maximum heap.
        start_timeout: seconds for every node to come up.
        data_dir: parent directory for the nodes' data (a fresh temp dir inside it).
    """

    def __init__(
        self,
        nodes: int = 1,
        *,
        kafka_home: str | os.PathLike[str] | None = None,
        java_home: str | os.PathLike[str] | None = None,
        heartbeat_interval_ms: int = 500,
        session_timeout_ms: int = 6000,
        listeners: Mapping[str, str] | None = None,
        server_properties: Mapping[str, object] | None = None,
        advertised_host: str = "127.0.0.1",
        heap_mb: int = 512,
        start_timeout: float = 120.0,
        data_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        if nodes not in (1, 3):
            raise ValueError(f"nodes must be 1 or 3, got {nodes!r}")
        if not 1 <= heartbeat_interval_ms < session_timeout_ms:
            raise ValueError(
                "need 1 <= heartbeat_interval_ms < session_timeout_ms, got "
                f"{heartbeat_interval_ms} and {session_timeout_ms}"
            )
        if heap_mb < 128:
            raise ValueError(f"heap_mb must be >= 128, got {heap_mb}")
        self._listeners = self._check_listeners(listeners or {})
        self._extra_props = {str(k): str(v) for k, v in (server_properties or {}).items()}
        self._home = _check_kafka_home(kafka_home)
        self._version = kafka_distribution_version(self._home)
        self._java = find_java(java_home)
        self._heartbeat_ms = heartbeat_interval_ms
        self._session_ms = session_timeout_ms
        self._host = advertised_host
        self._heap_mb = heap_mb
        self._start_timeout = start_timeout
        self._lock = threading.RLock()
        self._closed = False
        self._procs: list[subprocess.Popen[bytes]] = []
        self._owner_pid = os.getpid()
        self._finalizer = weakref.finalize(self, _finalize, self._procs, self._owner_pid)
        self._admin: Any = None
        self._producer: Any = None
        self._tmp = Path(
            tempfile.mkdtemp(prefix="kafka-cluster-", dir=os.fspath(data_dir) if data_dir else None)
        )
        self._nodes: dict[int, _Node] = {}
        try:
            self._start(nodes)
        except BaseException:
            self.close()
            raise

    @staticmethod
    def _check_listeners(listeners: Mapping[str, str]) -> dict[str, str]:
        checked: dict[str, str] = {}
        for name, protocol in listeners.items():
            upper = str(name).upper()
            if not _LISTENER_RE.match(upper) or upper in _RESERVED_LISTENERS:
                raise ValueError(
                    f"listener name {name!r} must match [A-Z][A-Z0-9_]* and not be one of "
                    f"{sorted(_RESERVED_LISTENERS)} (those are the cluster's own)"
                )
            proto = str(protocol).upper()
            if proto not in _PROTOCOLS:
                raise ValueError(
                    f"listener {name!r}: unknown security protocol {protocol!r} "
                    f"(one of {sorted(_PROTOCOLS)})"
                )
            checked[upper] = proto
        return checked

    # -- start ------------------------------------------------------------------------------

    def _start(self, count: int) -> None:
        attempts = 3
        for attempt in range(1, attempts + 1):
            self._layout(count, attempt)
            try:
                self._format_all()
                for node in self._nodes.values():
                    self._launch(node)
                self._await_nodes(list(self._nodes.values()), self._start_timeout)
                break
            except KafkaClusterError as exc:
                lost_port_race = any("Address already in use" in line for line in exc.log_tail)
                if not lost_port_race or attempt == attempts:
                    raise
                logger.info("KafkaCluster: a port was taken meanwhile, retrying with new ports")
                _terminate_all([n.proc for n in self._nodes.values() if n.proc], 10.0)
        self._await_usable()

    def _layout(self, count: int, attempt: int) -> None:
        ports = _free_ports(count * (2 + len(self._listeners)))
        self._cluster_id = _kafka_uuid()
        self._nodes = {}
        for i in range(1, count + 1):
            extra = {name: ports.pop() for name in self._listeners}
            self._nodes[i] = _Node(
                node_id=i,
                port=ports.pop(),
                controller_port=ports.pop(),
                extra_ports=extra,
                directory=self._tmp / f"try-{attempt}" / f"node-{i}",
            )
        voters = ",".join(
            f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self._nodes.values()
        )
        for node in self._nodes.values():
            node.directory.mkdir(parents=True)
            (node.directory / "logs").mkdir()
            node.config.write_text(self._properties(node, voters, count))

    def _properties(self, node: _Node, voters: str, count: int) -> str:
        rf = count
        min_isr = 2 if count > 1 else 1
        listeners = [f"PLAINTEXT://127.0.0.1:{node.port}"]
        advertised = [f"PLAINTEXT://{self._host}:{node.port}"]
        protocol_map = ["CONTROLLER:PLAINTEXT", "PLAINTEXT:PLAINTEXT"]
        for name, proto in self._listeners.items():
            listeners.append(f"{name}://127.0.0.1:{node.extra_ports[name]}")
            advertised.append(f"{name}://{self._host}:{node.extra_ports[name]}")
            protocol_map.append(f"{name}:{proto}")
        listeners.append(f"CONTROLLER://127.0.0.1:{node.controller_port}")
        hb, session = self._heartbeat_ms, self._session_ms
        props: dict[str, object] = {
            "process.roles": "broker,controller",
            "node.id": node.node_id,
            "controller.quorum.voters": voters,
            "listeners": ",".join(listeners),
            "advertised.listeners": ",".join(advertised),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": ",".join(protocol_map),
            "log.dirs": node.directory / "data",
            "metadata.log.dir": node.directory / "meta",
            "num.network.threads": 2,
            "num.io.threads": 4,
            "num.partitions": 1,
            "default.replication.factor": rf,
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": 10,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": min_isr,
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": min_isr,
            "group.coordinator.rebalance.protocols": "classic,consumer",
            "group.initial.rebalance.delay.ms": 0,
            "group.consumer.heartbeat.interval.ms": hb,
            "group.consumer.min.heartbeat.interval.ms": min(hb, _DEFAULT_HEARTBEAT_MS),
            "group.consumer.max.heartbeat.interval.ms": max(hb, _MAX_HEARTBEAT_MS),
            "group.consumer.session.timeout.ms": session,
            "group.consumer.min.session.timeout.ms": min(session, _DEFAULT_SESSION_MS),
            "group.consumer.max.session.timeout.ms": max(session, _MAX_SESSION_MS),
            "auto.create.topics.enable": "true",
            "log.segment.bytes": 104857600,
            "log.retention.check.interval.ms": 300000,
        }
        lines = ["# generated by consumer_sdk.testing.KafkaCluster"]
        lines += [f"{k}={v}" for k, v in props.items()]
        if self._extra_props:
            lines.append("# server_properties")
            lines += [f"{k}={v}" for k, v in self._extra_props.items()]
        return "\n".join(lines) + "\n"

    def _java_base(self) -> list[str]:
        return [self._java, "-cp", str(self._home / "libs" / "*")]

    def _format_all(self) -> None:
        tools_log = self._home / "config" / "tools-log4j2.yaml"
        procs = []
        for node in self._nodes.values():
            argv = [self._java, "-Xmx256m", "-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"]
            if tools_log.is_file():
                argv.append(f"-Dlog4j2.configurationFile={tools_log}")
            argv += [
                "-cp",
                str(self._home / "libs" / "*"),
                "kafka.tools.StorageTool",
                "format",
                "-t",
                self._cluster_id,
                "-c",
                str(node.config),
            ]
            procs.append(
                (node, subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
            )
        for node, proc in procs:
            try:
                out, _ = proc.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                out, _ = proc.communicate()
            if proc.returncode != 0:
                tail = out.decode("utf-8", "replace").splitlines()[-_LOG_TAIL:]
                raise KafkaClusterError(
                    f"formatting node {node.node_id}'s storage failed (kafka.tools.StorageTool "
                    f"exit {proc.returncode}):\n" + "\n".join(tail),
                    log_tail=tail,
                )

    def _launch(self, node: _Node) -> None:
        if node.console.exists():
            node.console.replace(node.console.with_suffix(f".log.{node.launches}"))
        node.launches += 1
        log4j = self._home / "config" / "log4j2.yaml"
        argv = [
            self._java,
            f"-Xmx{self._heap_mb}m",
            "-Xms64m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-XX:+ExitOnOutOfMemoryError",
            "-Djava.awt.headless=true",
            f"-D{_OWNER_PROPERTY}={os.getpid()}",
            f"-Dkafka.logs.dir={node.directory / 'logs'}",
        ]
        if log4j.is_file():
            argv.append(f"-Dlog4j2.configurationFile={log4j}")
        argv += ["-cp", str(self._home / "libs" / "*"), "kafka.Kafka", str(node.config)]
        preexec = None
        if _prctl is not None and threading.current_thread() is threading.main_thread():
            preexec = _die_with_parent
        with node.console.open("wb") as console:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=console,
                stderr=subprocess.STDOUT,
                cwd=node.directory,
                start_new_session=True,  # own process group; Ctrl-C is the test run's to handle
                preexec_fn=preexec,
            )
        node.proc = proc
        node.paused = False
        self._procs.append(proc)
        with _ALL_PROCS_LOCK:
            _ALL_PROCS[proc.pid] = proc
        logger.debug("KafkaCluster node %d started (pid %d)", node.node_id, proc.pid)

    def _await_nodes(self, nodes: list[_Node], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        pending = list(nodes)
        while pending:
            for node in list(pending):
                if node.ready():
                    pending.remove(node)
                elif not node.running():
                    assert node.proc is not None
                    tail = node.tail()
                    raise KafkaClusterError(
                        f"Kafka node {node.node_id} exited with code {node.proc.returncode} "
                        f"before it was ready; last {len(tail)} log line(s) of "
                        f"{node.console}:\n" + "\n".join(tail),
                        log_tail=tail,
                    )
            if not pending:
                return
            if time.monotonic() >= deadline:
                node = pending[0]
                tail = node.tail()
                raise KafkaClusterError(
                    f"Kafka node {node.node_id} not ready after {timeout:.0f}s; last "
                    f"{len(tail)} log line(s) of {node.console}:\n" + "\n".join(tail),
                    log_tail=tail,
                )
            time.sleep(0.2)

    def _await_usable(self) -> None:
        """All brokers registered and ``__consumer_offsets`` created (first group is instant)."""
        deadline = time.monotonic() + self._start_timeout
        count = len(self._nodes)
        while True:
            try:
                md = self.admin().list_topics(timeout=5)
                if len(md.brokers) == count:
                    break
            except Exception as exc:  # confluent_kafka.KafkaException while brokers settle
                logger.debug("KafkaCluster: metadata not ready: %s", exc)
            if time.monotonic() >= deadline:
                raise KafkaClusterError(f"{count} broker(s) did not register within the timeout")
            time.sleep(0.2)
        self.coordinator_for("__consumer_sdk_warmup", timeout=max(deadline - time.monotonic(), 30))

    # -- properties -------------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        """``host:port`` of every node's PLAINTEXT listener, comma-separated."""
        return ",".join(f"{self._host}:{n.port}" for n in self._nodes.values())

    def bootstrap_for(self, listener: str) -> str:
        """Bootstrap servers of the extra listener ``listener`` (a ``listeners=`` key)."""
        name = listener.upper()
        if name == "PLAINTEXT":
            return self.bootstrap_servers
        if name not in self._listeners:
            raise KafkaClusterError(
                f"no listener {listener!r}; this cluster has PLAINTEXT"
                + "".join(f", {n}" for n in self._listeners)
            )
        return ",".join(f"{self._host}:{n.extra_ports[name]}" for n in self._nodes.values())

    @property
    def node_ids(self) -> list[int]:
        return list(self._nodes)

    @property
    def kafka_version(self) -> tuple[int, int, int]:
        """The distribution's Kafka version, e.g. ``(4, 2, 1)``."""
        return self._version

    @property
    def cluster_id(self) -> str:
        return self._cluster_id

    @property
    def closed(self) -> bool:
        return self._closed

    def node_address(self, node_id: int) -> tuple[str, int]:
        """The PLAINTEXT ``(host, port)`` of ``node_id``."""
        return (self._host, self._node(node_id).port)

    def node_pids(self) -> dict[int, int]:
        """``{node_id: pid}`` of the running nodes (paused ones included)."""
        return {i: n.proc.pid for i, n in self._nodes.items() if n.proc and n.running()}

    def node_log_tail(self, node_id: int, lines: int = _LOG_TAIL) -> list[str]:
        """The last ``lines`` lines of a node's log (current run)."""
        return self._node(node_id).tail(lines)

    def running_nodes(self) -> list[int]:
        return [i for i, n in self._nodes.items() if n.running()]

    def _node(self, node_id: int) -> _Node:
        try:
            return self._nodes[int(node_id)]
        except (KeyError, ValueError, TypeError):
            raise KafkaClusterError(f"no node {node_id!r} (nodes: {sorted(self._nodes)})") from None

    def _live_bootstrap(self) -> str:
        live = [n for n in self._nodes.values() if n.running() and not n.paused]
        return ",".join(f"{self._host}:{n.port}" for n in live or self._nodes.values())

    def _default_replication(self) -> int:
        return min(3, len(self._nodes))

    def _check_open(self) -> None:
        if self._closed:
            raise KafkaClusterError("KafkaCluster is closed")

    # -- node faults ------------------------------------------------------------------------

    def _running_node(self, node_id: int) -> tuple[_Node, subprocess.Popen[bytes]]:
        """Node ``node_id`` of an open cluster and its process, which must be running (a
        paused node counts); KafkaClusterError otherwise."""
        self._check_open()
        node = self._node(node_id)
        if node.proc is None or not node.running():
            raise KafkaClusterError(f"node {node_id} is not running")
        return node, node.proc

    def stop_node(self, node_id: int, timeout: float = 60.0) -> None:
        """Controlled shutdown (SIGTERM) of one node; SIGKILL if it takes over ``timeout``."""
        _, proc = self._running_node(node_id)
        killed = _terminate_all([proc], timeout)
        if killed:
            logger.warning("node %d ignored SIGTERM for %.0fs: SIGKILLed", node_id, timeout)

    def kill_node(self, node_id: int) -> None:
        """SIGKILL one node (no controlled shutdown: a crash)."""
        node, proc = self._running_node(node_id)
        _signal_group(proc, signal.SIGKILL)
        proc.wait(timeout=30)
        node.paused = False

    def pause_node(self, node_id: int) -> None:
        """SIGSTOP one node: it keeps its sockets open but answers nothing (a hung broker)."""
        node, proc = self._running_node(node_id)
        _signal_group(proc, signal.SIGSTOP)
        node.paused = True

    def resume_node(self, node_id: int) -> None:
        """SIGCONT a node paused by `pause_node`."""
        node, proc = self._running_node(node_id)
        _signal_group(proc, signal.SIGCONT)
        node.paused = False

    def start_node(self, node_id: int, timeout: float | None = None) -> None:
        """Start a stopped or killed node again (same ports, config and data)."""
        self._check_open()
        node = self._node(node_id)
        if node.running():
            raise KafkaClusterError(f"node {node_id} is already running")
        with self._lock:
            self._launch(node)
        self._await_nodes([node], timeout if timeout is not None else self._start_timeout)

    # -- lifecycle --------------------------------------------------------------------------

    def close(self, timeout: float = 20.0) -> None:
        """Stop every node at once (SIGTERM, SIGKILL after ``timeout``) and remove the data.

        Idempotent; always returns and never leaves a JVM behind.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            # drop the clients first: stopped brokers would make them log disconnects
            self._producer = None
            self._admin = None
            killed = _terminate_all(self._procs, timeout)
            if killed:
                logger.warning(
                    "KafkaCluster.close: SIGKILLed node pid(s) %s after %.0fs", killed, timeout
                )
        finally:
            self._finalizer.detach()
            with _ALL_PROCS_LOCK:
                for proc in self._procs:
                    if not _alive(proc):
                        _ALL_PROCS.pop(proc.pid, None)
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"running={self.running_nodes()}"
        version = ".".join(map(str, self._version))
        return f"KafkaCluster(kafka={version}, bootstrap={self.bootstrap_servers!r}, {state})"


def _check_topic(topic: str) -> None:
    if not isinstance(topic, str) or not _TOPIC_RE.match(topic) or topic in (".", ".."):
        raise ValueError(f"invalid topic name {topic!r} (1-249 of [A-Za-z0-9._-])")


def _bytes(value: Payload) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


# -- Docker backend ---------------------------------------------------------------------------

DOCKER_KAFKA_IMAGE = "apache/kafka:4.1.0"


def docker_unavailable_reason() -> str | None:
    """None when testcontainers is installed and a Docker engine answers, else why not."""
    try:
        from testcontainers.core.docker_client import DockerClient
    except Exception as exc:  # depends on the environment
        return f"testcontainers is not installed ({exc})"
    try:
        DockerClient().client.ping()
    except Exception as exc:
        return f"no Docker engine reachable ({type(exc).__name__}: {exc})"
    return None


class DockerKafka(_ClusterOps):
    """A single real Kafka 4.x node in a Docker container (testcontainers, ``apache/kafka``).

    The fallback backend where no ``KAFKA_HOME`` is available: topic, data and group
    operations as on `KafkaCluster`; node faults need `KafkaCluster`.
    """

    def __init__(
        self,
        *,
        image: str = DOCKER_KAFKA_IMAGE,
        heartbeat_interval_ms: int = 500,
        session_timeout_ms: int = 6000,
        start_timeout: float = 120.0,
    ) -> None:
        from testcontainers.core.container import DockerContainer

        self._lock = threading.RLock()
        self._admin = None
        self._producer = None
        self._closed = False
        [self._port] = _free_ports(1)
        hb, session = heartbeat_interval_ms, session_timeout_ms
        env: dict[str, object] = {
            "KAFKA_NODE_ID": 1,
            "KAFKA_PROCESS_ROLES": "broker,controller",
            "KAFKA_LISTENERS": "PLAINTEXT://:9092,CONTROLLER://:9093",
            "KAFKA_ADVERTISED_LISTENERS": f"PLAINTEXT://127.0.0.1:{self._port}",
            "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@localhost:9093",
            "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": 1,
            "KAFKA_OFFSETS_TOPIC_NUM_PARTITIONS": 10,
            "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": 1,
            "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": 1,
            "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": 0,
            "KAFKA_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS": hb,
            "KAFKA_GROUP_CONSUMER_MIN_HEARTBEAT_INTERVAL_MS": min(hb, _DEFAULT_HEARTBEAT_MS),
            "KAFKA_GROUP_CONSUMER_SESSION_TIMEOUT_MS": session,
            "KAFKA_GROUP_CONSUMER_MIN_SESSION_TIMEOUT_MS": min(session, _DEFAULT_SESSION_MS),
        }
        container = DockerContainer(image).with_bind_ports(9092, self._port)
        for key, value in env.items():
            container = container.with_env(key, str(value))
        self._container = container
        container.start()
        try:
            deadline = time.monotonic() + start_timeout
            while True:
                try:
                    self.admin().list_topics(timeout=2)
                    break
                except Exception:
                    if time.monotonic() >= deadline:
                        raise KafkaClusterError(
                            f"Kafka container {image} not ready after {start_timeout:.0f}s"
                        ) from None
                    time.sleep(0.5)
            self.coordinator_for(
                "__consumer_sdk_warmup", timeout=max(deadline - time.monotonic(), 30)
            )
        except BaseException:
            self.close()
            raise

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self._port}"

    def _check_open(self) -> None:
        if self._closed:
            raise KafkaClusterError("DockerKafka is closed")

    @property
    def node_ids(self) -> list[int]:
        return [1]

    def _unsupported(self, what: str) -> KafkaClusterError:
        return KafkaClusterError(
            f"{what} needs KafkaCluster (set KAFKA_HOME to a Kafka 4.x distribution); the "
            "Docker backend runs one node without node faults"
        )

    def stop_node(self, node_id: int, timeout: float = 60.0) -> None:
        raise self._unsupported("stop_node")

    def kill_node(self, node_id: int) -> None:
        raise self._unsupported("kill_node")

    def pause_node(self, node_id: int) -> None:
        raise self._unsupported("pause_node")

    def resume_node(self, node_id: int) -> None:
        raise self._unsupported("resume_node")

    def start_node(self, node_id: int, timeout: float | None = None) -> None:
        raise self._unsupported("start_node")

    def close(self) -> None:
        """Stop and remove the container (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self._producer = None
        self._admin = None
        with contextlib.suppress(Exception):
            self._container.stop()

    def __enter__(self) -> DockerKafka:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
