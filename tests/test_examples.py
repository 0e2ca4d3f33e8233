"""Examples run as written (against EmbeddedKafka)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from consumer_sdk import Consumer, TopicPartition
from consumer_sdk.testing import EmbeddedKafka, wait_until

ROOT = Path(__file__).resolve().parent.parent


def test_revoke_time_commits_example() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "revoke_time_commits.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "processed 500 records" in result.stdout
    assert "committed" in result.stdout


def test_health_service_example_probes_metrics_and_sigterm() -> None:
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "examples" / "health_service.py"), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("serving on http://127.0.0.1:"), line
        base = line.split()[-1]

        def get(path: str) -> tuple[int, str]:
            try:
                with urllib.request.urlopen(base + path, timeout=10) as response:
                    return response.status, response.read().decode()
            except urllib.error.HTTPError as exc:
                return exc.code, exc.read().decode()

        assert get("/healthz/live")[0] == 200
        wait_until(lambda: get("/healthz/ready")[0] == 200, 30, 0.1, "ready")

        def stable() -> bool:  # ready already while the first assignment is reconciled
            status, body = get("/healthz/ready")
            health = json.loads(body)
            assert status == 200 and health["in_group"], health
            return health["state"] == "STABLE" and len(health["assignment"]) == 3

        wait_until(stable, 30, 0.1, "STABLE with the topic's 3 partitions")

        def caught_up() -> bool:
            health = json.loads(get("/healthz/ready")[1])
            return bool(health["lag_total"] == 0 and health["lag_unknown"] == 0)

        wait_until(caught_up, 30, 0.1, "lag 0 on every partition")
        status, text = get("/metrics")
        assert status == 200
        assert 'kafka_consumer_coordinator_assigned_partitions{client_id="health-service"' in text
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err[-2000:]
        assert "closed after 100 records" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_asyncio_service_example_shuts_down_gracefully_on_sigterm(
    embedded_kafka: EmbeddedKafka,
) -> None:
    """The asyncio service processes every record, and on SIGTERM commits them all and leaves
    the group (its member ends UNSUBSCRIBED) before it exits 0."""
    topic = "example-aio-orders"
    embedded_kafka.create_topic(topic, partitions=3)
    embedded_kafka.produce(topic, [f"order-{i}".encode() for i in range(500)])
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "examples" / "asyncio_service.py"),
            embedded_kafka.bootstrap_servers,
            topic,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "processed 500 records" in line:
                break
        assert any("processed 500 records" in line for line in lines), "".join(lines)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err[-2000:]
    assert "closed: member unsubscribed after the leave" in out
    with Consumer(
        {
            "bootstrap.servers": embedded_kafka.bootstrap_servers,
            "group.id": "example-asyncio-service",
        }
    ) as check:
        committed = check.committed([TopicPartition(topic, p) for p in range(3)])
    assert sum(tp.offset for tp in committed) == 500
