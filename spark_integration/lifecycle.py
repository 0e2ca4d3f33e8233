"""One `GroupReader` per stream reader in the stream-reader process, and a clean exit.

Spark stops the stream-reader process with SIGTERM and calls ``stop()`` only sometimes:
the SIGTERM handler and an ``atexit`` hook close every reader (its member commits what is
durable and leaves the group) before the process ends.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable
from types import FrameType

from spark_integration.driver import GroupReader
from spark_integration.options import SourceOptions

__all__ = ["close_all_readers", "close_reader", "reader_for"]

log = logging.getLogger("spark_integration")

_EXIT_WATCHDOG_S = 20.0

_registry: dict[str, GroupReader] = {}
_registry_lock = threading.RLock()
_handlers_installed = False


def reader_for(reader_id: str, options: SourceOptions) -> GroupReader:
    """The process's ``GroupReader`` for a stream reader id (created on first use)."""
    with _registry_lock:
        reader = _registry.get(reader_id)
        if reader is None:
            reader = GroupReader(options)
            _registry[reader_id] = reader
            _install_exit_handlers()
        return reader


def close_reader(reader_id: str) -> None:
    with _registry_lock:
        reader = _registry.pop(reader_id, None)
    if reader is not None:
        reader.close()


def close_all_readers() -> None:
    """Close every reader of this process: each member leaves its group."""
    with _registry_lock:
        readers = list(_registry.values())
        _registry.clear()
    for reader in readers:
        with contextlib.suppress(Exception):
            reader.close()


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    # Spark stops the stream-reader process with SIGTERM and rarely calls stop(). Unwind
    # instead of closing here (the signal may arrive inside the member's own poll): the
    # runner's ``finally: reader.stop()`` and atexit then leave the group. Repeated signals
    # are ignored, and a watchdog ends the process if the clean exit hangs.
    global _terminating
    if _terminating:
        return
    _terminating = True
    log.info("kip848: SIGTERM: leaving the group")
    watchdog = threading.Timer(_EXIT_WATCHDOG_S, os._exit, args=(128 + signum,))
    watchdog.daemon = True
    watchdog.start()
    if callable(_previous_sigterm):
        _previous_sigterm(signum, frame)
    raise SystemExit(128 + signum)


_previous_sigterm: Callable[[int, FrameType | None], object] | None = None
_terminating = False


def _install_exit_handlers() -> None:
    global _handlers_installed, _previous_sigterm
    if _handlers_installed:
        return
    _handlers_installed = True
    atexit.register(close_all_readers)
    if threading.current_thread() is threading.main_thread():
        try:
            previous = signal.getsignal(signal.SIGTERM)
            _previous_sigterm = previous if callable(previous) else None
            signal.signal(signal.SIGTERM, _on_sigterm)
        except (ValueError, OSError) as exc:
            log.debug("kip848: no SIGTERM handler: %s", exc)
