"""docs/configuration.md agrees with consumer_sdk.config: every key the consumer accepts is
documented where it belongs, every documented key is accepted (or listed as rejected), and
every group-membership key says what it does. (tests/test_docs.py checks that the page is
what docs/gen.py generates; this checks what the page says against the code.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from consumer_sdk.config import (
    _CALLBACK_KEYS,
    CONNECTION_KEYS,
    FETCHER_KEYS,
    FORBIDDEN_KEYS,
    KNOWN_KEYS,
    ConsumerConfig,
)
from consumer_sdk.errors import ConfigError

PAGE = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def _sections() -> dict[str, str]:
    parts = re.split(r"^## (.+)$", PAGE.read_text(), flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def _table(section: str) -> dict[str, list[str]]:
    rows = {}
    for line in _sections()[section].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `") and cells:
            rows[cells[0].strip("`")] = cells[1:]
    return rows


def _model_keys() -> set[str]:
    return {f.alias for f in ConsumerConfig.model_fields.values() if f.alias and not f.exclude}


def test_group_keys_are_the_model_fields_each_with_a_description() -> None:
    rows = _table("Group membership")
    assert set(rows) == _model_keys()
    undocumented = [key for key, cells in rows.items() if not cells[-1]]
    assert undocumented == []


def test_connection_keys_are_the_connection_layers() -> None:
    assert set(_table("Connection and security")) == set(CONNECTION_KEYS) - _model_keys()


def test_rejected_keys_are_refused() -> None:
    rows = _table("Rejected keys")
    assert set(rows) == set(FORBIDDEN_KEYS)
    for key in rows:
        with pytest.raises(ConfigError, match=re.escape(key)):
            ConsumerConfig.from_mapping({"bootstrap.servers": "h:1", "group.id": "g", key: 1})


def test_data_plane_keys_and_callbacks() -> None:
    text = _sections()["Passed to the data plane"]
    paragraphs = [p for p in text.split("\n\n") if p.strip()]
    listed = next(p for p in paragraphs if p.lstrip().startswith("`"))
    assert set(re.findall(r"`([^`]+)`", listed)) == set(FETCHER_KEYS)
    callbacks = next(p for p in paragraphs if p.startswith("Callbacks:"))
    assert set(_CALLBACK_KEYS) <= set(re.findall(r"`([a-z_]+)`", callbacks))


def test_every_accepted_key_is_documented_and_every_documented_key_accepted() -> None:
    documented = (
        set(_table("Group membership"))
        | set(_table("Connection and security"))
        | set(FETCHER_KEYS)  # checked against the page above
        | set(_CALLBACK_KEYS)
    )
    assert documented == set(KNOWN_KEYS)
