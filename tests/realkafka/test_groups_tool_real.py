"""``consumer-sdk groups list|describe|watch`` on the real broker, with an SDK member and a
confluent-kafka member in one KIP-848 group."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import uuid
from typing import Any

import confluent_kafka
import pytest

from consumer_sdk.cli import main
from consumer_sdk.testing import KafkaCluster, wait_until
from tests.runtime.harness import Member, Timeline

pytestmark = pytest.mark.realkafka

PER_PARTITION = 30


class _CkMember:
    """confluent-kafka's own KIP-848 consumer, polled by a thread."""

    def __init__(self, servers: str, group: str, topic: str) -> None:
        self.consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": servers,
                "group.id": group,
                "group.protocol": "consumer",
                "client.id": "ck-svc",
                "auto.offset.reset": "earliest",
                "auto.commit.interval.ms": 200,
            }
        )
        self.consumer.subscribe([topic])
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            self.consumer.poll(0.1)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.consumer.close()


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    assert main(["groups", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_groups_list_describe_watch(
    real_kafka: KafkaCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    servers = real_kafka.bootstrap_servers
    topic, group = f"gt-{uuid.uuid4().hex[:8]}", f"gt-g-{uuid.uuid4().hex[:6]}"
    real_kafka.create_topic(topic, partitions=4)
    for p in range(4):
        real_kafka.produce(topic, [f"{p}-{i}" for i in range(PER_PARTITION)], partition=p)
    sdk = Member(
        "sdk",
        {
            "bootstrap.servers": servers,
            "group.id": group,
            "client.id": "sdk-svc",
            "auto.offset.reset": "earliest",
            "auto.commit.interval.ms": 200,
        },
        [topic],
        Timeline(),
    )
    ck = _CkMember(servers, group, topic)
    watcher: subprocess.Popen[str] | None = None
    try:

        def settled() -> Any:
            # Before the first heartbeat the group does not exist (exit code 1).
            if main(["groups", "describe", group, "-b", servers, "--json"]) != 0:
                capsys.readouterr()
                return False
            view = json.loads(capsys.readouterr().out)
            members = view["members"]
            return (
                len(members) == 2
                and all(len(m["assignment"]) == 2 for m in members)
                and all(m["assignment"] == m["target_assignment"] for m in members)
                and view["lag_total"] == 0
                and all(p["committed"] == PER_PARTITION for p in view["partitions"])
                and view
            )

        view = wait_until(settled, 60, 0.3, "both members own 2 partitions, lag 0")
        assert view["state"] == "Stable" and view["group_id"] == group
        by_client = {m["client_id"]: m for m in view["members"]}
        assert set(by_client) == {"sdk-svc", "ck-svc"}
        assert by_client["sdk-svc"]["member_id"] == sdk.consumer.member_id
        for m in by_client.values():
            assert m["member_epoch"] > 0 and m["client_host"]
            assert m["subscribed_topics"] == [topic]
        owners = {(p["topic"], p["partition"]): p["owner"] for p in view["partitions"]}
        assert set(owners) == {(topic, p) for p in range(4)}
        assert {tuple(p) for p in by_client["sdk-svc"]["assignment"]} == {
            k for k, v in owners.items() if v == sdk.consumer.member_id
        }
        assert all(p["end_offset"] == PER_PARTITION for p in view["partitions"])

        listed = _cli(capsys, "list", "-b", servers, "--json")
        assert {"group_id": group, "type": "consumer"}.items() <= next(
            g for g in listed if g["group_id"] == group
        ).items()
        classic = _cli(capsys, "list", "-b", servers, "--json", "--type", "classic")
        assert group not in {g["group_id"] for g in classic}

        assert main(["groups", "describe", group, "-b", servers]) == 0
        text = capsys.readouterr().out
        assert "sdk-svc" in text and "ck-svc" in text and f"group {group}: Stable" in text

        # watch: the confluent-kafka member leaves, the SDK member takes its partitions.
        lines: queue.Queue[str] = queue.Queue()
        watch = ["groups", "watch", group, "-b", servers, "--json", "--interval", "0.2"]
        watcher = subprocess.Popen(
            [sys.executable, "-m", "consumer_sdk.cli", *watch, "--duration", "90"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        stdout = watcher.stdout
        assert stdout is not None
        threading.Thread(target=lambda: [lines.put(x) for x in stdout], daemon=True).start()
        changes: list[dict[str, Any]] = []

        def seen(kind: str, client: str, after: int = 0) -> int:
            """1 + the index of the first such change from ``after`` on, else 0."""
            while not lines.empty():
                changes.append(json.loads(lines.get()))
            for i, c in enumerate(changes[after:], after):
                if c["kind"] == kind and c["client_id"] == client:
                    return i + 1
            return 0

        wait_until(lambda: seen("joined", "ck-svc") and seen("joined", "sdk-svc"), 30, 0.1)
        ck_parts = {tuple(p) for p in by_client["ck-svc"]["assignment"]}
        ck.close()
        left = wait_until(lambda: seen("left", "ck-svc"), 60, 0.1, "ck-svc left")
        gained = wait_until(lambda: seen("gained", "sdk-svc", left), 60, 0.1, "sdk-svc gains")
        assert {tuple(p) for p in changes[gained - 1]["partitions"]} == ck_parts
        assert seen("epoch", "sdk-svc", left), "\n".join(
            f"{c['kind']} {c['client_id']} {c['detail']}" for c in changes
        )
        assert len(sdk.owned) == 4
    finally:
        if watcher is not None:
            watcher.terminate()
            watcher.communicate(timeout=10)
        if not ck.stop.is_set():
            ck.close()
        sdk.stop()
