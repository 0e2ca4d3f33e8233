"""``consumer.health()``: one consumer's state for health checks, with readiness and liveness.

Rules (docs/operations.md explains how to wire them to probes):

* **live** unless restarting the process is what helps: the consumer is closed, a fatal
  error ended it (fenced static member, unsupported assignor, authorization of the group),
  its network thread died, or the application stopped calling ``poll()``/``consume()``
  for longer than ``max.poll.interval.ms`` while subscribed (a stuck handler).
* **ready** when live and consuming as a member should: in the group (``STABLE``, or
  reconciling a new assignment with a member epoch), the group coordinator known, and a
  heartbeat answered within ``2 * heartbeat interval + request.timeout.ms``; with a manual
  assignment (no group), when partitions are assigned. A broker outage makes a consumer
  not ready within a heartbeat or two, never not live: it rejoins by itself when the
  brokers are back.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from consumer_sdk.membership import MemberState
from consumer_sdk.observability.client_metrics import LastError

__all__ = ["IN_GROUP_STATES", "Health"]

#: The member states in which a member holds (or is taking up) an assignment from the group.
IN_GROUP_STATES = frozenset(
    {MemberState.STABLE, MemberState.RECONCILING, MemberState.ACKNOWLEDGING}
)


@dataclass(frozen=True)
class Health:
    """A consumer's health at one moment (`as_dict` for a JSON health endpoint)."""

    live: bool
    ready: bool
    #: Why the consumer is not ready or not live (empty when both hold).
    reasons: tuple[str, ...]
    state: str
    in_group: bool
    #: Wall-clock seconds since when ``in_group`` has had its current value.
    since: float
    member_id: str
    member_epoch: int
    coordinator_known: bool
    #: Seconds since the coordinator last answered a heartbeat (None: never).
    last_heartbeat_age_s: float | None
    #: Seconds since the application last called poll()/consume() (None: never; resolution
    #: about one second while stable).
    last_poll_age_s: float | None
    assignment: tuple[tuple[str, int], ...]
    #: Sum of records-lag over the assigned partitions whose lag is known (None: none is).
    lag_total: int | None
    #: How many assigned partitions' lag is not known yet (no end offset yet, or no position:
    #: no record handed out and no committed offset), so not in ``lag_total``; None where
    #: there is no lag (a `GroupMember` without records).
    lag_unknown: int | None
    last_error: LastError | None

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["assignment"] = [list(p) for p in self.assignment]
        out["reasons"] = list(self.reasons)
        return out


def evaluate(
    *,
    closed: bool,
    fatal: str | None,
    network_failure: str | None,
    state: MemberState,
    member_epoch: int,
    coordinator_known: bool,
    subscribed: bool,
    manual: bool,
    heartbeat_age_s: float | None,
    heartbeat_interval_ms: int,
    request_timeout_ms: int,
    poll_age_s: float | None,
    max_poll_interval_ms: int,
) -> tuple[bool, bool, tuple[str, ...]]:
    """(live, ready, reasons) by the module's rules."""
    reasons: list[str] = []
    if closed:
        reasons.append("closed")
    if fatal is not None:
        reasons.append(f"fatal error: {fatal}")
    if network_failure is not None:
        reasons.append(f"network thread failed: {network_failure}")
    if subscribed and poll_age_s is not None and poll_age_s * 1000 > max_poll_interval_ms:
        reasons.append(
            f"no poll() for {poll_age_s:.1f} s (max.poll.interval.ms {max_poll_interval_ms})"
        )
    live = not reasons
    if manual:
        ready = live
    else:
        in_group = state in IN_GROUP_STATES and member_epoch > 0
        if not subscribed:
            reasons.append("not subscribed")
        elif not in_group:
            reasons.append(f"not in the group (state {state.name})")
        if not coordinator_known:
            reasons.append("group coordinator unknown")
        bound_s = (2 * heartbeat_interval_ms + request_timeout_ms) / 1000
        if heartbeat_age_s is None:
            reasons.append("no heartbeat answered yet")
        elif heartbeat_age_s > bound_s:
            reasons.append(f"last heartbeat answered {heartbeat_age_s:.1f} s ago")
        ready = not reasons
    return live, ready, tuple(reasons)
