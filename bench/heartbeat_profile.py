"""Heartbeat work counted, not timed: Python calls and bytecodes per heartbeat on each thread.

N ``GroupMember``s on EmbeddedKafka as in `bench.heartbeat_cost` (heartbeat interval 1 s,
each polled with ``poll(0)`` every 200 ms). Once they are stable and have polled steadily for
a while, ``sys.settrace`` counts opcode events and Python calls per function on the network
loop's thread and on the application's (the polling) thread over a window, divided by the
heartbeats sent in it; ``gc.callbacks`` times the collections in the same window. Unlike CPU
time, these counts do not move with the machine's load, except the loop's work per wake-up
(`WAKE_UP_WORK`, listed apart from the members' own path: one wake-up serves every member
due then, so its share per heartbeat follows the batching). Tracing slows both threads, so
the window's heartbeat count is a little lower than untraced.

    python -m bench.heartbeat_profile [--members 100] [--window 8] [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import gc
import sys
import threading
import time
from types import CodeType, FrameType
from typing import Any

from bench.heartbeat_cost import POLL_EVERY_S, _FacadeMember, _poll_round, close_group

Tracer = Any  # sys.settrace's callback (typeshed types it loosely)

#: The loop thread's work per wake-up rather than per heartbeat: one wake-up reads and writes
#: for every member due then, so its share per heartbeat moves with the batching (the load,
#: the timers' spread) while the members' own path does not.
WAKE_UP_WORK = frozenset(
    {
        "NetworkLoop._run_once",
        "NetworkLoop._update_interest",
        "NetworkLoop._drain_wakeups",
        "MuxConnection.on_readable",
        "MuxConnection._deliver",
        "MuxConnection.flush",
        "MuxConnection.wants_write",
        "FrameReader.feed",
    }
)


def _tracer(
    ops: collections.Counter[CodeType],
    calls: collections.Counter[CodeType],
    skip: CodeType | None = None,
) -> Tracer:
    """Counts opcodes and calls per code object; ``skip``'s own frames are not counted (the
    functions they call are)."""

    def local(frame: FrameType, event: str, arg: Any) -> Tracer:
        if event == "opcode":
            ops[frame.f_code] += 1
        return local

    def on_call(frame: FrameType, event: str, arg: Any) -> Tracer:
        if event != "call" or frame.f_code is skip:
            return None
        frame.f_trace_opcodes = True
        calls[frame.f_code] += 1
        return local

    return on_call


def measure(members: int = 100, window_s: float = 8.0, settle_s: float = 5.0) -> dict[str, Any]:
    """Counts per heartbeat: ``{"heartbeats", "loop", "app", "gc"}``, each thread's entry
    ``{"calls", "bytecodes", "functions": [(name, bytecodes, calls), ...]}`` (per heartbeat,
    most bytecodes first), and ``gc`` the collections in the window."""
    from consumer_sdk.runtime.netloop import NetworkLoop
    from consumer_sdk.testing import EmbeddedKafka

    collections_seen: list[tuple[int, float]] = []
    started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            collections_seen.append((info["generation"], time.perf_counter() - started[0]))

    loop_ops: collections.Counter[CodeType] = collections.Counter()
    loop_calls: collections.Counter[CodeType] = collections.Counter()
    app_ops: collections.Counter[CodeType] = collections.Counter()
    app_calls: collections.Counter[CodeType] = collections.Counter()
    with EmbeddedKafka(brokers=1, heartbeat_interval_ms=1000, session_timeout_ms=30000) as kafka:
        kafka.create_topic("hb", partitions=max(members, 1))
        group = [_FacadeMember(kafka.bootstrap_servers) for _ in range(members)]
        try:
            deadline = time.monotonic() + 60 + members * 0.1
            while time.monotonic() < deadline and not all(m.stable() for m in group):
                for m in group:
                    m.poll()
                time.sleep(0.05)
            polls = _poll_round(group, "loop")  # as bench.heartbeat_cost polls them
            settle_end = time.monotonic() + settle_s
            while time.monotonic() < settle_end:
                tick = time.monotonic()
                polls()
                time.sleep(max(0.0, POLL_EVERY_S - (time.monotonic() - tick)))
            beats0 = sum(m.heartbeats() for m in group)
            loop = NetworkLoop._shared
            assert loop is not None
            on, off = threading.Event(), threading.Event()

            def trace_loop() -> None:
                sys.settrace(_tracer(loop_ops, loop_calls))
                on.set()

            def untrace_loop() -> None:
                sys.settrace(None)
                off.set()

            loop.call_soon(trace_loop)
            on.wait()
            gc.callbacks.append(on_gc)
            app_tracer = _tracer(app_ops, app_calls, polls.__code__)  # (the round: benchmark's)
            end = time.monotonic() + window_s
            while time.monotonic() < end:
                tick = time.monotonic()
                sys.settrace(app_tracer)
                polls()
                sys.settrace(None)
                time.sleep(max(0.0, POLL_EVERY_S - (time.monotonic() - tick)))
            gc.callbacks.remove(on_gc)
            loop.call_soon(untrace_loop)
            off.wait()
            beats = sum(m.heartbeats() for m in group) - beats0
        finally:
            close_group(group)

    def per_beat(
        ops: collections.Counter[CodeType], calls: collections.Counter[CodeType]
    ) -> dict[str, Any]:
        n = max(beats, 1)
        wake = [c for c in ops if c.co_qualname in WAKE_UP_WORK]
        runs = [c for c in calls if c.co_qualname == "NetworkLoop._run_once"]
        return {
            "calls": sum(calls.values()) / n,
            "bytecodes": sum(ops.values()) / n,
            "wake_up_calls": sum(calls[c] for c in wake) / n,
            "wake_up_bytecodes": sum(ops[c] for c in wake) / n,
            "wake_ups": sum(calls[c] for c in runs) / n,
            "functions": [
                (
                    f"{code.co_qualname} ({code.co_filename.rsplit('/', 1)[-1]})",
                    k / n,
                    calls[code] / n,
                )
                for code, k in ops.most_common()
            ],
        }

    return {
        "members": members,
        "heartbeats": beats,
        "loop": per_beat(loop_ops, loop_calls),
        "app": per_beat(app_ops, app_calls),
        "gc": collections_seen,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--members", type=int, default=100)
    parser.add_argument("--window", type=float, default=8.0, help="seconds traced")
    parser.add_argument("--top", type=int, default=25, help="functions listed per thread")
    args = parser.parse_args()
    result = measure(args.members, args.window)
    print(f"{result['members']} members, {result['heartbeats']:.0f} heartbeats traced")
    for thread in ("loop", "app"):
        row = result[thread]
        print(
            f"== {thread} thread: {row['bytecodes']:.0f} bytecodes, {row['calls']:.1f} Python "
            "calls per heartbeat"
        )
        if thread == "loop":
            print(
                f"   members' path {row['bytecodes'] - row['wake_up_bytecodes']:.0f} bytecodes, "
                f"{row['calls'] - row['wake_up_calls']:.1f} calls; the loop's wake-ups "
                f"({row['wake_ups']:.2f} per heartbeat) {row['wake_up_bytecodes']:.0f} "
                f"bytecodes, {row['wake_up_calls']:.1f} calls"
            )
        for name, bytecodes, calls in row["functions"][: args.top]:
            print(f"{bytecodes:8.1f} bytecodes {calls:6.2f} calls  {name}")
    seen = result["gc"]
    print(
        f"gc: {len(seen)} collections in the window, {sum(s for _, s in seen) * 1000:.2f} ms "
        f"(generations {sorted({g for g, _ in seen})})"
    )


if __name__ == "__main__":
    main()
