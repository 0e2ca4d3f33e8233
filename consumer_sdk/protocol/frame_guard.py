"""Pure-Python bounds check of a response frame before kio's native decoder sees it.

kio's readers are native (Rust) and allocate an array's storage from its length prefix before
reading any element: a corrupted or hostile frame claiming billions of elements makes the
allocation fail and the whole process abort, with no Python exception. This module walks a
frame against the kio schema of its type and checks that every length prefix (string, bytes,
array element count, tagged-field count and size) fits in the bytes that remain, raising
`FrameBoundsError` that names the field otherwise. It checks sizes only; values and
nullability stay kio's to validate (kio raises ordinary exceptions for those).

The walk plan of each entity type is compiled once into closures; fixed-width runs of fields
are one addition.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Callable
from typing import Any

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from consumer_sdk.errors import ProtocolError

__all__ = ["FrameBoundsError", "check_frame", "entity_walker"]

#: walk(buf, pos, end) -> position after the value; raises FrameBoundsError
Walker = Callable[[bytes, int, int], int]

_FIXED_WIDTH = {
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from


# Walkers whose common case _compile inlines: "cstr" (compact string or bytes whose length
# fits one varint byte) and "tags" (an empty tagged-field section); the walker is the fallback.
_INLINE: dict[Walker, str] = {}


class FrameBoundsError(ProtocolError):
    """A length prefix or fixed-width field of a response runs past the end of its frame."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.detail = message


def _truncated(where: str, need: int, pos: int, end: int) -> FrameBoundsError:
    return FrameBoundsError(f"{where}: needs {need} bytes, {max(end - pos, 0)} remain")


def _uvarint(buf: bytes, pos: int, end: int, where: str) -> tuple[int, int]:
    if pos >= end:
        raise _truncated(where, 1, pos, end)
    b = buf[pos]
    pos += 1
    if b < 0x80:
        return b, pos
    value = b & 0x7F
    shift = 7
    while True:
        if pos >= end:
            raise FrameBoundsError(f"{where}: truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 28:
            raise FrameBoundsError(f"{where}: varint longer than 5 bytes")


def _fixed(width: int, where: str) -> Walker:
    def walk(buf: bytes, pos: int, end: int) -> int:
        if end - pos < width:
            raise _truncated(where, width, pos, end)
        return pos + width

    return walk


def _length_walker(flexible: bool, legacy_width: int, where: str) -> Walker:
    """A string or bytes value: its length prefix, then that many bytes."""
    if flexible:

        def walk_compact(buf: bytes, pos: int, end: int) -> int:
            if pos < end and buf[pos] < 0x80:
                n = buf[pos]
                pos += 1
            else:
                n, pos = _uvarint(buf, pos, end, where)
            if n > 1 and n - 1 > end - pos:  # n == 0: null, otherwise n - 1 bytes
                raise FrameBoundsError(
                    f"{where}: length {n - 1} exceeds the {end - pos} bytes that remain"
                )
            return pos + n - 1 if n else pos

        _INLINE[walk_compact] = "cstr"
        return walk_compact
    unpack = _I16 if legacy_width == 2 else _I32

    def walk_legacy(buf: bytes, pos: int, end: int) -> int:
        if end - pos < legacy_width:
            raise _truncated(where, legacy_width, pos, end)
        (n,) = unpack(buf, pos)
        pos += legacy_width
        if n < -1:
            raise FrameBoundsError(f"{where}: negative length {n}")
        if n > end - pos:
            raise FrameBoundsError(f"{where}: length {n} exceeds the {end - pos} bytes that remain")
        return pos + n if n > 0 else pos

    return walk_legacy


def _array_walker(flexible: bool, item: Walker | int, item_min: int, where: str) -> Walker:
    """An array: its element count, then the elements (fixed-width ones skipped at once)."""
    item_min = max(item_min, 1)
    if isinstance(item, int):
        return _fixed_array_walker(flexible, item, where)

    def check(n: int, pos: int, end: int) -> None:
        if n * item_min > end - pos:
            raise FrameBoundsError(
                f"{where}: array of {n} elements needs at least {n * item_min} bytes, "
                f"{max(end - pos, 0)} remain"
            )

    if flexible:

        def walk_compact(buf: bytes, pos: int, end: int) -> int:
            n, pos = _uvarint(buf, pos, end, where)
            if n > 1:  # n == 0: null, otherwise n - 1 elements
                check(n - 1, pos, end)
                for _ in range(n - 1):
                    pos = item(buf, pos, end)
            return pos

        return walk_compact

    def walk_legacy(buf: bytes, pos: int, end: int) -> int:
        if end - pos < 4:
            raise _truncated(where, 4, pos, end)
        (n,) = _I32(buf, pos)
        pos += 4
        if n < -1:
            raise FrameBoundsError(f"{where}: negative array length {n}")
        if n > 0:
            check(n, pos, end)
            for _ in range(n):
                pos = item(buf, pos, end)
        return pos

    return walk_legacy


def _fixed_array_walker(flexible: bool, width: int, where: str) -> Walker:
    def too_long(n: int, pos: int, end: int) -> FrameBoundsError:
        return FrameBoundsError(
            f"{where}: array of {n} elements needs {n * width} bytes, {max(end - pos, 0)} remain"
        )

    if flexible:

        def walk_compact(buf: bytes, pos: int, end: int) -> int:
            if pos < end and buf[pos] < 0x80:
                n = buf[pos]
                pos += 1
            else:
                n, pos = _uvarint(buf, pos, end, where)
            if n > 1:
                size = (n - 1) * width
                if size > end - pos:
                    raise too_long(n - 1, pos, end)
                pos += size
            return pos

        return walk_compact

    def walk_legacy(buf: bytes, pos: int, end: int) -> int:
        if end - pos < 4:
            raise _truncated(where, 4, pos, end)
        (n,) = _I32(buf, pos)
        pos += 4
        if n < -1:
            raise FrameBoundsError(f"{where}: negative array length {n}")
        if n > 0:
            if n * width > end - pos:
                raise too_long(n, pos, end)
            pos += n * width
        return pos

    return walk_legacy


def _nullable_entity(inner: Walker, where: str) -> Walker:
    def walk(buf: bytes, pos: int, end: int) -> int:
        if pos >= end:
            raise _truncated(where, 1, pos, end)
        if buf[pos] == 0xFF:  # int8 -1: null (KIP-893)
            return pos + 1
        return inner(buf, pos + 1, end)

    return walk


def _primitive(kafka_type: str, flexible: bool, where: str) -> tuple[Walker | int, int]:
    """A walker (or a fixed width) for one primitive value, and its minimal encoded size."""
    width = _FIXED_WIDTH.get(kafka_type)
    if width is not None:
        return width, width
    if kafka_type == "string":
        return _length_walker(flexible, 2, where), 1 if flexible else 2
    if kafka_type in ("bytes", "records"):
        return _length_walker(flexible, 4, where), 1 if flexible else 4
    raise TypeError(f"{where}: no bounds rule for kafka type {kafka_type!r}")


def _field(
    entity_type: type[Any], field: dataclasses.Field[Any], is_tag: bool
) -> tuple[Walker | int, int]:
    """The walker (or fixed width) of one field and its minimal encoded size; mirrors
    kio's field classification (tagged fields are never nullable on the wire)."""
    flexible: bool = entity_type.__flexible__
    where = f"{entity_type.__name__}.{field.name}"
    optional = False if is_tag else is_optional(field)
    match classify_field(field):
        case PrimitiveField():
            return _primitive(get_schema_field_type(field), flexible, where)
        case PrimitiveTupleField():
            item, item_min = _primitive(get_schema_field_type(field), flexible, where)
            return _array_walker(flexible, item, item_min, where), 1 if flexible else 4
        case EntityField(inner_type):
            inner, inner_min = _entity_plan(inner_type)
            if optional:
                return _nullable_entity(inner, where), 1
            return inner, inner_min
        case EntityTupleField(inner_type):
            inner, inner_min = _entity_plan(inner_type)
            return _array_walker(flexible, inner, inner_min, where), 1 if flexible else 4
    raise TypeError(f"{where}: unclassified field")  # pragma: no cover


def _tagged_section(name: str, tagged: dict[int, tuple[Walker, str]]) -> Walker:
    where = f"{name} tagged fields"

    def walk(buf: bytes, pos: int, end: int) -> int:
        if pos < end and buf[pos] == 0:  # the common case: no tagged fields
            return pos + 1
        count, pos = _uvarint(buf, pos, end, where)
        if count * 2 > end - pos:  # each needs at least a tag and a size byte
            raise FrameBoundsError(
                f"{where}: {count} tagged fields need at least {count * 2} bytes, "
                f"{max(end - pos, 0)} remain"
            )
        for _ in range(count):
            tag, pos = _uvarint(buf, pos, end, where)
            size, pos = _uvarint(buf, pos, end, f"{where} (tag {tag})")
            if size > end - pos:
                raise FrameBoundsError(
                    f"{where}: tag {tag} size {size} exceeds the {end - pos} bytes that remain"
                )
            stop = pos + size
            known = tagged.get(tag)
            if known is not None:
                # kio parses a known tag's content with the field's reader: bound that walk
                # by the tag's own size so nothing inside it can claim more.
                field_walk, field_where = known
                if field_walk(buf, pos, stop) > stop:  # pragma: no cover - walkers check
                    raise FrameBoundsError(f"{field_where}: runs past its tagged size {size}")
            pos = stop
        return pos

    _INLINE[walk] = "tags"
    return walk


_PLANS: dict[type[Any], tuple[Walker, int]] = {}


def _entity_plan(entity_type: type[Any]) -> tuple[Walker, int]:
    """The cached (walker, minimal encoded size) of an entity type."""
    plan = _PLANS.get(entity_type)
    if plan is None:
        plan = _PLANS[entity_type] = _build_plan(entity_type)
    return plan


def _build_plan(entity_type: type[Any]) -> tuple[Walker, int]:
    steps: list[Walker | int] = []
    minimum = 0
    tagged: dict[int, tuple[Walker, str]] = {}
    for field in dataclasses.fields(entity_type):
        tag = get_field_tag(field)
        step, step_min = _field(entity_type, field, tag is not None)
        if tag is not None:
            where = f"{entity_type.__name__}.{field.name}"
            tagged[int(tag)] = (_fixed(step, where) if isinstance(step, int) else step, where)
            continue
        minimum += step_min
        if isinstance(step, int) and steps and isinstance(steps[-1], int):
            steps[-1] += step  # coalesce runs of fixed-width fields
        else:
            steps.append(step)
    if entity_type.__flexible__:
        steps.append(_tagged_section(entity_type.__name__, tagged))
        minimum += 1
    return _compile(entity_type.__name__, steps), minimum


def _compile(name: str, steps: list[Walker | int]) -> Walker:
    """One straight-line function for an entity's steps (no per-step loop or type test)."""
    if all(isinstance(s, int) for s in steps):
        return _fixed(sum(steps), f"{name} fields")  # type: ignore[arg-type]
    lines = ["def walk(buf, pos, end):"]
    env: dict[str, Any] = {"FrameBoundsError": FrameBoundsError, "where": f"{name} fields"}
    for i, step in enumerate(steps):
        if isinstance(step, int):
            lines += [
                f"    pos += {step}",
                "    if pos > end:",
                "        raise FrameBoundsError(f'{where}: frame ends {pos - end} bytes early')",
            ]
            continue
        env[f"s{i}"] = step
        kind = _INLINE.get(step)
        if kind == "cstr":  # 0: null, 1: empty, n < 0x80: n - 1 bytes follow
            lines += [
                "    if pos < end and buf[pos] < 0x80:",
                "        n = buf[pos]",
                "        if n <= 1:",
                "            pos += 1",
                "        elif n <= end - pos:",
                "            pos += n",
                "        else:",
                f"            pos = s{i}(buf, pos, end)",
                "    else:",
                f"        pos = s{i}(buf, pos, end)",
            ]
        elif kind == "tags":
            lines += [
                "    if pos < end and buf[pos] == 0:",
                "        pos += 1",
                "    else:",
                f"        pos = s{i}(buf, pos, end)",
            ]
        else:
            lines.append(f"    pos = s{i}(buf, pos, end)")
    lines.append("    return pos")
    exec("\n".join(lines), env)  # the source is built above from integers and step names
    walk: Walker = env["walk"]
    return walk


def entity_walker(entity_type: type[Any]) -> Walker:
    """The cached bounds walker of a kio entity type."""
    return _entity_plan(entity_type)[0]


def check_frame(frame: bytes, header_type: type[Any], body_type: type[Any]) -> None:
    """Raise `FrameBoundsError` unless every length in ``frame`` (header then body) fits."""
    end = len(frame)
    plans = _PLANS
    header = plans.get(header_type) or _entity_plan(header_type)
    body = plans.get(body_type) or _entity_plan(body_type)
    body[0](frame, header[0](frame, 0, end), end)
