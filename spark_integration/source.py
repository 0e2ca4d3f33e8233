"""The ``kip848`` streaming source on pyspark's Python Data Source API (pyspark >= 4.2).

Spark creates two reader instances: one in the long-lived stream-reader process, which
calls the offset methods (it owns the ``GroupMember`` through
`spark_integration.driver.reader_for`), and one that is pickled to executors for
`Kip848StreamReader.read`. Neither creates anything in ``__init__``; the executor
copy carries only the parsed options and an id.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from spark_integration.executor import HEADERS_DDL, KAFKA_SCHEMA_DDL, ReadTask, read_range
from spark_integration.options import SourceOptions

if TYPE_CHECKING:
    from spark_integration.driver import GroupReader

__all__ = ["Kip848DataSource", "Kip848Partition", "Kip848StreamReader"]


class Kip848Partition(InputPartition):  # type: ignore[misc,unused-ignore]
    """One Spark task: a `ReadTask`."""

    def __init__(self, task: ReadTask) -> None:
        super().__init__(task)


class Kip848DataSource(DataSource):  # type: ignore[misc,unused-ignore]
    """``spark.readStream.format("kip848")``: a KIP-848 consumer-group member as a source."""

    @classmethod
    def name(cls) -> str:
        return "kip848"

    def schema(self) -> str:
        opts = SourceOptions.parse(self.options)
        return KAFKA_SCHEMA_DDL + (", " + HEADERS_DDL if opts.include_headers else "")

    def streamReader(self, schema: StructType) -> Kip848StreamReader:
        return Kip848StreamReader(SourceOptions.parse(self.options))


class Kip848StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc,unused-ignore]
    """Delegates the offset protocol to the process's ``GroupReader``; reads on executors."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.reader_id = uuid.uuid4().hex

    def _driver(self) -> GroupReader:
        from spark_integration.driver import reader_for  # not on executors: no consumer_sdk

        return reader_for(self.reader_id, self.options)

    def initialOffset(self) -> dict[str, Any]:
        return self._driver().initial_offset()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        min_rows = limit.min_rows if isinstance(limit, ReadMinRows) else 0
        return self._driver().latest_offset(start, max_rows=max_rows, min_rows=min_rows)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._driver().report_latest_offset()

    def prepareForTriggerAvailableNow(self) -> None:
        self._driver().prepare_for_trigger_available_now()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        o = self.options
        config = o.fetch_config("executor")
        return [
            Kip848Partition(
                ReadTask.make(
                    r,
                    config,
                    include_headers=o.include_headers,
                    fail_on_data_loss=o.fail_on_data_loss,
                    poll_timeout_ms=o.poll_timeout_ms,
                    arrow_batch_size=o.arrow_batch_size,
                )
            )
            for r in self._driver().plan(start, end)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        task: ReadTask = partition.value
        return read_range(task)

    def commit(self, end: dict[str, Any]) -> None:
        self._driver().commit(end)

    def stop(self) -> None:
        from spark_integration.driver import close_reader

        close_reader(self.reader_id)
