"""Mermaid state diagram generated from the transition table.

``python -m consumer_sdk.membership.diagram`` prints the diagram; with ``--markdown`` it prints
the whole of ``docs/state-diagram.md`` (header included), which a test keeps in sync.
"""

from __future__ import annotations

import sys

from consumer_sdk.membership.state import TRANSITIONS, TRIGGERS, MemberState

HEADER = """\
# Member state diagram

Generated from `consumer_sdk.membership.state.TRANSITIONS`, the core's single transition table
(the Java client's `MemberState` rules), by
`python -m consumer_sdk.membership.diagram --markdown > docs/state-diagram.md`.
Do not edit by hand: a test checks that this file matches the table.

Each edge is labelled with what moves a member into its target state. Self-transitions are
always allowed; RECONCILING lists its own explicitly (a new target during reconciliation).
FATAL is terminal. The member sends no heartbeat while UNSUBSCRIBED, FENCED, STALE or FATAL.
"""


def render_mermaid() -> str:
    """The ``stateDiagram-v2`` source for `TRANSITIONS`."""
    order = list(MemberState)
    lines = ["stateDiagram-v2", f"    [*] --> {MemberState.UNSUBSCRIBED.value}"]
    for source in order:
        for target in order:
            if source in TRANSITIONS[target]:
                lines.append(f"    {source.value} --> {target.value} : {TRIGGERS[target]}")
    lines.append(f"    {MemberState.FATAL.value} --> [*]")
    return "\n".join(lines) + "\n"


def render_markdown() -> str:
    """The content of ``docs/state-diagram.md``."""
    return f"{HEADER}\n```mermaid\n{render_mermaid()}```\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    sys.stdout.write(render_markdown() if "--markdown" in args else render_mermaid())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
