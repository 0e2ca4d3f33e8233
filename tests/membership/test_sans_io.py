"""The core is sans-IO: no sockets, threads, clocks, event loops or client libraries."""

from __future__ import annotations

import ast
from pathlib import Path

import consumer_sdk.membership

FORBIDDEN = {"socket", "threading", "time", "asyncio", "kio", "confluent_kafka", "selectors"}
PACKAGE_DIR = Path(consumer_sdk.membership.__file__).parent
# Modules of the SDK that themselves pull in I/O or third-party clients.
FORBIDDEN_SDK = {"consumer_sdk.errors", "consumer_sdk.protocol", "consumer_sdk.runtime"}


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            found.add(node.module)
    return found


def test_membership_sources_exist() -> None:
    names = {p.name for p in PACKAGE_DIR.glob("*.py")}
    assert {"state.py", "heartbeat.py", "reconciler.py", "events.py", "manager.py"} <= names


def test_no_io_imports_in_membership() -> None:
    offenders = []
    for path in sorted(PACKAGE_DIR.glob("*.py")):
        for module in _imports(path):
            top = module.split(".")[0]
            if top in FORBIDDEN or any(
                module == bad or module.startswith(bad + ".") for bad in FORBIDDEN_SDK
            ):
                offenders.append(f"{path.name}: {module}")
    assert offenders == []


def test_no_clock_or_sleep_calls() -> None:
    """Even without importing ``time``, nothing reads a clock (e.g. via datetime)."""
    for path in sorted(PACKAGE_DIR.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                assert node.attr not in {"monotonic", "sleep", "perf_counter", "utcnow"}, (
                    f"{path.name} reads a clock: {node.attr}"
                )
            if isinstance(node, ast.ImportFrom) and node.module == "datetime":
                raise AssertionError(f"{path.name} imports datetime")
