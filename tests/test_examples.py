"""Examples run as written (against EmbeddedKafka)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

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
