"""A small local SparkSession for examples, benchmarks and tests."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any


def local_session(app_name: str, master: str = "local[2]", **conf: str) -> Any:
    """A local SparkSession bound to 127.0.0.1 with the ``kip848`` source registered.

    Sets ``JAVA_HOME`` from the default ``java`` (when unset; machines may have several
    JDKs), ``SPARK_LOCAL_IP`` and the worker Python. ``conf`` adds Spark settings, with
    ``_`` standing for ``.`` in keys given as keyword arguments (``spark_sql_x="1"``) or
    passed as a dict with dotted keys (``**{"spark.sql.x": "1"}``).
    """
    java = shutil.which("java")
    if java is not None:
        os.environ.setdefault("JAVA_HOME", str(Path(os.path.realpath(java)).parent.parent))
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import spark_integration

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.bindAddress", "127.0.0.1")
    )
    for key, value in conf.items():
        builder = builder.config(key if "." in key else key.replace("_", "."), value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    spark_integration.register(session)
    return session
