"""Benchmark the server-side assignors on the grid of Kafka's JMH ``ServerSideAssignorBenchmark``.

Not a test. Run from the repository root::

    python -m bench.assignors            # full grid, writes docs/assignors-bench.md
    python -m bench.assignors --quick    # small subset for CI, well under a minute

Inputs follow the JMH setup (``ServerSideAssignorBenchmark`` / ``AssignorBenchmarkUtils``):
``topicCount`` topics with ``memberCount * ratio // topicCount`` partitions each, keyed by
random ``uuid.UUID`` topic ids; members ``member0..``. HOMOGENEOUS: everyone subscribes to
every topic. HETEROGENEOUS: ``min(5, members)`` buckets; bucket ``b`` holds the ``b``-th
contiguous slice of ``ceil(members / buckets)`` members, subscribed to the ``b``-th
contiguous slice of ``ceil(topics / buckets)`` topics. Members of a bucket share one
frozenset of topic ids. INCREMENTAL: the target computed for ``memberCount - 1`` members is
the previous assignment and ``newMember`` joins (with member ``memberCount - 2``'s
subscription when heterogeneous); only the final ``assign`` is timed. Rack awareness is
not benchmarked (``isRackAware=false``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from consumer_sdk.assignors import Assignment, Subscription, get_assignor

MEMBER_COUNTS = (100, 500, 1000, 5000, 10000)
RATIOS = (5, 10, 50)
TOPIC_COUNTS = (10, 100, 1000)
SUBSCRIPTIONS = ("HOMOGENEOUS", "HETEROGENEOUS")
ASSIGNOR_TYPES = ("RANGE", "UNIFORM")
ASSIGNMENT_TYPES = ("FULL", "INCREMENTAL")
MAX_BUCKET_COUNT = 5
MIN_RUNS = 5

# Published JMH results (ms/op), from docs of apache/kafka PRs quoted in the KIP-848
# reference, section 10. Key: (assignor, subscription, assignment, members, ratio, topics).
# Where a case was published twice, the most recent figure is used.
JAVA_MS: dict[tuple[str, str, str, int, int, int], float] = {
    # uniform heterogeneous, KAFKA-17710 (#17385), "after"
    ("UNIFORM", "HETEROGENEOUS", "FULL", 100, 5, 10): 0.059,
    ("UNIFORM", "HETEROGENEOUS", "FULL", 100, 10, 10): 0.076,
    ("UNIFORM", "HETEROGENEOUS", "FULL", 5000, 50, 10): 15.3,
    ("UNIFORM", "HETEROGENEOUS", "FULL", 5000, 50, 1000): 122.0,
    ("UNIFORM", "HETEROGENEOUS", "FULL", 10000, 5, 10): 5.8,
    ("UNIFORM", "HETEROGENEOUS", "FULL", 10000, 5, 1000): 203.0,
    ("UNIFORM", "HETEROGENEOUS", "FULL", 10000, 10, 10): 8.9,
    # uniform homogeneous, KAFKA-18688 (#19677), "after"
    ("UNIFORM", "HOMOGENEOUS", "FULL", 100, 5, 10): 0.020,
    ("UNIFORM", "HOMOGENEOUS", "FULL", 10000, 10, 10): 2.60,
    ("UNIFORM", "HOMOGENEOUS", "FULL", 10000, 50, 10): 13.9,
    ("UNIFORM", "HOMOGENEOUS", "FULL", 10000, 50, 1000): 14.6,
    ("UNIFORM", "HOMOGENEOUS", "INCREMENTAL", 100, 5, 10): 0.010,
    # uniform homogeneous (#17133)
    ("UNIFORM", "HOMOGENEOUS", "FULL", 5000, 10, 1000): 1.71,
    ("UNIFORM", "HOMOGENEOUS", "FULL", 5000, 50, 1000): 7.49,
    ("UNIFORM", "HOMOGENEOUS", "FULL", 10000, 10, 1000): 4.31,
    # range, in #19677
    ("RANGE", "HOMOGENEOUS", "FULL", 10000, 50, 1000): 26.2,
    ("RANGE", "HETEROGENEOUS", "FULL", 10000, 50, 1000): 124.0,
    ("RANGE", "HOMOGENEOUS", "INCREMENTAL", 10000, 50, 1000): 24.4,
    ("RANGE", "HETEROGENEOUS", "INCREMENTAL", 10000, 50, 1000): 114.9,
}

GOALS = (
    ("UNIFORM", "HOMOGENEOUS", "FULL", 10000, 50, 1000),
    ("UNIFORM", "HETEROGENEOUS", "FULL", 5000, 50, 1000),
)

QUICK_GRID = (
    # (members, ratio, topics): every assignor/subscription/assignment combination
    (100, 5, 10),
    (100, 10, 10),
    (1000, 10, 100),
)
"""``--quick`` runs these, plus the :data:`GOALS` cases."""


@dataclass(frozen=True, slots=True)
class Case:
    assignor: str
    subscription: str
    assignment: str
    members: int
    ratio: int
    topics: int

    @property
    def key(self) -> tuple[str, str, str, int, int, int]:
        return (
            self.assignor,
            self.subscription,
            self.assignment,
            self.members,
            self.ratio,
            self.topics,
        )

    @property
    def partitions_per_topic(self) -> int:
        return self.members * self.ratio // self.topics


@dataclass(frozen=True, slots=True)
class Result:
    case: Case
    ms: float
    """Median wall-clock time (time.perf_counter) per assign call, ms."""
    best: float
    """Fastest wall-clock time, ms."""
    cpu: float
    """Median CPU time of the process (time.process_time), ms: robust to other load."""
    runs: int


def cases(quick: bool) -> Iterator[Case]:
    grid = (
        QUICK_GRID
        if quick
        else [(m, r, t) for m in MEMBER_COUNTS for r in RATIOS for t in TOPIC_COUNTS]
    )
    for members, ratio, topics in grid:
        if members * ratio // topics < 1:
            continue
        for subscription in SUBSCRIPTIONS:
            for assignor in ASSIGNOR_TYPES:
                for assignment in ASSIGNMENT_TYPES:
                    yield Case(assignor, subscription, assignment, members, ratio, topics)
    if quick:
        for key in GOALS:
            yield Case(*key)


def build_inputs(
    case: Case,
) -> tuple[dict[str, Subscription[uuid.UUID]], dict[uuid.UUID, int], Assignment[uuid.UUID]]:
    """Members, partition counts and previous target for ``case`` (see module doc)."""
    rng = random.Random(f"{case.members}/{case.ratio}/{case.topics}")
    topic_ids = [uuid.UUID(int=rng.getrandbits(128), version=4) for _ in range(case.topics)]
    partitions = dict.fromkeys(topic_ids, case.partitions_per_topic)
    incremental = case.assignment == "INCREMENTAL"
    count = case.members - 1 if incremental else case.members
    members: dict[str, Subscription[uuid.UUID]] = {}
    if case.subscription == "HOMOGENEOUS":
        everything = Subscription(frozenset(topic_ids))
        for i in range(count):
            members[f"member{i}"] = everything
    else:
        buckets = min(MAX_BUCKET_COUNT, count)
        topics_per_bucket = math.ceil(case.topics / buckets)
        members_per_bucket = math.ceil(count / buckets)
        for b in range(buckets):
            sub = Subscription(
                frozenset(topic_ids[b * topics_per_bucket : (b + 1) * topics_per_bucket])
            )
            for i in range(b * members_per_bucket, min((b + 1) * members_per_bucket, count)):
                members[f"member{i}"] = sub
    previous: Assignment[uuid.UUID] = {}
    if incremental:
        previous = get_assignor(case.assignor.lower()).assign(members, partitions)
        if case.subscription == "HETEROGENEOUS":
            joiner = members[f"member{case.members - 2}"]
        else:
            joiner = Subscription(frozenset(topic_ids))
        members["newMember"] = joiner
    return members, partitions, previous


def run_case(case: Case, budget_s: float, max_runs: int) -> Result:
    """Time ``case`` in this process: one warm-up run, then at least MIN_RUNS timed runs."""
    members, partitions, previous = build_inputs(case)
    assignor = get_assignor(case.assignor.lower())
    expected = len(partitions) * case.partitions_per_topic
    times: list[float] = []
    cpu: list[float] = []
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        target = assignor.assign(members, partitions, previous)  # warm-up
        elapsed = time.perf_counter() - start
        assigned = sum(len(p) for topics in target.values() for p in topics.values())
        if assigned != expected:
            raise AssertionError(f"{_label(case)}: {assigned} partitions assigned, not {expected}")
        del target
        gc.collect()
        runs = max(MIN_RUNS, min(max_runs, int(budget_s / max(elapsed, 1e-6))))
        for _ in range(runs):
            start_cpu = time.process_time()
            start = time.perf_counter()
            assignor.assign(members, partitions, previous)
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
            gc.collect()
    finally:
        gc.enable()
    return Result(
        case,
        statistics.median(times) * 1e3,
        min(times) * 1e3,
        statistics.median(cpu) * 1e3,
        len(times),
    )


def run_case_forked(case: Case, budget_s: float, max_runs: int) -> Result:
    """Time ``case`` in a fresh interpreter, like JMH's fork per benchmark, so that heap
    state left by earlier (larger) cases does not skew it."""
    spec = "/".join(map(str, case.key))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.assignors",
            "--run-case",
            spec,
            "--budget",
            str(budget_s),
            "--max-runs",
            str(max_runs),
        ],
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{spec} failed:\n{proc.stdout}{proc.stderr}")
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return Result(case, data["ms"], data["best"], data["cpu"], data["runs"])


def _cpu_busy(interval: float = 0.5) -> float | None:
    """CPUs kept busy by other processes over ``interval`` (from /proc/stat; Linux)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            first = [int(x) for x in f.readline().split()[1:]]
        time.sleep(interval)
        with open("/proc/stat", encoding="ascii") as f:
            second = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    delta = [b - a for a, b in zip(first, second, strict=False)]
    total = sum(delta)
    idle = delta[3] + (delta[4] if len(delta) > 4 else 0)  # idle + iowait
    return (total - idle) / total * (os.cpu_count() or 1) if total else 0.0


def wait_until_idle(max_wait: float, threshold: float = 0.3) -> bool:
    """Wait up to ``max_wait`` seconds until other processes use under ``threshold`` CPUs.

    Returns whether the machine was idle when the wait ended.
    """
    deadline = time.monotonic() + max_wait
    while True:
        busy = _cpu_busy()
        if busy is None or busy < threshold:
            return True
        if time.monotonic() >= deadline:
            return False


def _parse_case(spec: str) -> Case:
    assignor, subscription, assignment, members, ratio, topics = spec.split("/")
    return Case(assignor, subscription, assignment, int(members), int(ratio), int(topics))


def _fmt_ms(ms: float) -> str:
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    if ms >= 1:
        return f"{ms:.2f}"
    return f"{ms:.3f}"


def render(
    results: list[Result],
    quick: bool,
    wall_s: float,
    budget_s: float,
    loads: tuple[tuple[float, float, float], tuple[float, float, float]],
    goal_runs: dict[tuple[str, str, str, int, int, int], list[Result]],
    idle: tuple[float, int] = (0.0, 0),
) -> str:
    command = "python -m bench.assignors" + (" --quick" if quick else "")
    lines = [
        "# Assignor benchmark",
        "",
        f"Generated by `{command}` (see `bench/assignors.py` and [assignors.md](assignors.md)).",
        "The inputs reproduce the grid of apache/kafka's JMH `ServerSideAssignorBenchmark`",
        "(rack awareness off). Each case runs in a fresh interpreter, like JMH's fork: one",
        f"warm-up run, then timed runs for about {budget_s:g} s (at least {MIN_RUNS}), with the",
        "garbage collector off while timing.",
        "",
        "- *ms/op*: median wall-clock time (`time.perf_counter`) of one `assign` call;",
        "  *best*: the fastest run; *cpu*: median CPU time of the process",
        "  (`time.process_time`), which leaves out time spent waiting for a CPU while other",
        "  processes run (but not their effect on shared caches).",
        "- *Java*: the published JMH figure (ms/op, AverageTime) where one exists (KIP-848",
        "  reference, section 10), measured by the PR authors on their own machines, so the",
        "  ratios are indicative only. *ratio* = ms/op / Java; *ratio best* = best / Java.",
        "  Not compared: the published 100/5/1000 figures (fewer partitions than topics, a",
        "  case this grid skips) and the rack-aware prototype (#20000).",
        "",
        f"- Machine: {platform.machine()}, {os.cpu_count()} CPUs, {_cpu_model()}",
        f"- Python: {platform.python_implementation()} {platform.python_version()}"
        f" ({platform.system()} {platform.release()})",
        f"- Load average (1/5/15 min) before: {_fmt_load(loads[0])}, after: {_fmt_load(loads[1])}",
        f"- Cases: {len(results)}, wall time {wall_s:.0f} s",
    ]
    if idle[0] > 0:
        lines.append(
            f"- Before each run the benchmark waited (up to {idle[0]:g} s) for other processes"
            f" to use under 0.3 CPUs; {idle[1]} runs started on a busier machine anyway."
        )
    lines += [
        "",
    ]
    if goal_runs:
        total_runs = max(map(len, goal_runs.values()))
        lines += [
            "## Goal cases",
            "",
            f"Each goal case is run {total_runs} times in all, each time in a fresh interpreter,",
            "to show how much the figures move on this machine: *median* is the median of the",
            "per-run medians, *range* their minimum and maximum.",
            "",
            "| case | median ms/op | range | median cpu | Java | ratio | ratio range |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for key, runs in goal_runs.items():
            java = JAVA_MS[key]
            ms = sorted(r.ms for r in runs)
            mid = statistics.median(ms)
            cpu = statistics.median(r.cpu for r in runs)
            lines.append(
                f"| {_label(runs[0].case)} | {_fmt_ms(mid)} | {_fmt_ms(ms[0])}-{_fmt_ms(ms[-1])} |"
                f" {_fmt_ms(cpu)} | {java:g} | {mid / java:.2f}x |"
                f" {ms[0] / java:.2f}-{ms[-1] / java:.2f}x |"
            )
        lines.append("")
    compared = [r for r in results if r.case.key in JAVA_MS]
    for title, rows in (("Cases with a published Java figure", compared),):
        if not rows:
            continue
        lines += [
            f"## {title}",
            "",
            "| case | ms/op | best | cpu | Java | ratio | ratio best |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for r in rows:
            java = JAVA_MS[r.case.key]
            lines.append(
                f"| {_label(r.case)} | {_fmt_ms(r.ms)} | {_fmt_ms(r.best)} | {_fmt_ms(r.cpu)} |"
                f" {java:g} | {r.ms / java:.2f}x | {r.best / java:.2f}x |"
            )
        lines.append("")
    if compared:
        ratios = [r.ms / JAVA_MS[r.case.key] for r in compared]
        lines += [
            f"Over these {len(compared)} cases ratio ranges from {min(ratios):.2f}x to"
            f" {max(ratios):.2f}x (geometric mean {statistics.geometric_mean(ratios):.2f}x).",
            "",
        ]
    lines += [
        "## All cases",
        "",
        "| assignor | subscription | assignment | members | ratio | topics | partitions |"
        " ms/op | best | cpu | runs | Java | ratio |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        c = r.case
        published = JAVA_MS.get(c.key)
        java_cols = f"{published:g} | {r.ms / published:.2f}x" if published is not None else " | "
        lines.append(
            f"| {c.assignor.lower()} | {c.subscription.lower()} | {c.assignment.lower()} |"
            f" {c.members} | {c.ratio} | {c.topics} | {c.partitions_per_topic * c.topics} |"
            f" {_fmt_ms(r.ms)} | {_fmt_ms(r.best)} | {_fmt_ms(r.cpu)} | {r.runs} | {java_cols} |"
        )
    return "\n".join(lines) + "\n"


def _fmt_load(load: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.2f}" for x in load)


def _label(case: Case) -> str:
    return (
        f"{case.assignor.lower()} {case.subscription.lower()} {case.assignment.lower()}"
        f" {case.members}/{case.ratio}/{case.topics}"
    )


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small subset (for CI)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("docs/assignors-bench.md"),
        help="markdown file to write (default: docs/assignors-bench.md)",
    )
    parser.add_argument(
        "--budget",
        type=float,
        default=None,
        help="seconds of timed runs per case (default 0.3, or 0.05 with --quick)",
    )
    parser.add_argument("--max-runs", type=int, default=15, help="cap on timed runs per case")
    parser.add_argument(
        "--only",
        default="",
        help="comma-separated tokens that must all match a field of the case,"
        " e.g. UNIFORM,FULL,10000",
    )
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run every case in this interpreter instead of a fresh one per case",
    )
    parser.add_argument(
        "--goal-repeats",
        type=int,
        default=None,
        help="extra independent runs of each goal case (default 6, or 0 with --quick)",
    )
    parser.add_argument(
        "--idle-wait",
        type=float,
        default=0.0,
        help="before each case, wait up to this many seconds for other processes to go"
        " quiet (for shared machines; default 0: do not wait)",
    )
    parser.add_argument(
        "--idle-budget",
        type=float,
        default=1800.0,
        help="total seconds --idle-wait may spend waiting (default 1800)",
    )
    parser.add_argument("--run-case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    budget: float = args.budget if args.budget is not None else (0.05 if args.quick else 0.3)

    if args.goal_repeats is None:
        args.goal_repeats = 0 if args.quick else 6
    if args.run_case:
        result = run_case(_parse_case(args.run_case), budget, args.max_runs)
        print(json.dumps(dataclasses.asdict(result) | {"case": None}))
        return 0

    filters = [f.strip().upper() for f in args.only.split(",") if f.strip()]
    selected = [c for c in cases(args.quick) if all(f in {*map(str, c.key)} for f in filters)]
    run = run_case if args.in_process else run_case_forked
    results: list[Result] = []
    started = time.perf_counter()
    load_before = os.getloadavg()
    print(f"{'case':<52} {'ms/op':>9} {'best':>9} {'cpu':>9} {'runs':>5} {'java':>8} {'ratio':>7}")
    busy_starts = 0
    wait_deadline = time.monotonic() + args.idle_budget

    def settle() -> None:
        nonlocal busy_starts
        wait = min(args.idle_wait, wait_deadline - time.monotonic())
        if args.idle_wait > 0 and not wait_until_idle(max(wait, 0.0)):
            busy_starts += 1

    for case in selected:
        settle()
        result = run(case, budget, args.max_runs)
        results.append(result)
        java = JAVA_MS.get(case.key)
        extra = f"{java:>8g} {result.ms / java:>6.1f}x" if java is not None else ""
        print(
            f"{_label(case):<52} {_fmt_ms(result.ms):>9} {_fmt_ms(result.best):>9}"
            f" {_fmt_ms(result.cpu):>9} {result.runs:>5} {extra}",
            flush=True,
        )
    goal_runs: dict[tuple[str, str, str, int, int, int], list[Result]] = {}
    for result in results:
        if result.case.key in GOALS and args.goal_repeats > 0:
            runs = [result]
            for _ in range(args.goal_repeats):
                settle()
                runs.append(run(result.case, budget, args.max_runs))
            goal_runs[result.case.key] = runs
            print(f"{_label(result.case)}: " + " ".join(_fmt_ms(r.ms) for r in runs), flush=True)
    wall = time.perf_counter() - started
    args.out.parent.mkdir(parents=True, exist_ok=True)
    loads = (load_before, os.getloadavg())
    args.out.write_text(
        render(results, args.quick, wall, budget, loads, goal_runs, (args.idle_wait, busy_starts)),
        encoding="utf-8",
    )
    print(f"wrote {args.out} ({len(results)} cases, {wall:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
