"""The README demo: SDK members (and one confluent-kafka member) sharing a topic on
EmbeddedKafka, with a live table of states, epochs and partitions as members join,
get fenced and leave, and a summary of records and rebalance latencies."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

import confluent_kafka

from consumer_sdk import Consumer, KafkaException, TopicPartition


@dataclass
class _DemoMember:
    name: str
    client: Any
    kind: str
    owned: set[int] = field(default_factory=set)
    records: list[tuple[int, int]] = field(default_factory=list)
    joined_at: float = field(default_factory=time.monotonic)
    first_assignment_s: float | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None
    lost: int = 0

    def state(self) -> str:
        if self.kind == "sdk":
            return str(self.client.state.name)
        return "STABLE" if self.owned else "JOINING"

    def epoch(self) -> str:
        return str(self.client.member_epoch) if self.kind == "sdk" else "-"


class Demo:
    def __init__(self, out: TextIO, members: int, partitions: int, seconds_per_step: float):
        self.out = out
        self.n_members = members
        self.partitions = partitions
        self.step = seconds_per_step
        self.members: list[_DemoMember] = []
        self.produced = 0
        self.lock = threading.Lock()

    def _log(self, text: str) -> None:
        self.out.write(text + "\n")
        self.out.flush()

    def _callbacks(self, m: _DemoMember) -> dict[str, Any]:
        def on_assign(_: Any, parts: list[TopicPartition]) -> None:
            with self.lock:
                m.owned.update(p.partition for p in parts)
                if m.first_assignment_s is None and m.owned:
                    m.first_assignment_s = time.monotonic() - m.joined_at

        def on_revoke(_: Any, parts: list[TopicPartition]) -> None:
            with self.lock:
                m.owned.difference_update(p.partition for p in parts)

        def on_lost(_: Any, parts: list[TopicPartition]) -> None:
            with self.lock:
                m.lost += 1
                m.owned.difference_update(p.partition for p in parts)

        return {"on_assign": on_assign, "on_revoke": on_revoke, "on_lost": on_lost}

    def _start(self, kafka: Any, name: str, kind: str) -> _DemoMember:
        conf = {
            "bootstrap.servers": kafka.bootstrap_servers,
            "group.id": "demo-group",
            "auto.offset.reset": "earliest",
        }
        if kind == "sdk":
            client: Any = Consumer(conf)
        else:
            client = confluent_kafka.Consumer({**conf, "group.protocol": "consumer"})
        m = _DemoMember(name, client, kind)
        client.subscribe(["orders"], **self._callbacks(m))

        def loop() -> None:
            while not m.stop.is_set():
                try:
                    msg = client.poll(0.1)
                except KafkaException:
                    continue
                if msg is not None and msg.error() is None:
                    m.records.append((msg.partition(), msg.offset()))

        m.thread = threading.Thread(target=loop, daemon=True, name=f"demo-{name}")
        m.thread.start()
        self.members.append(m)
        return m

    def _stop(self, m: _DemoMember) -> None:
        m.stop.set()
        if m.thread is not None:
            m.thread.join(5)
        closer = threading.Thread(target=m.client.close, daemon=True)
        closer.start()
        closer.join(10)
        m.kind = m.kind + " (left)"

    def _table(self, title: str) -> None:
        self._log(f"\n== {title}")
        self._log(
            f"   {'member':<10}{'kind':<16}{'state':<16}{'epoch':>6}  {'records':>8}  partitions"
        )
        with self.lock:
            for m in self.members:
                parts = ",".join(str(p) for p in sorted(m.owned)) or "-"
                state = m.state() if "left" not in m.kind else "LEFT"
                self._log(
                    f"   {m.name:<10}{m.kind:<16}{state:<16}{m.epoch():>6}  "
                    f"{len(m.records):>8}  {parts}"
                )

    def _settle(self) -> None:
        deadline = time.monotonic() + self.step * 4
        while time.monotonic() < deadline:
            with self.lock:
                live = [m for m in self.members if "left" not in m.kind]
                owned = [p for m in live for p in m.owned]
            if sorted(owned) == list(range(self.partitions)) and all(m.owned for m in live):
                return
            time.sleep(0.1)

    def run(self) -> int:
        from consumer_sdk.testing import EmbeddedKafka

        with EmbeddedKafka(brokers=3, heartbeat_interval_ms=500, session_timeout_ms=6000) as kafka:
            self._log(f"EmbeddedKafka (librdkafka mock cluster) at {kafka.bootstrap_servers}")
            kafka.create_topic("orders", partitions=self.partitions)
            stop_producing = threading.Event()

            def produce() -> None:
                i = 0
                while not stop_producing.is_set():
                    batch = [f"order-{i + k}".encode() for k in range(50)]
                    self.produced += kafka.produce("orders", batch)
                    i += 50
                    time.sleep(0.1)

            producer = threading.Thread(target=produce, daemon=True)
            producer.start()
            for n in range(self.n_members):
                self._start(kafka, f"sdk-{n + 1}", "sdk")
                self._settle()
                self._table(f"sdk-{n + 1} joined")
            self._start(kafka, "ck-1", "confluent-kafka")
            self._settle()
            self._table("a confluent-kafka member (group.protocol=consumer) joined")
            kafka.push_request_errors(68, [110])  # the next heartbeat of any member
            time.sleep(self.step)
            self._settle()
            fenced = ", ".join(m.name for m in self.members if m.lost) or "a member"
            self._table(
                f"one heartbeat fenced (FENCED_MEMBER_EPOCH): {fenced} -> on_lost -> rejoin"
            )
            leaver = self.members[1] if self.n_members > 1 else self.members[0]
            self._stop(leaver)
            self._settle()
            self._table(f"{leaver.name} closed and left the group")
            stop_producing.set()
            producer.join(5)
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline:
                if len({r for m in self.members for r in m.records}) >= self.produced:
                    break
                time.sleep(0.1)
            for m in self.members:
                if "left" not in m.kind:
                    self._stop(m)
            consumed = [r for m in self.members for r in m.records]
            unique = set(consumed)
            self._log("\n== summary")
            self._log(
                f"   records produced: {self.produced}, consumed: {len(unique)} unique, "
                f"{len(consumed) - len(unique)} redelivered after fencing/leave"
            )
            for m in self.members:
                if m.first_assignment_s is not None:
                    self._log(
                        f"   {m.name}: first partitions {m.first_assignment_s * 1000:.0f} ms "
                        "after subscribe"
                    )
            missing = self.produced - len(unique)
            self._log("   no record lost" if missing == 0 else f"   {missing} records not consumed")
            return 0 if missing == 0 else 1
