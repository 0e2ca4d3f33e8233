"""Observability of consumers: lag and counters (`client_metrics`), labelled samples of every
metric (`samples`), `health` verdicts, and exporters for Prometheus (`prometheus`, extra
``prometheus``) and OpenTelemetry (`otel`, extra ``otel``); `log_routing` for librdkafka's
logs."""
