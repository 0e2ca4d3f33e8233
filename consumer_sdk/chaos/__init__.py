"""Chaos soak for the consumer group member: ``python -m consumer_sdk.chaos --duration 600``.

See `consumer_sdk.chaos.driver` (the faults), `consumer_sdk.chaos.member` (a member
process and its log) and `consumer_sdk.chaos.analysis` (the checks), and
``docs/reliability.md`` for a recorded run.
"""

from __future__ import annotations

from consumer_sdk.chaos.analysis import Summary, analyze

__all__ = ["Summary", "analyze"]
