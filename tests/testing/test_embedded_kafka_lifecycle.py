"""EmbeddedKafka child-process lifecycle: start, close, death, failure to start, plugin."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from consumer_sdk.testing import EmbeddedKafka, EmbeddedKafkaError, wait_until

from .kafka_wire import api_versions, consumer_group_heartbeat_v1, send_without_answer

Factory = Callable[..., EmbeddedKafka]


def _process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _abort_child(kafka: EmbeddedKafka) -> None:
    """MemberEpoch -3 trips an rd_assert in the mock's heartbeat handler: SIGABRT."""
    request = consumer_group_heartbeat_v1("g-abort", "member-1", member_epoch=-3)
    send_without_answer(kafka.broker_address(1), request)
    wait_until(lambda: not kafka.alive, timeout=10.0, description="child abort")


def test_start_and_close_leave_no_process(embedded_kafka_factory: Factory) -> None:
    kafka = embedded_kafka_factory(brokers=1)
    pid = kafka.pid
    assert kafka.alive and not _process_gone(pid)
    assert len(kafka.bootstrap_servers.split(",")) == 1

    started = time.monotonic()
    kafka.close()
    assert time.monotonic() - started < 5.0
    assert _process_gone(pid)
    assert not kafka.alive and kafka.closed
    kafka.close()  # idempotent
    with pytest.raises(EmbeddedKafkaError, match="closed"):
        kafka.create_topic("t")


def test_context_manager_closes() -> None:
    with EmbeddedKafka(brokers=2) as kafka:
        pid = kafka.pid
        assert api_versions(kafka.broker_address(2))[0] == 0
    assert _process_gone(pid)


def test_finalizer_stops_an_unclosed_cluster() -> None:
    kafka = EmbeddedKafka(brokers=1)
    pid = kafka.pid
    del kafka
    gc.collect()
    assert _process_gone(pid)


def test_killed_child_makes_every_call_raise(embedded_kafka_factory: Factory) -> None:
    kafka = embedded_kafka_factory(brokers=1)
    pid = kafka.pid
    kafka.kill()
    assert not kafka.alive
    for _ in range(2):
        with pytest.raises(EmbeddedKafkaError, match="SIGKILL") as excinfo:
            kafka.topics()
        assert excinfo.value.returncode == -9
        assert str(pid) in str(excinfo.value)
    assert kafka.death_error() is None  # killed on purpose: not reported by the plugin
    started = time.monotonic()
    kafka.close()
    assert time.monotonic() - started < 5.0
    assert _process_gone(pid)


def test_aborted_child_reports_signal_and_stderr(embedded_kafka_factory: Factory) -> None:
    kafka = embedded_kafka_factory(brokers=1)
    _abort_child(kafka)
    with pytest.raises(EmbeddedKafkaError, match="SIGABRT") as excinfo:
        kafka.create_topic("after-abort")
    error = excinfo.value
    assert error.returncode == -6
    assert any("MemberEpoch" in line for line in error.stderr_tail), error.stderr_tail
    assert "MemberEpoch" in str(error)
    unexpected = kafka.death_error()
    assert unexpected is not None and unexpected.returncode == -6
    kafka.close()  # closed before teardown, so the fixture does not fail this test


def test_failure_to_start_is_reported() -> None:
    started = time.monotonic()
    with pytest.raises(EmbeddedKafkaError, match="librdkafka not found at '/nonexistent"):
        EmbeddedKafka(librdkafka_path="/nonexistent/librdkafka.so.1")
    assert time.monotonic() - started < 10.0


def test_debug_output_reaches_stderr_tail(embedded_kafka_factory: Factory) -> None:
    kafka = embedded_kafka_factory(brokers=1, debug="mock")
    assert api_versions(kafka.broker_address(1))[0] == 0
    wait_until(
        lambda: any("ApiVersion" in line for line in kafka.stderr_tail),
        timeout=5.0,
        description="mock debug line",
    )


def test_produce_fails_when_no_broker_is_up(embedded_kafka_factory: Factory) -> None:
    kafka = embedded_kafka_factory(brokers=1)
    kafka.create_topic("t", partitions=1)
    kafka.broker_down(-1)
    with pytest.raises(EmbeddedKafkaError, match="0 of 1 delivered"):
        kafka.produce("t", [b"x"], partition=0, timeout=1.0)
    kafka.broker_up(-1)
    assert kafka.produce("t", [b"x"], partition=0) == 1


PLUGIN_TEST = """
    from consumer_sdk.testing import EmbeddedKafka


    def test_shared(embedded_kafka: EmbeddedKafka) -> None:
        assert embedded_kafka.broker_count == 3
        embedded_kafka.create_topic("plugin-topic", partitions=2)


    def test_factory_and_unexpected_death(embedded_kafka_factory) -> None:
        kafka = embedded_kafka_factory(brokers=1)
        kafka._child.proc.kill()  # not via kill(): an unexpected death
        kafka._child.proc.wait()
"""

PLUGIN_CONFTEST = (Path(__file__).with_name("conftest.py")).read_text()


def test_pytest_plugin_fixtures(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(PLUGIN_CONFTEST)
    (tmp_path / "test_plugin_use.py").write_text(textwrap.dedent(PLUGIN_TEST))
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    output = result.stdout + result.stderr
    # Plugins may add warnings to the summary line ("2 passed, 1 warning, 1 error").
    assert re.search(r"\b2 passed\b.*\b1 error\b", output), output
    assert "EmbeddedKafka child process died" in output
    assert "SIGKILL" in output


def test_child_exits_when_the_parent_is_killed(tmp_path: Path) -> None:
    script = tmp_path / "parent.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys, time
            from consumer_sdk.testing import EmbeddedKafka
            kafka = EmbeddedKafka(brokers=1)
            print(kafka.pid, flush=True)
            time.sleep(60)
            """
        )
    )
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    with subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env
    ) as parent:
        try:
            assert parent.stdout is not None
            child_pid = int(parent.stdout.readline())
            assert not _process_gone(child_pid)
        finally:
            parent.kill()
            parent.wait(timeout=10)
    # The child sees EOF on its command pipe and exits (it is not our child: poll /proc).
    wait_until(
        lambda: not os.path.exists(f"/proc/{child_pid}") or _zombie(child_pid),
        timeout=10.0,
        description="orphaned child exit",
    )


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
