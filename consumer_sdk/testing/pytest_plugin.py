"""pytest fixtures for `EmbeddedKafka`.

Registered automatically through the ``pytest11`` entry point
``consumer_sdk_embedded_kafka`` once ``kip848-consumer`` is installed (do not also pass
``-p consumer_sdk.testing.pytest_plugin`` then: pytest would register it twice).

Fixtures:

``embedded_kafka``
    Module-scoped 3-broker cluster with heartbeat interval 500 ms and session timeout
    6000 ms, shared by the tests of one module. Tests should use their own topic and
    group names, and undo broker faults they cause.

``embedded_kafka_factory``
    Function-scoped factory ``factory(**kwargs) -> EmbeddedKafka`` taking the
    `EmbeddedKafka` constructor arguments, for custom or disposable clusters.

``real_kafka``
    Session-scoped single-node real Kafka (heartbeat 500 ms, session timeout 6000 ms): a
    `KafkaCluster` from ``KAFKA_HOME``, else a
    `DockerKafka` container where a Docker engine is reachable,
    else the test is skipped with the reason (also printed in the summary).

``real_kafka_cluster``
    Module-scoped 3-node `KafkaCluster` (needs ``KAFKA_HOME``),
    for tests where a node must stop, die or hang.

``kafka_backend``
    Module-scoped, parametrized ``embedded`` / ``real``: the module's ``embedded_kafka`` or
    the session's ``real_kafka``, for tests that need no mock-only fault.

All clusters are closed at teardown. If a child process died unexpectedly (not through
``kill()``), teardown fails with its exit status and last stderr lines. At the end of the
session, any KafkaCluster JVM still alive is killed and fails the run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from consumer_sdk.testing._embedded import EmbeddedKafka
from consumer_sdk.testing._jvm import leaked_kafka_jvms, terminate_registered
from consumer_sdk.testing.docker_kafka import DockerKafka, docker_unavailable_reason
from consumer_sdk.testing.kafka_cluster import KafkaCluster

REAL_FIXTURES = frozenset({"real_kafka", "real_kafka_cluster"})
_real_skip_reasons: set[str] = set()


def _close_all(clusters: list[EmbeddedKafka]) -> None:
    errors = [error for kafka in clusters if (error := kafka.death_error()) is not None]
    for kafka in clusters:
        kafka.close()
    if errors:
        pytest.fail(
            "EmbeddedKafka child process died during the test(s):\n"
            + "\n\n".join(str(e) for e in errors),
            pytrace=False,
        )


@pytest.fixture(scope="module")
def embedded_kafka() -> Iterator[EmbeddedKafka]:
    """A shared 3-broker EmbeddedKafka (heartbeat 500 ms, session timeout 6000 ms)."""
    kafka = EmbeddedKafka(brokers=3, heartbeat_interval_ms=500, session_timeout_ms=6000)
    try:
        yield kafka
    finally:
        _close_all([kafka])


@pytest.fixture
def embedded_kafka_factory() -> Iterator[Callable[..., EmbeddedKafka]]:
    """A factory of EmbeddedKafka clusters (constructor kwargs), closed at teardown."""
    clusters: list[EmbeddedKafka] = []

    def factory(**kwargs: Any) -> EmbeddedKafka:
        kafka = EmbeddedKafka(**kwargs)
        clusters.append(kafka)
        return kafka

    try:
        yield factory
    finally:
        _close_all(clusters)


def _real_backend() -> str:
    """``"kafka_home"`` or ``"docker"``; skips (with the reason) when neither is available."""
    if os.environ.get("KAFKA_HOME"):
        return "kafka_home"  # a broken KAFKA_HOME is an error from KafkaCluster, not a skip
    reason = docker_unavailable_reason()
    if reason is None:
        return "docker"
    _skip_real(
        "real-Kafka tier skipped: KAFKA_HOME is not set (point it at an Apache Kafka 4.x "
        f"distribution) and Docker is unavailable: {reason}"
    )
    raise AssertionError("unreachable")


def _skip_real(reason: str) -> None:
    _real_skip_reasons.add(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def real_kafka() -> Iterator[KafkaCluster | DockerKafka]:
    """A session-wide single-node real Kafka (heartbeat 500 ms, session timeout 6000 ms)."""
    kafka: KafkaCluster | DockerKafka
    if _real_backend() == "kafka_home":
        kafka = KafkaCluster(nodes=1, heartbeat_interval_ms=500, session_timeout_ms=6000)
    else:
        kafka = DockerKafka(heartbeat_interval_ms=500, session_timeout_ms=6000)
    try:
        yield kafka
    finally:
        kafka.close()


@pytest.fixture(scope="module")
def real_kafka_cluster() -> Iterator[KafkaCluster]:
    """A module-wide 3-node real Kafka (needs KAFKA_HOME) for node stop/kill/pause tests."""
    if _real_backend() != "kafka_home":
        _skip_real("a 3-node real Kafka needs KAFKA_HOME (the Docker backend runs one node)")
    kafka = KafkaCluster(nodes=3, heartbeat_interval_ms=500, session_timeout_ms=6000)
    try:
        yield kafka
    finally:
        kafka.close()


@pytest.fixture(scope="module", params=["embedded", "real"])
def kafka_backend(request: pytest.FixtureRequest) -> Any:
    """The module's ``embedded_kafka`` or the session's ``real_kafka`` (parametrized)."""
    name = "embedded_kafka" if request.param == "embedded" else "real_kafka"
    return request.getfixturevalue(name)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "realkafka: runs against a real Kafka broker (KAFKA_HOME or Docker)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        real_param = callspec is not None and callspec.params.get("kafka_backend") == "real"
        if names & REAL_FIXTURES or real_param:
            item.add_marker(pytest.mark.realkafka)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Fail the run loudly if a KafkaCluster JVM outlived the tests (after killing it)."""
    leaked = leaked_kafka_jvms()
    if not leaked:
        return
    import signal

    for pid in leaked:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    terminate_registered(5.0)
    message = (
        f"KafkaCluster JVM(s) {leaked} were still running at the end of the session "
        "(a cluster was not closed): killed them"
    )
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(message, red=True, bold=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    for reason in sorted(_real_skip_reasons):
        terminalreporter.write_line(reason, yellow=True)
