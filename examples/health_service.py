"""A consumer run as a service: health endpoints, Prometheus metrics, shutdown on SIGTERM.

python examples/health_service.py                 # against EmbeddedKafka, port 8080
python examples/health_service.py HOST:PORT 9000  # a real Kafka 4.x cluster, port 9000

GET /healthz/live    200 while restarting would not help, else 503 (liveness probe)
GET /healthz/ready   200 while consuming in the group, else 503 (readiness probe)
GET /metrics         Prometheus exposition (needs the 'prometheus' extra)

Both health answers carry ``consumer.health()`` as JSON. SIGTERM (or Ctrl-C) ends the poll
loop; ``close()`` then commits, revokes and leaves the group before the process exits.
"""

from __future__ import annotations

import json
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from consumer_sdk import Consumer


def serve(consumer: Consumer, port: int) -> ThreadingHTTPServer:
    """Serve the health and metrics endpoints of ``consumer`` on 127.0.0.1:``port``."""
    metrics: Any = None
    try:
        from prometheus_client import CollectorRegistry, generate_latest

        from consumer_sdk.observability.prometheus import ConsumerCollector

        registry = CollectorRegistry()
        ConsumerCollector.register(registry).add(consumer)

        def metrics() -> bytes:
            return bytes(generate_latest(registry))
    except ImportError:
        pass

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path in ("/healthz/live", "/healthz/ready"):
                health = consumer.health()
                ok = health.live if self.path.endswith("live") else health.ready
                body = json.dumps(health.as_dict(), default=str).encode()
                self._answer(200 if ok else 503, "application/json", body)
            elif self.path == "/metrics" and metrics is not None:
                self._answer(200, "text/plain; version=0.0.4", metrics())
            else:
                self._answer(404, "text/plain", b"not found\n")

        def _answer(self, status: int, kind: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:  # quiet access log
            return

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, name="health-http", daemon=True).start()
    return server


def run(bootstrap: str, topic: str, port: int) -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": "example-health-service",
        "client.id": "health-service",
        "auto.offset.reset": "earliest",
    }
    consumer = Consumer(config)
    server = serve(consumer, port)
    print(f"serving on http://127.0.0.1:{server.server_address[1]}", flush=True)
    consumed = 0
    try:
        consumer.subscribe([topic])
        while not stop.is_set():
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            error = msg.error()
            if error is not None:
                print(f"error: {error}", flush=True)
                if error.fatal():  # nothing more will come: end (liveness fails, so restart)
                    break
                continue
            consumed += 1  # process the record here
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()  # commits, revokes and leaves the group
        server.shutdown()
    print(f"closed after {consumed} records", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and not args[0].startswith("--"):
        run(args[0], "events", int(args[1]) if len(args) > 1 else 8080)
    else:
        from consumer_sdk.testing import EmbeddedKafka

        # --port 0 picks a free port (the test does so).
        port = int(args[args.index("--port") + 1]) if "--port" in args else 8080
        with EmbeddedKafka() as kafka:
            kafka.create_topic("events", partitions=3)
            kafka.produce("events", [f"event-{i}".encode() for i in range(100)])
            run(kafka.bootstrap_servers, "events", port)
