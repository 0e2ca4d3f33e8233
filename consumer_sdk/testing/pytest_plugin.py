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

All clusters are closed at teardown. If a child process died unexpectedly (not through
``kill()``), teardown fails with its exit status and last stderr lines.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from consumer_sdk.testing._embedded import EmbeddedKafka


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
