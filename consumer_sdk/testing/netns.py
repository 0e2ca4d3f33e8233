"""A multi-host network on one machine: a real Kafka cluster and member processes, each
host in its own Linux network namespace, joined by veth links to a bridge.

Needs root and iproute2 (``ip netns``, ``ip link``) and a Kafka distribution
(``KAFKA_HOME``). Every namespace, link and process belongs to one `NetnsCluster` and
carries its per-run suffix, so concurrent runs cannot collide, and nothing is configured in
the caller's own namespace: the bridge lives in a hub namespace, and the test's own clients
run in a ``ctl`` host namespace (`NetnsCluster.call` runs a function on a thread there;
sockets and threads it creates stay there).

Faults (no ``tc netem``):

- `NetnsCluster.partition` ``(a, b)``: packets from ``a`` to ``b`` are dropped silently (a
  blackhole route in ``a``), and from ``b`` to ``a`` too unless ``one_way``;
- `NetnsCluster.isolate` ``(host)``: the host's bridge port goes down (a pulled cable);
- `NetnsCluster.slow` ``(node, delay_s)`` and `NetnsCluster.reset` ``(node)`` (with
  ``slow_links=True``): every broker also listens on a ``SLOW`` listener reached through a
  `consumer_sdk.testing.faulty_proxy.FaultyProxy` per broker on host ``px``; clients that
  bootstrap from `NetnsCluster.slow_bootstrap_servers` talk to every broker through those
  proxies, which add latency or reset every connection on demand;
- `NetnsCluster.heal`: every route and port back, no latency.

``close()`` (also on ``with`` exit and at interpreter exit) kills every process the bed
started, then everything still running in its namespaces, and deletes the namespaces (their
links and the bridge go with them)::

    with NetnsCluster(brokers=3, hosts=("m1", "m2")) as net:
        net.create_topic("t", partitions=6)
        member = net.spawn("m1", [sys.executable, "-m", "my_member", net.bootstrap_servers])
        net.partition("m1", net.broker_host(net.coordinator_for("g")))
        ...
        net.heal()
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import logging
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from consumer_sdk.testing._helpers import kafka_uuid, wait_until

__all__ = ["NetnsCluster", "NetnsError", "netns_available"]

log = logging.getLogger("consumer_sdk.testing.netns")

T = TypeVar("T")

_CLONE_NEWNET = 0x40000000
_SUBNET = "10.88.0"
_KAFKA_PORT = 9092
_CONTROLLER_PORT = 9093
_SLOW_PORT = 9094
_libc: Any = None


class NetnsError(RuntimeError):
    """The test network could not be set up (not root, no ``ip``, a command failed)."""


def netns_available() -> str | None:
    """None if network namespaces can be made here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "iproute2 (ip) is not installed"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def _setns(name: str) -> None:
    """Move the calling thread into network namespace ``name``."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if _libc.setns(fd, _CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetnsError(f"setns({name}): {os.strerror(err)}")
    finally:
        os.close(fd)


class NetnsCluster:
    """``brokers`` Kafka nodes (hosts ``b1``..) and the named member ``hosts``, plus ``ctl``
    for the test's own clients, each in its own network namespace on one bridge."""

    def __init__(
        self,
        brokers: int = 3,
        hosts: Sequence[str] = ("m1", "m2", "m3"),
        *,
        kafka_home: str | os.PathLike[str] | None = None,
        heartbeat_interval_ms: int = 500,
        session_timeout_ms: int = 6000,
        start_timeout_s: float = 120.0,
        slow_links: bool = False,
    ) -> None:
        why = netns_available()
        if why is not None:
            raise NetnsError(why)
        home = kafka_home or os.environ.get("KAFKA_HOME")
        if not home or not (Path(home) / "libs").is_dir():
            raise NetnsError("set KAFKA_HOME to an Apache Kafka >= 4.0 distribution")
        self.kafka_home = Path(home)
        self.suffix = f"{os.getpid():x}{secrets.token_hex(2)}"
        self.broker_ids = list(range(1, brokers + 1))
        self.hosts = [f"b{i}" for i in self.broker_ids] + list(hosts) + ["ctl"]
        if slow_links:
            self.hosts.append("px")
        self._proxies: dict[int, Any] = {}
        self._ips = {h: f"{_SUBNET}.{i + 1}" for i, h in enumerate(self.hosts)}
        self._hub = f"nf{self.suffix}-hub"
        self._dir = Path(tempfile.mkdtemp(prefix=f"netns-{self.suffix}-"))
        self._procs: list[subprocess.Popen[bytes]] = []
        self._brokers: dict[int, subprocess.Popen[bytes]] = {}
        self._routes: set[tuple[str, str]] = set()
        self._down: set[str] = set()
        self._closed = False
        self._lock = threading.Lock()
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.session_timeout_ms = session_timeout_ms
        atexit.register(self.close)
        try:
            self._build_network()
            if slow_links:
                self._start_proxies()
            self._start_brokers(start_timeout_s)
        except BaseException:
            self.close()
            raise

    # -- names ---------------------------------------------------------------------------------

    def netns(self, host: str) -> str:
        """The namespace name of ``host``."""
        if host not in self._ips:
            raise KeyError(f"no host {host!r} (hosts: {self.hosts})")
        return f"nf{self.suffix}-{host}"

    def ip(self, host: str) -> str:
        return self._ips[host]

    def broker_host(self, node_id: int) -> str:
        return f"b{node_id}"

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{self._ips[f'b{i}']}:{_KAFKA_PORT}" for i in self.broker_ids)

    @property
    def slow_bootstrap_servers(self) -> str:
        """Bootstrap through the proxies (``slow_links=True``): every connection a client
        then makes to a broker goes through that broker's proxy."""
        if not self._proxies:
            raise NetnsError("start the NetnsCluster with slow_links=True")
        return ",".join(p.address for _, p in sorted(self._proxies.items()))

    def exec_prefix(self, host: str) -> list[str]:
        """Prefix a command with this to run it on ``host`` (``ip netns exec``)."""
        return ["ip", "netns", "exec", self.netns(host)]

    # -- setup ---------------------------------------------------------------------------------

    def _build_network(self) -> None:
        hub = self._hub
        _ip("netns", "add", hub)
        _ip("-n", hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", hub, "link", "set", "br0", "up")
        for host in self.hosts:
            ns = self.netns(host)
            _ip("netns", "add", ns)
            _ip("-n", hub, "link", "add", f"v-{host}", "type", "veth", "peer", "name", "eth0")
            _ip("-n", hub, "link", "set", "eth0", "netns", ns)
            _ip("-n", hub, "link", "set", f"v-{host}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self._ips[host]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        log.info("netns bed %s: hosts %s", self.suffix, self._ips)

    def _start_proxies(self) -> None:
        from consumer_sdk.testing.faulty_proxy import FaultyProxy

        px = self._ips["px"]

        def start() -> dict[int, Any]:  # in px: the proxies' threads and sockets stay there
            return {
                node: FaultyProxy(self._ips[f"b{node}"], _SLOW_PORT, host=px)
                for node in self.broker_ids
            }

        self._proxies = self.call(start, host="px", timeout_s=30)

    def _java(self) -> str:
        java_home = os.environ.get("JAVA_HOME")
        if java_home and (Path(java_home) / "bin" / "java").exists():
            return str(Path(java_home) / "bin" / "java")
        found = shutil.which("java")
        if found is None:
            raise NetnsError("java (17+) is not on PATH and JAVA_HOME is not set")
        return found

    def _config(self, node_id: int) -> Path:
        ip = self._ips[f"b{node_id}"]
        voters = ",".join(f"{i}@{self._ips[f'b{i}']}:{_CONTROLLER_PORT}" for i in self.broker_ids)
        rf = min(3, len(self.broker_ids))
        data = self._dir / f"node{node_id}"
        data.mkdir(exist_ok=True)
        lines = [
            "process.roles=broker,controller",
            f"node.id={node_id}",
            f"controller.quorum.voters={voters}",
            f"listeners=PLAINTEXT://{ip}:{_KAFKA_PORT},CONTROLLER://{ip}:{_CONTROLLER_PORT}"
            + (f",SLOW://{ip}:{_SLOW_PORT}" if self._proxies else ""),
            f"advertised.listeners=PLAINTEXT://{ip}:{_KAFKA_PORT}"
            + (f",SLOW://{self._proxies[node_id].address}" if self._proxies else ""),
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=PLAINTEXT",
            "listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SLOW:PLAINTEXT",
            f"log.dirs={data / 'data'}",
            f"offsets.topic.replication.factor={rf}",
            "offsets.topic.num.partitions=10",
            f"transaction.state.log.replication.factor={rf}",
            f"transaction.state.log.min.isr={min(2, rf)}",
            f"share.coordinator.state.topic.replication.factor={rf}",
            f"share.coordinator.state.topic.min.isr={min(2, rf)}",
            f"default.replication.factor={rf}",
            f"min.insync.replicas={min(2, rf)}",
            "group.initial.rebalance.delay.ms=0",
            f"group.consumer.heartbeat.interval.ms={self.heartbeat_interval_ms}",
            f"group.consumer.min.heartbeat.interval.ms={self.heartbeat_interval_ms}",
            f"group.consumer.session.timeout.ms={self.session_timeout_ms}",
            f"group.consumer.min.session.timeout.ms={self.session_timeout_ms}",
            "broker.session.timeout.ms=9000",
            "broker.heartbeat.interval.ms=1000",
            "auto.create.topics.enable=false",
        ]
        path = data / "server.properties"
        path.write_text("\n".join(lines) + "\n")
        return path

    def _start_brokers(self, timeout_s: float) -> None:
        java = self._java()
        classpath = f"{self.kafka_home / 'libs'}/*"
        cluster_id = kafka_uuid()
        for node in self.broker_ids:
            config = self._config(node)
            subprocess.run(
                [
                    java,
                    "-cp",
                    classpath,
                    "kafka.tools.StorageTool",
                    "format",
                    "-t",
                    cluster_id,
                    "-c",
                    str(config),
                ],
                check=True,
                capture_output=True,
                timeout=120,
            )
        for node in self.broker_ids:
            self._launch_broker(node)
        wait_until(
            lambda: self._brokers_ready(), timeout_s, 0.5, f"{len(self.broker_ids)} brokers up"
        )

    def _launch_broker(self, node: int) -> None:
        java = self._java()
        data = self._dir / f"node{node}"
        out = (data / "console.log").open("ab")
        popen = subprocess.Popen(
            [
                *self.exec_prefix(f"b{node}"),
                java,
                "-Xmx512m",
                "-Xms256m",
                f"-Dkafka.logs.dir={data / 'logs'}",
                f"-Dlog4j2.configurationFile={self.kafka_home / 'config' / 'log4j2.yaml'}",
                "-cp",
                f"{self.kafka_home / 'libs'}/*",
                "kafka.Kafka",
                str(data / "server.properties"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        out.close()
        self._brokers[node] = popen

    def _brokers_ready(self) -> bool:
        for node, popen in self._brokers.items():
            if popen.poll() is not None:
                tail = (self._dir / f"node{node}" / "console.log").read_text()[-2000:]
                raise NetnsError(f"broker {node} exited ({popen.returncode}):\n{tail}")
        try:
            return bool(self.call(self._metadata_brokers, timeout_s=15) == len(self.broker_ids))
        except Exception:
            return False

    def _metadata_brokers(self) -> int:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers, "log_level": 0})
        return len(admin.list_topics(timeout=5).brokers)

    # -- running things in a namespace --------------------------------------------------------

    def call(self, fn: Callable[[], T], host: str = "ctl", timeout_s: float | None = None) -> T:
        """Run ``fn`` on a new thread inside ``host``'s namespace and return its result (or
        raise its exception). Sockets, threads and processes it creates stay there."""
        ns = self.netns(host)
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                _setns(ns)
                box["result"] = fn()
            except BaseException as exc:
                box["error"] = exc

        thread = threading.Thread(target=run, name=f"netns-{host}", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            raise TimeoutError(f"{fn!r} in {host} did not finish within {timeout_s} s")
        if "error" in box:
            raise box["error"]
        result: T = box["result"]
        return result

    def spawn(self, host: str, argv: Sequence[str], **popen: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` on ``host`` (its own session: signals reach only it)."""
        popen.setdefault("start_new_session", True)
        proc: subprocess.Popen[bytes] = subprocess.Popen([*self.exec_prefix(host), *argv], **popen)
        self._procs.append(proc)
        return proc

    # -- cluster helpers (run in ctl) -----------------------------------------------------------

    def create_topic(self, topic: str, partitions: int = 1, timeout: float = 60.0) -> None:
        def create() -> None:
            from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

            admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
            rf = min(3, len(self.broker_ids))
            futures = admin.create_topics([NewTopic(topic, partitions, rf)])
            futures[topic].result(timeout)

        self.call(create, timeout_s=timeout + 10)

    def produce(
        self, topic: str, records: Sequence[tuple[str, str]], timeout: float = 60.0
    ) -> None:
        def send() -> None:
            from confluent_kafka import Producer

            producer = Producer(
                {"bootstrap.servers": self.bootstrap_servers, "acks": "all", "linger.ms": 5}
            )
            for key, value in records:
                while True:
                    try:
                        producer.produce(topic, value.encode(), key.encode())
                        break
                    except BufferError:
                        producer.poll(0.1)
            left = producer.flush(timeout)
            if left:
                raise NetnsError(f"{left} record(s) not delivered to {topic} within {timeout} s")

        self.call(send, timeout_s=timeout + 10)

    def coordinator_for(self, group: str, timeout: float = 30.0) -> int:
        def find() -> int:
            from consumer_sdk.protocol.client import ClusterClient

            client = ClusterClient({"bootstrap.servers": self.bootstrap_servers})
            try:
                node = wait_until(
                    lambda: _find(client, group), timeout, 0.2, f"the coordinator of {group}"
                )
                assert node is not None
                return node
            finally:
                client.close()

        return self.call(find, timeout_s=timeout + 10)

    # -- faults --------------------------------------------------------------------------------

    def partition(self, a: str, b: str, one_way: bool = False) -> None:
        """Drop packets from ``a`` to ``b`` (and from ``b`` to ``a`` unless ``one_way``)."""
        pairs = [(a, b)] if one_way else [(a, b), (b, a)]
        for src, dst in pairs:
            if (src, dst) not in self._routes:
                _ip("-n", self.netns(src), "route", "add", "blackhole", f"{self._ips[dst]}/32")
                self._routes.add((src, dst))
        log.info("netns %s: partitioned %s %s %s", self.suffix, a, "->" if one_way else "<->", b)

    def isolate(self, host: str) -> None:
        """Cut ``host`` from every other host (its bridge port down)."""
        _ip("-n", self._hub, "link", "set", f"v-{host}", "down")
        self._down.add(host)
        log.info("netns %s: isolated %s", self.suffix, host)

    def slow(self, node: int, delay_s: float) -> None:
        """Delay every frame to and from broker ``node`` through its proxy by ``delay_s``."""
        self._proxy(node).delay_s = delay_s
        log.info("netns %s: link to broker %d slowed by %.2f s", self.suffix, node, delay_s)

    def reset(self, node: int) -> None:
        """Reset every proxied connection to broker ``node``."""
        self._proxy(node).reset_connections()
        log.info("netns %s: connections to broker %d reset", self.suffix, node)

    def _proxy(self, node: int) -> Any:
        if node not in self._proxies:
            raise NetnsError("start the NetnsCluster with slow_links=True")
        return self._proxies[node]

    def heal(self) -> None:
        """Undo every `partition`, `isolate` and `slow`."""
        for proxy in self._proxies.values():
            proxy.delay_s = 0.0
        for src, dst in sorted(self._routes):
            _ip("-n", self.netns(src), "route", "del", "blackhole", f"{self._ips[dst]}/32")
        self._routes.clear()
        for host in sorted(self._down):
            _ip("-n", self._hub, "link", "set", f"v-{host}", "up")
        self._down.clear()
        log.info("netns %s: healed", self.suffix)

    # -- teardown ------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process, delete every namespace (links and bridge go with them)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for proc in [*self._procs, *self._brokers.values()]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        for proc in [*self._procs, *self._brokers.values()]:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(10)
        for proxy in self._proxies.values():
            with contextlib.suppress(Exception):
                proxy.close()
        for host in self.hosts:
            self._delete_netns(self.netns(host))
        self._delete_netns(self._hub)
        shutil.rmtree(self._dir, ignore_errors=True)
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)

    @staticmethod
    def _delete_netns(ns: str) -> None:
        if not Path(f"/run/netns/{ns}").exists():
            return
        pids = _ip("netns", "pids", ns, check=False).stdout.split()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        deadline = time.monotonic() + 10
        while _ip("netns", "pids", ns, check=False).stdout.strip():
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        _ip("netns", "del", ns, check=False)

    def __enter__(self) -> NetnsCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _find(client: Any, group: str) -> int | None:
    try:
        coordinator = client.find_coordinator(group, 5.0)
    except Exception:
        return None
    node: int = coordinator.node_id
    return node
