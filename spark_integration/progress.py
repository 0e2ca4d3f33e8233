"""Batches reported durable by Spark, passed from the driver to the stream-reader process.

Spark tells a source that a batch is in the sink only when it plans the next one
(``latestOffset`` / ``commit``), so the last batch of ``Trigger.Once`` would never be
committed to Kafka. A ``StreamingQueryListener`` on the driver (added by
``spark_integration.register``) sees each batch's end offset right after Spark wrote it to
the commit log, and writes it to a small file named after the member id in the offset; the
stream-reader process (on the driver's host) watches that file and commits the offsets.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

__all__ = ["channel", "forget", "listener_active", "publish", "read", "register_listener_pid"]


def channel() -> Path:
    """The directory shared by the driver and its stream-reader processes (one host)."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    path = Path(os.environ.get("KIP848_PROGRESS_DIR") or tempfile.gettempdir()) / (
        f"kip848-progress-{uid}"
    )
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def _safe(member_id: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in member_id) or "none"


def publish(end_offset: str | dict[str, Any]) -> str | None:
    """Record a durable batch end (offset JSON); returns the member id it was routed to."""
    data = json.loads(end_offset) if isinstance(end_offset, str) else end_offset
    if not isinstance(data, dict):
        return None
    meta = data.get("@meta")
    if not isinstance(meta, dict) or not meta.get("member"):
        return None
    member = str(meta["member"])
    target = channel() / f"{_safe(member)}.json"
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(target)
    return member


def read(member_id: str) -> str | None:
    """The last durable batch end published for ``member_id``."""
    try:
        return (channel() / f"{_safe(member_id)}.json").read_text()
    except OSError:
        return None


def forget(member_id: str) -> None:
    with contextlib.suppress(OSError):
        (channel() / f"{_safe(member_id)}.json").unlink()


def register_listener_pid(pid: int | None = None) -> Path:
    """Mark a driver process as running the progress listener."""
    marker = channel() / f"listener-{pid or os.getpid()}"
    marker.touch()
    return marker


def listener_active() -> bool:
    """Whether a live driver process on this host runs the progress listener."""
    for marker in channel().glob("listener-*"):
        try:
            pid = int(marker.name.split("-", 1)[1])
            os.kill(pid, 0)
        except (ValueError, ProcessLookupError):
            with contextlib.suppress(OSError):
                marker.unlink()
            continue
        except PermissionError:
            pass
        return True
    return False
