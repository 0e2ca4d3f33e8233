"""The console script: demo, describe, plan, simulate."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from consumer_sdk.cli import main
from consumer_sdk.testing import EmbeddedKafka


def test_demo_runs_and_loses_nothing() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "consumer_sdk.cli", "demo", "--step", "0.5"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    out = result.stdout
    assert "a confluent-kafka member (group.protocol=consumer) joined" in out
    assert "closed and left the group" in out
    assert "no record lost" in out


def test_plan_prints_a_balanced_assignment_and_the_moves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    previous = tmp_path / "prev.json"
    previous.write_text(
        json.dumps({"member-1": {"orders": [0, 1, 2, 3]}, "member-2": {"orders": [4, 5, 6, 7]}})
    )
    out_file = tmp_path / "target.json"
    code = main(
        [
            "plan",
            "--members",
            "3",
            "--topic",
            "orders:8",
            "--previous",
            str(previous),
            "--json",
            str(out_file),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    assert "uniform assignment of 8 partitions to 3 members" in text
    assert "changes from --previous" in text
    target = json.loads(out_file.read_text())
    sizes = sorted(len(parts["orders"]) for parts in target.values())
    assert sizes == [2, 3, 3]
    kept = set(target["member-1"]["orders"]) <= {0, 1, 2, 3}
    assert kept, "uniform keeps member-1 within its previous partitions"


def test_plan_rejects_a_bad_topic_spec(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", "--topic", "orders"]) == 2
    assert "expected NAME:PARTITIONS" in capsys.readouterr().err


def test_simulate_front_end(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["simulate", "--members", "10", "--partitions", "30", "--minutes", "1", "--seed", "5"]
    )
    assert code == 0
    assert "violations         0" in capsys.readouterr().out


def test_describe_reports_a_broker_without_consumer_group_describe(
    embedded_kafka: EmbeddedKafka, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["describe", "some-group", "-b", embedded_kafka.bootstrap_servers, "--timeout", "5"]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "describe 'some-group' failed" in err and "ConsumerGroupDescribe (API 69)" in err


def _parsers() -> list[tuple[str, argparse.ArgumentParser]]:
    from consumer_sdk.cli import build_parser
    from consumer_sdk.simulation.cli import build_parser as build_simulation_parser

    parser = build_parser()
    out = [("consumer-sdk", parser)]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            out += [(f"consumer-sdk {n}", p) for n, p in action.choices.items() if n != "simulate"]
    out.append(("consumer-sdk simulate", build_simulation_parser("consumer-sdk simulate")))
    return out


@pytest.mark.parametrize("name", [name for name, _ in _parsers()])
def test_help_is_plain_text_and_covers_every_option(name: str) -> None:
    parser = dict(_parsers())[name]
    text = parser.format_help()
    for markup in ("``", ":class:", ":meth:", ":func:", ":mod:", ":data:"):
        assert markup not in text, f"{name} --help shows {markup!r}:\n{text}"
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                assert choice.help, f"{name}: command {choice.dest} has no help"
            continue
        assert action.help and action.help != argparse.SUPPRESS, (
            f"{name}: {action.option_strings or action.dest} has no help"
        )


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.metadata

    from consumer_sdk import __version__

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out.strip()
    ck = importlib.metadata.version("confluent-kafka")
    assert out == f"consumer-sdk {__version__} (kip848-consumer, confluent-kafka {ck})"
