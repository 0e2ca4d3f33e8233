"""`Completion`: one outcome, completed once from any thread, awaited with a deadline."""

from __future__ import annotations

import threading

import pytest

from consumer_sdk.errors import KafkaException, KafkaTimeoutError
from consumer_sdk.runtime.completion import Completion, CompletionReaper


def test_the_first_outcome_wins_and_callbacks_run_once() -> None:
    c: Completion[int] = Completion(deadline=100.0, what="OffsetFetch for group 'g'")
    seen: list[int] = []
    c.add_done_callback(lambda done: seen.append(done.outcome()))
    assert c.complete(1)
    assert not c.complete(2)
    assert not c.fail(KafkaTimeoutError("late"))
    c.add_done_callback(lambda done: seen.append(done.outcome() * 10))  # already done: at once
    assert seen == [1, 10]
    assert c.result(0.0) == 1


def test_a_value_completed_on_another_thread_wakes_the_waiter() -> None:
    c: Completion[str] = Completion(deadline=100.0, what="commit")
    threading.Timer(0.05, lambda: c.complete("ok")).start()
    assert c.result(10.0) == "ok"


def test_a_failure_is_raised_to_the_waiter() -> None:
    c: Completion[str] = Completion(deadline=100.0, what="commit")
    boom = KafkaException("boom")
    c.fail(boom)
    with pytest.raises(KafkaException) as info:
        c.result(1.0)
    assert info.value is boom
    assert c.error() is boom


def test_a_wait_that_times_out_fails_the_completion_and_drops_the_late_answer() -> None:
    c: Completion[str] = Completion(deadline=100.0, what="OffsetFetch for group 'g'")
    with pytest.raises(KafkaTimeoutError, match="OffsetFetch for group 'g' did not complete"):
        c.result(0.01)
    assert not c.complete("late")
    with pytest.raises(KafkaTimeoutError):
        c.outcome()


def test_the_reaper_fails_what_is_past_its_deadline_only() -> None:
    reaper = CompletionReaper()
    early: Completion[int] = reaper.track(Completion(deadline=5.0, what="early"))
    late: Completion[int] = reaper.track(Completion(deadline=9.0, what="late"))
    answered: Completion[int] = reaper.track(Completion(deadline=1.0, what="answered"))
    answered.complete(7)
    assert reaper.next_deadline() == 5.0
    assert reaper.reap(4.9) == 0
    assert reaper.reap(5.0) == 1
    assert isinstance(early.error(), KafkaTimeoutError)
    assert not late.done() and len(reaper) == 1
    assert reaper.next_deadline() == 9.0
    reaper.fail_all(KafkaException("member failed"))
    assert isinstance(late.error(), KafkaException) and reaper.next_deadline() is None
    assert answered.outcome() == 7
