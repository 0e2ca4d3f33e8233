"""Optional OpenTelemetry export (``pip install 'kip848-consumer[otel]'``): see `otel`."""
