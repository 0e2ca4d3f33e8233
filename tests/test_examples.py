"""Examples run as written (against EmbeddedKafka)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from consumer_sdk.testing import wait_until

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
        wait_until(lambda: json.loads(get("/healthz/ready")[1])["lag_total"] == 0, 30, 0.1, "lag 0")
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
