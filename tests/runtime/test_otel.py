"""OpenTelemetry export of a real consumer's metrics and spans (EmbeddedKafka)."""

from __future__ import annotations

import logging
import math
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from consumer_sdk import Consumer, KafkaException
from consumer_sdk.observability.otel import instrument
from consumer_sdk.testing import EmbeddedKafka
from tests.runtime.harness import config, wait_for


def test_metrics_and_messaging_spans(embedded_kafka: EmbeddedKafka) -> None:
    topic, group = "otel-t", "otel-g"
    embedded_kafka.create_topic(topic, partitions=1)
    embedded_kafka.produce(topic, [b"a", b"b"])
    spans = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    c = Consumer({**config(embedded_kafka, group), "enable.auto.commit": False})
    handle = instrument(c, tracer_provider=tracing, meter_provider=meters)
    try:
        c.subscribe([topic])
        msg: Any = wait_for(lambda: c.poll(0.2), what="a record")
        with handle.process(msg):
            pass
        c.commit(msg, asynchronous=False)
        metrics = c.metrics()
        assert metrics["commit-total"] == 1, "the commit path records commit metrics"
        assert math.isfinite(metrics["commit-latency-avg"]) and metrics["commit-rate"] > 0
        names = [s.name for s in spans.get_finished_spans()]
        assert names[:3] == [f"poll {topic}", f"process {topic}", "commit"]
        receive = spans.get_finished_spans()[0]
        assert receive.kind is SpanKind.CLIENT
        assert receive.attributes["messaging.operation.name"] == "poll"
        assert receive.attributes["messaging.operation.type"] == "receive"
        assert receive.attributes["messaging.destination.name"] == topic
        assert receive.attributes["messaging.system"] == "kafka"
        assert receive.attributes["messaging.consumer.group.name"] == group
        assert receive.attributes["messaging.kafka.offset"] == msg.offset()
        data = reader.get_metrics_data()
        exported = {
            m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
        }
        assert "kafka.consumer.coordinator.heartbeat_total" in exported
        assert "kafka.consumer.coordinator.rebalance_latency_avg" in exported
        handle.uninstrument()
        assert "poll" not in vars(c)
    finally:
        c.close()


def _exported(reader: InMemoryMetricReader) -> dict[str, list[float]]:
    data = reader.get_metrics_data()
    out: dict[str, list[float]] = {}
    if data is None:
        return out
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                out.setdefault(m.name, []).extend(p.value for p in m.data.data_points)
    return out


def test_consume_spans_no_nan_and_failed_calls(
    embedded_kafka: EmbeddedKafka, caplog: pytest.LogCaptureFixture
) -> None:
    topic, group = "otel-consume-t", "otel-consume-g"
    embedded_kafka.create_topic(topic, partitions=2)
    embedded_kafka.produce(topic, [b"a", b"b", b"c", b"d"])
    spans = InMemorySpanExporter()
    tracing = TracerProvider()
    tracing.add_span_processor(SimpleSpanProcessor(spans))
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    c = Consumer({**config(embedded_kafka, group), "enable.auto.commit": False})
    handle = instrument(c, tracer_provider=tracing, meter_provider=meters)
    try:
        # Before any rebalance, averages and maxima have no samples (NaN in metrics()).
        assert math.isnan(c.metrics()["rebalance-latency-avg"])
        with caplog.at_level(logging.WARNING, logger="opentelemetry"):
            before = _exported(reader)
        assert not [r for r in caplog.records if "non-finite" in r.getMessage()]
        assert "kafka.consumer.coordinator.rebalance_latency_avg" not in before
        assert "kafka.consumer.coordinator.heartbeat_total" in before
        assert all(math.isfinite(v) for values in before.values() for v in values)

        c.subscribe([topic])
        got: list[Any] = []
        wait_for(lambda: got.extend(c.consume(10, 0.2)) or len(got) >= 4, what="4 records")
        consume_spans = [s for s in spans.get_finished_spans() if s.name.startswith("consume")]
        assert consume_spans, [s.name for s in spans.get_finished_spans()]
        assert sum(s.attributes["messaging.batch.message_count"] for s in consume_spans) == 4
        for span in consume_spans:
            assert span.name == f"consume {topic}"
            assert span.attributes["messaging.operation.name"] == "consume"
            assert span.attributes["messaging.operation.type"] == "receive"
            assert span.attributes["messaging.consumer.group.name"] == group
            assert span.end_time >= span.start_time
        with caplog.at_level(logging.WARNING, logger="opentelemetry"):
            after = _exported(reader)
        assert not [r for r in caplog.records if "non-finite" in r.getMessage()]
        assert "kafka.consumer.coordinator.rebalance_latency_avg" in after
    finally:
        c.close()
    spans.clear()
    with pytest.raises(KafkaException):
        c.poll(0.1)
    (failed,) = spans.get_finished_spans()
    assert failed.name == "poll"
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "_STATE"
    handle.uninstrument()


def test_two_consumers_on_one_meter_are_two_series(embedded_kafka: EmbeddedKafka) -> None:
    topic, group = "otel-two-t", "otel-two-g"
    embedded_kafka.create_topic(topic, partitions=2)
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    consumers = [
        Consumer({**config(embedded_kafka, group), "client.id": f"svc-{i}"}) for i in range(2)
    ]
    handles = [instrument(c, meter_provider=meters) for c in consumers]
    try:
        for c in consumers:
            c.subscribe([topic])

        def points() -> dict[str, float]:
            for c in consumers:
                c.poll(0.05)
            data = reader.get_metrics_data()
            for rm in data.resource_metrics if data is not None else ():
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        if m.name == "kafka.consumer.coordinator.assigned_partitions":
                            return {
                                str(p.attributes["messaging.client.id"]): p.value
                                for p in m.data.data_points
                            }
            return {}

        wait_for(lambda: points() == {"svc-0": 1, "svc-1": 1}, what="one partition each")
        data = reader.get_metrics_data()
        members = {
            p.attributes["messaging.consumer.member.id"]
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for m in sm.metrics
            if m.name == "kafka.consumer.coordinator.heartbeat_total"
            for p in m.data.data_points
        }
        assert members == {c.member_id for c in consumers}
        handles[0].uninstrument()
        assert set(points()) == {"svc-1"}
    finally:
        for c in consumers:
            c.close()
