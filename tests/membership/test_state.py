"""The transition table is the single source of truth for member states."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest

from consumer_sdk.membership import IllegalTransition, MemberState
from consumer_sdk.membership.diagram import render_markdown, render_mermaid
from consumer_sdk.membership.state import (
    ACCEPTS_ASSIGNMENT,
    NOT_IN_GROUP,
    TRANSITIONS,
    TRIGGERS,
    StateMachine,
    is_allowed,
)

S = MemberState
REPO = Path(__file__).resolve().parents[2]

# The reference table, written out independently of the implementation.
EXPECTED = {
    S.JOINING: {S.FENCED, S.UNSUBSCRIBED, S.STALE},
    S.RECONCILING: {S.STABLE, S.JOINING, S.ACKNOWLEDGING, S.RECONCILING},
    S.ACKNOWLEDGING: {S.RECONCILING},
    S.STABLE: {S.JOINING, S.ACKNOWLEDGING, S.RECONCILING},
    S.FENCED: {S.JOINING, S.STABLE, S.RECONCILING, S.ACKNOWLEDGING, S.PREPARE_LEAVING, S.LEAVING},
    S.PREPARE_LEAVING: {S.JOINING, S.STABLE, S.RECONCILING, S.ACKNOWLEDGING, S.UNSUBSCRIBED},
    S.LEAVING: {S.PREPARE_LEAVING},
    S.UNSUBSCRIBED: {S.PREPARE_LEAVING, S.LEAVING, S.FENCED},
    S.STALE: {S.LEAVING},
    S.FATAL: set(S) - {S.FENCED, S.STALE, S.FATAL},
}


def test_ten_states() -> None:
    assert [s.value for s in S] == [
        "UNSUBSCRIBED",
        "JOINING",
        "RECONCILING",
        "ACKNOWLEDGING",
        "STABLE",
        "FENCED",
        "PREPARE_LEAVING",
        "LEAVING",
        "STALE",
        "FATAL",
    ]


def test_table_matches_reference() -> None:
    assert {k: set(v) for k, v in TRANSITIONS.items()} == EXPECTED
    assert set(TRIGGERS) == set(TRANSITIONS) == set(S)


def test_state_groups() -> None:
    assert {S.STABLE, S.JOINING, S.ACKNOWLEDGING, S.RECONCILING} == ACCEPTS_ASSIGNMENT
    assert {S.UNSUBSCRIBED, S.FENCED, S.FATAL, S.STALE} == NOT_IN_GROUP


@pytest.mark.parametrize(("old", "new"), list(itertools.product(S, S)))
def test_every_pair_follows_the_table(old: MemberState, new: MemberState) -> None:
    seen: list[tuple[MemberState, MemberState, str]] = []
    machine = StateMachine(lambda o, n, r: seen.append((o, n, r)), initial=old)
    allowed = old is new or old in EXPECTED[new]
    assert is_allowed(old, new) is allowed
    if allowed:
        machine.transition(new, "test")
        assert machine.state is new
        assert seen == [(old, new, "test")]
    else:
        with pytest.raises(IllegalTransition) as info:
            machine.transition(new, "test")
        assert isinstance(info.value, RuntimeError)
        assert (info.value.old, info.value.new) == (old, new)
        assert machine.state is old
        assert seen == []


def test_fatal_is_terminal() -> None:
    assert all(S.FATAL not in sources for target, sources in TRANSITIONS.items())


def test_diagram_has_one_edge_per_allowed_transition() -> None:
    text = render_mermaid()
    assert text.startswith("stateDiagram-v2\n")
    edges = {
        tuple(line.split(" : ")[0].strip().split(" --> "))
        for line in text.splitlines()
        if " --> " in line and "[*]" not in line
    }
    expected = {(src.value, dst.value) for dst, srcs in EXPECTED.items() for src in srcs}
    assert edges == expected


def test_committed_diagram_is_up_to_date() -> None:
    committed = (REPO / "docs" / "state-diagram.md").read_text()
    assert committed == render_markdown(), (
        "regenerate: python -m consumer_sdk.membership.diagram --markdown > docs/state-diagram.md"
    )


def test_diagram_module_runs() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "consumer_sdk.membership.diagram"],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    ).stdout
    assert out == render_mermaid()
