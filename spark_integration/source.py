"""The ``kip848`` streaming source on pyspark's Python Data Source API (pyspark >= 4.2).

Spark creates two reader instances: one in the long-lived stream-reader process, which
calls the offset methods (it owns the ``GroupMember`` through
`spark_integration.lifecycle.reader_for`), and one that is pickled to executors for
`Kip848StreamReader.read`. Neither creates anything in ``__init__``; the executor
copy carries only the parsed options and an id.
"""

from __future__ import annotations

import logging
import sys
import uuid
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from spark_integration.executor import HEADERS_DDL, KAFKA_SCHEMA_DDL, ReadTask, read_range
from spark_integration.offsets import OffsetRange, pack_tasks
from spark_integration.options import SourceOptions

if TYPE_CHECKING:
    from spark_integration.driver import GroupReader

__all__ = [
    "Kip848BatchReader",
    "Kip848DataSource",
    "Kip848Partition",
    "Kip848StreamReader",
]

log = logging.getLogger("spark_integration")

#: The module pyspark runs as the stream-reader process (``spark_integration.driver`` has
#: the same; this module must not import it: executors unpickle readers through it).
_STREAM_READER_MAIN = "pyspark.sql.streaming.python_streaming_source_runner"


def _in_stream_reader_process() -> bool:
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(main, "name", None) == _STREAM_READER_MAIN


class Kip848Partition(InputPartition):  # type: ignore[misc,unused-ignore]
    """One Spark task: a `ReadTask`."""

    def __init__(self, task: ReadTask) -> None:
        super().__init__(task)


def _tasks(options: SourceOptions, ranges: Sequence[OffsetRange]) -> list[Kip848Partition]:
    """Ranges packed into Spark tasks of up to ``rowsPerTask`` records."""
    config = options.fetch_config("executor")
    return [
        Kip848Partition(
            ReadTask.make(
                group,
                config,
                include_headers=options.include_headers,
                fail_on_data_loss=options.fail_on_data_loss,
                poll_timeout_ms=options.poll_timeout_ms,
                arrow_batch_size=options.arrow_batch_size,
            )
        )
        for group in pack_tasks(ranges, options.rows_per_task)
    ]


class Kip848DataSource(DataSource):  # type: ignore[misc,unused-ignore]
    """``format("kip848")``: a KIP-848 consumer-group member as a streaming source, and
    batch reads of offset ranges (``spark.read``)."""

    @classmethod
    def name(cls) -> str:
        return "kip848"

    def schema(self) -> str:
        # load() does not say whether a stream or a batch follows: options valid for
        # neither fail here; the mode's own checks run when the reader is created.
        try:
            opts = SourceOptions.parse(self.options)
        except ValueError as streaming_error:
            try:
                opts = SourceOptions.parse(self.options, batch=True)
            except ValueError as batch_error:
                if str(batch_error) == str(streaming_error):
                    raise
                raise ValueError(
                    f"{streaming_error} (as a streaming query); {batch_error} (as a batch query)"
                ) from None
        return KAFKA_SCHEMA_DDL + (", " + HEADERS_DDL if opts.include_headers else "")

    def streamReader(self, schema: StructType) -> Kip848StreamReader:
        return Kip848StreamReader(SourceOptions.parse(self.options))

    def reader(self, schema: StructType) -> Kip848BatchReader:
        return Kip848BatchReader(SourceOptions.parse(self.options, batch=True))


class Kip848StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc,unused-ignore]
    """Delegates the offset protocol to the process's ``GroupReader``; reads on executors."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self.reader_id = uuid.uuid4().hex
        if options.membership and _in_stream_reader_process():
            # Spark constructs this reader some calls before the first that needs the group
            # member: the member starts joining now (the planner's and executors' copies
            # create nothing).
            from spark_integration.lifecycle import reader_for

            reader_for(self.reader_id, options).start()

    def _driver(self) -> GroupReader:
        from spark_integration.lifecycle import reader_for  # not on executors: no consumer_sdk

        return reader_for(self.reader_id, self.options)

    def initialOffset(self) -> dict[str, Any]:
        return self._driver().initial_offset()

    def getDefaultReadLimit(self) -> ReadLimit:
        o = self.options
        if o.max_offsets_per_trigger:
            return ReadMaxRows(o.max_offsets_per_trigger)
        if o.min_offsets_per_trigger:
            return ReadMinRows(o.min_offsets_per_trigger)
        return ReadAllAvailable()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        # Spark passes ReadAllAvailable for Trigger.Once / AvailableNow whatever the default.
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        min_rows = 0
        if isinstance(limit, ReadMinRows):
            min_rows = limit.min_rows
        elif isinstance(limit, ReadMaxRows):
            min_rows = self.options.min_offsets_per_trigger or 0
        return self._driver().latest_offset(
            start,
            max_rows=max_rows,
            min_rows=min_rows,
            all_available=isinstance(limit, ReadAllAvailable),
        )

    def reportLatestOffset(self) -> dict[str, Any] | None:
        return self._driver().report_latest_offset()

    def prepareForTriggerAvailableNow(self) -> None:
        self._driver().prepare_for_trigger_available_now()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        return _tasks(self.options, self._driver().plan(start, end))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        task: ReadTask = partition.value
        return read_range(task)

    def commit(self, end: dict[str, Any]) -> None:
        self._driver().commit(end)

    def stop(self) -> None:
        from spark_integration.lifecycle import close_reader

        close_reader(self.reader_id)


def _start_member_import() -> None:
    from spark_integration.driver import start_member_import

    start_member_import()


if _in_stream_reader_process():
    # Spark's stream-reader process imports this module when it unpickles the source, some
    # calls before it constructs the reader: start importing consumer_sdk now.
    _start_member_import()


class Kip848BatchReader(DataSourceReader):  # type: ignore[misc,unused-ignore]
    """``spark.read.format("kip848")``: the records between starting and ending offsets.

    No group membership: the partitions come from ``subscribe`` / ``subscribePattern``
    (topics existing now) or ``assign``, and the ranges are resolved once when Spark plans
    the query (on the driver); executors read them like streaming batches.
    """

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        from spark_integration.batch import plan_batch  # driver only: no consumer_sdk on executors

        return _tasks(self.options, plan_batch(self.options)) or [
            Kip848Partition(
                ReadTask.make(
                    (),
                    {},
                    include_headers=self.options.include_headers,
                    fail_on_data_loss=True,
                    poll_timeout_ms=1,
                    arrow_batch_size=1,
                )
            )
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        task: ReadTask = partition.value
        return read_range(task)
