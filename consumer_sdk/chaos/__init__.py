"""Chaos soak for the consumer group member: ``python -m consumer_sdk.chaos --duration 600``.

See :mod:`consumer_sdk.chaos.driver` (the faults), :mod:`consumer_sdk.chaos.member` (a member
process and its log) and :mod:`consumer_sdk.chaos.analysis` (the checks), and
``docs/reliability.md`` for a recorded run.
"""

from __future__ import annotations

from consumer_sdk.chaos.analysis import Summary, analyze

__all__ = ["Summary", "analyze"]
