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
        net = consumer._net
        real = net.heartbeat_trace

        def traced(request: Any, sent_at: float, response: Any, error: Any) -> None:
            if error is not None:
                self.log.write(
                    "hb", flush=True, sent=request.member_epoch, failure=type(error).__name__
                )
            else:
                self.log.write(
                    "hb",
                    flush=True,
                    sent=request.member_epoch,
                    code=response.error_code,
                    got=response.member_epoch,
                )
            if real is not None:
                real(request, sent_at, response, error)

        net.heartbeat_trace = traced
        return consumer


if __name__ == "__main__":
    sys.exit(member_main(sys.argv[1:], TracingMember))
