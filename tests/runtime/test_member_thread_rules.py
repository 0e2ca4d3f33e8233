"""The adapter's thread rules: loop-thread-only code refuses another thread (under pytest),
and the application side gets a frozen snapshot and completions, not the core."""

from __future__ import annotations

import queue

import pytest

from consumer_sdk.config import ConsumerConfig
from consumer_sdk.membership import MemberState
from consumer_sdk.runtime import member_network
from consumer_sdk.runtime.driver import MemberSnapshot
from consumer_sdk.runtime.fetcher import Fetcher
from consumer_sdk.runtime.member_network import MemberNetwork
from consumer_sdk.runtime.netloop import NetworkLoop


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


def test_the_loop_thread_takes_no_data_plane_lock() -> None:
    """The fetcher's locks (the application thread may hold them across a wait inside
    librdkafka) refuse the network loop thread; what the loop does with the fetcher (fence,
    read the published positions) takes neither."""
    fetcher = Fetcher({"bootstrap.servers": "127.0.0.1:1", "group.id": "thread-rules"})
    loop = NetworkLoop.acquire()
    done: queue.Queue[list[object]] = queue.Queue()

    def on_loop() -> None:
        outcomes: list[object] = []
        for lock in (fetcher._lock, fetcher._flight):
            try:
                with lock:
                    outcomes.append("taken")
            except AssertionError as exc:
                outcomes.append(str(exc))
        fetcher.fence({("t", 0)})
        outcomes.append(fetcher.publication.positions())
        done.put(outcomes)

    try:
        fetcher.assign({("t", 0): 5})
        loop.call_soon(on_loop)
        refused = "the network loop thread takes no data-plane lock"
        assert done.get(timeout=10) == [refused, refused, {("t", 0): (5, -1)}]
        with fetcher._flight:  # any other thread takes them
            assert fetcher.committable() == {("t", 0): (5, -1)}
    finally:
        loop.release()
        fetcher.close()
