"""Reading the query's commit log: which batches Spark made durable.

Spark tells a Python source that a batch is in the sink only when it plans the next one
(``latestOffset(start)``, ``commit(end)`` one batch late). After a query's last batch
(``Trigger.Once``, a stop between triggers) no such call comes. With the source option
``checkpointLocation`` (the same path as the query's), the stream-reader process reads
``<checkpoint>/commits/N`` and ``offsets/N`` itself: the batch whose commit-log entry
exists is durable. The stream reader runs on the driver's host, so this works for
Spark Connect clients on other hosts too. Paths are local, ``file:`` URIs, or any URI
``pyarrow.fs`` opens (``s3://``, ``hdfs://``, ``gs://``).
"""

from __future__ import annotations

import json
import logging
from typing import Any

__all__ = ["CommitLog"]

log = logging.getLogger("spark_integration")


class CommitLog:
    """The latest committed batch of a streaming checkpoint, and its source offsets."""

    def __init__(self, location: str) -> None:
        from pyarrow import fs

        if "://" in location:
            self._fs, root = fs.FileSystem.from_uri(location)
        else:
            self._fs, root = fs.LocalFileSystem(), location.removeprefix("file:")
        self._root = root.rstrip("/")

    def latest_committed(self) -> int | None:
        """The highest batch id with a commit-log entry (None before the first)."""
        from pyarrow import fs

        try:
            infos = self._fs.get_file_info(fs.FileSelector(f"{self._root}/commits"))
        except (FileNotFoundError, OSError):
            return None
        ids = [int(i.base_name) for i in infos if i.base_name.isdigit()]
        return max(ids) if ids else None

    def source_offsets(self, batch: int) -> list[dict[str, Any]]:
        """Every source's end offset of ``batch`` from the offset log (JSON objects only)."""
        try:
            with self._fs.open_input_stream(f"{self._root}/offsets/{batch}") as f:
                text = f.read().decode("utf-8")
        except (FileNotFoundError, OSError) as exc:
            log.info("kip848: cannot read offsets/%d of the checkpoint: %s", batch, exc)
            return []
        out = []
        # "v1", the batch metadata, then one line per source ("-" for none).
        for line in text.splitlines()[2:]:
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                out.append(value)
        return out
