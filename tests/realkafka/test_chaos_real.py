"""A CI-length chaos soak on a real 3-node Apache Kafka: ``python -m consumer_sdk.chaos
--broker real`` (members SIGKILLed, SIGSTOPped past the session and restarted; the
coordinator's node stopped; a node SIGKILLed and one SIGSTOPped past the session timeout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CI_DURATION_S = 45


def test_chaos_ci_run_on_a_real_cluster(tmp_path: Path) -> None:
    if not os.environ.get("KAFKA_HOME"):
        pytest.skip(
            "chaos on a real cluster needs KAFKA_HOME (an Apache Kafka >= 4.0 distribution)"
        )
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "consumer_sdk.chaos",
            "--broker",
            "real",
            "--duration",
            str(CI_DURATION_S),
            "--workdir",
            str(tmp_path),
            "--seed",
            "848",
        ],
        capture_output=True,
        text=True,
        timeout=CI_DURATION_S + 420,
        check=False,
    )
    report = result.stdout + "\n" + result.stderr[-3000:]
    assert result.returncode == 0, report
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["broker"] == "real"
    assert summary["violations"] == {}, report
    assert summary["produced"] > 1000 and summary["lost"] == 0
    assert summary["processed_unique"] == summary["produced"]
    # every duplicate explained; librdkafka's own (early acknowledgements, rewinds) apart
    assert summary["duplicates"] == (
        summary["duplicates_explained"] + summary["duplicates_librdkafka"]
    ), report
    assert summary["overlaps"] == 0 and summary["overlaps_mock_readoption"] == 0
    assert summary["committed_regressions"] == 0 and summary["uncommitted_at_end"] == 0
    assert summary["close_failures"] == 0 and summary["fault_errors"] == 0
    for action in ("kill", "stop", "restart", "coordinator", "node_kill", "node_pause"):
        assert summary["actions"].get(action, 0) >= 1, (action, summary["actions"])
    assert "result:                      PASS" in result.stdout
