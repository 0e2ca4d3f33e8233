"""The one ctypes edge of the runtime: librdkafka's consumer group metadata serialization,
waking a thread blocked in a ``confluent_kafka.Consumer``'s poll/consume, and the consumer
queue's IO event (a byte written to a file descriptor when records arrive; asyncio's
``add_reader`` waits on it).

``confluent_kafka.Producer.send_offsets_to_transaction`` takes the group metadata as the
bytes that ``rd_kafka_consumer_group_metadata_write`` produces (confluent-kafka-python turns
them back into an ``rd_kafka_consumer_group_metadata_t`` with ``..._read``). The SDK's
membership lives in Python, so it builds that object with librdkafka's own
``rd_kafka_consumer_group_metadata_new_with_genid`` and serializes it with ``..._write``,
calling the librdkafka that the confluent-kafka wheel bundles (the one its binding uses),
so the format always matches the reader.
"""

from __future__ import annotations

import ctypes
import glob
import os
import threading
from dataclasses import dataclass
from typing import Any

import confluent_kafka

__all__ = [
    "GroupMetadata",
    "LibrdkafkaError",
    "QueueWaker",
    "consumer_queue_io_event",
    "consumer_queue_waker",
    "read_group_metadata",
    "write_group_metadata",
]

_c_void_p = ctypes.c_void_p
_c_char_p = ctypes.c_char_p

# name -> (restype, argtypes). Pointers are c_void_p: the default int restype would truncate.
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "rd_kafka_consumer_group_metadata_new_with_genid": (
        _c_void_p,
        [_c_char_p, ctypes.c_int32, _c_char_p, _c_char_p],
    ),
    "rd_kafka_consumer_group_metadata_write": (
        _c_void_p,
        [_c_void_p, ctypes.POINTER(_c_void_p), ctypes.POINTER(ctypes.c_size_t)],
    ),
    "rd_kafka_consumer_group_metadata_read": (
        _c_void_p,
        [ctypes.POINTER(_c_void_p), _c_char_p, ctypes.c_size_t],
    ),
    "rd_kafka_consumer_group_metadata_group_id": (_c_char_p, [_c_void_p]),
    "rd_kafka_consumer_group_metadata_member_id": (_c_char_p, [_c_void_p]),
    "rd_kafka_consumer_group_metadata_group_instance_id": (_c_char_p, [_c_void_p]),
    "rd_kafka_consumer_group_metadata_generation_id": (ctypes.c_int32, [_c_void_p]),
    "rd_kafka_consumer_group_metadata_destroy": (None, [_c_void_p]),
    "rd_kafka_error_string": (_c_char_p, [_c_void_p]),
    "rd_kafka_error_destroy": (None, [_c_void_p]),
    "rd_kafka_mem_free": (None, [_c_void_p, _c_void_p]),
    "rd_kafka_name": (_c_char_p, [_c_void_p]),
    "rd_kafka_type": (ctypes.c_int, [_c_void_p]),
    "rd_kafka_queue_get_consumer": (_c_void_p, [_c_void_p]),
    "rd_kafka_queue_yield": (None, [_c_void_p]),
    "rd_kafka_queue_destroy": (None, [_c_void_p]),
    "rd_kafka_queue_io_event_enable": (None, [_c_void_p, ctypes.c_int, _c_void_p, ctypes.c_size_t]),
    "rd_kafka_queue_length": (ctypes.c_size_t, [_c_void_p]),
}

_RD_KAFKA_CONSUMER = 1

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


class LibrdkafkaError(RuntimeError):
    """librdkafka could not be loaded, lacks a symbol, or reported an error."""


@dataclass(frozen=True, slots=True)
class GroupMetadata:
    """The fields of a serialized ``rd_kafka_consumer_group_metadata_t``."""

    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str | None


def _library_path() -> str:
    # The image the binding already mapped (confluent_kafka.cimpl links it), else the wheel's.
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if "librdkafka" in os.path.basename(path) and os.path.isfile(path):
                    return path
    except OSError:
        pass
    package_dir = os.path.dirname(os.path.abspath(confluent_kafka.__file__))
    patterns = [
        os.path.join(os.path.dirname(package_dir), "confluent_kafka.libs", "librdkafka*.so*"),
        os.path.join(package_dir, ".dylibs", "librdkafka*.dylib"),
        os.path.join(os.path.dirname(package_dir), "confluent_kafka.libs", "librdkafka*.dll"),
    ]
    found = sorted(path for pattern in patterns for path in glob.glob(pattern))
    if not found:
        raise LibrdkafkaError(
            f"cannot find the librdkafka bundled with confluent_kafka "
            f"{confluent_kafka.__version__} (nothing matches {' or '.join(patterns)})"
        )
    return found[0]


def _library() -> ctypes.CDLL:
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = _library_path()
        try:
            lib = ctypes.CDLL(path)
        except OSError as exc:
            raise LibrdkafkaError(f"cannot load librdkafka from {path}: {exc}") from None
        missing = []
        for name, (restype, argtypes) in _SIGNATURES.items():
            fn = getattr(lib, name, None)
            if fn is None:
                missing.append(name)
                continue
            fn.restype = restype
            fn.argtypes = argtypes
        if missing:
            raise LibrdkafkaError(
                f"librdkafka at {path} (confluent-kafka {confluent_kafka.__version__}) lacks "
                f"{', '.join(missing)} (consumer_group_metadata() and the wake-up of a blocked "
                "poll need them; librdkafka >= 1.6 has all)"
            )
        _lib = lib
        return lib


def _raise_error(lib: ctypes.CDLL, error: int, what: str) -> None:
    message = (lib.rd_kafka_error_string(error) or b"").decode(errors="replace")
    lib.rd_kafka_error_destroy(error)
    raise LibrdkafkaError(f"{what}: {message}")


def write_group_metadata(
    group_id: str, generation_id: int, member_id: str, group_instance_id: str | None
) -> bytes:
    """The bytes ``confluent_kafka.Consumer.consumer_group_metadata()`` returns for a member
    with these fields (what ``Producer.send_offsets_to_transaction`` accepts)."""
    lib = _library()
    cgmd = lib.rd_kafka_consumer_group_metadata_new_with_genid(
        group_id.encode(),
        generation_id,
        member_id.encode(),
        group_instance_id.encode() if group_instance_id is not None else None,
    )
    if not cgmd:
        raise LibrdkafkaError("rd_kafka_consumer_group_metadata_new_with_genid returned NULL")
    try:
        buffer = _c_void_p()
        size = ctypes.c_size_t()
        error = lib.rd_kafka_consumer_group_metadata_write(
            cgmd, ctypes.byref(buffer), ctypes.byref(size)
        )
        if error:
            _raise_error(lib, error, "rd_kafka_consumer_group_metadata_write")
        try:
            return ctypes.string_at(buffer, size.value)
        finally:
            lib.rd_kafka_mem_free(None, buffer)
    finally:
        lib.rd_kafka_consumer_group_metadata_destroy(cgmd)


def read_group_metadata(data: bytes) -> GroupMetadata:
    """Parse serialized group metadata with librdkafka's own reader."""
    lib = _library()
    cgmd = _c_void_p()
    error = lib.rd_kafka_consumer_group_metadata_read(ctypes.byref(cgmd), data, len(data))
    if error:
        _raise_error(lib, error, "rd_kafka_consumer_group_metadata_read")
    try:
        instance = lib.rd_kafka_consumer_group_metadata_group_instance_id(cgmd)
        return GroupMetadata(
            group_id=lib.rd_kafka_consumer_group_metadata_group_id(cgmd).decode(),
            generation_id=int(lib.rd_kafka_consumer_group_metadata_generation_id(cgmd)),
            member_id=lib.rd_kafka_consumer_group_metadata_member_id(cgmd).decode(),
            group_instance_id=instance.decode() if instance is not None else None,
        )
    finally:
        lib.rd_kafka_consumer_group_metadata_destroy(cgmd)


class QueueWaker:
    """Ends the wait of a thread blocked in a consumer's ``poll()``/``consume()`` at once
    (``rd_kafka_queue_yield`` on its consumer queue); a wake with no thread waiting ends the
    next wait instead, so none is lost. Any thread; `close` before the consumer's close."""

    def __init__(self, lib: ctypes.CDLL, queue: int) -> None:
        self._lib = lib
        self._queue: int | None = queue
        self._lock = threading.Lock()

    def wake(self) -> None:
        with self._lock:
            if self._queue is not None:
                self._lib.rd_kafka_queue_yield(self._queue)

    def close(self) -> None:
        with self._lock:
            queue, self._queue = self._queue, None
        if queue is not None:
            self._lib.rd_kafka_queue_destroy(queue)


class QueueIoEvent:
    """librdkafka writes a byte to ``fd`` when an op (a record batch, an error) is put on the
    consumer queue and none was written since the queue was last served
    (``rd_kafka_queue_io_event_enable``). Any thread; `close` before the consumer's close."""

    _PAYLOAD = ctypes.create_string_buffer(b"r", 1)

    def __init__(self, lib: ctypes.CDLL, queue: int, fd: int) -> None:
        self._lib = lib
        self._queue: int | None = queue
        self._lock = threading.Lock()
        lib.rd_kafka_queue_io_event_enable(queue, fd, ctypes.addressof(self._PAYLOAD), 1)
        self._length = lib.rd_kafka_queue_length

    def length(self) -> int:
        """Ops (records, error events) waiting on the queue now (0 once closed); no wait, no
        lock but librdkafka's own queue lock."""
        queue = self._queue
        return self._length(queue) if queue is not None else 0

    def close(self) -> None:
        with self._lock:
            queue, self._queue = self._queue, None
        if queue is not None:
            self._lib.rd_kafka_queue_io_event_enable(queue, -1, None, 0)
            self._lib.rd_kafka_queue_destroy(queue)


def consumer_queue_io_event(
    consumer: confluent_kafka.Consumer, client_id: str, fd: int
) -> QueueIoEvent:
    """A `QueueIoEvent` writing to ``fd`` for ``consumer``'s queue (checked as in
    `consumer_queue_waker`; raises `LibrdkafkaError`)."""
    lib = _library()
    return QueueIoEvent(lib, _consumer_queue(lib, consumer, client_id), fd)


def consumer_queue_waker(consumer: confluent_kafka.Consumer, client_id: str) -> QueueWaker:
    """A `QueueWaker` for ``consumer`` (whose ``client.id`` is ``client_id``).

    confluent-kafka has no wake-up call, so this reads the ``rd_kafka_t`` handle that its
    binding keeps right after the object header, and checks it before use: the header's type
    must be the object's type, and librdkafka must name the handle a consumer of
    ``client_id``. Raises `LibrdkafkaError` when any of that does not hold."""
    lib = _library()
    return QueueWaker(lib, _consumer_queue(lib, consumer, client_id))


def _consumer_queue(lib: ctypes.CDLL, consumer: confluent_kafka.Consumer, client_id: str) -> int:
    """A new reference to ``consumer``'s librdkafka consumer queue (see
    `consumer_queue_waker`)."""
    word = ctypes.sizeof(ctypes.c_ssize_t)
    base = id(consumer)
    if ctypes.c_void_p.from_address(base + word).value != id(type(consumer)):
        raise LibrdkafkaError("unexpected object layout of confluent_kafka.Consumer")
    handle = ctypes.c_void_p.from_address(base + word + ctypes.sizeof(_c_void_p)).value
    if not handle:
        raise LibrdkafkaError("the confluent_kafka.Consumer has no librdkafka handle")
    name = (lib.rd_kafka_name(handle) or b"").decode(errors="replace")
    if lib.rd_kafka_type(handle) != _RD_KAFKA_CONSUMER or not name.startswith(
        f"{client_id}#consumer-"
    ):
        raise LibrdkafkaError(f"unexpected librdkafka handle {name!r} for client.id {client_id!r}")
    queue = lib.rd_kafka_queue_get_consumer(handle)
    if not queue:
        raise LibrdkafkaError(f"{name} has no consumer queue")
    return int(queue)
