"""A CI-length chaos soak with network faults: ``python -m consumer_sdk.chaos --broker netns``
(every broker and member on its own host, a network namespace: members cut from their
coordinator both ways and one way, members cut from every broker, the coordinator's node cut
from the other brokers; plus member kills, SIGSTOPs and restarts), confluent-kafka in the
group as the oracle, the checker's invariants unchanged."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from consumer_sdk.testing.netns import netns_available

pytestmark = pytest.mark.realkafka

CI_DURATION_S = 40


def test_chaos_ci_run_with_network_faults(tmp_path: Path) -> None:
    if not os.environ.get("KAFKA_HOME"):
        pytest.skip("needs KAFKA_HOME (an Apache Kafka >= 4.0 distribution)")
    why = netns_available()
    if why is not None:
        pytest.skip(why)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "consumer_sdk.chaos",
            "--broker",
            "netns",
            "--duration",
            str(CI_DURATION_S),
            "--workdir",
            str(tmp_path),
            "--seed",
            "848",
            # as in test_netfaults.py: a confluent-kafka owner seen releasing a partition
            # 11 ms before its on_revoke returned
            "--overlap-tolerance",
            "0.05",
        ],
        capture_output=True,
        text=True,
        timeout=CI_DURATION_S + 480,
        check=False,
    )
    report = result.stdout + "\n" + result.stderr[-3000:]
    assert result.returncode == 0, report
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["broker"] == "netns"
    assert summary["violations"] == {}, report
    assert summary["produced"] > 1000 and summary["lost"] == 0
    assert summary["processed_unique"] == summary["produced"]
    # every duplicate explained; librdkafka's own (early acknowledgements, rewinds) apart
    assert summary["duplicates"] == (
        summary["duplicates_explained"] + summary["duplicates_librdkafka"]
    ), report
    assert summary["overlaps"] == 0
    assert summary["committed_regressions"] == 0 and summary["uncommitted_at_end"] == 0
    assert summary["close_failures"] == 0 and summary["fault_errors"] == 0
    for action in ("net_coord", "net_coord_one_way", "net_isolate", "net_coord_cut", "kill"):
        assert summary["actions"].get(action, 0) >= 1, (action, summary["actions"])
    assert "result:                      PASS" in result.stdout
