"""The docs build (strict: broken links fail) and the generated pages match the code."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_generated_reference_pages_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen.py"), "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once with ``mkdocs build --strict`` (warnings and broken links fail)."""
    mkdocs = shutil.which("mkdocs", path=str(Path(sys.executable).parent)) or shutil.which("mkdocs")
    if mkdocs is None:
        pytest.fail("mkdocs is not installed: install the 'dev' extra")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [mkdocs, "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return out


def _text(page: Path) -> str:
    """A page's visible text (tags dropped, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


def test_docs_build_strictly(site: Path) -> None:
    assert (site / "index.html").exists()


def test_api_reference_is_generated_from_the_docstrings(site: Path) -> None:
    text = _text(site / "api" / "index.html")
    from consumer_sdk import Consumer, GroupMember

    for cls in (Consumer, GroupMember):
        for name, member in vars(cls).items():
            if not name.startswith("_") and callable(member):
                assert name in text, f"the API page lacks {cls.__name__}.{name}"
    first_line = (Consumer.__doc__ or "").strip().splitlines()[0].replace("``", "")
    assert first_line in text, "the Consumer docstring is not rendered"
    assert "<table>" in (site / "api" / "index.html").read_text(), "CloseOption's table"


def test_no_raw_roles_or_table_debris_in_the_site(site: Path) -> None:
    problems = []
    for page in sorted(site.rglob("*.html")):
        text = _text(page)
        for pattern in (r":(class|meth|func|mod|attr|data|exc|obj):`", r"^\s*={4,}(\s+={4,})*\s*$"):
            for match in re.finditer(pattern, text, re.MULTILINE):
                problems.append(f"{page.relative_to(site)}: {match.group(0).strip()!r}")
    assert not problems, "\n".join(problems[:20])


def test_docstrings_use_markdown_not_sphinx_roles() -> None:
    roles = re.compile(r":(?:py:)?(?:class|meth|func|mod|attr|data|exc|obj):`")
    found = [
        f"{path.relative_to(ROOT)}:{lineno}"
        for package in ("consumer_sdk", "spark_integration")
        for path in sorted((ROOT / package).rglob("*.py"))
        for lineno, line in enumerate(path.read_text().splitlines(), 1)
        if roles.search(line)
    ]
    assert not found, f"Sphinx roles render raw in the Markdown docs: {found}"


def test_one_nav_entry_per_page() -> None:
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml may hold !!python/name tags (plugins); the nav needs none of them.
    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)

    def pages(nav: list[object]) -> list[str]:
        out: list[str] = []
        for entry in nav:
            value = next(iter(entry.values())) if isinstance(entry, dict) else entry
            out += pages(value) if isinstance(value, list) else [str(value)]
        return out

    listed = pages(config["nav"])
    assert len(listed) == len(set(listed)), f"a page is listed twice: {listed}"
    on_disk = {p.name for p in (ROOT / "docs").glob("*.md")}
    assert set(listed) == on_disk, f"nav vs docs/: {sorted(set(listed) ^ on_disk)}"


def _table(page: str, *headers: str) -> list[list[str]]:
    """The rows of the Markdown table whose header starts with ``| header | header |``."""
    lines = (ROOT / "docs" / page).read_text().splitlines()
    head = "| " + " | ".join(headers) + " |"
    start = next(i for i, line in enumerate(lines) if line.startswith(head))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().strip("`") for cell in line.strip("|").split("|")])
    return rows


def test_metrics_page_matches_the_code() -> None:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from consumer_sdk import GroupMember
    from consumer_sdk.membership.metrics import GROUP, MembershipMetrics
    from consumer_sdk.observability.otel import instrument
    from consumer_sdk.observability.samples import export_name, metric_keys

    rows = _table("metrics.md", "Metric", "OpenTelemetry instrument")
    documented = {row[0]: row[1] for row in rows}
    assert len(documented) == len(rows), "a metric is listed twice"
    code = set(MembershipMetrics().snapshot(0))
    assert set(documented) == code, f"page vs code: {sorted(set(documented) ^ code)}"
    assert all(row[2] for row in rows), "every metric has a meaning"

    member = GroupMember({"bootstrap.servers": "127.0.0.1:9", "group.id": "metrics-page"})
    try:
        assert set(member.metrics()) == code
        handle = instrument(member, meter_provider=MeterProvider([InMemoryMetricReader()]))
        instruments = {g.name for g in handle._gauges}
        consumer_rows = _table("metrics.md", "Metric", "Group")
        more = {(row[1], row[0]) for row in consumer_rows}
        assert more == set(metric_keys()) - {(GROUP, name) for name in code}
        assert all(row[2] == export_name(row[1], row[0]) and row[3] for row in consumer_rows)
        otel_more = {export_name(group, name, ".") for group, name in more}
        assert set(documented.values()) | otel_more == instruments
        handle.uninstrument()
        fields = {row[0] for row in _table("metrics.md", "Field")}
        assert fields == set(member.group_stats()), sorted(fields ^ set(member.group_stats()))
    finally:
        member.close(timeout=2.0)
