"""Optional OpenTelemetry export (``pip install consumer-sdk[otel]``): see :mod:`.otel`."""
