"""The consumer-sdk command line: demo, describe, plan and simulate."""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import time
from collections.abc import Sequence
from typing import Any


def demo(args: argparse.Namespace) -> int:
    """SDK members and a confluent-kafka member sharing a topic on EmbeddedKafka."""
    from consumer_sdk.demo import Demo

    return Demo(sys.stdout, args.members, args.partitions, args.step).run()


def describe(args: argparse.Namespace) -> int:
    """ConsumerGroupDescribe: members, epochs, assigned vs target partitions."""
    from consumer_sdk.errors import ConfigError, KafkaException
    from consumer_sdk.protocol.client import ClusterClient

    try:
        config = _connection_config(args)
        client = ClusterClient({**config, "bootstrap.servers": args.bootstrap_servers})
    except (ConfigError, OSError) as exc:
        sys.stderr.write(f"describe: {exc}\n")
        return 2
    with client:
        try:
            group = client.describe_group(args.group, args.timeout)
            names = client.metadata(None, args.timeout)
        except KafkaException as exc:
            sys.stderr.write(f"describe {args.group!r} failed: {exc.args[0].str()}\n")
            return 1

    def fmt(parts: dict[Any, tuple[int, ...]]) -> str:
        out = []
        for topic_id, ps in sorted(parts.items(), key=lambda kv: str(kv[0])):
            name = names.topic_name(topic_id) or str(topic_id)
            out.append(f"{name}[{','.join(map(str, ps))}]")
        return " ".join(out) or "-"

    sys.stdout.write(
        f"group {group['group_id']}: state {group['state']}, group epoch {group['group_epoch']}, "
        f"assignment epoch {group['assignment_epoch']}, assignor {group['assignor']}\n"
    )
    for m in group["members"]:
        static = f" instance {m['instance_id']}" if m["instance_id"] else ""
        sys.stdout.write(
            f"  {m['member_id']}{static} epoch {m['member_epoch']} ({m['client_id']}@"
            f"{m['client_host']})\n    assigned {fmt(m['assignment'])}\n"
            f"    target   {fmt(m['target_assignment'])}\n"
        )
    return 0


def groups(args: argparse.Namespace) -> int:
    """``groups list|describe|watch``: KIP-848 groups of any client."""
    import json

    from consumer_sdk.admin import groups as admin
    from consumer_sdk.errors import ConfigError, KafkaException
    from consumer_sdk.protocol.client import ClusterClient

    try:
        config = _connection_config(args)
        client = ClusterClient({**config, "bootstrap.servers": args.bootstrap_servers})
    except (ConfigError, OSError) as exc:
        sys.stderr.write(f"groups: {exc}\n")
        return 2
    out = sys.stdout
    with client:
        try:
            if args.action == "list":
                listed = admin.list_groups(client, None if args.type == "all" else [args.type])
                if args.json:
                    out.write(json.dumps(listed) + "\n")
                for g in [] if args.json else listed:
                    out.write(f"{g['group_id']}\t{g['type']}\t{g['state']}\n")
            elif args.action == "describe":
                view = admin.describe_group(client, _group(args), args.timeout)
                out.write(json.dumps(view.as_dict()) + "\n" if args.json else _render(view))
            else:
                deadline = None if args.duration is None else time.monotonic() + args.duration
                for _view, found in admin.watch(
                    client,
                    _group(args),
                    args.interval,
                    timeout_s=args.timeout,
                    stop=lambda: deadline is not None and time.monotonic() >= deadline,
                ):
                    for change in found:
                        if args.json:
                            out.write(json.dumps(change.as_dict()) + "\n")
                        else:
                            stamp = time.strftime("%H:%M:%S", time.localtime(change.at))
                            out.write(f"{stamp} {change}\n")
                    out.flush()
        except KafkaException as exc:
            sys.stderr.write(f"groups {args.action} failed: {exc.args[0].str()}\n")
            return 1
        except KeyboardInterrupt:
            return 0
    return 0


def _group(args: argparse.Namespace) -> str:
    if not args.group:
        raise SystemExit(f"consumer-sdk groups {args.action}: give a group id")
    return str(args.group)


def _render(view: Any) -> str:
    """A group view as text: the group line, members, then partitions with lag."""
    lines = [
        f"group {view.group_id}: {view.state}, group epoch {view.group_epoch}, assignment "
        f"epoch {view.assignment_epoch}, assignor {view.assignor}, lag {view.lag_total}"
    ]

    def fmt(parts: tuple[tuple[str, int], ...]) -> str:
        by_topic: dict[str, list[int]] = {}
        for t, p in parts:
            by_topic.setdefault(t, []).append(p)
        return " ".join(f"{t}[{','.join(map(str, ps))}]" for t, ps in by_topic.items()) or "-"

    for m in view.members:
        static = f" instance {m.instance_id}" if m.instance_id else ""
        rack = f" rack {m.rack_id}" if m.rack_id else ""
        sub = m.subscribed_regex or ",".join(m.subscribed_topics)
        lines.append(
            f"  {m.client_id} {m.member_id}{static} epoch {m.member_epoch} "
            f"host {m.client_host}{rack} subscribed {sub}"
        )
        lines.append(f"    assigned {fmt(m.assignment)}")
        lines.append(f"    target   {fmt(m.target_assignment)}")
    lines.append("  TOPIC PARTITION OWNER TARGET COMMITTED END LAG")
    clients = {m.member_id: m.client_id for m in view.members}
    for p in view.partitions:
        lines.append(
            f"  {p.topic} {p.partition} {clients.get(p.owner, '-') if p.owner else '-'} "
            f"{clients.get(p.target_owner, '-') if p.target_owner else '-'} "
            f"{'-' if p.committed is None else p.committed} "
            f"{'-' if p.end_offset is None else p.end_offset} {'-' if p.lag is None else p.lag}"
        )
    return "\n".join(lines) + "\n"


def _add_connection_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bootstrap-servers", "-b", required=True, help="comma-separated host:port list"
    )
    p.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for the broker (default: 10)"
    )
    p.add_argument(
        "-X",
        action="append",
        metavar="KEY=VALUE",
        help="a librdkafka connection setting, repeatable (TLS, SASL, timeouts)",
    )
    p.add_argument(
        "--command-config",
        metavar="FILE",
        help="a properties file of librdkafka connection settings (key=value lines); -X wins",
    )


def _connection_config(args: argparse.Namespace) -> dict[str, str]:
    """librdkafka connection keys from ``--command-config FILE`` then ``-X key=value``
    (TLS and SASL for a secured cluster, as Kafka's tools and kcat take them)."""
    from consumer_sdk.errors import ConfigError

    config: dict[str, str] = {}
    if args.command_config:
        with open(args.command_config, encoding="utf-8") as f:
            for number, raw in enumerate(f, 1):
                line = raw.strip()
                if not line or line.startswith(("#", "!")):
                    continue
                key, sep, value = line.partition("=")
                if not sep:
                    raise ConfigError(f"{args.command_config}:{number}: expected key=value")
                config[key.strip()] = value.strip()
    for item in args.X or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"-X {item!r}: expected key=value")
        config[key.strip()] = value
    from consumer_sdk.config import CONNECTION_KEYS

    for key in config:
        if key not in CONNECTION_KEYS or key in ("bootstrap.servers", "oauth_cb"):
            raise ConfigError(f"{key}: not a connection setting describe can use")
    return config


def plan(args: argparse.Namespace) -> int:
    """Preview what a server-side assignor does for a group (and what moves)."""
    import json

    from consumer_sdk.assignors import Subscription, assign, explain

    partitions: dict[str, int] = {}
    for spec in args.topic:
        name, _, count = spec.rpartition(":")
        if not name or not count.isdigit():
            sys.stderr.write(f"--topic {spec!r}: expected NAME:PARTITIONS\n")
            return 2
        partitions[name] = int(count)
    previous: dict[str, dict[str, set[int]]] = {}
    if args.previous:
        with open(args.previous) as f:
            raw = json.load(f)
        previous = {m: {t: set(ps) for t, ps in topics.items()} for m, topics in raw.items()}
    members = {f"member-{i + 1}": Subscription(topics=set(partitions)) for i in range(args.members)}
    for m in previous:
        members.setdefault(m, Subscription(topics=set(partitions)))
    target = assign(args.assignor, members=members, partitions=partitions, previous=previous)
    sys.stdout.write(
        f"{args.assignor} assignment of {sum(partitions.values())} partitions "
        f"to {len(members)} members\n"
    )
    for member in sorted(target):
        parts = target[member]
        total = sum(len(ps) for ps in parts.values())
        desc = " ".join(f"{t}[{','.join(map(str, sorted(ps)))}]" for t, ps in sorted(parts.items()))
        sys.stdout.write(f"  {member:<12} {total:>4}  {desc or '-'}\n")
    if previous:
        sys.stdout.write("changes from --previous:\n" + explain(previous, target) + "\n")
    if args.json:
        result = {m: {t: sorted(ps) for t, ps in parts.items()} for m, parts in target.items()}
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


DESCRIPTION = """\
Tools for the KIP-848 consumer group protocol (package kip848-consumer).
"consumer-sdk COMMAND --help" describes each command.
"""


def version_text() -> str:
    """``consumer-sdk X (kip848-consumer, confluent-kafka Y)``."""
    from consumer_sdk._version import __version__

    try:
        ck = importlib.metadata.version("confluent-kafka")
    except importlib.metadata.PackageNotFoundError:  # pragma: no cover - a hard dependency
        ck = "missing"
    return f"consumer-sdk {__version__} (kip848-consumer, confluent-kafka {ck})"


def build_parser() -> argparse.ArgumentParser:
    """The parser; every option has help text (tests walk it)."""
    parser = argparse.ArgumentParser(
        prog="consumer-sdk",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", title="commands")
    p_demo = sub.add_parser(
        "demo",
        help="SDK members and a confluent-kafka member sharing a topic on EmbeddedKafka",
        description="Start EmbeddedKafka, produce continuously and run SDK members and one "
        "confluent-kafka (group.protocol=consumer) member in one group, printing their states, "
        "epochs and partitions as members join, get fenced and leave; then check that no "
        "record was lost.",
    )
    p_demo.add_argument("--members", type=int, default=3, help="SDK members (default: 3)")
    p_demo.add_argument(
        "--partitions", type=int, default=6, help="partitions of the demo topic (default: 6)"
    )
    p_demo.add_argument(
        "--step", type=float, default=1.0, help="seconds between demo steps (default: 1.0)"
    )
    p_demo.set_defaults(func=demo)
    p_desc = sub.add_parser(
        "describe",
        help="a group's members, epochs and assignments (ConsumerGroupDescribe)",
        description="Print a KIP-848 group's state, epochs and assignor, and per member its "
        "epoch, client, and assigned versus target partitions (needs Kafka 4.0+).",
    )
    p_desc.add_argument("group", help="the consumer group id")
    p_desc.add_argument(
        "--bootstrap-servers", "-b", required=True, help="comma-separated host:port list"
    )
    p_desc.add_argument(
        "--timeout", type=float, default=10.0, help="seconds to wait for the broker (default: 10)"
    )
    p_desc.add_argument(
        "-X",
        action="append",
        metavar="KEY=VALUE",
        help="a librdkafka connection setting, repeatable, e.g. -X security.protocol=SASL_SSL "
        "-X sasl.mechanism=SCRAM-SHA-512 -X sasl.username=... (TLS, SASL, timeouts)",
    )
    p_desc.add_argument(
        "--command-config",
        metavar="FILE",
        help="a properties file of librdkafka connection settings (key=value lines); -X wins",
    )
    p_desc.set_defaults(func=describe)
    p_groups = sub.add_parser(
        "groups",
        help="list, describe or watch KIP-848 groups of any client",
        description="list: the groups (ListGroups, type consumer by default); describe: a "
        "group's members (client id, host, rack, epoch, subscription, current and target "
        "assignment) and per partition owner, committed offset, end offset and lag; watch: "
        "print changes as they happen (members joining and leaving, epochs, partitions "
        "gained and lost, targets). --json for scripts (watch: one JSON object per change).",
    )
    p_groups.add_argument(
        "action", choices=["list", "describe", "watch"], help="list, describe or watch"
    )
    p_groups.add_argument("group", nargs="?", help="the group id (describe, watch)")
    _add_connection_args(p_groups)
    p_groups.add_argument("--json", action="store_true", help="JSON output")
    p_groups.add_argument(
        "--type",
        default="consumer",
        choices=["consumer", "classic", "share", "all"],
        help="list: group type (default: consumer, KIP-848)",
    )
    p_groups.add_argument(
        "--interval", type=float, default=0.5, help="watch: seconds between describes"
    )
    p_groups.add_argument(
        "--duration", type=float, default=None, help="watch: stop after this many seconds"
    )
    p_groups.set_defaults(func=groups)
    p_plan = sub.add_parser(
        "plan",
        help="preview what a server-side assignor does, and what moves",
        description="Run the broker's uniform or range assignor locally for N members "
        "subscribed to the given topics, and explain what moves from --previous.",
    )
    p_plan.add_argument(
        "--assignor",
        default="uniform",
        choices=["uniform", "range"],
        help="server-side assignor (default: uniform)",
    )
    p_plan.add_argument("--members", type=int, default=3, help="members (default: 3)")
    p_plan.add_argument(
        "--topic",
        action="append",
        required=True,
        metavar="NAME:PARTITIONS",
        help="a subscribed topic and its partition count; repeat for several topics",
    )
    p_plan.add_argument(
        "--previous",
        metavar="FILE",
        help='JSON file with the current assignment: {"member": {"topic": [partitions]}}',
    )
    p_plan.add_argument(
        "--json", metavar="FILE", help="write the target assignment to this JSON file"
    )
    p_plan.set_defaults(func=plan)
    sub.add_parser(
        "simulate",
        help="rehearse rebalances of many members in virtual time",
        add_help=False,
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["simulate"]:  # its own parser and flags
        from consumer_sdk.simulation.cli import main as simulation_main

        return simulation_main(argv[1:], prog="consumer-sdk simulate")
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
