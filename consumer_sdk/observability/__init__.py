"""Observability: per-consumer log routing and optional OpenTelemetry export.

- `log_routing`: the ``logger`` configuration key, routing one consumer's records (on the
  shared network-loop thread too) to the application's logger;
- `otel`: metrics as observable gauges and messaging spans
  (``pip install 'kip848-consumer[otel]'``).

Imports: `log_routing` the standard library only (the runtime imports it); `otel`
`consumer_sdk.runtime` and ``opentelemetry``. Threads: `log_routing` tells members apart by
the emitting thread and, on the loop thread, by the member whose work is running; `otel`
spans are recorded on the application thread inside the instrumented calls, and its gauges
are read on whatever thread the OpenTelemetry reader collects on.
"""
