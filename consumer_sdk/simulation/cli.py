"""``python -m consumer_sdk.simulation``: run a simulated deployment and print a summary."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from consumer_sdk.simulation.config import FAULT_MIXES, SimConfig
from consumer_sdk.simulation.engine import Simulation
from consumer_sdk.simulation.shrink import format_failure, replay, shrink
from consumer_sdk.simulation.trace import Trace


def build_parser(prog: str = "python -m consumer_sdk.simulation") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Deterministic virtual-time simulation of a KIP-848 consumer group: real "
        "member cores against a model of the group coordinator, with faults. Exits 1 if an "
        "invariant is violated.",
    )
    p.add_argument("--members", type=int, default=10, help="initial members (default 10)")
    p.add_argument("--partitions", type=int, default=60, help="partitions in total (default 60)")
    p.add_argument("--topics", type=int, default=0, help="topics (default: min(10, partitions))")
    p.add_argument("--minutes", type=float, default=10.0, help="virtual minutes (default 10)")
    p.add_argument(
        "--seed", type=int, default=0, help="random seed; a run is a function of it (default 0)"
    )
    p.add_argument(
        "--faults",
        choices=sorted(FAULT_MIXES),
        default="default",
        help="fault mix: crashes, fencing, coordinator moves... (default: default)",
    )
    p.add_argument(
        "--assignor",
        choices=("uniform", "range"),
        default="uniform",
        help="server-side assignor (default: uniform)",
    )
    p.add_argument(
        "--static-fraction",
        type=float,
        default=None,
        help="share of members with a group.instance.id (default: the fault mix's)",
    )
    p.add_argument(
        "--regex-fraction",
        type=float,
        default=None,
        help="share of members subscribing by regex (default: the fault mix's)",
    )
    p.add_argument(
        "--poll-interval-ms",
        type=int,
        default=1_000,
        help="how often each simulated application polls (default 1000)",
    )
    p.add_argument(
        "--rebalance-timeout-ms",
        type=int,
        default=60_000,
        help="the members' max.poll.interval.ms (default 60000)",
    )
    p.add_argument(
        "--session-timeout-ms",
        type=int,
        default=45_000,
        help="the coordinator's group.consumer.session.timeout.ms (default 45000)",
    )
    p.add_argument(
        "--heartbeat-interval-ms",
        type=int,
        default=5_000,
        help="the coordinator's group.consumer.heartbeat.interval.ms (default 5000)",
    )
    p.add_argument(
        "--static-rejoin-in-place",
        action="store_true",
        help="model apache/kafka#23542 (static member rejoining with its own id)",
    )
    p.add_argument(
        "--no-coalesce-polls",
        action="store_true",
        help="deliver every application poll() to the core (slower)",
    )
    p.add_argument(
        "--progress",
        type=float,
        default=None,
        metavar="MIN",
        help="a progress line on stderr every MIN virtual minutes "
        "(default: every 10 for runs of 30 minutes or more)",
    )
    p.add_argument("--keep-going", action="store_true", help="do not stop at the first violation")
    p.add_argument("--shrink", action="store_true", help="shrink a failing run's trace")
    p.add_argument("--trace-out", type=Path, help="write the (shrunk) trace of a failing run here")
    p.add_argument("--replay", type=Path, help="replay a trace file instead of generating a run")
    p.add_argument("--profile", action="store_true", help="print the top of a cProfile")
    p.add_argument("-v", "--verbose", action="store_true", help="log the members' INFO lines")
    return p


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    args = (build_parser(prog) if prog else build_parser()).parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if args.replay is not None:
        trace = Trace.from_json(args.replay.read_text())
        report = replay(trace)
    else:
        progress = args.progress
        if progress is None:
            progress = 10.0 if args.minutes >= 30 else 0.0
        config = SimConfig(
            members=args.members,
            partitions=args.partitions,
            topics=args.topics,
            minutes=args.minutes,
            seed=args.seed,
            faults=args.faults,
            assignor=args.assignor,
            static_fraction=args.static_fraction,
            regex_fraction=args.regex_fraction,
            poll_interval_ms=args.poll_interval_ms,
            rebalance_timeout_ms=args.rebalance_timeout_ms,
            session_timeout_ms=args.session_timeout_ms,
            heartbeat_interval_ms=args.heartbeat_interval_ms,
            static_rejoin_in_place=args.static_rejoin_in_place,
            coalesce_polls=not args.no_coalesce_polls,
            stop_on_violation=not args.keep_going,
            progress_every_min=progress,
        )
        sim = Simulation(config)
        if args.profile:
            import cProfile
            import pstats

            profiler = cProfile.Profile()
            report = profiler.runcall(sim.run)
            pstats.Stats(profiler, stream=sys.stderr).sort_stats("cumulative").print_stats(30)
        else:
            report = sim.run()
        trace = report.trace
    print(report.summary())
    if report.ok:
        return 0
    if args.shrink:
        print("shrinking...", file=sys.stderr)
        trace, report = shrink(trace)
    print(format_failure(report, trace))
    if args.trace_out is not None:
        args.trace_out.write_text(trace.to_json())
        print(f"trace written to {args.trace_out}")
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
