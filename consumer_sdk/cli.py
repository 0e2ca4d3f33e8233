"""``consumer-sdk`` command line: ``demo`` (more subcommands arrive with their features)."""

from __future__ import annotations

import argparse
import base64
import sys
import time
import uuid
from collections.abc import Sequence

from consumer_sdk.domain import HeartbeatRequest, HeartbeatResponse, TopicIdPartitions
from consumer_sdk.protocol.client import ClusterClient


def _member_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def _describe(client: ClusterClient, owned: Sequence[TopicIdPartitions] | None) -> str:
    if not owned:
        return "-"
    parts = []
    for tp in owned:
        name = client.topic_name(tp.topic_id) or str(tp.topic_id)
        parts.append(f"{name}[{','.join(str(p) for p in sorted(tp.partitions))}]")
    return " ".join(parts)


def demo(args: argparse.Namespace) -> int:
    """EmbeddedKafka + KIP-848 joins over the SDK's own wire layer."""
    from consumer_sdk.testing import EmbeddedKafka

    out = sys.stdout
    with EmbeddedKafka(brokers=3, heartbeat_interval_ms=500, session_timeout_ms=6000) as kafka:
        out.write(f"EmbeddedKafka up: {kafka.bootstrap_servers}\n")
        kafka.create_topic("orders", partitions=args.partitions)
        produced = kafka.produce("orders", [f"order-{i}".encode() for i in range(args.records)])
        out.write(f"created topic 'orders' ({args.partitions} partitions), produced {produced}\n")
        with ClusterClient({"bootstrap.servers": kafka.bootstrap_servers}) as client:
            md = client.metadata(["orders"], timeout_s=10)
            out.write(f"topic id of 'orders': {md.topic_id('orders')}\n")
            coordinator = client.find_coordinator("demo-group", 10)
            out.write(f"group coordinator: broker {coordinator.node_id}\n\n")
            members: dict[str, HeartbeatResponse] = {}

            def join(member: str) -> HeartbeatRequest:
                return HeartbeatRequest(
                    group_id="demo-group",
                    member_id=member,
                    member_epoch=0,
                    rebalance_timeout_ms=30_000,
                    subscribed_topic_names=("orders",),
                    subscribed_topic_regex="",
                    topic_partitions=(),
                )

            for n in range(args.members):
                member = _member_id()
                started = time.monotonic()
                response = client.heartbeat(join(member), 10)
                took = (time.monotonic() - started) * 1000
                members[member] = response
                out.write(
                    f"member {n + 1} {member} joined: epoch {response.member_epoch}, "
                    f"interval {response.heartbeat_interval_ms} ms, assignment "
                    f"{_describe(client, response.assignment)} ({took:.1f} ms)\n"
                )
            out.write("\nheartbeats after the group settles (KIP-848 revoke-then-assign):\n")
            for _ in range(4):
                time.sleep(0.5)
                for member, last in list(members.items()):
                    # Epoch 0 means still joining: the heartbeat stays a full one.
                    request = (
                        join(member)
                        if last.member_epoch == 0
                        else HeartbeatRequest(
                            group_id="demo-group",
                            member_id=member,
                            member_epoch=last.member_epoch,
                            topic_partitions=tuple(last.assignment or ()),
                        )
                    )
                    response = client.heartbeat(request, 10)
                    if response.assignment is None:
                        response = HeartbeatResponse(
                            response.error_code, response.member_epoch,
                            response.heartbeat_interval_ms, response.member_id,
                            response.error_message, last.assignment,
                        )  # fmt: skip
                    members[member] = response
            for n, (member, response) in enumerate(members.items()):
                out.write(
                    f"  member {n + 1}: epoch {response.member_epoch}, partitions "
                    f"{_describe(client, response.assignment)}\n"
                )
            for member, response in members.items():
                client.heartbeat(HeartbeatRequest("demo-group", member, -1), 10)
            out.write("\nall members left the group (epoch -1).\n")
    out.write("EmbeddedKafka stopped.\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="consumer-sdk", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_demo = sub.add_parser("demo", help="run the demo on EmbeddedKafka")
    p_demo.add_argument("--members", type=int, default=2)
    p_demo.add_argument("--partitions", type=int, default=6)
    p_demo.add_argument("--records", type=int, default=100)
    p_demo.set_defaults(func=demo)
    args = parser.parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
