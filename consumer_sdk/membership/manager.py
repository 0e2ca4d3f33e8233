"""The membership manager: member state, reconciliation, leave, fencing and fatal handling.

It mirrors the Java client's ``ConsumerMembershipManager`` behaviour (states, reconciliation,
leave, callbacks) but
waits for the application thread through events instead of futures: a step that needs a
callback or a commit emits `CallbacksNeeded` / `CommitNeeded` and resumes when
`CallbackCompleted` / `CommitCompleted` comes back with the same id.

Heartbeat timing, content and the error policy live in
`consumer_sdk.membership.heartbeat`, which calls the ``on_heartbeat_*`` and
``transition_to_*`` hooks below.
"""

from __future__ import annotations

import enum
import logging
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from consumer_sdk.domain import HeartbeatResponse
from consumer_sdk.error_codes import ErrorCode
from consumer_sdk.membership._log import MemberLog
from consumer_sdk.membership.config import MembershipConfig
from consumer_sdk.membership.events import (
    AssignmentChanged,
    BackgroundEvent,
    CallbackCompleted,
    CallbackKind,
    CallbacksNeeded,
    CloseOption,
    CommitCompleted,
    CommitNeeded,
    ErrorEvent,
    LeaveCompleted,
    StateChanged,
    Subscribe,
    TopicPartition,
)
from consumer_sdk.membership.metrics import MembershipMetrics
from consumer_sdk.membership.reconciler import (
    NO_ASSIGNMENT,
    AssignedPartition,
    LocalAssignment,
    Reconciler,
    ReconciliationPass,
    Step,
    from_wire,
    sorted_named,
)
from consumer_sdk.membership.state import (
    ACCEPTS_ASSIGNMENT,
    HEARTBEAT_NOW,
    LEAVING_STATES,
    NOT_IN_GROUP,
    MemberState,
    StateMachine,
)

S = MemberState

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
STATIC_LEAVE_EPOCH = -2

_NO_PARTITIONS: frozenset[TopicPartition] = frozenset()


class _Purpose(enum.Enum):
    """What a pending callback or commit resumes when it completes."""

    RECONCILE_COMMIT = "reconcile-commit"
    RECONCILE_REVOKE = "reconcile-revoke"
    RECONCILE_ASSIGN = "reconcile-assign"
    LEAVE_COMMIT = "leave-commit"
    LEAVE_RELEASE = "leave-release"
    FENCED_LOST = "fenced-lost"
    STALE_LOST = "stale-lost"
    FATAL_LOST = "fatal-lost"


@dataclass(frozen=True, slots=True)
class _Pending:
    purpose: _Purpose
    kind: CallbackKind | None
    started_ms: int
    pass_id: int | None = None


class MembershipManager:
    """Member state and assignment of one consumer; see the module docstring.

    ``emit`` receives every background event (the facade appends them to its queue).
    Every public method takes the current virtual time.
    """

    __slots__ = (
        "_cfg",
        "_close_option",
        "_closed",
        "_emit_event",
        "_epoch",
        "_fatal",
        "_fields",
        "_fields_of",
        "_generation",
        "_has_listener",
        "_leave_hb_sent",
        "_leave_in_progress",
        "_leave_unconfirmed",
        "_leaving_due_to_poll_timer",
        "_log",
        "_member_id",
        "_metadata",
        "_metadata_needed",
        "_metrics",
        "_named",
        "_next_id",
        "_now",
        "_on_state_change",
        "_pending_callbacks",
        "_pending_commits",
        "_rec",
        "_rejoin_when_released",
        "_sm",
        "_stale_release_pending",
        "_subscription",
        "_subscription_updated",
    )

    def __init__(
        self,
        config: MembershipConfig,
        member_id: str,
        emit: Callable[[BackgroundEvent], None],
        metrics: MembershipMetrics,
        on_state_change: Callable[[StateChanged], None] | None = None,
    ) -> None:
        if not member_id:
            raise ValueError("the member id must not be empty")
        self._cfg = config
        self._member_id = member_id
        self._epoch = JOIN_EPOCH
        self._generation = 0
        self._emit_event = emit
        self._metrics = metrics
        self._on_state_change = on_state_change
        self._log = MemberLog(config.client_id, config.group_id, self._identity)
        self._sm = StateMachine(self._on_transition)
        self._rec = Reconciler()
        # The named views of the reconciler's (immutable) sets, rebuilt when a set is replaced:
        # the host reads them after every run.
        self._named: dict[str, tuple[object, frozenset[TopicPartition]]] = {}
        self._now = 0

        self._metadata: dict[uuid.UUID, str] = {}
        self._metadata_needed = False

        self._subscription: Subscribe | None = None
        self._fields_of: Subscribe | None = None  # the subscription ``_fields`` describe
        self._fields: tuple[tuple[str, ...], str] = ((), "")
        self._subscription_updated = False
        self._has_listener = True
        self._closed = False
        self._close_option = CloseOption.DEFAULT

        self._leave_in_progress = False
        self._leave_hb_sent = False
        # The leave under way began with the membership unconfirmed past the session.
        self._leave_unconfirmed = False
        self._leaving_due_to_poll_timer = False
        self._stale_release_pending = False
        self._rejoin_when_released = False
        self._fatal: ErrorEvent | None = None

        self._next_id = 1
        self._pending_callbacks: dict[int, _Pending] = {}
        self._pending_commits: dict[int, _Pending] = {}

    # ------------------------------------------------------------------------------------------
    # Read-only views
    # ------------------------------------------------------------------------------------------

    @property
    def state(self) -> MemberState:
        return self._sm.state  # the methods below read ``self._sm.state`` (hot path)

    @property
    def state_machine(self) -> StateMachine:
        """The state machine: the heartbeat manager reads its ``state`` attribute directly
        (several times per heartbeat) instead of through `state`."""
        return self._sm

    @property
    def member_id(self) -> str:
        return self._member_id

    @property
    def member_epoch(self) -> int:
        return self._epoch

    @property
    def generation(self) -> int:
        """Bumped whenever the member (re)joins: the answer to a heartbeat sent before that
        describes a membership that is over, and is ignored."""
        return self._generation

    @property
    def config(self) -> MembershipConfig:
        return self._cfg

    @property
    def log(self) -> MemberLog:
        return self._log

    @property
    def fatal_error(self) -> ErrorEvent | None:
        return self._fatal

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def subscription_fields(self) -> tuple[tuple[str, ...], str] | None:
        """``(names, regex)`` as sent: names with ``""``, or ``()`` with the regex."""
        sub = self._subscription
        if sub is None:
            return None
        if sub is not self._fields_of:  # computed once per subscription, read per heartbeat
            if sub.pattern is not None:
                self._fields = ((), sub.pattern)
            else:
                self._fields = (tuple(sorted(set(sub.topics))), "")
            self._fields_of = sub
        return self._fields

    @property
    def current_assignment(self) -> LocalAssignment:
        return self._rec.current

    @property
    def target_assignment(self) -> LocalAssignment:
        return self._rec.target

    @property
    def holds_unacked_partitions(self) -> bool:
        """Whether the member holds partitions that its current (acked) assignment lacks: added
        by a pass that has not been applied yet, or whose ASSIGNED callback failed."""
        acked = self._rec.current.partitions
        return any((p.topic_id, p.partition) not in acked for p in self._rec.owned)

    @property
    def reconciliation_in_progress(self) -> bool:
        return self._rec.running is not None

    # The four views below are read by the host per poll or per heartbeat response, and are
    # nearly always empty or unchanged: an empty one costs no generator.

    @property
    def assigned_partitions(self) -> frozenset[TopicPartition]:
        return self._named_view("owned", self._rec.owned)

    def _named_view(
        self, key: str, parts: frozenset[AssignedPartition]
    ) -> frozenset[TopicPartition]:
        cached = self._named.get(key)
        if cached is not None and cached[0] is parts:
            return cached[1]
        named = frozenset(p.named for p in parts) if parts else _NO_PARTITIONS
        self._named[key] = (parts, named)
        return named

    def held_views(self) -> tuple[frozenset[TopicPartition], frozenset[TopicPartition]]:
        """`assigned_partitions` and `pending_revocation` in one call (read after every run
        and heartbeat answer)."""
        rec = self._rec
        named = self._named
        owned, pending = rec.owned, rec.pending_revocation
        cached = named.get("owned")
        assigned = cached[1] if cached is not None and cached[0] is owned else None
        if assigned is None:
            assigned = self._named_view("owned", owned)
        cached = named.get("pending")
        revoking = cached[1] if cached is not None and cached[0] is pending else None
        if revoking is None:
            revoking = self._named_view("pending", pending)
        return assigned, revoking

    @property
    def fetchable_partitions(self) -> frozenset[TopicPartition]:
        fetchable = self._rec.fetchable
        return frozenset(p.named for p in fetchable) if fetchable else _NO_PARTITIONS

    @property
    def pending_revocation(self) -> frozenset[TopicPartition]:
        return self._named_view("pending", self._rec.pending_revocation)

    @property
    def awaiting_callback(self) -> frozenset[TopicPartition]:
        awaiting = self._rec.awaiting_callback
        return frozenset(p.named for p in awaiting) if awaiting else _NO_PARTITIONS

    @property
    def metadata_needed(self) -> bool:
        return self._metadata_needed

    @property
    def unresolved_topic_ids(self) -> frozenset[uuid.UUID]:
        return self._rec.unresolved_topic_ids(self._metadata)

    @property
    def leave_in_progress(self) -> bool:
        return self._leave_in_progress

    def should_skip_heartbeat(self) -> bool:
        return self._sm.state in NOT_IN_GROUP

    def should_heartbeat_now(self) -> bool:
        return self._sm.state in HEARTBEAT_NOW

    def is_leaving(self) -> bool:
        return self._sm.state in LEAVING_STATES

    def leave_epoch(self, due_to_poll_timer: bool = False) -> int | None:
        """The epoch of the leave HB by close option (KIP-1092), or None for no leave HB."""
        option = CloseOption.DEFAULT if due_to_poll_timer else self._close_option
        if self._cfg.is_static:
            return LEAVE_EPOCH if option is CloseOption.LEAVE_GROUP else STATIC_LEAVE_EPOCH
        return None if option is CloseOption.REMAIN_IN_GROUP else LEAVE_EPOCH

    # ------------------------------------------------------------------------------------------
    # Application events
    # ------------------------------------------------------------------------------------------

    def handle_subscribe(self, now_ms: int, event: Subscribe) -> None:
        self._now = now_ms
        if self._rejected_after_close_or_fatal("subscribe"):
            return
        if not event.topics and event.pattern is None:
            self.handle_unsubscribe(now_ms)
            return
        self._subscription = event
        self._has_listener = event.has_listener
        self._subscription_updated = True
        self._log.info(
            "Subscribed to %s; the member joins (or updates its subscription) on the next poll",
            f"pattern {event.pattern!r}" if event.pattern is not None else list(event.topics),
        )

    def handle_unsubscribe(self, now_ms: int, *, unconfirmed: bool = False) -> None:
        """``unconfirmed``: no heartbeat answer has confirmed the membership for longer than
        the session timeout (see `consumer_sdk.membership.stall`): the partitions are
        released as lost, not revoked."""
        self._now = now_ms
        if self._closed:
            self._log.warning("Ignoring unsubscribe: the consumer is closed")
            return
        self._subscription = None
        self._subscription_updated = False
        self._rejoin_when_released = False
        if self._fatal is not None:
            self._emit(self._fatal)
            self._emit(LeaveCompleted(heartbeat_sent=False))
            return
        self._leave_group(close=False, unconfirmed=unconfirmed)

    def handle_close(self, now_ms: int, option: CloseOption, *, unconfirmed: bool = False) -> None:
        """``unconfirmed``: as for `handle_unsubscribe`."""
        self._now = now_ms
        if self._closed:
            self._log.debug("Ignoring close: the consumer is already closed")
            return
        self._closed = True
        self._close_option = option
        self._subscription = None
        self._subscription_updated = False
        self._rejoin_when_released = False
        if self._fatal is not None:
            self._emit(LeaveCompleted(heartbeat_sent=False))
            return
        self._leave_group(close=True, unconfirmed=unconfirmed)

    def handle_poll(self, now_ms: int) -> None:
        """The application is inside ``poll()``: run the commit-safe reconciliation pass, then
        join (after subscribe) or rejoin (after going stale)."""
        self._now = now_ms
        # (the tests of both calls, inline: a stable member's poll makes neither)
        if (self._closed or self._fatal is not None) and self._rejected_after_close_or_fatal(
            "poll"
        ):
            return
        if self._sm.state is S.RECONCILING:
            self.maybe_reconcile(now_ms, can_commit=True)
        state = self._sm.state
        if state is S.UNSUBSCRIBED and self._subscription_updated and self._subscription:
            self.transition_to_joining("subscribed, first poll")
        elif state is S.STALE and self._subscription is not None:
            if self._stale_release_pending:
                self._log.info("Stale member will rejoin once its lost callback completes")
                self._rejoin_when_released = True
            else:
                self.transition_to_joining("poll after the member went stale")

    def handle_callback_completed(self, now_ms: int, event: CallbackCompleted) -> None:
        self._now = now_ms
        pending = self._pending_callbacks.pop(event.callback_id, None)
        if pending is None:
            self._log.debug("Ignoring completion of unknown callback %d", event.callback_id)
            return
        if pending.kind is not None:
            self._metrics.record_callback_latency(
                pending.kind.value.lower(), now_ms, now_ms - pending.started_ms
            )
        self._resume(pending, event.error)

    def handle_commit_completed(self, now_ms: int, event: CommitCompleted) -> None:
        self._now = now_ms
        pending = self._pending_commits.pop(event.commit_id, None)
        if pending is None:
            self._log.debug("Ignoring completion of unknown commit %d", event.commit_id)
            return
        if event.error is not None:
            self._log.error(
                "Auto-commit before %s failed: %s. Proceeding anyway.",
                "leaving" if pending.purpose is _Purpose.LEAVE_COMMIT else "reconciling",
                event.error,
            )
        self._resume(pending, None)

    def _rejected_after_close_or_fatal(self, what: str) -> bool:
        if self._closed:
            # A poll racing close() is normal; a subscribe after close() is a caller's bug.
            if what == "poll":
                self._log.debug("Ignoring poll: the consumer is closed")
            else:
                self._log.warning("Ignoring %s: the consumer is closed", what)
            return True
        if self._fatal is not None:
            self._emit(self._fatal)
            return True
        return False

    # ------------------------------------------------------------------------------------------
    # Metadata
    # ------------------------------------------------------------------------------------------

    def on_metadata(self, now_ms: int, topic_names_by_id: Mapping[uuid.UUID, str]) -> None:
        """New metadata: replace the id -> name view and retry unresolved assignments."""
        self._now = now_ms
        self._metadata = dict(topic_names_by_id)
        self._metadata_needed = False
        self.maybe_reconcile(now_ms, can_commit=False)

    # ------------------------------------------------------------------------------------------
    # Heartbeat hooks (called by the heartbeat manager)
    # ------------------------------------------------------------------------------------------

    def on_heartbeat_success(self, now_ms: int, response: HeartbeatResponse) -> None:
        """Take the epoch and the assignment of a successful response (ignored out of the group)."""
        self._now = now_ms
        state = self._sm.state
        if state is S.LEAVING or state in NOT_IN_GROUP:
            self._log.debug("Ignoring heartbeat response: member is %s", state)
            return
        if response.member_epoch < 0:
            self._log.debug("Ignoring heartbeat response with epoch %d", response.member_epoch)
            return
        if response.member_id and response.member_id != self._member_id:
            self._log.warning(
                "Broker answered with member id %s; keeping the client's id", response.member_id
            )
        if response.member_epoch != self._epoch:
            self._set_epoch(response.member_epoch)
        if response.assignment is None:
            return
        if state not in ACCEPTS_ASSIGNMENT:
            self._log.debug("Ignoring new assignment: member is %s", state)
            return
        self._process_assignment(from_wire(response.assignment))

    def on_heartbeat_failure(self, now_ms: int, retriable: bool) -> None:
        self._now = now_ms
        if not retriable:
            self._metrics.record_rebalance_failed(now_ms)

    def on_heartbeat_request_generated(self, now_ms: int) -> None:
        """A heartbeat was built, which moves the state on: ACKNOWLEDGING and LEAVING end here."""
        self._now = now_ms
        state = self._sm.state
        if state is S.ACKNOWLEDGING:
            if self._rec.target_reconciled():
                self._to(S.STABLE, "assignment acknowledged")
            else:
                self._to(S.RECONCILING, "acknowledged; a newer target is waiting")
        elif state is S.LEAVING:
            if self._leaving_due_to_poll_timer:
                self._transition_to_stale()
            else:
                self._leave_hb_sent = True
                self._to(S.UNSUBSCRIBED, "leave heartbeat sent")

    def on_heartbeat_request_skipped(self, now_ms: int, reason: str) -> None:
        """No heartbeat could be sent (no coordinator, or none wanted): a leave ends here."""
        self._now = now_ms
        if self._sm.state is S.LEAVING:
            self._log.warning("Leave heartbeat not sent (%s)", reason)
            self._to(S.UNSUBSCRIBED, f"leave heartbeat skipped: {reason}")
            self.complete_leave()

    def complete_leave(self) -> None:
        """The leave operation is over (answered, failed, skipped or superseded)."""
        if self._leave_in_progress:
            self._leave_in_progress = False
            self._emit(LeaveCompleted(heartbeat_sent=self._leave_hb_sent))

    def emit_error(self, code: int, message: str) -> None:
        """Surface a non-fatal error to the application (``poll()`` raises it)."""
        self._emit(ErrorEvent(code, message, fatal=False))

    # ------------------------------------------------------------------------------------------
    # Transitions with effects
    # ------------------------------------------------------------------------------------------

    def transition_to_joining(self, reason: str) -> None:
        """Join (or rejoin) with epoch 0 and the same member id; drops an unreconciled target."""
        if self._sm.state is S.FATAL:
            self._log.warning("Not joining: the member is in FATAL state")
            return
        if self._rec.running is not None:
            self._rec.rejoined_during_pass = True
        self._set_epoch(JOIN_EPOCH)
        self._generation += 1
        self._subscription_updated = False
        self._rejoin_when_released = False
        self._to(S.JOINING, reason)
        self._rec.clear_target_and_names()

    def transition_to_fenced(self, now_ms: int, code: int) -> None:
        """FENCED_MEMBER_EPOCH / UNKNOWN_MEMBER_ID: lose the partitions, then rejoin."""
        self._now = now_ms
        name = ErrorCode.name_of(code)
        state = self._sm.state
        if state is S.PREPARE_LEAVING:
            self._log.info("Fenced (%s) while preparing to leave: no leave heartbeat", name)
            self.transition_to_sending_leave_group(now_ms, due_to_poll_timer=False)
            self._to(S.UNSUBSCRIBED, f"fenced ({name}) while leaving")
            self.complete_leave()
            return
        if state is S.LEAVING:
            self._to(S.UNSUBSCRIBED, f"fenced ({name}) before the leave heartbeat")
            self.complete_leave()
            return
        if state in NOT_IN_GROUP:
            self._log.debug("Ignoring %s: member is %s", name, state)
            return
        self._to(S.FENCED, name)
        self._set_epoch(JOIN_EPOCH)
        self._release(CallbackKind.LOST, _Purpose.FENCED_LOST)

    def transition_to_fatal(self, now_ms: int, code: int, message: str) -> bool:
        """Enter FATAL (terminal) and surface the error; False if it could not apply."""
        self._now = now_ms
        previous = self._sm.state
        if previous in (S.FENCED, S.STALE, S.FATAL):
            self._log.warning(
                "Ignoring fatal error %s while %s: %s", ErrorCode.name_of(code), previous, message
            )
            return False
        event = ErrorEvent(code, message, fatal=True)
        self._fatal = event
        self._emit(event)
        self._log.error("Fatal error %s: %s", ErrorCode.name_of(code), message)
        self._to(S.FATAL, ErrorCode.name_of(code))
        self._rec.clear_target_and_names()
        if previous in LEAVING_STATES or (previous is S.UNSUBSCRIBED and self._leave_in_progress):
            self.complete_leave()
            return True
        self._release(CallbackKind.LOST, _Purpose.FATAL_LOST)
        return True

    def transition_to_sending_leave_group(self, now_ms: int, due_to_poll_timer: bool) -> None:
        """Set the leave epoch and go LEAVING so that the next poll builds the leave HB."""
        self._now = now_ms
        state = self._sm.state
        if state in (S.FATAL, S.UNSUBSCRIBED):
            self._log.warning("Not sending a leave heartbeat: member is %s", state)
            return
        if due_to_poll_timer:
            self._leaving_due_to_poll_timer = True
            self._to(S.PREPARE_LEAVING, "poll timer expired (max.poll.interval.ms)")
        epoch = self.leave_epoch(due_to_poll_timer)
        self._set_epoch(LEAVE_EPOCH if epoch is None else epoch)
        self._rec.current = NO_ASSIGNMENT
        self._to(S.LEAVING, "sending leave heartbeat" if epoch is not None else "leaving")

    # ------------------------------------------------------------------------------------------
    # Reconciliation (the Java client's maybeReconcile: revoke first, then assign, then ack)
    # ------------------------------------------------------------------------------------------

    def maybe_reconcile(self, now_ms: int, can_commit: bool) -> None:
        """Start a pass if RECONCILING, the target differs and no pass runs; ``can_commit`` is
        True only for the pass triggered by the application's poll (it may revoke)."""
        self._now = now_ms
        rec = self._rec
        if self._sm.state is not S.RECONCILING or rec.target_reconciled() or rec.running:
            return
        resolution = rec.resolve(self._metadata)
        if resolution.unresolved:
            self._request_metadata(resolution.unresolved)
        if not rec.current.is_none and resolution.resolved.partitions == rec.current.partitions:
            if resolution.resolved == rec.current:
                return  # this partial assignment is already acked; wait for metadata
            self._log.info(
                "Resolvable part of the target equals the current assignment; "
                "acknowledging it with local epoch %d",
                resolution.resolved.local_epoch,
            )
            rec.current = resolution.resolved
            self._to(S.ACKNOWLEDGING, "partial assignment acknowledged (topics unresolved)")
            return
        revoked = rec.owned - resolution.assigned
        if not can_commit and (self._cfg.auto_commit or revoked):
            return  # revocation and the pre-rebalance commit only run inside poll()
        running = rec.start_pass(resolution)
        if self._log.enabled(logging.INFO):
            self._log.info(
                "Reconciling local epoch %d: assigned %s, owned %s, added %s, revoked %s",
                resolution.resolved.local_epoch,
                sorted_named(resolution.assigned),
                sorted_named(rec.owned),
                sorted_named(running.added),
                sorted_named(running.revoked),
            )
        rec.mark_pending_revocation(running.revoked)
        if self._cfg.auto_commit:
            running.step = Step.COMMIT
            self._request_commit(_Purpose.RECONCILE_COMMIT, "reconciliation", running.pass_id)
            return
        self._reconcile_revoke(running)

    def _reconcile_revoke(self, running: ReconciliationPass) -> None:
        if self._abort_pass(running):
            return
        revoked = running.revoked & self._rec.owned
        running.step = Step.REVOKE
        if revoked and self._log.enabled(logging.INFO):
            self._log.info("Revoking partitions %s", sorted_named(revoked))
        callback = self._request_callback(
            CallbackKind.REVOKED, revoked, _Purpose.RECONCILE_REVOKE, running.pass_id
        )
        if callback is None:
            self._reconcile_assign(running, None)

    def _reconcile_assign(self, running: ReconciliationPass, error: str | None) -> None:
        if error is not None:
            self._log.error("onPartitionsRevoked failed: %s. Nothing is acked; will retry", error)
            self._rec.end_pass()
            return
        if self._abort_pass(running):
            return
        running.step = Step.ASSIGN
        self._update_owned(lambda: self._rec.apply_owned(running.assigned, running.added))
        callback = self._request_callback(
            CallbackKind.ASSIGNED, running.added, _Purpose.RECONCILE_ASSIGN, running.pass_id
        )
        if callback is None:
            self._reconcile_apply(running, None)

    def _reconcile_apply(self, running: ReconciliationPass, error: str | None) -> None:
        if error is not None:
            self._log.error(
                "onPartitionsAssigned failed: %s. Added partitions %s stay unfetchable; "
                "nothing is acked; will retry",
                error,
                sorted_named(running.added),
            )
            self._rec.end_pass()
            return
        self._rec.enable_all()
        if self._abort_pass(running):
            return
        self._rec.current = running.resolved
        self._rec.end_pass()
        self._to(S.ACKNOWLEDGING, f"reconciled local epoch {running.resolved.local_epoch}")

    def _abort_pass(self, running: ReconciliationPass) -> bool:
        """True (and the pass is dropped) if it no longer applies: the member left RECONCILING
        or rejoined since it started (checked after commit, after revoke, before apply)."""
        rec = self._rec
        if rec.running is not running:
            return True
        if self._sm.state is not S.RECONCILING or rec.rejoined_during_pass:
            why = (
                "the member rejoined the group"
                if rec.rejoined_during_pass
                else f"the member is {self.state}"
            )
            self._log.info("Interrupting reconciliation that no longer applies: %s", why)
            rec.end_pass()
            return True
        return False

    def _process_assignment(self, partitions: frozenset[tuple[uuid.UUID, int]]) -> None:
        changed = self._rec.update_target(partitions)
        if changed:
            self._log.debug(
                "New target assignment (local epoch %d): %d partitions",
                self._rec.target.local_epoch,
                len(partitions),
            )
        if not self._rec.target_reconciled():
            if self._sm.state is not S.RECONCILING or changed:
                self._to(S.RECONCILING, "new target assignment")
        elif self._sm.state in (S.RECONCILING, S.JOINING):
            self._to(S.STABLE, "target equals the current assignment")

    def _request_metadata(self, unresolved: frozenset[uuid.UUID]) -> None:
        if not self._metadata_needed:
            self._log.debug("Topic ids %s unresolved; requesting metadata", sorted(unresolved))
        self._metadata_needed = True

    # ------------------------------------------------------------------------------------------
    # Leave (epoch -1, or -2 for a static member; close options; the poll timer)
    # ------------------------------------------------------------------------------------------

    def _leave_group(self, close: bool, unconfirmed: bool = False) -> None:
        state = self._sm.state
        if state in NOT_IN_GROUP:
            if state is S.FENCED:
                self._update_owned(self._rec.clear_assignment)
                self._to(S.UNSUBSCRIBED, "unsubscribed while fenced")
            self._emit(LeaveCompleted(heartbeat_sent=False))
            return
        if state in LEAVING_STATES:
            self._log.debug("Leave already in progress")
            return
        self._leave_in_progress = True
        self._leave_hb_sent = False
        self._leave_unconfirmed = unconfirmed
        self._to(S.PREPARE_LEAVING, "close" if close else "unsubscribe")
        if self._leave_unconfirmed and self._rec.owned:
            # Its session may have expired: another member may own the partitions by now.
            self._log.info(
                "No heartbeat answer has confirmed the membership for longer than the session "
                "timeout: releasing the partitions as lost, without a commit"
            )
        elif self._cfg.auto_commit and self._epoch > 0 and self._rec.owned:
            # Commit what was consumed while the offsets still carry a valid epoch, before the
            # release callback and the leave heartbeat (close and unsubscribe alike).
            self._rec.mark_pending_revocation(self._rec.owned)
            self._request_commit(_Purpose.LEAVE_COMMIT, "close" if close else "unsubscribe")
            return
        self._leave_release()

    def _leave_release(self) -> None:
        in_group = self._sm.state is S.PREPARE_LEAVING and self._epoch > 0
        kind = (
            CallbackKind.REVOKED if in_group and not self._leave_unconfirmed else CallbackKind.LOST
        )
        self._release(kind, _Purpose.LEAVE_RELEASE)

    def _leave_released(self, error: str | None) -> None:
        if error is not None:
            self._log.error("Release callback failed: %s. Leaving anyway", error)
        self._update_owned(self._rec.clear_assignment)
        if self._sm.state is S.PREPARE_LEAVING:
            self.transition_to_sending_leave_group(self._now, due_to_poll_timer=False)

    # ------------------------------------------------------------------------------------------
    # Fenced / stale / fatal releases
    # ------------------------------------------------------------------------------------------

    def _release(self, kind: CallbackKind, purpose: _Purpose) -> None:
        """Stop fetching everything owned, then run the REVOKED / LOST callback for it."""
        owned = self._rec.owned
        self._rec.mark_pending_revocation(owned)
        if purpose is _Purpose.STALE_LOST:
            self._stale_release_pending = True
        if self._request_callback(kind, owned, purpose) is None:
            self._resume(_Pending(purpose, kind, self._now), None)

    def _transition_to_stale(self) -> None:
        self._leaving_due_to_poll_timer = False
        self._rejoin_when_released = False
        self._to(S.STALE, "left the group because the poll timer expired")
        self._release(CallbackKind.LOST, _Purpose.STALE_LOST)

    def _fenced_released(self, error: str | None) -> None:
        if error is not None:
            self._log.error("onPartitionsLost failed after fencing: %s. Rejoining anyway", error)
        self._update_owned(self._rec.clear_assignment)
        if self._sm.state is S.FENCED:
            self.transition_to_joining("rejoin after fencing")

    def _stale_released(self, error: str | None) -> None:
        if error is not None:
            self._log.error("onPartitionsLost failed after going stale: %s", error)
        self._update_owned(self._rec.clear_assignment)
        self._stale_release_pending = False
        if self._rejoin_when_released and self._sm.state is S.STALE:
            self.transition_to_joining("poll after the member went stale")

    def _fatal_released(self, error: str | None) -> None:
        if error is not None:
            self._log.error("onPartitionsLost failed after a fatal error: %s", error)
        self._update_owned(self._rec.clear_assignment)

    # ------------------------------------------------------------------------------------------
    # Waiting for the application thread
    # ------------------------------------------------------------------------------------------

    def _new_id(self) -> int:
        value = self._next_id
        self._next_id += 1
        return value

    def _request_callback(
        self,
        kind: CallbackKind,
        partitions: frozenset[AssignedPartition],
        purpose: _Purpose,
        pass_id: int | None = None,
    ) -> int | None:
        """Emit `CallbacksNeeded`, or return None if no callback is to run (REVOKED and
        LOST only run for a non-empty set; none run without a listener)."""
        if kind is not CallbackKind.ASSIGNED and not partitions:
            return None
        if not self._has_listener:
            return None
        callback_id = self._new_id()
        self._pending_callbacks[callback_id] = _Pending(purpose, kind, self._now, pass_id)
        self._emit(CallbacksNeeded(callback_id, kind, sorted_named(partitions)))
        return callback_id

    def _request_commit(self, purpose: _Purpose, reason: str, pass_id: int | None = None) -> None:
        commit_id = self._new_id()
        self._pending_commits[commit_id] = _Pending(purpose, None, self._now, pass_id)
        deadline = self._now + self._cfg.rebalance_timeout_ms
        self._emit(CommitNeeded(commit_id, deadline, self._epoch, reason))

    def _resume(self, pending: _Pending, error: str | None) -> None:
        purpose = pending.purpose
        if purpose in (
            _Purpose.RECONCILE_COMMIT,
            _Purpose.RECONCILE_REVOKE,
            _Purpose.RECONCILE_ASSIGN,
        ):
            running = self._rec.running
            if running is None or running.pass_id != pending.pass_id:
                self._log.debug("Ignoring %s of a reconciliation that ended", purpose.value)
                return
            if purpose is _Purpose.RECONCILE_COMMIT:
                self._reconcile_revoke(running)
            elif purpose is _Purpose.RECONCILE_REVOKE:
                self._reconcile_assign(running, error)
            else:
                self._reconcile_apply(running, error)
        elif purpose is _Purpose.LEAVE_COMMIT:
            self._leave_release()
        elif purpose is _Purpose.LEAVE_RELEASE:
            self._leave_released(error)
        elif purpose is _Purpose.FENCED_LOST:
            self._fenced_released(error)
        elif purpose is _Purpose.STALE_LOST:
            self._stale_released(error)
        else:
            self._fatal_released(error)

    # ------------------------------------------------------------------------------------------
    # Plumbing
    # ------------------------------------------------------------------------------------------

    def _identity(self) -> tuple[str, int]:
        return (self._member_id, self._epoch)

    def _emit(self, event: BackgroundEvent) -> None:
        self._emit_event(event)

    def _to(self, new: MemberState, reason: str) -> None:
        self._sm.transition(new, reason)

    def _on_transition(self, old: MemberState, new: MemberState, reason: str) -> None:
        if old is S.RECONCILING and new in (S.STABLE, S.ACKNOWLEDGING):
            self._metrics.record_rebalance_ended(self._now)
        if old is not S.RECONCILING and new is S.RECONCILING:
            self._metrics.record_rebalance_started(self._now)
        self._log.info("Transitioned from %s to %s (%s)", old, new, reason)
        event = StateChanged(old, new, reason)
        self._emit(event)
        if self._on_state_change is not None:
            self._on_state_change(event)

    def _set_epoch(self, epoch: int) -> None:
        if epoch != self._epoch:
            self._log.debug("Member epoch %d -> %d", self._epoch, epoch)
            self._epoch = epoch

    def _update_owned(self, change: Callable[[], None]) -> None:
        before = frozenset(p.named for p in self._rec.owned)
        change()
        after = frozenset(p.named for p in self._rec.owned)
        self._metrics.set_assigned_partitions(len(after))
        if after != before:
            self._emit(AssignmentChanged(tuple(sorted(after))))
