"""Cost of the bounds check run on every response frame before kio's native decoder.

Measures, in one run, decoding ConsumerGroupHeartbeat v0 responses (a plain heartbeat, and one
carrying an assignment of 2 topics x 3 partitions) three ways: the bounds check alone
(``frame_guard.check_frame``), kio's native readers alone, and ``framing.decode_response``
(check + kio + correlation id), and the latter with the check switched off: the difference
is what the check adds per decoded heartbeat response. Best of 5 repeats.

    python -m bench.frame_guard [--number 200000]
"""

from __future__ import annotations

import argparse
import datetime
import io
import timeit
import uuid
from typing import Any

from kio.schema.consumer_group_heartbeat.v0.response import (
    Assignment,
    ConsumerGroupHeartbeatResponse,
    TopicPartitions,
)
from kio.schema.errors import ErrorCode
from kio.schema.response_header.v1.header import ResponseHeader
from kio.serial import entity_reader, entity_writer
from kio.static.primitive import i32, i32Timedelta

from consumer_sdk.protocol import framing
from consumer_sdk.protocol.frame_guard import check_frame
from consumer_sdk.protocol.framing import decode_response


def _frame(with_assignment: bool) -> bytes:
    assignment = None
    if with_assignment:
        assignment = Assignment(
            topic_partitions=tuple(
                TopicPartitions(topic_id=uuid.uuid4(), partitions=(i32(0), i32(1), i32(2)))
                for _ in range(2)
            )
        )
    response = ConsumerGroupHeartbeatResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        error_code=ErrorCode.none,
        error_message=None,
        member_id="m-" + "x" * 22,
        member_epoch=i32(5),
        heartbeat_interval=i32Timedelta.parse(datetime.timedelta(milliseconds=500)),
        assignment=assignment,
    )
    buf = io.BytesIO()
    entity_writer(ResponseHeader)(buf, ResponseHeader(correlation_id=i32(7)))
    entity_writer(ConsumerGroupHeartbeatResponse)(buf, response)
    return buf.getvalue()


def _us(fn: Any, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=200_000)
    args = parser.parse_args(argv)
    header_reader = entity_reader(ResponseHeader)
    body_reader = entity_reader(ConsumerGroupHeartbeatResponse)
    rt = ConsumerGroupHeartbeatResponse
    print(
        "| ConsumerGroupHeartbeat v0 response | bytes | check | kio | decode_response | unchecked "
        "| added |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for label, with_assignment in (("plain", False), ("assignment 2x3", True)):
        frame = _frame(with_assignment)
        check = _us(lambda frame=frame: check_frame(frame, ResponseHeader, rt), args.number)
        kio = _us(lambda frame=frame: body_reader(frame, header_reader(frame, 0)[1]), args.number)
        full = _us(lambda frame=frame: decode_response(frame, rt, 7), args.number)
        checked = framing._check_bounds
        framing._check_bounds = lambda *_: None  # type: ignore[assignment]
        try:
            unchecked = _us(lambda frame=frame: decode_response(frame, rt, 7), args.number)
        finally:
            framing._check_bounds = checked  # type: ignore[assignment]
        print(
            f"| {label} | {len(frame)} | {check:.2f} µs | {kio:.2f} µs | {full:.2f} µs "
            f"| {unchecked:.2f} µs | {full - unchecked:+.2f} µs |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
