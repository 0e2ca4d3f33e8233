"""Child process of test_fuzz_native_abort: corrupts valid frames of every parsed response
type and decodes them. Run apart from pytest because kio's native readers abort the whole
process (no exception) when a length prefix makes them allocate too much.

Usage: python -m tests.reliability.native_fuzz_child SEED FRAMES_PER_TYPE
Prints one line per type ("<type> ok=<n> rejected=<n>"), exits 1 on an exception other than
ProtocolError, and dies with a signal if a native reader aborts.
"""

from __future__ import annotations

import random
import sys
import traceback
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumer_sdk.errors import ProtocolError
from consumer_sdk.protocol.framing import decode_api_versions_v0, decode_response
from tests.reliability.test_fuzz_responses import PARSED, ApiVersionsV0, frame_of

CID = 7
# Bytes that turn a length prefix into a huge count: a 5-byte varint above 2**32 (it made
# kio ask for 100+ GB and abort), the largest int32 and the int16 -2.
_HUGE = (b"\xff\xff\xff\xff\x7f", b"\x7f\xff\xff\xff", b"\xff\xfe")


def _examples(response_type: type[Any], count: int) -> list[Any]:
    found: list[Any] = []

    @settings(
        derandomize=True,
        database=None,
        max_examples=count,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.from_type(response_type))
    def collect(example: Any) -> None:
        found.append(example)

    collect()
    return found


def _corrupt(rng: random.Random, frame: bytes) -> bytes:
    f = bytearray(frame)
    mode = rng.random()
    if mode < 0.5:  # random byte flips after the correlation id
        for _ in range(rng.randint(1, 4)):
            f[rng.randint(4, len(f) - 1)] = rng.randint(0, 255)
    elif mode < 0.9:  # a huge length at a random position
        huge = rng.choice(_HUGE)
        at = rng.randint(4, len(f) - 1)
        f[at : at + len(huge)] = huge
    cut = rng.randint(4, len(f)) if rng.random() < 0.3 else len(f)
    return bytes(f[:cut])


def run(seed: int, per_type: int) -> int:
    rng = random.Random(seed)
    targets: list[tuple[str, type[Any], Callable[[bytes], Any]]] = [
        (
            f"{t.__name__}-v{t.__version__}",
            t,
            lambda f, t=t: decode_response(f, t, CID),
        )
        for t, _ in PARSED
    ]
    targets.append(("decode_api_versions_v0", ApiVersionsV0, decode_api_versions_v0))
    for name, response_type, decode in targets:
        # Small frames keep the run short (kio decoding a frame costs per byte) without
        # losing shapes: hypothesis also yields nested, tagged and null-valued examples.
        frames = sorted({frame_of(x, CID) for x in _examples(response_type, 40)}, key=len)
        frames = [f for f in frames if len(f) <= 300] or frames[:1]
        ok = rejected = 0
        for _ in range(per_type):
            frame = _corrupt(rng, rng.choice(frames))
            try:
                decode(frame)
                ok += 1
            except ProtocolError:
                rejected += 1
            except Exception:
                print(f"{name}: {frame.hex()}", flush=True)
                traceback.print_exc()
                return 1
        print(f"{name} ok={ok} rejected={rejected}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(run(int(sys.argv[1]), int(sys.argv[2])))
