"""What a member may do when it cannot be sure the broker still counts it as a member.

Two decisions, both pure functions of times the host passes in (the member's own monotonic
clock, in ms):

- *Zombie records* (`may_hand_out`, `handout_deadline_ms`): the broker restarts a member's
  session when it reads a heartbeat, no earlier than the member sent it. So the member is
  certainly still a member until one session timeout after it *sent* its last heartbeat
  that was answered without error. Past that (a stall: a SIGSTOP, a long GC pause, a network
  partition from the coordinator) its partitions may already belong to another member, and no
  record may reach the application until a newer heartbeat's answer confirms the
  membership; a fenced member's partitions are lost anyway.
- *Unreleased static instance id* (`unreleased_retry_deadline_ms`): a static member that
  restarts at once after a crash is refused with UNRELEASED_INSTANCE_ID while the broker still
  counts the dead incarnation. The broker expires that incarnation at the latest one session
  after the refusal (the incarnation's last heartbeat came before it), so the member retries
  until then, plus a margin, before it gives up.
"""

from __future__ import annotations

#: The broker's default ``group.consumer.session.timeout.ms``, used while the broker has not
#: said what the group's is (DescribeConfigs of the group refused or not supported).
DEFAULT_SESSION_TIMEOUT_MS = 45_000

#: Added to the session timeout before an unreleased instance id is taken as a live
#: duplicate: the broker's session timers fire on its own schedule, not to the millisecond.
UNRELEASED_MARGIN_MS = 3_000


def handout_deadline_ms(confirmed_sent_ms: int | None, session_timeout_ms: int) -> int | None:
    """Until when records may be handed to the application: one session after the send of
    the last heartbeat answered without error. ``None`` (no bound) when no heartbeat was
    answered in the current membership (not in a group: manual assignment or not
    subscribed; a member that has not joined owns nothing)."""
    if confirmed_sent_ms is None:
        return None
    return confirmed_sent_ms + session_timeout_ms


def may_hand_out(now_ms: int, confirmed_sent_ms: int | None, session_timeout_ms: int) -> bool:
    """Whether a record of an owned partition may reach the application at ``now_ms``."""
    deadline = handout_deadline_ms(confirmed_sent_ms, session_timeout_ms)
    return deadline is None or now_ms <= deadline


def unreleased_retry_deadline_ms(
    first_refusal_ms: int, session_timeout_ms: int, heartbeat_interval_ms: int
) -> int:
    """Until when a join refused with UNRELEASED_INSTANCE_ID is retried: the broker has
    expired a dead incarnation by then; a refusal after it means a live duplicate."""
    return first_refusal_ms + session_timeout_ms + max(UNRELEASED_MARGIN_MS, heartbeat_interval_ms)
