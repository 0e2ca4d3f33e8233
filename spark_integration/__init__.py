"""PySpark integration: a KIP-848 group-member streaming source and executor members.

* ``register(spark)`` adds the ``kip848`` streaming source (pyspark >= 4.2):

      spark_integration.register(spark)
      df = (spark.readStream.format("kip848")
            .option("kafka.bootstrap.servers", servers).option("group.id", "orders-etl")
            .option("subscribe", "orders").load())

* ``run_group_members(spark, config, topics, process_batch, members=N)`` runs N
  ``consumer_sdk.Consumer`` members as long-running Spark tasks, each restarted with
  backoff when it dies.

See docs/spark.md.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import TYPE_CHECKING, Any

from spark_integration.offsets import DataLossError, OffsetRange, SourceOffset
from spark_integration.options import SourceOptions

if TYPE_CHECKING:
    from spark_integration.members import GroupMembersJob, MemberReport


def _require_spark_extra() -> None:
    # find_spec, not import: executors unpickle through this package and must stay light.
    missing = []
    for module in ("pyspark", "pyarrow"):
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(module)
    if missing:
        raise ImportError(
            f"spark_integration needs {' and '.join(missing)}: install the [spark] extra "
            "(pip install 'kip848-consumer[spark]')",
            name=missing[0],
        )


_require_spark_extra()

# Executors import this package to unpickle the reader: keep consumer_sdk and
# pyspark out of its import path.

__all__ = [
    "FORMAT",
    "DataLossError",
    "GroupMembersJob",
    "MemberReport",
    "OffsetRange",
    "SourceOffset",
    "SourceOptions",
    "kafka_schema",
    "register",
    "run_group_members",
]

logging.getLogger("spark_integration").addHandler(logging.NullHandler())

#: The format name of the streaming source.
FORMAT = "kip848"


def register(spark: Any) -> None:
    """Register the ``kip848`` source with a SparkSession (pyspark >= 4.2), also a Spark
    Connect session."""
    from spark_integration.source import Kip848DataSource

    spark.dataSource.register(Kip848DataSource)


def kafka_schema(include_headers: bool = False) -> str:
    """The source's output schema as DDL, identical to Spark's Kafka source."""
    from spark_integration.executor import HEADERS_DDL, KAFKA_SCHEMA_DDL

    return KAFKA_SCHEMA_DDL + (", " + HEADERS_DDL if include_headers else "")


def run_group_members(*args: Any, **kwargs: Any) -> GroupMembersJob:
    """Run N long-lived ``consumer_sdk.Consumer`` group members as supervised Spark tasks.

    See `spark_integration.members.run_group_members`.
    """
    from spark_integration.members import run_group_members as run

    return run(*args, **kwargs)


def __getattr__(name: str) -> Any:
    if name in ("GroupMembersJob", "MemberReport"):
        from spark_integration import members

        return getattr(members, name)
    raise AttributeError(f"module 'spark_integration' has no attribute {name!r}")
