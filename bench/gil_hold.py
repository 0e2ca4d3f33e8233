"""The GIL limit: an application call that holds the GIL starves the heartbeats.

Heartbeats are Python code (on the process's shared network loop),
so while the application thread runs a C call that does not release the GIL, no heartbeat is
built, sent or answered. A pure-Python loop does not do this (the interpreter switches threads
every ``sys.getswitchinterval()``), nor does a C call that releases the GIL (``time.sleep``,
socket and file I/O, most compression and hashing of large buffers). What truly holds it: a C
function called without releasing the GIL. Here ``usleep`` through ``ctypes.PyDLL`` (which,
unlike ``ctypes.CDLL``, keeps the GIL), standing in for e.g. a long ``sorted()`` of a huge list,
a catastrophic ``re`` match, or an extension without ``Py_BEGIN_ALLOW_THREADS``.

One member is stable on EmbeddedKafka (heartbeat interval 500 ms, session timeout 6000 ms);
the application holds the GIL for H seconds, then polls again. Reported per H: the longest gap
between two heartbeats the broker saw from this process, and whether the member lost its
partitions (fenced: the broker's session timeout expired).

    python -m bench.gil_hold [--holds 1,3,5,7,9] [--runtime threads|loop|both]
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import itertools
import time
from typing import Any

SESSION_MS = 6000
INTERVAL_MS = 500
API_HEARTBEAT = 68


def _hold_gil(seconds: float) -> None:
    """Sleep inside a C call that keeps the GIL (ctypes.PyDLL does not release it)."""
    libc = ctypes.PyDLL(ctypes.util.find_library("c"))
    libc.usleep(ctypes.c_uint(int(seconds * 1_000_000)))


class _Threads:
    def __init__(self, bootstrap: str, group: str) -> None:
        from consumer_sdk import GroupMember

        self.lost = 0
        self.m = GroupMember(
            {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
        )

        def on_lost(_: Any, parts: list[Any]) -> None:
            self.lost += 1

        self.m.subscribe([group], on_lost=on_lost)

    def poll(self) -> None:
        self.m.poll(0.05)

    def stable(self) -> bool:
        from consumer_sdk import MemberState

        return self.m.state is MemberState.STABLE and bool(self.m.assignment())

    def close(self) -> None:
        self.m.close(timeout=5)


class _Loop:
    def __init__(self, bootstrap: str, group: str) -> None:
        from consumer_sdk.config import ConsumerConfig
        from consumer_sdk.membership import Subscribe
        from consumer_sdk.runtime.member_network import MemberNetwork

        self.lost = 0
        self.left = False
        self.closing = False
        self.owned = 0
        conf = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
        self.net = MemberNetwork(ConsumerConfig.from_mapping(conf))
        self.net.submit(Subscribe(topics=(group,)))

    def poll(self) -> None:
        from consumer_sdk.membership import (
            CallbackCompleted,
            CallbackKind,
            CallbacksNeeded,
            CommitCompleted,
            CommitNeeded,
            LeaveCompleted,
        )

        if not self.closing:
            self.net.note_poll()
        for event in self.net.drain_background_events():
            if isinstance(event, CallbacksNeeded):
                if event.kind is CallbackKind.LOST:
                    self.lost += 1
                if event.kind is CallbackKind.ASSIGNED:
                    self.owned += len(event.partitions)
                else:
                    self.owned -= len(event.partitions)
                self.net.submit(CallbackCompleted(event.callback_id))
            elif isinstance(event, CommitNeeded):
                self.net.submit(CommitCompleted(event.commit_id))
            elif isinstance(event, LeaveCompleted):
                self.left = True
        time.sleep(0.05)

    def stable(self) -> bool:
        from consumer_sdk.membership import MemberState

        return self.net.state is MemberState.STABLE and self.owned > 0

    def close(self) -> None:
        from consumer_sdk.membership import Close

        self.closing = True
        self.net.submit(Close())
        deadline = time.monotonic() + 5
        while not self.left and time.monotonic() < deadline:
            self.poll()
        self.net.stop()


def _until(member: Any, done: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        member.poll()
        if done():
            return True
    return False


def measure(hold_s: float, runtime: str) -> dict[str, Any]:
    from consumer_sdk.testing import EmbeddedKafka

    group = f"gil-{runtime}-{int(hold_s * 1000)}"
    with EmbeddedKafka(
        brokers=1, heartbeat_interval_ms=INTERVAL_MS, session_timeout_ms=SESSION_MS
    ) as kafka:
        kafka.create_topic(group, partitions=2)
        member = (_Threads if runtime == "threads" else _Loop)(kafka.bootstrap_servers, group)
        try:
            if not _until(member, member.stable, 30):
                raise RuntimeError("the member did not join")
            kafka.clear_requests()
            _until(member, lambda: False, 2.0)  # steady heartbeats, recorded
            _hold_gil(hold_s)
            # Poll for longer than a session timeout: a fenced member notices on its next
            # heartbeat (FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER_ID), then rejoins.
            _until(member, lambda: member.lost > 0, SESSION_MS / 1000 + 3)
            beats = [r.timestamp_us for r in kafka.requests(API_HEARTBEAT)]
            gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(beats)]
            return {
                "runtime": runtime,
                "hold_s": hold_s,
                "max_heartbeat_gap_s": max(gaps) if gaps else float("nan"),
                "fenced": member.lost > 0,
            }
        finally:
            member.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--holds", default="1,3,5,7,9")
    parser.add_argument("--runtime", choices=["threads", "loop", "both"], default="both")
    args = parser.parse_args()
    runtimes = ("threads", "loop") if args.runtime == "both" else (args.runtime,)
    for runtime in runtimes:
        for hold in (float(h) for h in args.holds.split(",")):
            row = measure(hold, runtime)
            gap = row["max_heartbeat_gap_s"]
            print(
                f"{runtime:>7} GIL held {hold:4.1f} s: longest heartbeat gap {gap:.2f} s, "
                f"fenced: {row['fenced']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
