"""OpenTelemetry export of a real consumer's metrics and spans (EmbeddedKafka)."""

from __future__ import annotations

from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from consumer_sdk import Consumer
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
        names = [s.name for s in spans.get_finished_spans()]
        assert names[:3] == [f"receive {topic}", f"process {topic}", "commit"]
        receive = spans.get_finished_spans()[0]
        assert receive.attributes["messaging.system"] == "kafka"
        assert receive.attributes["messaging.consumer.group.name"] == group
        assert receive.attributes["messaging.kafka.offset"] == msg.offset()
        data = reader.get_metrics_data()
        exported = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics
                    for m in sm.metrics}  # fmt: skip
        assert "kafka.consumer.coordinator.heartbeat_total" in exported
        assert "kafka.consumer.coordinator.rebalance_latency_avg" in exported
        handle.uninstrument()
        assert "poll" not in vars(c)
    finally:
        c.close()
