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

The JVM process control lives in ``_jvm``, the topic, data and group operations shared with
`DockerKafka` in ``_cluster_ops``; this module keeps the cluster: node layout, configuration,
start, node faults and close. Its methods run on the calling thread and block until done.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

from consumer_sdk.testing._cluster_ops import (
    DEFAULT_HEARTBEAT_MS,
    DEFAULT_SESSION_MS,
    MAX_HEARTBEAT_MS,
    MAX_SESSION_MS,
    ClusterOps,
    GroupDescription,
    GroupMemberDescription,
    KafkaClusterError,
)
from consumer_sdk.testing._cluster_ops import Payload as Payload
from consumer_sdk.testing._helpers import free_ports, kafka_uuid
from consumer_sdk.testing._jvm import (
    check_kafka_home,
    find_java,
    forget_exited,
    kafka_distribution_version,
    leaked_kafka_jvms,
    owner_tag,
    signal_group,
    spawn,
    stop_unclosed,
    terminate_all,
)
from consumer_sdk.testing.docker_kafka import DOCKER_KAFKA_IMAGE as DOCKER_KAFKA_IMAGE
from consumer_sdk.testing.docker_kafka import DockerKafka, docker_unavailable_reason

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

_LOG_TAIL = 40
_READY_MARK = "Kafka Server started"
_RESERVED_LISTENERS = frozenset({"PLAINTEXT", "CONTROLLER"})
_PROTOCOLS = frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"})
_LISTENER_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")


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


class KafkaCluster(ClusterOps):
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
        self._home = check_kafka_home(kafka_home)
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
        self._finalizer = weakref.finalize(self, stop_unclosed, self._procs, self._owner_pid)
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
                terminate_all([n.proc for n in self._nodes.values() if n.proc], 10.0)
        self._await_usable()

    def _layout(self, count: int, attempt: int) -> None:
        ports = free_ports(count * (2 + len(self._listeners)))
        self._cluster_id = kafka_uuid()
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
            "group.consumer.min.heartbeat.interval.ms": min(hb, DEFAULT_HEARTBEAT_MS),
            "group.consumer.max.heartbeat.interval.ms": max(hb, MAX_HEARTBEAT_MS),
            "group.consumer.session.timeout.ms": session,
            "group.consumer.min.session.timeout.ms": min(session, DEFAULT_SESSION_MS),
            "group.consumer.max.session.timeout.ms": max(session, MAX_SESSION_MS),
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
            owner_tag(),
            f"-Dkafka.logs.dir={node.directory / 'logs'}",
        ]
        if log4j.is_file():
            argv.append(f"-Dlog4j2.configurationFile={log4j}")
        argv += ["-cp", str(self._home / "libs" / "*"), "kafka.Kafka", str(node.config)]
        proc = spawn(argv, console=node.console, cwd=node.directory)
        node.proc = proc
        node.paused = False
        self._procs.append(proc)
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
        killed = terminate_all([proc], timeout)
        if killed:
            logger.warning("node %d ignored SIGTERM for %.0fs: SIGKILLed", node_id, timeout)

    def kill_node(self, node_id: int) -> None:
        """SIGKILL one node (no controlled shutdown: a crash)."""
        node, proc = self._running_node(node_id)
        signal_group(proc, signal.SIGKILL)
        proc.wait(timeout=30)
        node.paused = False

    def pause_node(self, node_id: int) -> None:
        """SIGSTOP one node: it keeps its sockets open but answers nothing (a hung broker)."""
        node, proc = self._running_node(node_id)
        signal_group(proc, signal.SIGSTOP)
        node.paused = True

    def resume_node(self, node_id: int) -> None:
        """SIGCONT a node paused by `pause_node`."""
        node, proc = self._running_node(node_id)
        signal_group(proc, signal.SIGCONT)
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
            killed = terminate_all(self._procs, timeout)
            if killed:
                logger.warning(
                    "KafkaCluster.close: SIGKILLed node pid(s) %s after %.0fs", killed, timeout
                )
        finally:
            self._finalizer.detach()
            forget_exited(self._procs)
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
