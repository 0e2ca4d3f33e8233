"""One mechanism for every blocking call of the application side: a `Completion`.

The application thread (or an asyncio event loop, see ``consumer_sdk.aio``) hands work to the
network loop together with a `Completion`; the loop thread completes it exactly once, with a
value or an error, and the application waits for it with a deadline. The loop keeps the
completions it owns in a `CompletionReaper`, which fails the ones whose deadline has passed,
so no caller ever waits longer than it asked, whatever the network does (Java's
``CompletableApplicationEvent`` with its ``CompletableEventReaper``).

Thread rules: `Completion.complete` / `Completion.fail` may be called from any thread (the
first call wins); done callbacks run on the thread that completed it, or at once on the
thread that adds them when it is already done, and must not block. `CompletionReaper` is
not thread-safe: it belongs to the thread that drives the work (the network loop).
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from consumer_sdk.errors import KafkaTimeoutError

T = TypeVar("T")

__all__ = ["Completion", "CompletionReaper"]

_order = itertools.count()


class Completion(Generic[T]):
    """The outcome of one blocking call, completed once, awaited with a deadline.

    ``deadline`` is a ``time.monotonic()`` instant; ``what`` names the call in the timeout
    error ("OffsetFetch for group 'g'").
    """

    __slots__ = ("_callbacks", "_done", "_error", "_lock", "_value", "deadline", "what")

    def __init__(self, deadline: float, what: str) -> None:
        self.deadline = deadline
        self.what = what
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        self._callbacks: list[Callable[[Completion[T]], None]] = []

    def __repr__(self) -> str:
        state = "pending" if not self.done() else ("failed" if self._error else "done")
        return f"Completion({self.what!r}, {state})"

    def done(self) -> bool:
        return self._done.is_set()

    def complete(self, value: T) -> bool:
        """Complete with ``value``; False when it was already done (the value is dropped)."""
        return self._finish(value, None)

    def fail(self, error: BaseException) -> bool:
        """Complete with ``error``; False when it was already done."""
        return self._finish(None, error)

    def expire(self) -> bool:
        """Fail with the timeout error that names the call (the deadline passed)."""
        return self.fail(KafkaTimeoutError(f"{self.what} did not complete in time"))

    def _finish(self, value: T | None, error: BaseException | None) -> bool:
        with self._lock:
            if self._done.is_set():
                return False
            self._value, self._error = value, error
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            callback(self)
        return True

    def add_done_callback(self, callback: Callable[[Completion[T]], None]) -> None:
        """Call ``callback(self)`` once when done (at once if it already is)."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def wait(self, timeout: float) -> bool:
        """Block at most ``timeout`` seconds for completion; True when done."""
        return self._done.wait(max(timeout, 0.0))

    def outcome(self) -> T:
        """The value of a done completion, or raise its error."""
        if not self._done.is_set():
            raise RuntimeError(f"{self.what}: outcome() before completion")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def error(self) -> BaseException | None:
        """The error of a done completion (None: none, or not done yet)."""
        return self._error if self._done.is_set() else None

    def result(self, timeout: float) -> T:
        """Wait at most ``timeout`` seconds and return the value or raise the error; on
        timeout the completion fails with `KafkaTimeoutError` (so a late answer is
        dropped, not delivered to a caller who has gone)."""
        if not self._done.wait(max(timeout, 0.0)):
            self.expire()
        return self.outcome()


class CompletionReaper:
    """The completions a driving thread owns, failed when their deadline passes.

    `track` a completion when its work is queued; call `reap` with the current monotonic
    time on every run of the loop, and wait no longer than `next_deadline`.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Completion[object]]] = []

    def __len__(self) -> int:
        return sum(1 for _, _, c in self._heap if not c.done())

    def track(self, completion: Completion[T]) -> Completion[T]:
        entry: tuple[float, int, Completion[object]]
        entry = (completion.deadline, next(_order), completion)  # type: ignore[assignment]
        heapq.heappush(self._heap, entry)
        return completion

    def reap(self, now: float) -> int:
        """Fail every tracked completion whose deadline is at or before ``now``; drop the
        completed ones. Returns how many it failed."""
        failed = 0
        heap = self._heap
        while heap and (heap[0][0] <= now or heap[0][2].done()):
            _, _, completion = heapq.heappop(heap)
            if completion.expire():
                failed += 1
        return failed

    def next_deadline(self) -> float | None:
        """The earliest deadline still pending (None: nothing tracked)."""
        heap = self._heap
        while heap and heap[0][2].done():
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def fail_all(self, error: BaseException) -> None:
        """Fail every pending completion with ``error`` (the member failed or stopped)."""
        heap, self._heap = self._heap, []
        for _, _, completion in heap:
            completion.fail(error)
