"""One local SparkSession for every Spark test (starting one takes 10-20 s)."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _java_home() -> str | None:
    java = shutil.which("java")
    if java is None:
        return None
    return str(Path(os.path.realpath(java)).parent.parent)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local[4] SparkSession with the kip848 source registered (skips without pyspark)."""
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")
    pytest.importorskip("pyarrow", reason="pyarrow is not installed (pip install -e '.[spark]')")
    java_home = _java_home()
    if java_home is not None:
        os.environ.setdefault("JAVA_HOME", java_home)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import spark_integration

    session = (
        SparkSession.builder.master("local[4]")
        .appName("spark-integration-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "4")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    spark_integration.register(session)
    try:
        yield session
    finally:
        session.stop()
