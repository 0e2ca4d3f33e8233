"""examples/spark_pipeline.py runs as written (against EmbeddedKafka, in the shared session)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="pyspark is not installed (pip install -e '.[spark]')")
pytestmark = pytest.mark.spark

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "spark_pipeline.py"


def test_spark_pipeline_example(spark: Any) -> None:
    spec = importlib.util.spec_from_file_location("spark_pipeline_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    summary = module.main_embedded(spark, orders=1400)
    assert summary["records"] == 1400
    assert summary["batches"] >= 3  # maxOffsetsPerTrigger=500
    assert summary["totals"]["c0"] == round(sum(i % 100 + 0.5 for i in range(0, 1400, 7)), 2)
    assert summary["lag"] == dict.fromkeys(range(4), 0)  # the group committed everything
