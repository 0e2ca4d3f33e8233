"""The kip848 source beyond one local session, on the real broker: two Spark applications
(two driver processes) sharing one group through graceful hand-overs, a Spark Connect
client on its own, and a standalone cluster. Everything Spark runs from pyspark's own
distribution on 127.0.0.1, in child processes killed at the end."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.spark.apps import App, SparkDaemon, free_port, spark_env, spark_home
from tests.spark.helpers import committed, high_watermarks, wait_for
from tests.spark.spark_app import read_sink

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")
pytestmark = pytest.mark.spark

PARTS = 6


class Producer:
    """Produces to every partition of a topic at a steady pace in a thread until stopped."""

    def __init__(self, kafka: Any, topic: str, per_second: int = 300) -> None:
        import confluent_kafka

        self._producer = confluent_kafka.Producer(
            {"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 5}
        )
        self._topic, self._rate = topic, per_second
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        i = 0
        while not self._stop.wait(0.05):
            for _ in range(self._rate // 20):
                self._producer.produce(self._topic, f"v{i}".encode(), partition=i % PARTS)
                i += 1
            self._producer.poll(0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        assert self._producer.flush(30) == 0


def positions(records: list[tuple[str, int, int]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for _, p, o in records:
        out[p] = max(out.get(p, -1), o + 1)
    return out


def settled(app: App) -> bool:
    """The query's commit log holds the last batch of its offset log.

    Spark writes a batch to the sink, then its commit-log entry: a stop between the two
    leaves the batch undone in Spark's eyes (replayed on restart), so the source rightly
    does not commit it to Kafka, though the sink already shows its records. A test that
    expects the last batch committed on stop waits for this first.
    """
    checkpoint = app.workdir / "checkpoint"

    def batches(log: str) -> set[int]:
        return {int(f.name) for f in (checkpoint / log).glob("*") if f.name.isdigit()}

    planned = batches("offsets")
    return bool(planned) and max(planned) in batches("commits")


def check_exactly_once(kafka: Any, topic: str, sinks: dict[str, list[Any]]) -> None:
    produced = {
        (topic, p, o) for p, hw in high_watermarks(kafka, topic, PARTS).items() for o in range(hw)
    }
    for name, records in sinks.items():
        assert len(records) == len(set(records)), f"{name} holds a record twice"
    names = list(sinks)
    for i, a in enumerate(names):
        for b in names[i + 1 :]:
            both = set(sinks[a]) & set(sinks[b])
            assert not both, f"{len(both)} records in both {a} and {b}: {sorted(both)[:10]}"
    union = set().union(*map(set, sinks.values()))
    assert union == produced, f"missing {sorted(produced - union)[:10]}"


def _alive(*apps: App) -> bool:
    for app in apps:
        app.check()
    return True


@pytest.fixture
def apps() -> Iterator[list[App]]:
    started: list[App] = []
    try:
        yield started
    finally:
        for app in started:
            app.close()


@pytest.mark.timeout(900)
def test_graceful_hand_overs_between_two_applications_are_exactly_once(
    real_kafka: Any, tmp_path: Path, apps: list[App]
) -> None:
    """A joins; B joins (A hands partitions over); A stops gracefully (B takes all); A
    rejoins; then the same with B stopping: every record in exactly one sink."""
    topic, group = "dep-handover", "dep-handover-g"
    real_kafka.create_topic(topic, partitions=PARTS)
    common = ["--bootstrap", real_kafka.bootstrap_servers, "--topic", topic, "--group", group]
    a = App("a", tmp_path / "a", *common)
    apps.append(a)
    b = App("b", tmp_path / "b", *common)
    apps.append(b)
    a.expect("ready")
    b.expect("ready")
    producer = Producer(real_kafka, topic)
    try:
        a.start()
        wait_for(lambda: _alive(a) and read_sink(a.workdir), 180, "A reading")
        b.start()
        wait_for(
            lambda: _alive(a, b) and read_sink(b.workdir), 180, "B reading (A handed some over)"
        )
        for leaving, staying in ((a, b), (b, a)):
            leaving.stop()
            at_stop = high_watermarks(real_kafka, topic, PARTS)
            wait_for(
                lambda s=staying, hw=at_stop: (
                    _alive(a, b)
                    and all(positions(read_sink(s.workdir)).get(p, 0) > hw[p] for p in range(PARTS))
                ),
                180,
                f"{staying.name} reading every partition after {leaving.name} stopped",
            )
            at_start = high_watermarks(real_kafka, topic, PARTS)
            leaving.start()
            wait_for(
                lambda s=leaving, hw=at_start: (
                    _alive(a, b)
                    and any(positions(read_sink(s.workdir)).get(p, 0) > hw[p] for p in range(PARTS))
                ),
                180,
                f"{leaving.name} rejoining and reading",
            )
    finally:
        producer.stop()
    final = high_watermarks(real_kafka, topic, PARTS)
    wait_for(
        lambda: all(
            positions(read_sink(a.workdir) + read_sink(b.workdir)).get(p, 0) >= final[p]
            for p in range(PARTS)
        ),
        180,
        "both applications catching up",
    )
    wait_for(lambda: settled(a) and settled(b), 60, "both commit logs holding the last batch")
    a.stop()
    b.stop()
    check_exactly_once(real_kafka, topic, {"A": read_sink(a.workdir), "B": read_sink(b.workdir)})
    for app in (a, b):  # each handed partitions over while running and when stopped
        kinds = [e["kind"] for e in app.events()]
        assert kinds.count("revoke") >= 3, (app.name, kinds)
    # Both stopped gracefully: the group's committed offsets are where the sinks stopped
    # (committed on revoke when the stream readers closed, which the JVM does not await).
    wait_for(
        lambda: committed(real_kafka, group, topic, PARTS) == final,
        60,
        "the offsets committed on close",
    )


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[str]:
    """A standalone master and one worker (2 cores) from pyspark's distribution."""
    work = tmp_path / "standalone"
    work.mkdir()
    port = free_port()
    master = SparkDaemon(
        work / "master.log",
        "org.apache.spark.deploy.master.Master",
        *("--host", "127.0.0.1", "--port", str(port), "--webui-port", str(free_port())),
    )
    worker: SparkDaemon | None = None
    try:
        master.wait_for_port(port)
        url = f"spark://127.0.0.1:{port}"
        worker = SparkDaemon(
            work / "worker.log",
            "org.apache.spark.deploy.worker.Worker",
            *("--host", "127.0.0.1", "--cores", "2", "--memory", "2g"),
            *("--webui-port", str(free_port()), "--work-dir", str(work / "work"), url),
        )
        worker.wait_for_log("Successfully registered with master")
        yield url
    finally:
        if worker is not None:
            worker.close()
        master.close()


def produce_fixed(kafka: Any, topic: str, per_partition: int) -> None:
    import confluent_kafka

    producer = confluent_kafka.Producer({"bootstrap.servers": kafka.bootstrap_servers})
    for p in range(PARTS):
        for i in range(per_partition):
            producer.produce(topic, f"r{p}-{i}".encode(), partition=p)
    assert producer.flush(30) == 0


def run_once_then_stream(kafka: Any, app: App, topic: str, group: str) -> None:
    """Trigger.Once, then a processingTime run stopped after its last batch: each run's
    batches are committed to Kafka by the time the query stopped, with nothing reported by
    a listener (the stream reader reads the commit log)."""
    produce_fixed(kafka, topic, 100)
    app.expect("ready")
    app.start("once")
    hw = high_watermarks(kafka, topic, PARTS)
    wait_for(
        lambda: _alive(app) and committed(kafka, group, topic, PARTS) == hw,
        180,
        "the Trigger.Once batch committed to Kafka",
    )
    assert positions(read_sink(app.workdir)) == hw
    app.stop()
    produce_fixed(kafka, topic, 100)
    hw = high_watermarks(kafka, topic, PARTS)
    app.start()
    wait_for(
        lambda: _alive(app) and positions(read_sink(app.workdir)) == hw and settled(app),
        180,
        "the second run, its last batch in the commit log",
    )
    app.stop()
    # The last batch was committed before the member left (the stop waited for the leave).
    wait_for(lambda: committed(kafka, group, topic, PARTS) == hw, 60, "the last batch committed")
    check_exactly_once(kafka, topic, {app.name: read_sink(app.workdir)})


@pytest.mark.timeout(600)
def test_a_spark_connect_client_on_a_standalone_cluster_commits_to_kafka(
    real_kafka: Any, standalone: str, tmp_path: Path, apps: list[App]
) -> None:
    """A Spark Connect server (pyspark's distribution) running on a standalone cluster (a
    master and a worker, so the source's tasks run in an executor JVM of their own) and a
    client in another process with its own temporary directory: the group's committed
    offsets follow the sink, for Trigger.Once and for the last batch before a stop. One
    test for both deployments: each costs a few JVMs on a 2-core CI machine."""
    topic, group = "dep-connect", "dep-connect-g"
    real_kafka.create_topic(topic, partitions=PARTS)
    server_tmp, client_tmp = tmp_path / "server-tmp", tmp_path / "client-tmp"
    server_tmp.mkdir()
    client_tmp.mkdir()
    port = free_port()
    home = spark_home()
    server = SparkDaemon(
        tmp_path / "connect-server.log",
        "org.apache.spark.sql.connect.service.SparkConnectServer",
        *("--master", standalone, "--name", "kip848-connect"),
        *("--conf", f"spark.connect.grpc.binding.port={port}"),
        *("--conf", "spark.connect.grpc.binding.address=127.0.0.1"),
        *("--conf", "spark.ui.enabled=false", "--conf", "spark.cores.max=1"),
        *("--conf", "spark.sql.streaming.noDataMicroBatches.enabled=false"),
        *("--conf", f"spark.driver.extraJavaOptions=-Djava.io.tmpdir={server_tmp}"),
        submit=True,
        env={"TMPDIR": str(server_tmp), "SPARK_HOME": str(home)},
    )
    try:
        server.wait_for_port(port)
        app = App(
            "connect",
            server_tmp / "app",  # the checkpoint and the sink live on the server's side
            *("--bootstrap", real_kafka.bootstrap_servers, "--topic", topic, "--group", group),
            *("--remote", f"sc://127.0.0.1:{port}"),
            env=spark_env(TMPDIR=str(client_tmp)),
        )
        apps.append(app)
        run_once_then_stream(real_kafka, app, topic, group)
        assert not list(client_tmp.glob("kip848*")), "the client shares files with the server"
    finally:
        for app in apps:
            app.close()
        apps.clear()
        server.close()
