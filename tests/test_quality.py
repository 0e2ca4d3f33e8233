"""The code stays ruff- and mypy-clean (the tools come with the `dev` extra)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool(name: str) -> str:
    path = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: install the 'dev' extra (pip install -e '.[dev]')")
    return path


def test_ruff_clean() -> None:
    result = subprocess.run(
        [_tool("ruff"), "check", "consumer_sdk", "spark_integration", "tests", "bench"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_ruff_format_clean() -> None:
    """Formatting is ruff's, with no per-line exceptions (`# fmt: skip`)."""
    paths = ["consumer_sdk", "spark_integration", "tests", "bench", "examples", "docs"]
    result = subprocess.run(
        [_tool("ruff"), "format", "--check", *paths],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    skips = [
        f"{path.relative_to(ROOT)}:{number}"
        for top in paths
        for path in sorted((ROOT / top).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if line.rstrip().endswith("# fmt" + ": skip")
    ]
    assert not skips, f"per-line format exceptions: {skips}"


def test_mypy_clean() -> None:
    result = subprocess.run([_tool("mypy")], cwd=ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
