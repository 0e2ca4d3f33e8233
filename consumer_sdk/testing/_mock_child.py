"""Child process hosting librdkafka's mock cluster (see `consumer_sdk.testing`).

Run as a script (``python -u -P _mock_child.py '<json config>'``); it imports only the
standard library and ``confluent_kafka`` so it works whether or not ``consumer_sdk`` is
importable in the child.

Protocol: one JSON object per line. The child writes ``{"event": "ready", ...}`` or
``{"event": "fatal", "error": ...}`` first, then answers each request
``{"id": n, "cmd": name, "args": {...}}`` with ``{"id": n, "ok": true, "result": ...}`` or
``{"id": n, "ok": false, "error": text, "code": mock_error_code_or_null}``. The protocol
uses a private duplicate of the original stdout; file descriptor 1 is redirected to
stderr so that nothing else (C code included) can corrupt it. The child exits when it
receives ``close`` or when its stdin reaches EOF (parent gone).

Variadic C functions: ``rd_kafka_mock_broker_push_request_error_rtts`` has no array
form, so its ``(err, rtt_ms)`` pairs are passed as extra ``c_int`` arguments. That matches
the x86-64 System V calling convention (and Linux aarch64 for int-sized varargs); the
cluster-wide stack uses ``rd_kafka_mock_push_request_errors_array`` instead.
"""

from __future__ import annotations

import base64
import collections
import ctypes
import glob
import json
import os
import signal
import sys
import traceback
from collections.abc import Callable
from typing import IO, Any

_c_void_p = ctypes.c_void_p
_c_char_p = ctypes.c_char_p
_c_int = ctypes.c_int
_c_int16 = ctypes.c_int16
_c_int32 = ctypes.c_int32
_c_int64 = ctypes.c_int64
_c_size_t = ctypes.c_size_t

# name -> (restype, argtypes). Every pointer is c_void_p: the default int restype would
# truncate 64-bit pointers.
_SIGNATURES: dict[str, tuple[Any, list[Any]]] = {
    "rd_kafka_version_str": (_c_char_p, []),
    "rd_kafka_err2str": (_c_char_p, [_c_int]),
    "rd_kafka_err2name": (_c_char_p, [_c_int]),
    "rd_kafka_conf_new": (_c_void_p, []),
    "rd_kafka_conf_set": (_c_int, [_c_void_p, _c_char_p, _c_char_p, _c_char_p, _c_size_t]),
    "rd_kafka_conf_destroy": (None, [_c_void_p]),
    "rd_kafka_new": (_c_void_p, [_c_int, _c_void_p, _c_char_p, _c_size_t]),
    "rd_kafka_destroy": (None, [_c_void_p]),
    "rd_kafka_topic_partition_list_new": (_c_void_p, [_c_int]),
    "rd_kafka_topic_partition_list_add": (_c_void_p, [_c_void_p, _c_char_p, _c_int32]),
    "rd_kafka_topic_partition_list_destroy": (None, [_c_void_p]),
    "rd_kafka_mock_cluster_new": (_c_void_p, [_c_void_p, _c_int]),
    "rd_kafka_mock_cluster_destroy": (None, [_c_void_p]),
    "rd_kafka_mock_cluster_bootstraps": (_c_char_p, [_c_void_p]),
    "rd_kafka_mock_topic_create": (_c_int, [_c_void_p, _c_char_p, _c_int, _c_int]),
    "rd_kafka_mock_topic_delete": (_c_int, [_c_void_p, _c_char_p]),
    "rd_kafka_mock_partition_set_leader": (_c_int, [_c_void_p, _c_char_p, _c_int32, _c_int32]),
    "rd_kafka_mock_coordinator_set": (_c_int, [_c_void_p, _c_char_p, _c_char_p, _c_int32]),
    "rd_kafka_mock_broker_set_down": (_c_int, [_c_void_p, _c_int32]),
    "rd_kafka_mock_broker_set_up": (_c_int, [_c_void_p, _c_int32]),
    "rd_kafka_mock_broker_set_rtt": (_c_int, [_c_void_p, _c_int32, _c_int]),
    "rd_kafka_mock_push_request_errors_array": (
        None,
        [_c_void_p, _c_int16, _c_size_t, ctypes.POINTER(_c_int)],
    ),
    "rd_kafka_mock_clear_request_errors": (None, [_c_void_p, _c_int16]),
    # Variadic: only the fixed arguments are declared; pairs follow as c_int.
    "rd_kafka_mock_broker_push_request_error_rtts": (
        _c_int,
        [_c_void_p, _c_int32, _c_int16, _c_size_t],
    ),
    "rd_kafka_mock_broker_error_stack_cnt": (
        _c_int,
        [_c_void_p, _c_int32, _c_int16, ctypes.POINTER(_c_size_t)],
    ),
    "rd_kafka_mock_set_apiversion": (_c_int, [_c_void_p, _c_int16, _c_int16, _c_int16]),
    "rd_kafka_mock_set_group_consumer_session_timeout_ms": (None, [_c_void_p, _c_int]),
    "rd_kafka_mock_set_group_consumer_heartbeat_interval_ms": (None, [_c_void_p, _c_int]),
    "rd_kafka_mock_cgrp_consumer_target_assignment_new": (
        _c_void_p,
        [ctypes.POINTER(_c_char_p), _c_int, ctypes.POINTER(_c_void_p)],
    ),
    "rd_kafka_mock_cgrp_consumer_target_assignment_destroy": (None, [_c_void_p]),
    "rd_kafka_mock_cgrp_consumer_target_assignment": (None, [_c_void_p, _c_char_p, _c_void_p]),
    "rd_kafka_mock_start_request_tracking": (None, [_c_void_p]),
    "rd_kafka_mock_get_requests": (
        ctypes.POINTER(_c_void_p),
        [_c_void_p, ctypes.POINTER(_c_size_t)],
    ),
    "rd_kafka_mock_clear_requests": (None, [_c_void_p]),
    "rd_kafka_mock_request_id": (_c_int32, [_c_void_p]),
    "rd_kafka_mock_request_api_key": (_c_int16, [_c_void_p]),
    "rd_kafka_mock_request_timestamp": (_c_int64, [_c_void_p]),
    "rd_kafka_mock_request_destroy_array": (None, [ctypes.POINTER(_c_void_p), _c_size_t]),
    "rd_kafka_mock_topic_set_error": (None, [_c_void_p, _c_char_p, _c_int]),
}

#: The oldest confluent-kafka whose bundled librdkafka has every required symbol above and
#: whose mock cluster runs KIP-848 groups as the SDK's tests expect (2.8-2.10 export the
#: symbols, but 2.10's mock does not give a restarted static member its partitions back).
#: Keep in step with pyproject.toml's dependency range (tests/test_packaging.py checks).
MIN_CONFLUENT_KAFKA = "2.11.0"
#: Symbols only some commands need -> the confluent-kafka release that added them.
OPTIONAL_SYMBOLS = {"rd_kafka_mock_topic_delete": "2.15.0"}

_RD_KAFKA_PRODUCER = 0
_METADATA_TIMEOUT_S = 5.0


class CommandError(Exception):
    """A command failed; ``code`` is the mock's error code when there is one."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


def find_librdkafka() -> str:
    """Path of the librdkafka that ``confluent_kafka.cimpl`` is linked against."""
    import confluent_kafka

    # Importing confluent_kafka loaded cimpl and hence its librdkafka: prefer the
    # mapping actually in this process.
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
        # Linux wheels (auditwheel), then macOS wheels (delocate).
        os.path.join(os.path.dirname(package_dir), "confluent_kafka.libs", "librdkafka*.so*"),
        os.path.join(package_dir, ".dylibs", "librdkafka*.dylib"),
    ]
    candidates = sorted(path for pattern in patterns for path in glob.glob(pattern))
    if not candidates:
        raise RuntimeError(
            f"librdkafka not found: nothing matches {' or '.join(map(repr, patterns))} "
            f"(confluent-kafka {_confluent_kafka_version()} at {package_dir})"
        )
    return candidates[0]


def _confluent_kafka_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("confluent-kafka")
    except importlib.metadata.PackageNotFoundError:
        return "?"


def load_library(path: str) -> tuple[ctypes.CDLL, set[str]]:
    """Bind the mock-cluster API; return the library and the optional symbols it lacks.

    A missing required symbol is an error that names it and the confluent-kafka release
    that has it, so an older confluent-kafka fails at start, not halfway through a test.
    """
    if not os.path.isfile(path):
        raise RuntimeError(f"librdkafka not found at {path!r}")
    lib = ctypes.CDLL(path)
    missing = []
    for name, (restype, argtypes) in _SIGNATURES.items():
        try:
            fn = getattr(lib, name)
        except AttributeError:
            missing.append(name)
            continue
        fn.restype = restype
        fn.argtypes = argtypes
    required = [name for name in missing if name not in OPTIONAL_SYMBOLS]
    if required:
        version = (
            (lib.rd_kafka_version_str() or b"?").decode()
            if hasattr(lib, "rd_kafka_version_str")
            else "?"
        )
        raise RuntimeError(
            f"EmbeddedKafka needs librdkafka's mock-cluster function(s) {', '.join(required)}, "
            f"which {path} (librdkafka {version}, confluent-kafka "
            f"{_confluent_kafka_version()}) does not export: install "
            f"confluent-kafka>={MIN_CONFLUENT_KAFKA} (pip install "
            f"'confluent-kafka>={MIN_CONFLUENT_KAFKA}')"
        )
    return lib, set(missing)


class MockCluster:
    """The mock cluster and the commands the parent can run on it."""

    def __init__(self, config: dict[str, Any]) -> None:
        import confluent_kafka

        self._ck = confluent_kafka
        requested_path = config.get("librdkafka_path")
        self.library_path = requested_path or find_librdkafka()
        self.lib, self._missing_optional = load_library(self.library_path)
        self.version = (self.lib.rd_kafka_version_str() or b"?").decode()
        libversion = confluent_kafka.libversion()  # a str, not a tuple, in 2.12.0
        binding_version = libversion if isinstance(libversion, str) else libversion[0]
        if not requested_path and self.version != binding_version:
            raise RuntimeError(
                f"{self.library_path} is librdkafka {self.version} but confluent_kafka "
                f"uses {binding_version}"
            )
        self.broker_count = int(config["brokers"])
        self.topics: dict[str, int] = {}
        self._decoded: list[tuple[int, int, int]] = []
        self.rk = self._new_host_handle(config.get("debug"))
        self.mc: int | None = self.lib.rd_kafka_mock_cluster_new(self.rk, self.broker_count)
        if not self.mc:
            self.lib.rd_kafka_destroy(self.rk)
            raise RuntimeError("rd_kafka_mock_cluster_new() failed (see stderr)")
        self.bootstrap = self.lib.rd_kafka_mock_cluster_bootstraps(self.mc).decode()
        if config.get("heartbeat_interval_ms") is not None:
            self.set_heartbeat_interval(ms=config["heartbeat_interval_ms"])
        if config.get("session_timeout_ms") is not None:
            self.set_session_timeout(ms=config["session_timeout_ms"])
        self.lib.rd_kafka_mock_start_request_tracking(self.mc)

    def _new_host_handle(self, debug: str | None) -> int:
        errstr = ctypes.create_string_buffer(512)
        conf = self.lib.rd_kafka_conf_new()
        settings = {"client.id": "embedded-kafka-mock"}
        if debug:
            settings["debug"] = debug
        for key, value in settings.items():
            if self.lib.rd_kafka_conf_set(conf, key.encode(), value.encode(), errstr, 512) != 0:
                self.lib.rd_kafka_conf_destroy(conf)
                raise RuntimeError(f"rd_kafka_conf_set({key}={value}): {errstr.value.decode()}")
        rk = self.lib.rd_kafka_new(_RD_KAFKA_PRODUCER, conf, errstr, 512)
        if not rk:
            # conf is only owned by rk on success.
            self.lib.rd_kafka_conf_destroy(conf)
            raise RuntimeError(f"rd_kafka_new() failed: {errstr.value.decode()}")
        return int(rk)

    def destroy(self) -> None:
        if self.mc:
            self.lib.rd_kafka_mock_cluster_destroy(self.mc)
            self.mc = None
        if self.rk:
            self.lib.rd_kafka_destroy(self.rk)
            self.rk = 0

    # -- helpers ---------------------------------------------------------------------------

    def _require(self, symbol: str, command: str) -> None:
        if symbol in self._missing_optional:
            raise CommandError(
                f"{command} needs librdkafka's {symbol}, which librdkafka {self.version} "
                f"(confluent-kafka {_confluent_kafka_version()}) does not export: install "
                f"confluent-kafka>={OPTIONAL_SYMBOLS[symbol]}"
            )

    def _check(self, err: int, what: str) -> None:
        if err:
            name = (self.lib.rd_kafka_err2name(err) or b"?").decode()
            text = (self.lib.rd_kafka_err2str(err) or b"?").decode()
            raise CommandError(f"{what}: {name} ({err}): {text}", code=err)

    def _client_config(self, **extra: Any) -> dict[str, Any]:
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "client.id": "embedded-kafka-admin",
            "log_level": 3,
        }
        config.update(extra)
        return config

    def _metadata_topics(self) -> dict[str, int]:
        producer = self._ck.Producer(self._client_config())
        try:
            metadata = producer.list_topics(timeout=_METADATA_TIMEOUT_S)
        except self._ck.KafkaException as exc:
            raise CommandError(f"cannot read cluster metadata: {exc}") from None
        finally:
            del producer
        return {name: len(t.partitions) for name, t in metadata.topics.items() if t.error is None}

    def _partition_count(self, topic: str) -> int:
        if topic in self.topics:
            return self.topics[topic]
        count = self._metadata_topics().get(topic)
        if count is None:
            raise CommandError(f"unknown topic {topic!r}", code=3)
        return count

    def _check_partition(self, topic: str, partition: int) -> None:
        count = self._partition_count(topic)
        if not 0 <= partition < count:
            raise CommandError(
                f"topic {topic!r} has {count} partition(s); partition {partition} does not exist",
                code=3,
            )

    # -- commands --------------------------------------------------------------------------

    def create_topic(self, topic: str, partitions: int, replication_factor: int) -> None:
        err = self.lib.rd_kafka_mock_topic_create(
            self.mc, topic.encode(), partitions, replication_factor
        )
        self._check(err, f"create_topic({topic!r})")
        self.topics[topic] = partitions

    def delete_topic(self, topic: str) -> None:
        self._require("rd_kafka_mock_topic_delete", "delete_topic")
        self._check(
            self.lib.rd_kafka_mock_topic_delete(self.mc, topic.encode()),
            f"delete_topic({topic!r})",
        )
        self.topics.pop(topic, None)

    def list_topics(self) -> dict[str, int]:
        return self._metadata_topics()

    def produce(
        self,
        topic: str,
        messages: list[list[str | None]],
        partition: int | None,
        headers: list[list[str]] | None,
        flush_timeout: float,
    ) -> int:
        if partition is not None:
            self._check_partition(topic, partition)
        failures: list[str] = []
        delivered = 0

        def on_delivery(err: Any, _msg: Any) -> None:
            nonlocal delivered
            if err is None:
                delivered += 1
            else:
                failures.append(str(err))

        decoded_headers = [(name, base64.b64decode(v)) for name, v in headers] if headers else None
        timeout_ms = max(1, int(flush_timeout * 1000))
        producer = self._ck.Producer(
            self._client_config(
                **{
                    "client.id": "embedded-kafka-producer",
                    "linger.ms": 0,
                    "message.timeout.ms": timeout_ms,
                }
            )
        )
        try:
            for key, value in messages:
                kwargs: dict[str, Any] = {
                    "key": None if key is None else base64.b64decode(key),
                    "value": None if value is None else base64.b64decode(value),
                    "on_delivery": on_delivery,
                }
                if partition is not None:
                    kwargs["partition"] = partition
                if decoded_headers:
                    kwargs["headers"] = decoded_headers
                while True:
                    try:
                        producer.produce(topic, **kwargs)
                        break
                    except BufferError:
                        producer.poll(0.05)
            remaining = producer.flush(flush_timeout + 1.0)
        finally:
            del producer
        if failures or remaining:
            raise CommandError(
                f"produce to {topic!r}: {delivered} of {len(messages)} delivered; "
                f"{len(failures)} failed ({'; '.join(sorted(set(failures))[:3])}), "
                f"{remaining} undelivered"
            )
        return delivered

    def set_group_coordinator(self, group: str, broker_id: int) -> None:
        err = self.lib.rd_kafka_mock_coordinator_set(self.mc, b"group", group.encode(), broker_id)
        self._check(err, f"set_group_coordinator({group!r}, {broker_id})")

    def broker_down(self, broker_id: int) -> None:
        err = self.lib.rd_kafka_mock_broker_set_down(self.mc, broker_id)
        self._check(err, f"broker_down({broker_id})")

    def broker_up(self, broker_id: int) -> None:
        self._check(self.lib.rd_kafka_mock_broker_set_up(self.mc, broker_id), "broker_up")

    def set_rtt(self, broker_id: int, ms: int) -> None:
        self._check(self.lib.rd_kafka_mock_broker_set_rtt(self.mc, broker_id, ms), "set_rtt")

    def partition_set_leader(self, topic: str, partition: int, broker_id: int) -> None:
        # The mock auto-creates unknown topics here: check first.
        self._check_partition(topic, partition)
        err = self.lib.rd_kafka_mock_partition_set_leader(
            self.mc, topic.encode(), partition, broker_id
        )
        self._check(err, f"partition_set_leader({topic!r}, {partition}, {broker_id})")

    def set_topic_error(self, topic: str, error: int) -> None:
        # The mock auto-creates unknown topics here: check first.
        self._partition_count(topic)
        self.lib.rd_kafka_mock_topic_set_error(self.mc, topic.encode(), error)

    def push_request_errors(self, api_key: int, errors: list[int]) -> None:
        array = (_c_int * len(errors))(*errors)
        self.lib.rd_kafka_mock_push_request_errors_array(self.mc, api_key, len(errors), array)

    def clear_request_errors(self, api_key: int) -> None:
        self.lib.rd_kafka_mock_clear_request_errors(self.mc, api_key)

    def push_broker_errors(self, broker_id: int, api_key: int, errors: list[list[int]]) -> None:
        extras: list[Any] = []
        for err, rtt_ms in errors:
            extras += [_c_int(err), _c_int(rtt_ms)]
        fn = self.lib.rd_kafka_mock_broker_push_request_error_rtts
        err = fn(self.mc, broker_id, api_key, len(errors), *extras)
        self._check(err, f"push_broker_errors(broker {broker_id})")

    def pending_broker_errors(self, broker_id: int, api_key: int) -> int:
        count = _c_size_t(0)
        err = self.lib.rd_kafka_mock_broker_error_stack_cnt(
            self.mc, broker_id, api_key, ctypes.byref(count)
        )
        self._check(err, "pending_broker_errors")
        return int(count.value)

    def set_api_version(self, api_key: int, min_version: int, max_version: int) -> None:
        err = self.lib.rd_kafka_mock_set_apiversion(self.mc, api_key, min_version, max_version)
        self._check(err, f"set_api_version({api_key}, {min_version}, {max_version})")

    def set_heartbeat_interval(self, ms: int) -> None:
        self.lib.rd_kafka_mock_set_group_consumer_heartbeat_interval_ms(self.mc, ms)

    def set_session_timeout(self, ms: int) -> None:
        self.lib.rd_kafka_mock_set_group_consumer_session_timeout_ms(self.mc, ms)

    def set_target_assignment(
        self, group: str, assignment: list[list[Any]] | None, validate: bool
    ) -> None:
        setter = self.lib.rd_kafka_mock_cgrp_consumer_target_assignment
        if assignment is None:
            setter(self.mc, group.encode(), None)
            return
        if validate:
            for _member, partitions in assignment:
                for topic, partition in partitions:
                    self._check_partition(topic, partition)
        lists: list[int] = []
        target = None
        try:
            for _member, partitions in assignment:
                tplist = self.lib.rd_kafka_topic_partition_list_new(max(1, len(partitions)))
                if not tplist:
                    raise CommandError("rd_kafka_topic_partition_list_new() failed")
                lists.append(tplist)
                for topic, partition in partitions:
                    self.lib.rd_kafka_topic_partition_list_add(tplist, topic.encode(), partition)
            count = len(assignment)
            member_ids = (_c_char_p * max(1, count))(*[m.encode() for m, _ in assignment])
            list_array = (_c_void_p * max(1, count))(*lists)
            target = self.lib.rd_kafka_mock_cgrp_consumer_target_assignment_new(
                member_ids, count, list_array
            )
            if not target:
                raise CommandError("rd_kafka_mock_cgrp_consumer_target_assignment_new() failed")
            setter(self.mc, group.encode(), target)
        finally:
            if target:
                self.lib.rd_kafka_mock_cgrp_consumer_target_assignment_destroy(target)
            for tplist in lists:
                self.lib.rd_kafka_topic_partition_list_destroy(tplist)

    def _tracked(self) -> list[tuple[int, int, int]]:
        """All tracked requests. The mock's list only grows until clear_requests (which
        only this class calls), so entries decoded earlier are kept and only new ones are
        decoded."""
        count = _c_size_t(0)
        array = self.lib.rd_kafka_mock_get_requests(self.mc, ctypes.byref(count))
        if not array or not count.value:
            return self._decoded
        try:
            if count.value < len(self._decoded):  # cleared behind our back: start over
                self._decoded = []
            for i in range(len(self._decoded), count.value):
                self._decoded.append(
                    (
                        int(self.lib.rd_kafka_mock_request_api_key(array[i])),
                        int(self.lib.rd_kafka_mock_request_timestamp(array[i])),
                        int(self.lib.rd_kafka_mock_request_id(array[i])),
                    )
                )
        finally:
            self.lib.rd_kafka_mock_request_destroy_array(array, count.value)
        return self._decoded

    def requests(self, api_key: int | None) -> list[tuple[int, int, int]]:
        tracked = self._tracked()
        return list(tracked) if api_key is None else [r for r in tracked if r[0] == api_key]

    def request_counts(self) -> list[tuple[int, int]]:
        return sorted(collections.Counter(r[0] for r in self._tracked()).items())

    def clear_requests(self) -> None:
        self.lib.rd_kafka_mock_clear_requests(self.mc)
        self._decoded = []

    def ping(self) -> str:
        return "pong"


COMMANDS = (
    "ping",
    "create_topic",
    "delete_topic",
    "list_topics",
    "produce",
    "set_group_coordinator",
    "broker_down",
    "broker_up",
    "set_rtt",
    "partition_set_leader",
    "set_topic_error",
    "push_request_errors",
    "clear_request_errors",
    "push_broker_errors",
    "pending_broker_errors",
    "set_api_version",
    "set_heartbeat_interval",
    "set_session_timeout",
    "set_target_assignment",
    "requests",
    "request_counts",
    "clear_requests",
)


def _send(out: IO[str], message: dict[str, Any]) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def main(argv: list[str]) -> int:
    # Private copy of stdout for the protocol; fd 1 now goes to stderr.
    out = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        config = json.loads(argv[1])
        cluster = MockCluster(config)
    except BaseException as exc:
        traceback.print_exc()
        _send(out, {"event": "fatal", "error": f"{type(exc).__name__}: {exc}"})
        return 2
    _send(
        out,
        {
            "event": "ready",
            "bootstrap": cluster.bootstrap,
            "librdkafka": cluster.version,
            "library": cluster.library_path,
        },
    )
    commands: dict[str, Callable[..., Any]] = {name: getattr(cluster, name) for name in COMMANDS}
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            print("embedded-kafka child: stdin closed, shutting down", file=sys.stderr)
            break
        try:
            request = json.loads(line)
            request_id = request["id"]
            cmd = request["cmd"]
        except (ValueError, KeyError, TypeError) as exc:
            print(f"embedded-kafka child: bad request {line!r}: {exc}", file=sys.stderr)
            continue
        if cmd == "close":
            cluster.destroy()
            _send(out, {"id": request_id, "ok": True, "result": None})
            break
        handler = commands.get(cmd)
        try:
            if handler is None:
                raise CommandError(f"unknown command {cmd!r}")
            result = handler(**request.get("args", {}))
            reply: dict[str, Any] = {"id": request_id, "ok": True, "result": result}
        except CommandError as exc:
            reply = {"id": request_id, "ok": False, "error": str(exc), "code": exc.code}
        except Exception as exc:
            traceback.print_exc()
            reply = {
                "id": request_id,
                "ok": False,
                "error": f"{type(exc).__name__}: {exc}",
                "code": None,
            }
        _send(out, reply)
    sys.stderr.flush()
    return 0


if __name__ == "__main__":
    # os._exit: skip interpreter teardown while librdkafka threads may still exist.
    code = main(sys.argv)
    os._exit(code)
