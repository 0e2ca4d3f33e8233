"""OpenTelemetry for a consumer: its metrics as observable gauges, and messaging spans.

    from consumer_sdk.observability.otel import instrument
    handle = instrument(consumer)            # global providers, or pass your own
    ...
    handle.uninstrument()

Metrics keep the Java consumer's names under ``kafka.consumer.coordinator.*`` and
``kafka.consumer.fetch_manager.*`` (e.g. ``kafka.consumer.coordinator.rebalance_latency_avg``,
``kafka.consumer.fetch_manager.records_lag``), with the attributes
``messaging.consumer.group.name``, ``messaging.client.id`` (``client.id``) and
``messaging.consumer.member.id`` (plus ``messaging.destination.name`` and
``messaging.destination.partition.id`` per partition), so consumers instrumented on one meter
are separate series. A metric without samples (an average before the first rebalance) is not
reported rather than reported as NaN. Spans follow the
OpenTelemetry messaging semantic conventions (name ``{messaging.operation.name} {topic}``):

| span | kind | operation name / type | emitted for |
| --- | --- | --- | --- |
| `poll <topic>` | CLIENT | `poll` / `receive` | a `poll()` that returned a record |
| `consume <topic>` | CLIENT | `consume` / `receive` | a `consume()` that returned records |
| `process <topic>` | CONSUMER | `process` / `process` | `with handle.process(msg):` |
| `commit` | CLIENT | `commit` / `settle` | a synchronous `commit()` |

``consume`` spans carry ``messaging.batch.message_count`` and drop the topic from their name
when the records come from several topics.

A `poll`/`consume`/`commit` that raises ends its span with status ERROR and ``error.type``.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

try:
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace as otel_trace
    from opentelemetry.metrics import CallbackOptions, Observation
    from opentelemetry.trace import SpanKind, Status, StatusCode
except ImportError as exc:  # pragma: no cover - depends on the extra
    raise ImportError(
        "consumer_sdk.observability.otel needs OpenTelemetry: pip install 'kip848-consumer[otel]'"
    ) from exc

from consumer_sdk.observability.samples import Sample, collect, export_name, metric_keys
from consumer_sdk.runtime.group_member import GroupMember

__all__ = ["Instrumentation", "instrument"]

_SCOPE = "consumer_sdk"

# Sample labels -> OpenTelemetry attribute names.
_ATTRIBUTES = {
    "group": "messaging.consumer.group.name",
    "client_id": "messaging.client.id",
    "member_id": "messaging.consumer.member.id",
    "topic": "messaging.destination.name",
    "partition": "messaging.destination.partition.id",
}
# One collection reads each consumer once, not once per instrument.
_FRESH_S = 0.5


class _MeterExport:
    """The observable gauges of one meter, shared by every consumer instrumented on it (an
    instrument name can be created once per meter)."""

    def __init__(self, meter: Any) -> None:
        self._lock = threading.Lock()
        self._members: list[GroupMember] = []
        self._cache: dict[int, tuple[float, list[Sample]]] = {}
        self.gauges = [
            meter.create_observable_gauge(
                export_name(group, name, "."),
                callbacks=[functools.partial(self._observe, group, name)],
                description=f"{group} {name}",
            )
            for group, name in metric_keys()
        ]

    def add(self, member: GroupMember) -> None:
        with self._lock:
            if member not in self._members:
                self._members.append(member)

    def remove(self, member: GroupMember) -> None:
        with self._lock:
            if member in self._members:
                self._members.remove(member)
            self._cache.pop(id(member), None)

    def _samples(self, member: GroupMember) -> list[Sample]:
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(id(member))
        if cached is not None and now - cached[0] < _FRESH_S:
            return cached[1]
        try:
            samples = collect(member)
        except Exception:
            samples = []
        with self._lock:
            self._cache[id(member)] = (now, samples)
        return samples

    def _observe(self, group: str, name: str, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            members = list(self._members)
        out = []
        for member in members:
            for sample in self._samples(member):
                if sample.name == name and sample.group == group:
                    attrs = {_ATTRIBUTES[k]: v for k, v in sample.labels}
                    out.append(Observation(sample.value, attrs))
        return out


_EXPORTS: dict[int, tuple[Any, _MeterExport]] = {}
_EXPORTS_LOCK = threading.Lock()


def _export_for(meter_provider: Any) -> _MeterExport:
    """The export of ``meter_provider`` (one per provider: its meters share instruments)."""
    with _EXPORTS_LOCK:
        found = _EXPORTS.get(id(meter_provider))
        if found is None or found[0] is not meter_provider:
            meter = otel_metrics.get_meter(_SCOPE, meter_provider=meter_provider)
            found = _EXPORTS[id(meter_provider)] = (meter_provider, _MeterExport(meter))
        return found[1]


def _record_attributes(member: GroupMember, msg: Any) -> dict[str, Any]:
    return {
        "messaging.system": "kafka",
        "messaging.destination.name": msg.topic(),
        "messaging.destination.partition.id": str(msg.partition()),
        "messaging.kafka.offset": msg.offset(),
        "messaging.consumer.group.name": member.group_id,
        "messaging.client.id": member.member_id,
    }


def _error_type(exc: Exception) -> str:
    """The Kafka error name (``UNKNOWN_MEMBER_ID``) when there is one, else the class name."""
    error = exc.args[0] if exc.args else None
    name = getattr(error, "name", None)
    if callable(name):
        with contextlib.suppress(Exception):
            return str(name())
    return type(exc).__qualname__


class Instrumentation:
    """What `instrument` installed on one consumer; `uninstrument` removes it."""

    def __init__(self, member: GroupMember, tracer: Any, meter_provider: Any) -> None:
        self.member = member
        self.tracer = tracer
        self._originals: dict[str, Callable[..., Any]] = {}
        self._export = _export_for(meter_provider)
        self._export.add(member)
        self._gauges = self._export.gauges
        self._wrap("poll", self._receive("poll", batch=False))
        if hasattr(member, "consume"):
            self._wrap("consume", self._receive("consume", batch=True))
        self._wrap("commit", self._commit)

    def _wrap(self, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        original = getattr(self.member, name)
        self._originals[name] = original
        setattr(self.member, name, make(original))

    def _receive(
        self, operation: str, batch: bool
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Wrap ``poll`` (one record) or ``consume`` (a list): one receive span per call that
        returned records, spanning the call itself."""

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def receive(*args: Any, **kwargs: Any) -> Any:
                started = time.time_ns()
                try:
                    result = original(*args, **kwargs)
                except Exception as exc:
                    self._failed_span(operation, "receive", started, exc)
                    raise
                records = [m for m in (result if batch else [result]) if m is not None]
                records = [m for m in records if m.error() is None]
                if records:
                    self._receive_span(operation, started, records, batch)
                return result

            return receive

        return make

    def _receive_span(self, operation: str, started: int, records: list[Any], batch: bool) -> None:
        topics = {m.topic() for m in records}
        attributes: dict[str, Any] = {
            "messaging.system": "kafka",
            "messaging.operation.name": operation,
            "messaging.operation.type": "receive",
            "messaging.consumer.group.name": self.member.group_id,
            "messaging.client.id": self.member.member_id,
        }
        name = operation
        if len(topics) == 1:
            topic = next(iter(topics))
            name = f"{operation} {topic}"
            attributes["messaging.destination.name"] = topic
            partitions = {m.partition() for m in records}
            if len(partitions) == 1:
                attributes["messaging.destination.partition.id"] = str(next(iter(partitions)))
        if batch:
            attributes["messaging.batch.message_count"] = len(records)
        else:
            attributes["messaging.kafka.offset"] = records[0].offset()
        span = self.tracer.start_span(
            name, kind=SpanKind.CLIENT, attributes=attributes, start_time=started
        )
        span.end()

    def _failed_span(self, operation: str, kind: str, started: int, exc: Exception) -> None:
        span = self.tracer.start_span(
            operation,
            kind=SpanKind.CLIENT,
            start_time=started,
            attributes={
                "messaging.system": "kafka",
                "messaging.operation.name": operation,
                "messaging.operation.type": kind,
                "messaging.consumer.group.name": self.member.group_id,
                "error.type": _error_type(exc),
            },
        )
        span.set_status(Status(StatusCode.ERROR, str(exc)))
        span.end()

    def _commit(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def commit(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("asynchronous", True) and len(args) < 3:
                return original(*args, **kwargs)
            with self.tracer.start_as_current_span(
                "commit",
                kind=SpanKind.CLIENT,
                attributes={
                    "messaging.system": "kafka",
                    "messaging.operation.name": "commit",
                    "messaging.operation.type": "settle",
                    "messaging.consumer.group.name": self.member.group_id,
                    "messaging.kafka.member_epoch": self.member.member_epoch,
                },
            ) as span:
                try:
                    return original(*args, **kwargs)
                except Exception as exc:
                    span.set_attribute("error.type", _error_type(exc))
                    span.set_status(Status(StatusCode.ERROR, str(exc)))
                    raise

        return commit

    @contextlib.contextmanager
    def process(self, msg: Any) -> Iterator[Any]:
        """``with handle.process(msg): ...`` wraps the application's work on one record."""
        with self.tracer.start_as_current_span(
            f"process {msg.topic()}",
            kind=SpanKind.CONSUMER,
            attributes={
                **_record_attributes(self.member, msg),
                "messaging.operation.name": "process",
                "messaging.operation.type": "process",
            },
        ) as span:
            yield span

    def uninstrument(self) -> None:
        """Remove the wrappers (the class's own methods show through again) and stop
        exporting this consumer's metrics."""
        self._export.remove(self.member)
        for name in self._originals:
            vars(self.member).pop(name, None)
        self._originals.clear()


def instrument(
    member: GroupMember, *, tracer_provider: Any = None, meter_provider: Any = None
) -> Instrumentation:
    """Export ``member``'s metrics and emit messaging spans through OpenTelemetry."""
    tracer = otel_trace.get_tracer(_SCOPE, tracer_provider=tracer_provider)
    if meter_provider is None:
        meter_provider = otel_metrics.get_meter_provider()
    return Instrumentation(member, tracer, meter_provider)
