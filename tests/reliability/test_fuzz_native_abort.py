"""Corrupted frames of every parsed response type never kill the process.

kio's native readers abort the process (a failed Rust allocation, no Python exception) on an
array whose length prefix is huge; the framing layer bounds-checks frames first. The
corruption loop runs in a child process so that an abort fails this test with its signal
instead of killing pytest.

Each run corrupts ``NATIVE_FUZZ_FRAMES`` frames per type (3,000: about 25 s) from a new seed
(``NATIVE_FUZZ_SEED`` repeats one; a failure names its seed), so runs add up to more
coverage than one fixed long run: ``NATIVE_FUZZ_FRAMES=100000`` for a long one."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.reliability.test_fuzz_responses import PARSED

ROOT = Path(__file__).resolve().parents[2]
FRAMES_PER_TYPE = int(os.environ.get("NATIVE_FUZZ_FRAMES", "3000"))
SEED = int(os.environ.get("NATIVE_FUZZ_SEED") or random.randrange(2**31))


def test_corrupted_frames_raise_protocol_error_and_never_abort() -> None:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.reliability.native_fuzz_child",
            str(SEED),
            str(FRAMES_PER_TYPE),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if proc.returncode < 0:
        died = signal.Signals(-proc.returncode).name
        raise AssertionError(
            f"the decoder process died with {died} (NATIVE_FUZZ_SEED={SEED}):\n"
            f"{proc.stderr[-3000:]}"
        )
    assert proc.returncode == 0, (
        f"NATIVE_FUZZ_SEED={SEED}\n" + proc.stdout[-2000:] + proc.stderr[-3000:]
    )
    counts = {
        name: (int(ok), int(rejected))
        for name, ok, rejected in re.findall(r"^(\S+) ok=(\d+) rejected=(\d+)$", proc.stdout, re.M)
    }
    expected = {f"{t.__name__}-v{t.__version__}" for t, _ in PARSED} | {"decode_api_versions_v0"}
    assert set(counts) == expected
    for name, (ok, rejected) in counts.items():
        assert ok + rejected == FRAMES_PER_TYPE, name
        # both outcomes occur: corruption is rejected, and unharmed frames still decode
        assert ok > 0 and rejected > 0, (name, ok, rejected, SEED)
