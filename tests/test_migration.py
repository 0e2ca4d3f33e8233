"""docs/migration.md ("Coming from confluent-kafka") stays true to both libraries.

Methods: every public attribute of ``confluent_kafka.Consumer`` has a row; a "same" row needs
the method on ``consumer_sdk.Consumer`` with a compatible signature (confluent-kafka's
parameter names, order and defaults, as its docstrings document them: ``Consumer`` is a C
type without ``inspect`` signatures), "different" needs the method and a note, and "not
supported" needs a reason and fails once the method exists compatibly (flip the row).

Configuration keys: "not supported" keys are refused with a ConfigError naming them, the others
are accepted; every key the SDK knows and every consumer key of the bundled librdkafka has a row.
"""

from __future__ import annotations

import ctypes
import inspect
import re
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest

from consumer_sdk import Consumer
from consumer_sdk.config import FORBIDDEN_KEYS, KNOWN_KEYS, ConsumerConfig
from consumer_sdk.errors import ConfigError

PAGE = Path(__file__).resolve().parent.parent / "docs" / "migration.md"
STATUSES = ("same", "different", "not supported")
REQUIRED = object()

# Methods whose docstring has no ``.. py:function::`` line: confluent-kafka documents them
# without parameters.
UNDOCUMENTED_SIGNATURES: dict[str, list[tuple[str, object]]] = {
    "assignment": [],
    "close": [],
    "unassign": [],
    "unsubscribe": [],
}

# Keys librdkafka's configuration dump reports that only a producer (or librdkafka's own
# test harness) uses; a consumer refuses them like any unknown key.
PRODUCER_OR_TEST_KEYS = frozenset(
    {
        "transaction.timeout.ms",
        "enable.idempotence",
        "enable.gapless.guarantee",
        "queue.buffering.max.messages",
        "queue.buffering.max.kbytes",
        "queue.buffering.max.ms",
        "queue.buffering.backpressure.threshold",
        "message.send.max.retries",
        "compression.codec",
        "compression.level",
        "batch.num.messages",
        "batch.size",
        "delivery.report.only.error",
        "sticky.partitioning.linger.ms",
        "request.required.acks",
        "request.timeout.ms",
        "message.timeout.ms",
        "queuing.strategy",
        "produce.offset.report",
        "partitioner",
        "test.mock.num.brokers",
        "test.mock.broker.rtt",
    }
)


def _table(heading: str) -> dict[str, tuple[str, str]]:
    """``{first cell without backticks: (status, notes)}`` of the table under ``## heading``."""
    lines = PAGE.read_text().splitlines()
    start = lines.index(f"## {heading}")
    rows: dict[str, tuple[str, str]] = {}
    in_table = False
    for line in lines[start + 1 :]:
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            if in_table:
                break
            continue
        in_table = True
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] in ("Method", "Key") or set(cells[0]) <= {"-", " "}:
            continue
        assert len(cells) == 3, f"{heading}: a row needs 3 cells: {line}"
        name = cells[0].strip("`")
        assert name not in rows, f"{heading}: {name} is listed twice"
        assert cells[1] in STATUSES, f"{heading}: {name}: status {cells[1]!r} not in {STATUSES}"
        rows[name] = (cells[1], cells[2])
    return rows


def _method_rows() -> dict[str, tuple[str, str]]:
    return {re.sub(r"\(.*", "", k): v for k, v in _table("Methods").items()}


def _parse_default(text: str) -> object:
    constants: dict[str, object] = {"None": None, "True": True, "False": False}
    if text in constants:
        return constants[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def confluent_signature(name: str) -> list[tuple[str, object]]:
    """``[(parameter, default or REQUIRED)]`` from confluent-kafka's docstring."""
    doc = getattr(confluent_kafka.Consumer, name).__doc__ or ""
    match = re.search(rf"\.\. py:function:: {name}\((.*)\)", doc)
    if match is None:
        return UNDOCUMENTED_SIGNATURES[name]
    params: list[tuple[str, object]] = []
    for raw in filter(None, (p.strip() for p in match.group(1).split(","))):
        optional = raw.startswith("[")
        raw = raw.strip("[]")
        pname, _, default = raw.partition("=")
        params.append((pname.strip(), _parse_default(default.strip()) if optional else REQUIRED))
    return params


def _same_default(name: str, theirs: object, ours: object) -> bool:
    # confluent-kafka documents "no timeout" as None for some methods and -1 for others.
    if name == "timeout" and theirs in (None, -1) and ours in (None, -1):
        return True
    return theirs == ours


def incompatibilities(name: str) -> list[str]:
    """Why ``consumer_sdk.Consumer.name`` cannot stand in for confluent-kafka's (empty: it can)."""
    ours = getattr(Consumer, name, None)
    if ours is None or not callable(ours):
        return [f"consumer_sdk.Consumer has no method {name}"]
    params = [p for p in inspect.signature(ours).parameters.values() if p.name != "self"]
    problems = []
    for i, (pname, default) in enumerate(confluent_signature(name)):
        if i >= len(params) or params[i].name != pname:
            got = params[i].name if i < len(params) else "nothing"
            problems.append(f"parameter {i + 1} is {got}, confluent-kafka's is {pname}")
            continue
        has_default = params[i].default is not inspect.Parameter.empty
        if default is REQUIRED and has_default:
            continue  # more lenient than confluent-kafka: fine
        if default is not REQUIRED and not has_default:
            problems.append(f"{pname} is required, confluent-kafka defaults it to {default!r}")
        elif default is not REQUIRED and not _same_default(pname, default, params[i].default):
            problems.append(
                f"{pname} defaults to {params[i].default!r}, confluent-kafka's to {default!r}"
            )
    extra = params[len(confluent_signature(name)) :]
    for p in extra:
        if p.default is inspect.Parameter.empty and p.kind is not p.VAR_KEYWORD:
            problems.append(f"extra parameter {p.name} has no default")
    return problems


PUBLIC_METHODS = sorted(n for n in dir(confluent_kafka.Consumer) if not n.startswith("_"))


def test_every_confluent_kafka_method_has_a_row() -> None:
    rows = _method_rows()
    missing = [n for n in PUBLIC_METHODS if n not in rows]
    assert not missing, f"docs/migration.md lacks rows for confluent_kafka.Consumer.{missing}"
    stale = [n for n in rows if n not in PUBLIC_METHODS]
    assert not stale, f"rows for methods confluent_kafka.Consumer does not have: {stale}"


@pytest.mark.parametrize("name", PUBLIC_METHODS)
def test_method_row_is_true(name: str) -> None:
    status, notes = _method_rows()[name]
    problems = incompatibilities(name)
    if status == "same":
        assert not problems, f"{name} is 'same' on the migration page, but: {problems}"
    elif status == "different":
        assert hasattr(Consumer, name), f"{name} is 'different' but does not exist"
        assert notes, f"{name}: say how it differs"
    else:
        assert notes, f"{name}: say why it is not supported"
        assert problems, (
            f"consumer_sdk.Consumer.{name} now matches confluent-kafka's signature: change its "
            "row in docs/migration.md from 'not supported' to 'same' (or 'different')"
        )
    # The row's own signature is confluent-kafka's (so the page reads as its documentation).
    documented = _table("Methods")
    (cell,) = [k for k in documented if re.sub(r"\(.*", "", k) == name]
    shown = [p.strip() for p in cell[cell.index("(") + 1 : -1].split(",") if p.strip()]
    expected = [p if d is REQUIRED else f"{p}={d!r}" for p, d in confluent_signature(name)]
    assert shown == expected, f"the row shows {cell}, confluent-kafka documents {expected}"


def test_signature_check_can_fail() -> None:
    # committed()'s default timeout differs (10 s vs none): the checker must see it.
    assert incompatibilities("committed") == ["timeout defaults to 10.0, confluent-kafka's to None"]
    assert confluent_signature("consume") == [("num_messages", 1), ("timeout", -1)]
    assert confluent_signature("seek") == [("partition", REQUIRED)]


def _librdkafka_consumer_keys() -> set[str]:
    """Every configuration key the bundled librdkafka dumps for a new (global + topic) conf."""
    from consumer_sdk.testing._mock_child import find_librdkafka

    lib = ctypes.CDLL(find_librdkafka())
    keys: set[str] = set()
    lib.rd_kafka_conf_dump_free.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t]
    for new, dump, destroy in (
        ("rd_kafka_conf_new", "rd_kafka_conf_dump", "rd_kafka_conf_destroy"),
        ("rd_kafka_topic_conf_new", "rd_kafka_topic_conf_dump", "rd_kafka_topic_conf_destroy"),
    ):
        getattr(lib, new).restype = ctypes.c_void_p
        getattr(lib, dump).restype = ctypes.POINTER(ctypes.c_char_p)
        getattr(lib, dump).argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t)]
        getattr(lib, destroy).argtypes = [ctypes.c_void_p]
        conf = getattr(lib, new)()
        count = ctypes.c_size_t()
        array = getattr(lib, dump)(conf, ctypes.byref(count))
        keys |= {array[i].decode() for i in range(0, count.value, 2)}
        lib.rd_kafka_conf_dump_free(array, count)
        getattr(lib, destroy)(conf)
    return keys


def test_every_consumer_key_has_a_row() -> None:
    rows = _table("Configuration keys")
    sdk_keys = set(KNOWN_KEYS) | set(FORBIDDEN_KEYS)
    missing = sorted(sdk_keys - set(rows))
    assert not missing, f"keys the SDK knows without a row in docs/migration.md: {missing}"
    librdkafka = _librdkafka_consumer_keys() - PRODUCER_OR_TEST_KEYS
    assert len(librdkafka) > 80, "the configuration dump looks wrong"
    missing = sorted(librdkafka - set(rows))
    assert not missing, (
        f"librdkafka {confluent_kafka.libversion()} consumer keys without a row: {missing}"
    )


def _config(key: str, value: Any) -> None:
    ConsumerConfig.from_mapping(
        {"bootstrap.servers": "localhost:9092", "group.id": "g", key: value}
    )


@pytest.mark.parametrize("key", sorted(_table("Configuration keys")))
def test_key_row_is_true(key: str) -> None:
    status, notes = _table("Configuration keys")[key]
    if status == "not supported":
        assert notes, f"{key}: say why it is not supported"
        assert key not in KNOWN_KEYS, (
            f"ConsumerConfig accepts {key}: change its row in docs/migration.md from "
            "'not supported' to 'same' (or 'different')"
        )
        with pytest.raises(ConfigError, match=re.escape(key)):
            _config(key, "1")
    else:
        assert key in KNOWN_KEYS, f"{key} is '{status}' on the migration page but is refused"
        if status == "different":
            assert notes, f"{key}: say how it differs"
