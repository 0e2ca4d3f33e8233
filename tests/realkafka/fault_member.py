"""A chaos member process that also logs every ConsumerGroupHeartbeat of an SDK member.

``python -m tests.realkafka.fault_member`` takes the arguments of ``python -m
consumer_sdk.chaos member`` and writes the same JSON lines, plus one ``hb`` line per
heartbeat: ``sent`` (the request's member epoch), then ``code`` and ``got`` (the response's
error code and member epoch) or ``failure`` (no response). The fault tests read the epoch
sequence of a fenced member from them.
"""

from __future__ import annotations

import sys
from typing import Any

from consumer_sdk.chaos.member import ChaosMember, member_main


class TracingMember(ChaosMember):
    def _make_consumer(self) -> Any:
        consumer = super()._make_consumer()
        if self.impl != "sdk":
            return consumer
        client = consumer._client
        real = client.heartbeat

        def traced(request: Any, timeout_s: float | None = None) -> Any:
            try:
                response = real(request, timeout_s)
            except Exception as exc:
                self.log.write("hb", flush=True, sent=request.member_epoch,
                               failure=type(exc).__name__)  # fmt: skip
                raise
            self.log.write("hb", flush=True, sent=request.member_epoch,
                           code=response.error_code, got=response.member_epoch)  # fmt: skip
            return response

        client.heartbeat = traced
        return consumer


if __name__ == "__main__":
    sys.exit(member_main(sys.argv[1:], TracingMember))
