"""The throughput A/B's arithmetic and its docs section (`bench.throughput`): pure functions,
no broker (the A/B itself needs a real cluster: `python -m bench.throughput --broker real
--against REV`)."""

from __future__ import annotations

from typing import Any

from bench import convergence, throughput
from bench.__main__ import AB_BEGIN, AB_END, REAL_BEGIN, REAL_END, _real_section
from bench.__main__ import _with_real_section as with_section


def _result() -> dict[str, Any]:
    # three rounds; rates (wall, cpu, thread, chunk ns per record) per reader
    rates = {
        "consume": {
            "raw": [(100.0, 80.0, 200.0, 500.0)] * 3,
            "head": [(90.0, 80.0, 100.0, 1000.0), (100.0, 80.0, 200.0, 500.0), (80.0, 40, 50, 250)],
            "rev": [(100.0, 40.0, 100.0, 1000.0)] * 3,
        }
    }
    extra: dict[str, Any] = {
        "rev": "r",
        "rev_commit": "a" * 40,
        "head_commit": "b" * 40,
        "nodes": 3,
    }
    extra.update(records=10, record_bytes=100, partitions=6, rounds=3, config={}, wall_s=60.0)
    return throughput._summary(rates, ("raw", "head", "rev"), {**extra, "loads": [1.0, 2.0]})


def test_summary_takes_the_median_of_the_rounds_ratios() -> None:
    out = _result()
    wall = out["consume"]["wall"]
    assert wall["head/raw"]["all"] == [0.9, 1.0, 0.8]
    assert wall["head/raw"]["median"] == 0.9
    assert wall["head"]["median"] == 90.0
    # the chunk measure is ns per record: turned into records per second, higher is better
    chunk = out["consume"]["chunk"]
    assert chunk["raw"]["median"] == 2e6
    assert chunk["head/rev"]["all"] == [1.0, 2.0, 4.0]
    lo, hi = wall["head/raw"]["ci95"]
    assert 0.8 <= lo <= 0.9 <= hi <= 1.0
    assert "rawcfg/raw" not in wall  # only pairs of readers that ran


def test_bootstrap_ci_of_a_constant_is_that_constant() -> None:
    assert convergence.bootstrap_ci(5, lambda picks: 2.0) == (2.0, 2.0)
    ratio = convergence.bootstrap_ratio_ci([2.0] * 4, [1.0] * 4)
    assert ratio == (2.0, 2.0)


def test_the_ab_section_replaces_its_own_and_leaves_the_real_broker_section() -> None:
    real = f"{REAL_BEGIN}\nreal\n{REAL_END}"
    doc = f"# Benchmarks\n\n{real}\n"
    section = throughput.render_ab([_result()], "found")
    assert section.startswith(AB_BEGIN) and section.endswith(AB_END)
    once = with_section(doc, section, AB_BEGIN, AB_END)
    twice = with_section(once, section.replace("found", "again"), AB_BEGIN, AB_END)
    assert _real_section(twice) == real
    assert _real_section(twice, AB_BEGIN, AB_END).endswith("again\n\n" + AB_END)
    assert twice.count(AB_BEGIN) == 1
