"""`Backoff`: the one exponential backoff with jitter of the SDK (pure: no clock, no sleep).

Every retry delay is computed here: the request managers' retries and the heartbeat's
(``consumer_sdk.membership``), the network loop's reconnects (``runtime.netloop``), the
blocking client's reconnects (``protocol.client``, which waits with tenacity), the
application side's OffsetFetch retries (``runtime.group_member``) and, through the driver,
the simulator's. The caller owns the ``random.Random`` that draws the jitter.
"""

from __future__ import annotations

import math
import random

__all__ = ["Backoff"]


class Backoff:
    """Exponential backoff with jitter: ``base * 2**n``, capped at ``max_ms``."""

    __slots__ = ("_base", "_exp_max", "_jitter", "_max", "_rng", "low", "span")

    def __init__(self, base_ms: int, max_ms: int, jitter: float, rng: random.Random) -> None:
        self._base = base_ms
        self._max = max_ms
        self._jitter = jitter
        self._rng = rng
        ratio = max_ms / base_ms if base_ms > 0 else 1.0
        self._exp_max = math.log(ratio, 2) if ratio > 1.0 else 0.0
        #: ``backoff_ms(0)`` is ``min(max, int(base * (low + span * rng.random())))`` with
        #: these (``span`` 0.0: no jitter, no draw; both None: no backoff growth, ``base``):
        #: for a caller that inlines it (the heartbeat's, once per answer).
        self.low: float | None = None
        self.span = 0.0
        if self._exp_max != 0.0:
            self.low = 1.0 - jitter if jitter > 0.0 else 1.0
            self.span = ((1.0 + jitter) - (1.0 - jitter)) if jitter > 0.0 else 0.0

    def backoff_ms(self, attempts: int) -> int:
        """Backoff after ``attempts`` previous failures (0 -> about ``base``)."""
        if self._exp_max == 0.0:
            return self._base
        # attempts 0 (after every success) needs no power: base * 2.0 ** 0.0 is base
        term = self._base * (2.0 ** min(float(attempts), self._exp_max)) if attempts else self._base
        factor = 1.0
        jitter = self._jitter
        if jitter > 0.0:
            # random.uniform(1 - jitter, 1 + jitter), the same draw without its Python call
            low = 1.0 - jitter
            factor = low + ((1.0 + jitter) - low) * self._rng.random()
        return min(self._max, int(term * factor))

    def backoff_s(self, attempts: int) -> float:
        """`backoff_ms` in seconds."""
        return self.backoff_ms(attempts) / 1000
