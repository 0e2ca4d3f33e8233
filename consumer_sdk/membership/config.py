"""Configuration of the membership core."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MembershipConfig:
    """What the member sends and how it times its heartbeats.

    ``rebalance_timeout_ms`` is the consumer's ``max.poll.interval.ms``: it is sent as the HB's
    RebalanceTimeoutMs and is also the poll timer. ``auto_commit`` (``enable.auto.commit``) makes
    every reconciliation pass commit consumed offsets first (`CommitNeeded`).
    """

    group_id: str
    group_instance_id: str | None = None
    client_rack: str | None = None
    remote_assignor: str | None = None
    rebalance_timeout_ms: int = 300_000
    auto_commit: bool = True
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1000
    retry_backoff_jitter: float = 0.2
    client_id: str = "consumer_sdk"

    def __post_init__(self) -> None:
        if not self.group_id:
            raise ValueError("group_id must not be empty")
        if self.group_instance_id is not None and not self.group_instance_id.strip():
            raise ValueError("group_instance_id must be None or a non-empty string")
        if self.remote_assignor is not None and not self.remote_assignor:
            raise ValueError("remote_assignor must be None or a non-empty string")
        if self.rebalance_timeout_ms <= 0:
            raise ValueError("rebalance_timeout_ms (max.poll.interval.ms) must be positive")
        if self.retry_backoff_ms < 0 or self.retry_backoff_max_ms < 0:
            raise ValueError("retry backoffs must not be negative")
        if not 0.0 <= self.retry_backoff_jitter < 1.0:
            raise ValueError("retry_backoff_jitter must be in [0, 1)")

    @property
    def is_static(self) -> bool:
        """Whether the member is static (has a ``group.instance.id``)."""
        return self.group_instance_id is not None
