"""One local SparkSession for every Spark test (starting one takes 10-20 s)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[4] SparkSession with the kip848 source registered (skips without pyspark)."""
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")
    pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[spark]')")
    from spark_integration.session import local_session

    session = local_session(
        "spark-integration-tests",
        "local[4]",
        **{
            "spark.default.parallelism": "4",
            "spark.sql.streaming.noDataMicroBatches.enabled": "false",
            # collect() hands results over a local socket that the JVM keeps open for this
            # long (15 s by default): on a loaded CI machine the Python side came too late
            "spark.python.authenticate.socketTimeout": "120s",
        },
    )
    try:
        yield session
    finally:
        session.stop()
