"""Heartbeat cost: CPU per heartbeat and how many members one process holds at a 1 s interval.

N GroupMembers (membership only, no data plane) join one group on EmbeddedKafka with a
1000 ms heartbeat interval; once stable, the process's CPU time over a window is divided by
the heartbeats sent in it. The mock broker runs in its own process and is not counted.
"""

from __future__ import annotations

import resource
import sys
import time
from typing import Any


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def measure(members: int, window_s: float) -> dict[str, float]:
    from consumer_sdk import GroupMember, MemberState
    from consumer_sdk.testing import EmbeddedKafka

    with EmbeddedKafka(brokers=1, heartbeat_interval_ms=1000, session_timeout_ms=30000) as kafka:
        kafka.create_topic("hb", partitions=max(members, 1))
        group: list[Any] = []
        try:
            for _ in range(members):
                m = GroupMember({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "hb",
                                 "enable.auto.commit": False})  # fmt: skip
                m.subscribe(["hb"])
                group.append(m)
            deadline = time.monotonic() + 60 + members * 0.1
            while time.monotonic() < deadline:
                for m in group:
                    m.poll(0)
                if all(m.state is MemberState.STABLE for m in group):
                    break
                time.sleep(0.05)
            stable = sum(m.state is MemberState.STABLE for m in group)
            time.sleep(1.5)  # let join-time traffic drain
            hb0 = sum(m.metrics()["heartbeat-total"] for m in group)
            cpu0, t0 = _cpu_s(), time.monotonic()
            end = t0 + window_s
            while time.monotonic() < end:
                for m in group:
                    m.poll(0)  # the application keeps polling (poll timer)
                time.sleep(0.2)
            cpu = _cpu_s() - cpu0
            wall = time.monotonic() - t0
            beats = sum(m.metrics()["heartbeat-total"] for m in group) - hb0
        finally:
            for m in group:
                m.close(timeout=2)
    return {
        "members": members,
        "stable": stable,
        "heartbeats_per_s": beats / wall,
        "cpu_core_fraction": cpu / wall,
        "cpu_us_per_heartbeat": cpu / beats * 1e6 if beats else float("nan"),
    }


def run(quick: bool = False) -> dict[str, Any]:
    sizes = [10, 100] if quick else [10, 100, 300, 1000]
    window = 5.0 if quick else 10.0
    rows = [measure(n, window) for n in sizes]
    biggest = rows[-1]
    return {"rows": rows, "goal": "1000 members under 20% of one core",
            "largest_cpu_fraction": biggest["cpu_core_fraction"]}  # fmt: skip


if __name__ == "__main__":
    result = run(quick="--quick" in sys.argv)
    for row in result["rows"]:
        print(f"{row['members']:>5} members ({row['stable']} stable): "
              f"{row['heartbeats_per_s']:.0f} HB/s, {row['cpu_core_fraction'] * 100:.1f}% of a "
              f"core, {row['cpu_us_per_heartbeat']:.0f} us CPU per heartbeat")  # fmt: skip
