"""One chaos member process: consume, log every processed record, commit after processing.

Two implementations share the loop: ``sdk`` (this SDK's `Consumer`) and
``ck`` (``confluent_kafka.Consumer`` with ``group.protocol=consumer``). Each process appends
JSON lines to its own file; every line has ``t`` (wall clock, seconds), ``ev``, ``inc`` (the
incarnation: name and pid) and the member id/epoch when known:

``start`` / ``assign`` / ``revoke`` / ``lost`` (``parts``: partitions) / ``rec`` (``p``, ``o``)
/ ``commit`` (``offsets``: partition -> next offset) / ``commit_failed`` / ``error`` /
``closed`` (``took``) / ``exit``. SDK members also log every ConsumerGroupHeartbeat they send
(``hb``: ``sent`` time, request epoch ``req_ep``, ``tp``: the partitions its TopicPartitions
field reported as owned, or null when the field was left out as unchanged, and the outcome:
``err`` and ``resp_ep``, ``assigned`` (null: unchanged), or ``fail``), which is the evidence the
checker needs to tell the mock broker's faults from the SDK's (`analysis`).

Commit policy: synchronous commits after processing each batch (``enable.auto.commit`` is
off). A batch's records are logged and flushed to the OS before its commit, so a record that
is committed was always logged first; a record processed but not committed (the process was
killed, or fenced, before its commit) may be processed again by the next owner.
A failed commit is retried with the next batch, or after a second without records.
``on_revoke`` retries the commit of processed-but-uncommitted offsets of the revoked
partitions before it returns. SIGTERM makes the loop stop and ``close()`` the consumer.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import IO, Any

log = logging.getLogger("consumer_sdk.chaos")

Partition = int


class EventLog:
    """Append-only JSON-lines log of one member incarnation."""

    def __init__(self, path: str, name: str) -> None:
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115
        self._lock = threading.Lock()
        self.incarnation = f"{name}/{os.getpid()}"
        self.member_id = ""
        self.epoch = -1

    def write(self, ev: str, flush: bool = False, **fields: Any) -> None:
        record = {
            "t": time.time(),
            "ev": ev,
            "inc": self.incarnation,
            "mid": self.member_id,
            "ep": self.epoch,
            **fields,
        }
        line = json.dumps(record, separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(line)
            if flush:
                self._file.flush()

    def flush(self) -> None:
        with self._lock:
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.flush()
            self._file.close()


class ChaosMember:
    """The consume-log-commit loop around one consumer (``impl``: ``sdk`` or ``ck``)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.impl: str = args.impl
        self.topic: str = args.topic
        self.log = EventLog(args.log, args.name)
        self.stop = threading.Event()
        # partition -> next offset processed but not yet committed
        self.pending: dict[Partition, int] = {}
        self._last_commit = 0.0
        self.consumer: Any = None
        # close() has begun: confluent-kafka's member id is not asked again (see `_identity`)
        self._closing = False

    # -- consumer construction --------------------------------------------------------------

    def _config(self) -> dict[str, Any]:
        conf: dict[str, Any] = {
            "bootstrap.servers": self.args.bootstrap,
            "group.id": self.args.group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "client.id": self.args.name,
        }
        if getattr(self.args, "instance_id", None):
            conf["group.instance.id"] = self.args.instance_id
        if self._is_sdk():
            conf["socket.timeout.ms"] = 10_000
        else:
            conf["group.protocol"] = "consumer"
            conf["enable.auto.offset.store"] = False
            # librdkafka's heartbeat trace: its cgrp/consumer debug lines on stderr carry their own
            # timestamps and this client.id (the incarnation); see analysis.librdkafka_heartbeats
            conf["client.id"] = self.log.incarnation
            conf["debug"] = "cgrp,consumer"
        return conf

    def _make_consumer(self) -> Any:
        if self.impl == "sdk":
            from consumer_sdk import Consumer

            consumer = Consumer(self._config())
            self._trace_heartbeats(consumer)
            return consumer
        import confluent_kafka

        return confluent_kafka.Consumer(self._config())

    def _trace_heartbeats(self, consumer: Any) -> None:
        """Log each heartbeat the SDK puts on the wire, with its outcome (see the module doc).

        The chaos topic is the only one subscribed, so every partition in TopicPartitions is
        one of its partitions."""
        net: Any = getattr(consumer, "_net", None)
        if net is None or not hasattr(net, "heartbeat_trace"):
            log.error("heartbeat trace unavailable: the consumer has no MemberNetwork")
            return

        def parts(topics: Any) -> list[int] | None:
            return None if topics is None else sorted(p for t in topics for p in t.partitions)

        def traced(request: Any, sent: float, response: Any, error: Any) -> None:
            fields = {
                "sent": sent,
                "req_ep": request.member_epoch,
                "tp": parts(request.topic_partitions),
            }
            if error is not None:
                self.log.write("hb", fail=f"{type(error).__name__}: {error}", **fields)
                return
            self.log.write(
                "hb",
                err=response.error_code,
                resp_ep=response.member_epoch,
                assigned=parts(response.assignment),
                **fields,
            )

        net.heartbeat_trace = traced

    def _is_sdk(self) -> bool:
        """Whether the consumer is this SDK's (else confluent-kafka's)."""
        return self.impl == "sdk"

    def _identity(self) -> None:
        c = self.consumer
        if self._is_sdk():
            self.log.member_id, self.log.epoch = c.member_id, c.member_epoch
        elif not self._closing:
            # Not during close(): librdkafka answers memberid() from its group thread, and
            # once a commit in on_revoke failed there (UNKNOWN_MEMBER_ID after the leave) that
            # thread has terminated, so the call never returned, the close timed out and the
            # member was killed still "owning" the partitions it had left (chaos, netns, CI).
            # The id the member closes with is the one last read.
            try:
                self.log.member_id = c.memberid() or ""
            except Exception:  # older bindings have no memberid()
                self.log.member_id = ""

    # -- callbacks ------------------------------------------------------------------------------

    def _parts(self, partitions: list[Any]) -> list[int]:
        return sorted(int(tp.partition) for tp in partitions if tp.topic == self.topic)

    def on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self._identity()
        self.log.write("assign", flush=True, parts=self._parts(partitions))

    def on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        parts = self._parts(partitions)
        self.log.write("revoking", parts=parts)
        todo = {p: o for p, o in self.pending.items() if p in parts}
        if todo:
            self._commit(todo)
        self._revoked(parts)

    def _revoked(self, parts: list[int]) -> None:
        for p in parts:
            self.pending.pop(p, None)
        self._identity()
        self.log.write("revoke", flush=True, parts=parts)

    def on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        parts = self._parts(partitions)
        for p in parts:
            self.pending.pop(p, None)
        self._identity()
        self.log.write("lost", flush=True, parts=parts)

    # -- commit -----------------------------------------------------------------------------

    def _commit(self, offsets: dict[Partition, int]) -> bool:
        from confluent_kafka import KafkaException

        tps, sent = self._commit_started(offsets)
        try:
            self.consumer.commit(offsets=tps, asynchronous=False)
        except KafkaException as exc:
            return self._commit_failed(offsets, exc)
        return self._commit_done(offsets, sent)

    def _commit_started(self, offsets: dict[Partition, int]) -> tuple[list[Any], float]:
        """The commit's TopicPartitions, and when it was sent."""
        from confluent_kafka import TopicPartition

        self._last_commit = time.monotonic()
        return [TopicPartition(self.topic, p, o) for p, o in sorted(offsets.items())], time.time()

    def _commit_failed(self, offsets: dict[Partition, int], exc: Exception) -> bool:
        self.log.write("commit_failed", flush=True, offsets=offsets, error=str(exc))
        return False

    def _commit_done(self, offsets: dict[Partition, int], sent: float) -> bool:
        self.log.write("commit", flush=True, offsets=offsets, sent=sent)
        for p, o in offsets.items():
            if self.pending.get(p) == o:
                del self.pending[p]
        return True

    def _processed(self, messages: list[Any]) -> dict[Partition, int] | None:
        """Log each record of a batch as processed; the offsets to commit next: the whole
        pending set after records, after a second without a commit while some are pending
        (a failed commit is retried even when no more records come), else None."""
        batch: dict[Partition, int] = {}
        for msg in messages:
            if msg.error() is not None:
                self.log.write("error", error=str(msg.error()), fatal=False)
                continue
            p, o = int(msg.partition()), int(msg.offset())
            self.log.write("rec", p=p, o=o)
            batch[p] = o + 1
        if batch:
            self.log.flush()  # processed before committed
            self.pending.update(batch)
            return dict(self.pending)
        if self.pending and time.monotonic() - self._last_commit >= 1.0:
            return dict(self.pending)
        return None

    def _consume_failed(self, exc: Exception) -> bool:
        """Log a consume error; whether it is fatal."""
        error = exc.args[0]
        self.log.write("error", flush=True, error=str(exc), fatal=error.fatal())
        return bool(error.fatal())

    # -- main loop --------------------------------------------------------------------------

    def run(self) -> int:
        from confluent_kafka import KafkaException

        signal.signal(signal.SIGTERM, lambda *_: self.stop.set())
        signal.signal(signal.SIGINT, lambda *_: self.stop.set())
        self.consumer = self._make_consumer()
        self._identity()
        self.log.write("start", flush=True, impl=self.impl, pid=os.getpid())
        self.consumer.subscribe(
            [self.topic], on_assign=self.on_assign, on_revoke=self.on_revoke, on_lost=self.on_lost
        )
        status = 0
        try:
            while not self.stop.is_set():
                try:
                    messages = self.consumer.consume(200, 0.2)
                except KafkaException as exc:
                    if self._consume_failed(exc):
                        status = 3
                        break
                    continue
                if self.impl == "sdk":
                    self._identity()
                todo = self._processed(messages)
                if todo is not None:
                    self._commit(todo)
        finally:
            self.log.write("closing", flush=True)
            self._closing = True
            started = time.monotonic()
            self._close()
            took = time.monotonic() - started
            self.log.write("closed", flush=True, took=took)
            self.log.write("exit", flush=True, status=status)
            self.log.close()
        return status

    def _close(self) -> None:
        if self.impl == "sdk":
            self.consumer.close(timeout=self.args.close_timeout)
            return
        # confluent-kafka's close() can block; bound it like the SDK's.
        closer = threading.Thread(target=self.consumer.close, daemon=True)
        closer.start()
        closer.join(self.args.close_timeout)


def member_main(
    argv: list[str],
    member_class: type[ChaosMember] = ChaosMember,
    impls: tuple[str, ...] = ("sdk", "ck"),
) -> int:
    """Parse a member's arguments and run ``member_class`` (a subclass may add logging or
    other ``impls``)."""
    parser = argparse.ArgumentParser(prog="python -m consumer_sdk.chaos member")
    parser.add_argument("--impl", choices=impls, default=impls[0])
    parser.add_argument("--name", required=True)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--log", required=True)
    parser.add_argument("--close-timeout", type=float, default=10.0)
    parser.add_argument("--instance-id", default=None, help="group.instance.id (static member)")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING,
        stream=sys.stderr,
        format=f"%(asctime)s {args.name} %(levelname)s %(name)s %(message)s",
    )
    return member_class(args).run()
