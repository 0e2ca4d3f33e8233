"""The adapter's thread rules: loop-thread-only code refuses another thread (under pytest),
and the application side gets a frozen snapshot and completions, not the core."""

from __future__ import annotations

import pytest

from consumer_sdk.config import ConsumerConfig
from consumer_sdk.membership import MemberState
from consumer_sdk.runtime import member_network
from consumer_sdk.runtime.driver import MemberSnapshot
from consumer_sdk.runtime.member_network import MemberNetwork


def _member() -> MemberNetwork:
    # Nothing listens on port 1: the member only ever looks for a coordinator.
    conf = {"bootstrap.servers": "127.0.0.1:1", "group.id": "thread-rules"}
    return MemberNetwork(ConsumerConfig.from_mapping(conf))


def test_loop_thread_work_refuses_the_application_thread() -> None:
    assert member_network.check_threads  # the suite runs with CONSUMER_SDK_CHECK_THREADS=1
    net = _member()
    try:
        with pytest.raises(AssertionError, match="network loop thread only"):
            net._run()
        assert net.failure is None  # refused before it touched the member
    finally:
        net.stop()


def test_the_application_reads_a_frozen_snapshot_and_waits_with_deadlines() -> None:
    net = _member()
    try:
        snap = net.snapshot
        assert isinstance(snap, MemberSnapshot)
        assert snap.state is MemberState.UNSUBSCRIBED and snap.member_epoch == 0
        with pytest.raises(AttributeError):
            snap.state = MemberState.STABLE  # type: ignore[misc]
        # A query runs on the loop thread and comes back through a Completion.
        assert net.call(lambda d: d.core.member_id) == snap.member_id
    finally:
        net.stop()
