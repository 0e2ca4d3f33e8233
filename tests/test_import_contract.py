"""The layering, checked on the import statements of the source (static, with ``ast``).

The sans-IO packages stay sans-IO: `consumer_sdk.membership` (the member core),
`consumer_sdk.coordinator` (the broker model) and `consumer_sdk.assignors` never import the wire
(`consumer_sdk.protocol`, ``kio``), the runtime, ``confluent_kafka``, sockets, threads, processes
or clocks. The coordinator stays independent of the member core it is used to check, and the
assignors depend on nothing else in the SDK. The wire layer never imports the layers above it,
and ``kio`` appears only in it (and in the test proxies that play a broker).

Every ``import`` and ``from ... import`` counts, wherever it is (inside a function, under
``TYPE_CHECKING``), and so does every import of the SDK modules a package reaches: importing
`consumer_sdk.domain` from the core would bring in whatever ``domain`` imports.
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import consumer_sdk

ROOT = Path(consumer_sdk.__file__).resolve().parent.parent

#: What no sans-IO module may import: the wire, client libraries, I/O, threads and processes,
#: clocks and sleeps, and dynamic imports (which would hide any of those from this check).
NO_IO = frozenset(
    {
        "kio",
        "confluent_kafka",
        "tenacity",
        "socket",
        "ssl",
        "select",
        "selectors",
        "asyncio",
        "http",
        "urllib",
        "threading",
        "_thread",
        "queue",
        "concurrent",
        "multiprocessing",
        "subprocess",
        "signal",
        "time",
        "datetime",
        "importlib",
    }
)

_SDK_PACKAGES = (
    "consumer_sdk.assignors",
    "consumer_sdk.chaos",
    "consumer_sdk.coordinator",
    "consumer_sdk.membership",
    "consumer_sdk.observability",
    "consumer_sdk.protocol",
    "consumer_sdk.runtime",
    "consumer_sdk.simulation",
    "consumer_sdk.testing",
)


@dataclass(frozen=True)
class Rule:
    package: str
    #: module prefixes (``a.b`` also forbids ``a.b.c``) it must not import, directly or not
    forbidden: frozenset[str]
    why: str


RULES = [
    Rule(
        "consumer_sdk.membership",
        NO_IO
        | {
            "consumer_sdk.protocol",
            "consumer_sdk.runtime",
            "consumer_sdk.coordinator",
            "consumer_sdk.simulation",
            "consumer_sdk.testing",
            "consumer_sdk.chaos",
            "consumer_sdk.observability",
            "spark_integration",
        },
        "the member core is sans-IO: time is passed in, the host does the I/O",
    ),
    Rule(
        "consumer_sdk.coordinator",
        NO_IO
        | {
            "consumer_sdk.protocol",
            "consumer_sdk.runtime",
            "consumer_sdk.membership",
            "consumer_sdk.simulation",
            "consumer_sdk.testing",
            "consumer_sdk.chaos",
            "consumer_sdk.observability",
            "spark_integration",
        },
        "the broker model is sans-IO and independent of the member core it checks",
    ),
    Rule(
        "consumer_sdk.assignors",
        NO_IO
        | {"consumer_sdk." + name for name in ("domain", "error_codes", "errors", "config")}
        | (set(_SDK_PACKAGES) - {"consumer_sdk.assignors"})
        | {"spark_integration"},
        "the assignors are pure functions over their arguments",
    ),
    Rule(
        "consumer_sdk.protocol",
        frozenset(
            {
                "consumer_sdk.runtime",
                "consumer_sdk.membership",
                "consumer_sdk.coordinator",
                "consumer_sdk.assignors",
                "consumer_sdk.simulation",
                "consumer_sdk.testing",
                "consumer_sdk.chaos",
                "consumer_sdk.observability",
                "spark_integration",
            }
        ),
        "the wire layer is the bottom layer: it knows domain types, not their users",
    ),
]

#: The only places that may import ``kio``: the wire layer, and the test proxies playing a broker.
KIO_ALLOWED = ("consumer_sdk.protocol", "consumer_sdk.testing")


# -- the checker ----------------------------------------------------------------------------


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_file(name: str, root: Path) -> Path | None:
    """The source file of module ``name`` under ``root``, or None (not ours, or no module)."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imports(path: Path, root: Path) -> Iterator[tuple[int, str]]:
    """``(line, module)`` for every module an import statement anywhere in ``path`` names.

    ``from a.b import c`` names ``a.b.c`` when that is a module, else ``a.b``.
    """
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, node.module] if node.module else anchor)
            else:
                base = node.module or ""
            names = [a.name for a in node.names]
            modules = [f"{base}.{n}" for n in names if module_file(f"{base}.{n}", root)]
            if len(modules) < len(names):
                yield node.lineno, base
            for module in modules:
                yield node.lineno, module


def _is_under(module: str, prefixes: Iterable[str]) -> str | None:
    for prefix in prefixes:
        if module == prefix or module.startswith(prefix + "."):
            return prefix
    return None


def _parents(module: str) -> list[str]:
    """The packages Python initializes before ``module``, but the root package: it runs the
    public API (`consumer_sdk.Consumer`), which a submodule does not depend on. Importing a
    name from the root package itself does count (``from consumer_sdk import Consumer``)."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(2, len(parts))]


def violations(package: str, forbidden: Iterable[str], root: Path) -> list[str]:
    """Every import of a ``forbidden`` module by ``package`` or by an SDK module it reaches,
    as ``file:line imports module (via chain)``."""
    forbidden = tuple(forbidden)
    start = module_file(package, root)
    assert start is not None, f"no package {package} under {root}"
    files = sorted(start.parent.rglob("*.py"))
    via: dict[Path, str] = {f: "" for f in files}
    queue = deque(files)
    found: list[str] = []
    while queue:
        path = queue.popleft()
        for line, module in imports(path, root):
            where = f"{path.relative_to(root)}:{line}"
            hit = _is_under(module, forbidden)
            if hit is not None:
                found.append(f"{where} imports {module}{via[path]}")
                continue
            for name in [*_parents(module), module]:
                target = module_file(name, root)
                if target is not None and target not in via:
                    via[target] = f" (reached via {where})"
                    queue.append(target)
    return found


def kio_importers(root: Path, allowed: Iterable[str]) -> list[str]:
    allowed = tuple(allowed)
    found = []
    for top in ("consumer_sdk", "spark_integration"):
        for path in sorted((root / top).rglob("*.py")):
            if _is_under(module_name(path, root), allowed):
                continue
            found += [
                f"{path.relative_to(root)}:{line} imports {module}"
                for line, module in imports(path, root)
                if _is_under(module, ["kio"])
            ]
    return found


# -- the contract ---------------------------------------------------------------------------


@pytest.mark.parametrize("rule", RULES, ids=[r.package for r in RULES])
def test_layer_imports(rule: Rule) -> None:
    found = violations(rule.package, rule.forbidden, ROOT)
    assert not found, f"{rule.package}: {rule.why}; but\n" + "\n".join(found)


def test_kio_stays_in_the_wire_layer() -> None:
    found = kio_importers(ROOT, KIO_ALLOWED)
    assert not found, "kio is the wire layer's (consumer_sdk.protocol); but\n" + "\n".join(found)


def test_sans_io_randomness_comes_from_an_injected_random() -> None:
    """No module-level ``random.x()`` (hidden global state, unreproducible in the simulator):
    only ``random.Random(...)`` instances, which the host may seed."""
    found = []
    for package in ("membership", "coordinator", "assignors"):
        for path in sorted((ROOT / "consumer_sdk" / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "random"
                    and node.func.attr != "Random"
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} random.{node.func.attr}")
                elif isinstance(node, ast.ImportFrom) and node.module == "random":
                    names = [a.name for a in node.names if a.name != "Random"]
                    if names:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} from random {names}")
    assert not found, "\n".join(found)


# -- the checker finds what it must ---------------------------------------------------------


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_checker_sees_every_kind_of_import(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "sdk/__init__.py": "import threading\n",  # the root package is not followed
            "sdk/core/__init__.py": "",
            "sdk/core/a.py": "def f():\n    import time\n    return time\n",
            "sdk/core/b.py": "from sdk.core import c\nfrom . import d\n",
            "sdk/core/c.py": "from sdk.util import helper\n",
            "sdk/core/d.py": "from ..wire.conn import Conn\n",
            "sdk/core/e.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    import sdk.runtime\n",
            "sdk/util.py": "from confluent_kafka import KafkaException as helper\n",
            "sdk/wire/__init__.py": "",
            "sdk/wire/conn.py": "import socket\nConn = socket.socket\n",
        },
    )
    found = violations("sdk.core", NO_IO | {"sdk.wire", "sdk.runtime"}, root)
    text = "\n".join(found)
    assert "sdk/core/a.py:2 imports time" in text  # inside a function
    assert "sdk/core/d.py:1 imports sdk.wire.conn" in text  # relative
    assert "sdk/core/e.py:3 imports sdk.runtime" in text  # type-checking only
    # transitive, through a sibling module and a module outside the package
    assert "sdk/util.py:1 imports confluent_kafka (reached via sdk/core/c.py:1)" in text
    assert "threading" not in text
    assert len(found) == 4, text


def test_the_checker_passes_a_clean_package(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "sdk/__init__.py": "",
            "sdk/core/__init__.py": "from sdk.core.a import x\n",
            "sdk/core/a.py": "import random\nfrom sdk import domain\nx = random.Random(1)\n",
            "sdk/domain.py": "import dataclasses\nimport uuid\n",
        },
    )
    assert violations("sdk.core", NO_IO | {"sdk.wire"}, root) == []


def test_the_checker_follows_the_root_package_only_for_its_own_names(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "sdk/__init__.py": "import threading\n",
            "sdk/core/__init__.py": "",
            "sdk/core/a.py": "import sdk.domain\nfrom sdk import domain\n",
            "sdk/core/b.py": "from sdk import Api\n",
            "sdk/domain.py": "",
        },
    )
    assert violations("sdk.core", NO_IO, root) == [
        "sdk/__init__.py:1 imports threading (reached via sdk/core/b.py:1)"
    ]


def test_the_checker_finds_kio_outside_the_wire_layer(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "consumer_sdk/protocol/m.py": "import kio\n",
            "consumer_sdk/runtime/n.py": "def f():\n    from kio.schema import x\n",
            "spark_integration/s.py": "from kio import y\n",
        },
    )
    assert kio_importers(root, ["consumer_sdk.protocol"]) == [
        "consumer_sdk/runtime/n.py:2 imports kio.schema",
        "spark_integration/s.py:1 imports kio",
    ]
