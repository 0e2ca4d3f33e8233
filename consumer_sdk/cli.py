"""``consumer-sdk`` command line: ``demo`` (more subcommands arrive with their features)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def demo(args: argparse.Namespace) -> int:
    """SDK members and a confluent-kafka member sharing a topic on EmbeddedKafka."""
    from consumer_sdk.demo import Demo

    return Demo(sys.stdout, args.members, args.partitions, args.step).run()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="consumer-sdk", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="run the demo on EmbeddedKafka")
    p_demo.add_argument("--members", type=int, default=3, help="SDK members (default 3)")
    p_demo.add_argument("--partitions", type=int, default=6)
    p_demo.add_argument("--step", type=float, default=1.0, help="seconds between steps")
    p_demo.set_defaults(func=demo)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
