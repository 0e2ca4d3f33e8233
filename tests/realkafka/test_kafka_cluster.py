"""KafkaCluster itself: clear setup errors, node faults, data and group helpers, no leaked JVM."""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import confluent_kafka
import pytest

from consumer_sdk import Consumer
from consumer_sdk.testing import KafkaCluster, KafkaClusterError, wait_until
from consumer_sdk.testing.kafka_cluster import (
    find_java,
    kafka_distribution_version,
    leaked_kafka_jvms,
)


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    # a zombie not yet reaped by its parent is gone for our purpose
    return stat.exists() and stat.read_text().rsplit(")", 1)[-1].split()[0] == "Z"


# -- bad setup: clear errors, no JVM needed ----------------------------------------------------


def test_missing_kafka_home_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KAFKA_HOME", raising=False)
    with pytest.raises(KafkaClusterError, match="set KAFKA_HOME"):
        KafkaCluster()


def test_kafka_home_that_is_not_a_distribution(tmp_path: Path) -> None:
    with pytest.raises(KafkaClusterError, match="is not a directory"):
        KafkaCluster(kafka_home=tmp_path / "nowhere")
    with pytest.raises(KafkaClusterError, match="no libs/ directory"):
        KafkaCluster(kafka_home=tmp_path)
    (tmp_path / "libs").mkdir()
    (tmp_path / "libs" / "kafka-clients-4.2.1.jar").touch()
    with pytest.raises(KafkaClusterError, match="not a Kafka distribution"):
        KafkaCluster(kafka_home=tmp_path)


def test_kafka_older_than_4_is_refused(tmp_path: Path) -> None:
    (tmp_path / "libs").mkdir()
    (tmp_path / "libs" / "kafka_2.13-3.9.1.jar").touch()
    (tmp_path / "libs" / "kafka_2.13-3.9.1-test.jar").touch()
    assert kafka_distribution_version(tmp_path) == (3, 9, 1)
    with pytest.raises(
        KafkaClusterError, match=r"is Kafka 3\.9\.1; KafkaCluster needs Kafka >= 4\.0"
    ):
        KafkaCluster(kafka_home=tmp_path)


def test_kafka_server_jar_names_the_version(tmp_path: Path) -> None:
    (tmp_path / "libs").mkdir()
    (tmp_path / "libs" / "kafka-server-4.1.0.jar").touch()
    assert kafka_distribution_version(tmp_path) == (4, 1, 0)


def test_no_java_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KafkaClusterError, match="no Java found"):
        find_java(tmp_path)
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(KafkaClusterError, match="no Java found: set JAVA_HOME"):
        find_java()


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="nodes must be 1 or 3"):
        KafkaCluster(nodes=2)
    with pytest.raises(ValueError, match="heartbeat_interval_ms < session_timeout_ms"):
        KafkaCluster(heartbeat_interval_ms=6000, session_timeout_ms=6000)
    with pytest.raises(ValueError, match="listener name"):
        KafkaCluster(listeners={"PLAINTEXT": "SSL"})
    with pytest.raises(ValueError, match="unknown security protocol"):
        KafkaCluster(listeners={"SECURE": "TLS"})


# -- real JVMs --------------------------------------------------------------------------------

needs_kafka_home = pytest.mark.skipif(
    not os.environ.get("KAFKA_HOME"), reason="KafkaCluster needs KAFKA_HOME (a Kafka 4.x download)"
)


@needs_kafka_home
@pytest.mark.realkafka
def test_a_node_that_does_not_come_up_reports_its_log() -> None:
    before = set(leaked_kafka_jvms())
    keystore = "/nonexistent/keystore.p12"  # formatting passes; the broker's SSL setup fails
    with pytest.raises(KafkaClusterError, match="exited with code") as info:
        KafkaCluster(
            listeners={"SECURE": "SSL"},
            server_properties={"ssl.keystore.location": keystore, "ssl.keystore.password": "x"},
            start_timeout=90,
        )
    assert any(keystore in line for line in info.value.log_tail), info.value.log_tail
    assert keystore in str(info.value)
    assert set(leaked_kafka_jvms()) <= before  # the failed constructor cleaned up


@needs_kafka_home
@pytest.mark.realkafka
def test_close_leaves_no_jvm_even_with_a_paused_node() -> None:
    before = set(leaked_kafka_jvms())
    kafka = KafkaCluster(listeners={"EXTRA": "PLAINTEXT"})
    pids = list(kafka.node_pids().values())
    assert len(pids) == 1 and set(pids) <= set(leaked_kafka_jvms())
    # the extra listener is a real one: a client can use it
    kafka.create_topic("extra-listener", 1)
    assert kafka.bootstrap_for("extra") != kafka.bootstrap_servers
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": kafka.bootstrap_for("EXTRA")}).list_topics(timeout=10)
    assert "extra-listener" in md.topics
    kafka.pause_node(1)  # a SIGSTOPped JVM ignores SIGTERM until continued
    kafka.close(timeout=20)
    kafka.close()  # idempotent
    assert all(_pid_gone(pid) for pid in pids)
    assert set(leaked_kafka_jvms()) <= before
    with pytest.raises(KafkaClusterError, match="closed"):
        kafka.create_topic("after-close", 1)


@needs_kafka_home
@pytest.mark.realkafka
def test_an_unclosed_cluster_fails_the_session_and_is_killed(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from consumer_sdk.testing import KafkaCluster

        LEAK = []

        def test_leak():
            kafka = KafkaCluster()
            LEAK.append(kafka)  # never closed
            print("LEAKED-PIDS", sorted(kafka.node_pids().values()))
        """
    )
    result = pytester.runpytest_subprocess("-s", "-p", "no:cacheprovider")
    output = result.stdout.str()
    assert result.ret == pytest.ExitCode.TESTS_FAILED, output
    assert "were still running at the end of the session" in output, output
    pids = [int(p) for p in re.findall(r"LEAKED-PIDS \[(\d+)\]", output)]
    assert pids, output
    wait_until(lambda: all(_pid_gone(p) for p in pids), timeout=30, description="leaked JVM gone")


# -- data and groups on the shared single node --------------------------------------------------


def test_produce_describe_committed(real_kafka: KafkaCluster) -> None:
    topic, group = f"kc-{uuid.uuid4().hex[:8]}", f"kc-g-{uuid.uuid4().hex[:6]}"
    real_kafka.create_topic(topic, 3)
    with pytest.raises(KafkaClusterError) as info:
        real_kafka.create_topic(topic, 3)
    assert info.value.code == 36  # TOPIC_ALREADY_EXISTS
    assert real_kafka.topics()[topic] == 3
    assert real_kafka.produce(topic, [b"a", "b", (b"k", b"c")], partition=1) == 3
    assert real_kafka.produce(topic, [f"x{i}" for i in range(9)], key="same") == 9
    with pytest.raises(KafkaClusterError, match="no group") as missing:
        real_kafka.describe_group(group)
    assert missing.value.code == 69

    consumer = Consumer(
        {
            "bootstrap.servers": real_kafka.bootstrap_servers,
            "group.id": group,
            "group.instance.id": "static-1",
            "client.rack": "rack-a",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.subscribe([topic])
        seen: list[tuple[int, int]] = []

        def consumed_all() -> bool:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                seen.append((msg.partition(), msg.offset()))
            return len(seen) == 12

        wait_until(consumed_all, timeout=60, description="12 records")
        consumer.commit(asynchronous=False)
        want = {}
        for p in range(3):
            offsets = [o for part, o in seen if part == p]
            if offsets:
                want[(topic, p)] = max(offsets) + 1
        assert real_kafka.committed(group) == want

        described = real_kafka.describe_group(group)
        assert described.state.lower() == "stable"
        assert described.coordinator == real_kafka.coordinator_for(group)
        [member] = described.members
        assert member.member_id == consumer.member_id
        assert member.instance_id == "static-1"
        assert member.rack == "rack-a"
        assert member.member_epoch == consumer.member_epoch == described.group_epoch
        assert member.subscribed_topics == (topic,)
        assert member.partitions == {(topic, p) for p in range(3)}
    finally:
        consumer.close()
    real_kafka.add_partitions(topic, 5)
    assert real_kafka.topics()[topic] == 5
    real_kafka.delete_topic(topic)
    assert topic not in real_kafka.topics()


# -- node faults on three nodes -----------------------------------------------------------------


@needs_kafka_home
def test_node_stop_kill_pause_and_start(real_kafka_cluster: KafkaCluster) -> None:
    kafka = real_kafka_cluster
    assert sorted(kafka.node_pids()) == [1, 2, 3]
    group = f"kc-nodes-{uuid.uuid4().hex[:6]}"
    topic = f"kc-nodes-{uuid.uuid4().hex[:6]}"
    kafka.create_topic(topic, 3)
    assert kafka.produce(topic, [b"before"]) == 1

    committer = confluent_kafka.Consumer(
        {"bootstrap.servers": kafka.bootstrap_servers, "group.id": group}
    )
    try:  # a simple (memberless) commit, so the group has offsets to read back
        committer.commit(offsets=[confluent_kafka.TopicPartition(topic, 0, 1)], asynchronous=False)
    finally:
        committer.close()
    assert kafka.committed(group) == {(topic, 0): 1}

    first = kafka.coordinator_for(group)
    old_pid = kafka.node_pids()[first]
    kafka.stop_node(first)
    # read right after the move, the new coordinator possibly still loading the group
    # (AdminClient's OffsetFetch crashed the process in librdkafka 2.16 around a move)
    assert kafka.committed(group) == {(topic, 0): 1}
    assert _pid_gone(old_pid)
    assert first not in kafka.node_pids()
    # a controlled shutdown hands the coordinator over at once
    moved = kafka.coordinator_for(group)
    assert moved != first and moved in kafka.node_pids()
    assert kafka.produce(topic, [b"one node down"]) == 1
    for fault in (kafka.stop_node, kafka.kill_node, kafka.pause_node, kafka.resume_node):
        with pytest.raises(KafkaClusterError, match=f"node {first} is not running"):
            fault(first)
    kafka.start_node(first)
    assert kafka.node_pids()[first] != old_pid
    with pytest.raises(KafkaClusterError, match="already running"):
        kafka.start_node(first)

    victim = kafka.coordinator_for(group)
    pid = kafka.node_pids()[victim]
    kafka.kill_node(victim)
    assert _pid_gone(pid)
    # a crash moves it once the controller fences the node (broker.session.timeout.ms)
    wait_until(
        lambda: kafka.coordinator_for(group) != victim, timeout=60, description="coordinator moved"
    )
    kafka.start_node(victim)

    paused = kafka.coordinator_for(group)
    kafka.pause_node(paused)
    try:
        stat = Path(f"/proc/{kafka.node_pids()[paused]}/stat")
        wait_until(
            lambda: stat.read_text().rsplit(")", 1)[-1].split()[0] == "T",
            timeout=10,
            description="the paused JVM in state T (stopped)",
        )
    finally:
        kafka.resume_node(paused)
    wait_until(lambda: kafka.topics().get(topic) == 3, timeout=60, description="metadata")
    with pytest.raises(KafkaClusterError, match="no node 7"):
        kafka.stop_node(7)
