"""OpenTelemetry for a consumer: its metrics as observable gauges, and messaging spans.

    from consumer_sdk.observability.otel import instrument
    handle = instrument(consumer)            # global providers, or pass your own
    ...
    handle.uninstrument()

Metrics keep the Java consumer's names under ``kafka.consumer.coordinator.*`` (e.g.
``kafka.consumer.coordinator.rebalance_latency_avg``). Spans follow the OpenTelemetry
messaging semantic conventions: ``receive <topic>`` for each record ``poll()`` returns,
``process <topic>`` for work the application wraps with `Instrumentation.process`,
and ``commit`` (operation type ``settle``) for synchronous commits.
"""

from __future__ import annotations

import contextlib
import functools
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

from consumer_sdk.runtime.group_member import GroupMember

__all__ = ["Instrumentation", "instrument"]

_SCOPE = "consumer_sdk"


def _record_attributes(member: GroupMember, msg: Any) -> dict[str, Any]:
    return {
        "messaging.system": "kafka",
        "messaging.destination.name": msg.topic(),
        "messaging.destination.partition.id": str(msg.partition()),
        "messaging.kafka.offset": msg.offset(),
        "messaging.consumer.group.name": member.group_id,
        "messaging.client.id": member.member_id,
    }


class Instrumentation:
    """What `instrument` installed on one consumer; `uninstrument` removes it."""

    def __init__(self, member: GroupMember, tracer: Any, meter: Any) -> None:
        self.member = member
        self.tracer = tracer
        self._originals: dict[str, Callable[..., Any]] = {}
        self._gauges = []
        names = sorted(member.metrics())
        for name in names:
            self._gauges.append(
                meter.create_observable_gauge(
                    f"kafka.consumer.coordinator.{name.replace('-', '_')}",
                    callbacks=[functools.partial(self._observe, name)],
                    description=f"consumer-coordinator-metrics {name}",
                )
            )
        self._wrap("poll", self._poll)
        self._wrap("commit", self._commit)

    def _observe(self, name: str, options: CallbackOptions) -> Iterable[Observation]:
        try:
            value = self.member.metrics().get(name)
        except Exception:
            return []
        attrs = {"messaging.consumer.group.name": self.member.group_id}
        return [] if value is None else [Observation(value, attrs)]

    def _wrap(self, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        original = getattr(self.member, name)
        self._originals[name] = original
        setattr(self.member, name, make(original))

    def _poll(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def poll(*args: Any, **kwargs: Any) -> Any:
            msg = original(*args, **kwargs)
            if msg is not None and msg.error() is None:
                with self.tracer.start_as_current_span(
                    f"receive {msg.topic()}",
                    kind=SpanKind.CONSUMER,
                    attributes={
                        **_record_attributes(self.member, msg),
                        "messaging.operation.type": "receive",
                    },
                ):
                    pass
            return msg

        return poll

    def _commit(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def commit(*args: Any, **kwargs: Any) -> Any:
            if kwargs.get("asynchronous", True) and len(args) < 3:
                return original(*args, **kwargs)
            with self.tracer.start_as_current_span(
                "commit",
                kind=SpanKind.CLIENT,
                attributes={
                    "messaging.system": "kafka",
                    "messaging.operation.type": "settle",
                    "messaging.consumer.group.name": self.member.group_id,
                    "messaging.kafka.member_epoch": self.member.member_epoch,
                },
            ) as span:
                try:
                    return original(*args, **kwargs)
                except Exception as exc:
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
                "messaging.operation.type": "process",
            },
        ) as span:
            yield span

    def uninstrument(self) -> None:
        """Remove the wrappers (the class's own methods show through again)."""
        for name in self._originals:
            vars(self.member).pop(name, None)
        self._originals.clear()


def instrument(
    member: GroupMember, *, tracer_provider: Any = None, meter_provider: Any = None
) -> Instrumentation:
    """Export ``member``'s metrics and emit messaging spans through OpenTelemetry."""
    tracer = otel_trace.get_tracer(_SCOPE, tracer_provider=tracer_provider)
    meter = otel_metrics.get_meter(_SCOPE, meter_provider=meter_provider)
    return Instrumentation(member, tracer, meter)
