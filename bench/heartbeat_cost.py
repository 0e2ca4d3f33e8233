"""Heartbeat cost: CPU per heartbeat and how many members one process holds at a 1 s interval.

N members (membership only, no data plane) join one group on EmbeddedKafka with a 1000 ms
heartbeat interval; the application polls each every 200 ms. Once all are stable (or the join
deadline passed), the process's CPU time over a window is divided by the heartbeats sent in
it. The mock broker runs in its own process and is not counted.

Two row sets, measured the same way in the same run:

- ``loop``: ``GroupMember`` as applications use it (``poll(0)`` every 200 ms), i.e. the
  application-side facade on the shared network loop (one thread, one connection per broker
  for the whole process). This is the SDK's runtime.
- ``network``: ``MemberNetwork`` alone, driven by a minimal application side (post the poll
  event, drain background events, complete callbacks): the loop's cost without the facade.

    python -m bench.heartbeat_cost [--quick] [--runtime loop|network|both] [--sizes 100,1000]
"""

from __future__ import annotations

import argparse
import resource
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

WINDOW_S = 10.0
POLL_EVERY_S = 0.2


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _loop_thread_cpu_s() -> float | None:
    """CPU time of the shared network loop's thread (Linux: its schedstat), else None."""
    from consumer_sdk.runtime.netloop import NetworkLoop

    loop = NetworkLoop._shared
    thread = loop._thread if loop is not None else None
    if thread is None or thread.native_id is None:
        return None
    try:
        with open(f"/proc/self/task/{thread.native_id}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except OSError:
        return None


class _FacadeMember:
    """A ``GroupMember`` polled as an application does."""

    def __init__(self, bootstrap: str) -> None:
        from consumer_sdk import GroupMember

        self.m = GroupMember(
            {"bootstrap.servers": bootstrap, "group.id": "hb", "enable.auto.commit": False}
        )
        self.m.subscribe(["hb"])

    def poll(self) -> None:
        self.m.poll(0)

    def stable(self) -> bool:
        from consumer_sdk import MemberState

        return self.m.state is MemberState.STABLE

    def heartbeats(self) -> float:
        return self.m.metrics()["heartbeat-total"]

    def start_close(self) -> None:
        # Closed in parallel: one by one, a thousand bounded closes would take many minutes.
        self._closer = threading.Thread(target=self.m.close, kwargs={"timeout": 2}, daemon=True)
        self._closer.start()

    def closed(self) -> bool:
        return not self._closer.is_alive()


class _NetworkMember:
    """``MemberNetwork`` with a minimal application side (no facade)."""

    def __init__(self, bootstrap: str) -> None:
        from consumer_sdk.config import ConsumerConfig
        from consumer_sdk.membership import Subscribe
        from consumer_sdk.runtime.member_network import MemberNetwork

        conf = {"bootstrap.servers": bootstrap, "group.id": "hb", "enable.auto.commit": False}
        self.net = MemberNetwork(ConsumerConfig.from_mapping(conf))
        self.net.submit(Subscribe(topics=("hb",)))
        self.left = False
        self.closing = False

    def poll(self) -> None:
        from consumer_sdk.membership import (
            CallbackCompleted,
            CallbacksNeeded,
            CommitCompleted,
            CommitNeeded,
            LeaveCompleted,
        )

        if not self.closing:
            self.net.note_poll()
        for event in self.net.drain_background_events():
            if isinstance(event, CallbacksNeeded):
                self.net.submit(CallbackCompleted(event.callback_id))
            elif isinstance(event, CommitNeeded):
                self.net.submit(CommitCompleted(event.commit_id))
            elif isinstance(event, LeaveCompleted):
                self.left = True

    def stable(self) -> bool:
        from consumer_sdk.membership import MemberState

        return self.net.state is MemberState.STABLE

    def heartbeats(self) -> float:
        return self.net.core.metrics.snapshot(0)["heartbeat-total"]

    def start_close(self) -> None:
        from consumer_sdk.membership import Close

        self.closing = True
        self.net.submit(Close())

    def closed(self) -> bool:
        self.poll()
        if self.left:
            self.net.stop()
        return self.left


def close_group(group: Sequence[Any]) -> None:
    """Close every member at once and wait up to 30 s for all of them."""
    for m in group:
        m.start_close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not all(m.closed() for m in group):
        time.sleep(0.05)


def measure(members: int, window_s: float = WINDOW_S, runtime: str = "loop") -> dict[str, Any]:
    from consumer_sdk.testing import EmbeddedKafka

    factory = _FacadeMember if runtime == "loop" else _NetworkMember
    with EmbeddedKafka(brokers=1, heartbeat_interval_ms=1000, session_timeout_ms=30000) as kafka:
        kafka.create_topic("hb", partitions=max(members, 1))
        group: list[Any] = []
        try:
            t_join = time.monotonic()
            for _ in range(members):
                group.append(factory(kafka.bootstrap_servers))
            deadline = time.monotonic() + 60 + members * 0.1
            while time.monotonic() < deadline:
                for m in group:
                    m.poll()
                if all(m.stable() for m in group):
                    break
                time.sleep(0.05)
            join_s = time.monotonic() - t_join
            time.sleep(1.5)  # let join-time traffic drain
            hb0 = sum(m.heartbeats() for m in group)
            poll_round = _poll_round(group, runtime)
            loop0 = _loop_thread_cpu_s()
            cpu0, t0 = _cpu_s(), time.monotonic()
            app0, in_polls = time.thread_time(), 0.0
            end = t0 + window_s
            while time.monotonic() < end:
                tick = time.monotonic()
                polls0 = time.thread_time()
                poll_round()  # the application keeps polling (poll timer)
                in_polls += time.thread_time() - polls0
                time.sleep(max(0.0, POLL_EVERY_S - (time.monotonic() - tick)))
            app = time.thread_time() - app0
            cpu = _cpu_s() - cpu0
            wall = time.monotonic() - t0
            loop1 = _loop_thread_cpu_s()
            beats = sum(m.heartbeats() for m in group) - hb0
            stable = sum(m.stable() for m in group)
        finally:
            close_group(group)
    return {
        "runtime": runtime,
        "members": members,
        "stable": stable,
        "join_s": join_s,
        "heartbeats_per_s": beats / wall,
        "cpu_core_fraction": cpu / wall,
        "cpu_us_per_heartbeat": cpu / beats * 1e6 if beats else float("nan"),
        # of which the network loop's thread (the rest: the application side)
        "loop_cpu_us_per_heartbeat": (
            (loop1 - loop0) / beats * 1e6
            if beats and loop0 is not None and loop1 is not None
            else float("nan")
        ),
        # of the rest: this thread's CPU inside the members' polls, and outside them (the
        # benchmark's own loop, its clock reads and its sleep and wake-up every round)
        "polls_cpu_us_per_heartbeat": in_polls / beats * 1e6 if beats else float("nan"),
        "bench_cpu_us_per_heartbeat": (app - in_polls) / beats * 1e6 if beats else float("nan"),
    }


def _poll_round(group: Sequence[Any], runtime: str) -> Callable[[], None]:
    """One round of the application's polls, every member once. The facade's members are
    called as an application calls them (``member.poll(0)``): a prepared ``partial`` per
    member is two more objects per call for the CPU's caches to miss (about 0.7 µs per poll
    at 100 members, measured), the benchmark's cost, not the SDK's."""
    if runtime == "loop":
        members = [m.m for m in group]

        def facade_round() -> None:
            for member in members:
                member.poll(0)

        return facade_round
    polls = [m.poll for m in group]

    def network_round() -> None:
        for poll in polls:
            poll()

    return network_round


def run(
    quick: bool = False,
    runtimes: tuple[str, ...] = ("loop", "network"),
    sizes: list[int] | None = None,
) -> dict[str, Any]:
    window = 5.0 if quick else WINDOW_S
    rows: list[dict[str, Any]] = []
    for runtime in runtimes:
        if sizes is not None:
            chosen = sizes
        elif runtime == "network":
            chosen = [100] if quick else [100, 1000]
        else:
            chosen = [10, 100, 1000] if quick else [10, 100, 300, 1000, 2000]
        rows.extend(measure(n, window, runtime) for n in chosen)
    goal_rows = [r for r in rows if r["members"] == 1000 and r["runtime"] == "loop"]
    largest = goal_rows[-1]["cpu_core_fraction"] if goal_rows else None
    return {
        "rows": rows,
        "goal": "1000 members under 10% of one core, all stable; <= 60 us per heartbeat at 100",
        "largest_cpu_fraction": largest,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--runtime", choices=["loop", "network", "both"], default="both")
    parser.add_argument("--sizes", help="comma-separated member counts")
    args = parser.parse_args()
    runtimes = ("loop", "network") if args.runtime == "both" else (args.runtime,)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else None
    result = run(args.quick, runtimes, sizes)
    for row in result["rows"]:
        print(
            f"{row['runtime']:>7} {row['members']:>5} members ({row['stable']} stable, joined "
            f"in {row['join_s']:.1f}s): {row['heartbeats_per_s']:.0f} HB/s, "
            f"{row['cpu_core_fraction'] * 100:.1f}% of a core, "
            f"{row['cpu_us_per_heartbeat']:.0f} us CPU per heartbeat "
            f"({row['loop_cpu_us_per_heartbeat']:.0f} on the network loop's thread, "
            f"{row['polls_cpu_us_per_heartbeat']:.0f} in the application's polls, "
            f"{row['bench_cpu_us_per_heartbeat']:.0f} the benchmark's own loop and sleeps)",
            flush=True,
        )


if __name__ == "__main__":
    main()
