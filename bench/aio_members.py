"""Many members on one process, the asyncio face against the sync one: CPU per thread and work
counted per heartbeat.

N members (membership only) in one group on EmbeddedKafka, heartbeat interval 1 s, as in
`bench.aio` (``members``) and `bench.heartbeat_cost` (``loop``):

- ``aio``: N ``AIOGroupMember``\\ s on one event loop, a task each looping ``await poll(1.0)``;
- ``sync``: N ``GroupMember``\\ s polled with ``poll(0)`` every 200 ms from one thread.

Once all are stable, each thread's CPU over the window is read from
``/proc/self/task/<tid>/schedstat`` (the application's thread: the event loop or the polling
thread; the shared network loop's thread; the rest of the process), and the time cyclic GC
passes took (``gc.callbacks``; a pass runs on whichever thread allocates at the time).
With ``--trace`` the window is counted instead of timed: ``sys.settrace`` counts Python calls
and bytecodes per function on both threads, per heartbeat sent in the window (counts do not
move with the machine's load; tracing slows both threads).

One kind per process, so runs can be interleaved and A/B'd against another tree::

    python -m bench.aio_members --kind aio [--members 1000] [--window 10] [--trace]
    PYTHONPATH=/work/main python bench/aio_members.py --kind aio   # another tree's SDK
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

POLL_EVERY_S = 0.2  # the sync members' poll(0) period (as bench.heartbeat_cost)

Tracer = Any  # sys.settrace's callback (typeshed types it loosely)
Counts = collections.Counter[CodeType]


def _thread_cpu() -> dict[int, float]:
    """CPU seconds of each of this process's threads, by native id (schedstat: nanoseconds on
    a CPU, finer than the stat file's clock ticks)."""
    out: dict[int, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0]) / 1e9
        except OSError:
            continue
    return out


def _tracer(ops: Counts, calls: Counts) -> Tracer:
    def local(frame: FrameType, event: str, arg: Any) -> Tracer:
        if event == "opcode":
            ops[frame.f_code] += 1
        return local

    def on_call(frame: FrameType, event: str, arg: Any) -> Tracer:
        if event != "call":
            return None
        frame.f_trace_opcodes = True
        calls[frame.f_code] += 1
        return local

    return on_call


class _Window:
    """CPU per thread (or traced counts) over a window: started and ended on the application's
    thread; the network loop's thread is traced through its own ``call_soon``."""

    def __init__(self, trace: bool) -> None:
        from consumer_sdk.runtime.netloop import NetworkLoop

        loop = NetworkLoop._shared
        assert loop is not None and loop._thread is not None
        self._netloop = loop
        self.net_tid = loop._thread.native_id
        self.app_tid = threading.get_native_id()
        self.trace = trace
        self.counts: dict[str, tuple[Counts, Counts]] = {
            "app": (collections.Counter(), collections.Counter()),
            "loop": (collections.Counter(), collections.Counter()),
        }

    def _on_loop(self, fn: Callable[[], None]) -> None:
        done = threading.Event()

        def run() -> None:
            fn()
            done.set()

        self._netloop.call_soon(run)
        done.wait(10)

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.gc_s += time.perf_counter() - self._gc_started

    def start(self) -> None:
        self.gc_s = self._gc_started = 0.0
        self.gc0 = [g["collections"] for g in gc.get_stats()]
        gc.callbacks.append(self._on_gc)
        if self.trace:
            tracer = _tracer(*self.counts["loop"])
            self._on_loop(lambda: sys.settrace(tracer))
            sys.settrace(_tracer(*self.counts["app"]))
        self.cpu0 = _thread_cpu()
        self.t0 = time.monotonic()

    def stop(self) -> dict[str, Any]:
        wall = time.monotonic() - self.t0
        cpu = _thread_cpu()
        gc.callbacks.remove(self._on_gc)
        passes = [g["collections"] - n for g, n in zip(gc.get_stats(), self.gc0, strict=True)]
        if self.trace:
            sys.settrace(None)
            self._on_loop(lambda: sys.settrace(None))
        used = {tid: s - self.cpu0.get(tid, 0.0) for tid, s in cpu.items()}
        app = used.pop(self.app_tid, 0.0)
        net = used.pop(self.net_tid or -1, 0.0)
        return {
            "wall_s": wall,
            "app": app / wall,
            "loop": net / wall,
            "other": sum(used.values()) / wall,
            "gc": self.gc_s / wall,  # cyclic GC passes, on whichever thread ran them
            "gc_passes": passes,  # per generation, in the window
        }


def _per_beat(ops: Counts, calls: Counts, beats: float, top: int) -> dict[str, Any]:
    n = max(beats, 1.0)
    return {
        "calls": sum(calls.values()) / n,
        "bytecodes": sum(ops.values()) / n,
        "functions": [
            (
                f"{code.co_qualname} ({code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno})",
                k / n,
                calls[code] / n,
            )
            for code, k in ops.most_common(top)
        ],
    }


async def _aio(
    bootstrap: str, count: int, window_s: float, trace: bool, extra: dict[str, Any]
) -> dict[str, Any]:
    from bench.aio import start_members
    from consumer_sdk import MemberState

    members, stop, tasks, _ = await start_members(bootstrap, count, extra)
    window = _Window(trace)
    beats0 = sum(m.metrics()["heartbeat-total"] for m in members)
    window.start()
    await asyncio.sleep(window_s)
    shares = window.stop()
    beats = sum(m.metrics()["heartbeat-total"] for m in members) - beats0
    stable = sum(m.state is MemberState.STABLE for m in members)
    stop.set()
    await asyncio.gather(*tasks)
    await asyncio.gather(*(m.close(timeout=2) for m in members))
    return {"shares": shares, "beats": beats, "stable": stable, "counts": window.counts}


def _sync(
    bootstrap: str, count: int, window_s: float, trace: bool, extra: dict[str, Any]
) -> dict[str, Any]:
    import functools

    from consumer_sdk import GroupMember, MemberState

    group = f"sync-hb-{uuid.uuid4().hex[:6]}"
    members = [
        GroupMember({"bootstrap.servers": bootstrap, "group.id": group, **extra})
        for _ in range(count)
    ]
    for m in members:
        m.subscribe(["aio-hb"])
    polls = [functools.partial(m.poll, 0) for m in members]

    def poll_round() -> None:
        tick = time.monotonic()
        for poll in polls:
            poll()
        time.sleep(max(0.0, POLL_EVERY_S - (time.monotonic() - tick)))

    deadline = time.monotonic() + 60 + count * 0.1
    while time.monotonic() < deadline and not all(m.state is MemberState.STABLE for m in members):
        poll_round()
    settle = time.monotonic() + 2.0
    while time.monotonic() < settle:
        poll_round()
    window = _Window(trace)
    beats0 = sum(m.metrics()["heartbeat-total"] for m in members)
    window.start()
    end = time.monotonic() + window_s
    while time.monotonic() < end:
        poll_round()
    shares = window.stop()
    beats = sum(m.metrics()["heartbeat-total"] for m in members) - beats0
    stable = sum(m.state is MemberState.STABLE for m in members)
    closers = [
        threading.Thread(target=m.close, kwargs={"timeout": 2}, daemon=True) for m in members
    ]
    for t in closers:
        t.start()
    for t in closers:
        t.join(30)
    return {"shares": shares, "beats": beats, "stable": stable, "counts": window.counts}


def measure(
    kind: str, members: int, window_s: float, trace: bool, top: int, auto_commit: bool = True
) -> dict[str, Any]:
    from consumer_sdk.testing import EmbeddedKafka

    load = os.getloadavg()[0]
    extra = {} if auto_commit else {"enable.auto.commit": False}
    with EmbeddedKafka(brokers=1, heartbeat_interval_ms=1000, session_timeout_ms=30000) as kafka:
        kafka.create_topic("aio-hb", partitions=max(members, 1))
        if kind == "aio":
            got = asyncio.run(_aio(kafka.bootstrap_servers, members, window_s, trace, extra))
        else:
            got = _sync(kafka.bootstrap_servers, members, window_s, trace, extra)
    shares = got["shares"]
    out: dict[str, Any] = {
        "kind": kind,
        "auto_commit": auto_commit,
        "members": members,
        "stable": got["stable"],
        "load": load,
        "heartbeats_per_s": got["beats"] / shares["wall_s"],
        "cpu": {k: v for k, v in shares.items() if k not in ("wall_s", "gc_passes")},
        "gc_passes": shares["gc_passes"],
    }
    if trace:
        out["per_heartbeat"] = {
            thread: _per_beat(ops, calls, got["beats"], top)
            for thread, (ops, calls) in got["counts"].items()
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kind", choices=("aio", "sync"), default="aio")
    parser.add_argument("--members", type=int, default=1000)
    parser.add_argument("--window", type=float, default=10.0, help="seconds measured")
    parser.add_argument("--trace", action="store_true", help="count calls, not CPU")
    parser.add_argument("--top", type=int, default=30, help="functions listed per thread")
    parser.add_argument("--no-auto-commit", action="store_true", help="enable.auto.commit false")
    parser.add_argument("--json", action="store_true", help="one JSON line")
    args = parser.parse_args()
    r = measure(args.kind, args.members, args.window, args.trace, args.top, not args.no_auto_commit)
    if args.json:
        print(json.dumps(r))
        return
    cpu = r["cpu"]
    total = cpu["app"] + cpu["loop"] + cpu["other"]
    print(
        f"{r['kind']} (auto-commit {r['auto_commit']}): {r['stable']}/{r['members']} stable, "
        f"{r['heartbeats_per_s']:.0f} hb/s, "
        f"load {r['load']:.1f}; % of a core: process {100 * total:.2f}, app thread "
        f"{100 * cpu['app']:.2f}, network loop {100 * cpu['loop']:.2f}, other "
        f"{100 * cpu['other']:.2f} (cyclic GC {100 * cpu['gc']:.2f}, passes per generation "
        f"{r['gc_passes']})"
    )
    for thread, row in r.get("per_heartbeat", {}).items():
        print(
            f"== {thread}: {row['bytecodes']:.0f} bytecodes, {row['calls']:.1f} calls per heartbeat"
        )
        for name, ops, calls in row["functions"]:
            print(f"{ops:8.1f} bytecodes {calls:6.2f} calls  {name}")


if __name__ == "__main__":
    main()
