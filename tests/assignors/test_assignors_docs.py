"""The usage example in docs/assignors.md runs and prints what the page says."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "assignors.md"


def test_preview_example_prints_the_documented_output() -> None:
    text = DOC.read_text(encoding="utf-8")
    blocks = re.findall(r"```(\w*)\n(.*?)```", text, flags=re.S)
    code = next(body for lang, body in blocks if lang == "python" and "explain(" in body)
    expected = next(body for lang, body in blocks if lang == "" and "members," in body)
    out = io.StringIO()
    namespace: dict[str, object] = {}
    with contextlib.redirect_stdout(out):
        exec(compile(code, str(DOC), "exec"), namespace)
    assert out.getvalue() == expected
    # The comment after the first assign() shows the actual result.
    shown = re.search(r"current = assign\(.*?\)\n((?:# .*\n)+)", code)
    assert shown is not None
    literal = "".join(line[2:] for line in shown.group(1).splitlines(keepends=True))
    assert eval(literal) == namespace["current"]
