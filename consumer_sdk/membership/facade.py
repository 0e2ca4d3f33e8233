"""``GroupMembership``: the single entry point a host drives (runtime threads or a test loop).

Two hosts are expected:

- The runtime: the application thread submits application events (`submit`)
  and `drain_background_events` inside ``poll()``; the shared network loop
  calls `poll`, sends the returned heartbeat, and reports responses,
  failures, metadata and coordinator changes. The core is not thread-safe: the runtime calls it
  from the loop thread only (``submit`` and ``drain_background_events`` are the two methods
  safe to call from another thread), or serialises all calls with a lock.
- A single-threaded host (tests, a simulator): calls `handle` directly.
"""

from __future__ import annotations

import random
import uuid
from collections import deque
from collections.abc import Callable, Mapping

from consumer_sdk.domain import HeartbeatRequest, HeartbeatResponse
from consumer_sdk.membership.config import MembershipConfig
from consumer_sdk.membership.events import (
    ApplicationEvent,
    BackgroundEvent,
    CallbackCompleted,
    Close,
    CommitCompleted,
    ErrorEvent,
    Poll,
    StateChanged,
    Subscribe,
    TopicPartition,
    Unsubscribe,
)
from consumer_sdk.membership.heartbeat import Failure, HeartbeatRequestManager, PollResult
from consumer_sdk.membership.ids import new_member_id
from consumer_sdk.membership.manager import MembershipManager
from consumer_sdk.membership.metrics import MembershipMetrics
from consumer_sdk.membership.reconciler import LocalAssignment
from consumer_sdk.membership.stall import (
    DEFAULT_SESSION_TIMEOUT_MS,
    may_hand_out,
)
from consumer_sdk.membership.state import MemberState, StateMachine


class GroupMembership:
    """A KIP-848 consumer group member, sans I/O: feed it time and events, send what it asks.

    ``rng`` drives backoff jitter and, without ``member_id_factory``, the member id (one id for
    the member's lifetime). ``on_state_change`` is a tracing hook called for every transition,
    in addition to the `StateChanged` background event.
    """

    __slots__ = (
        "_heartbeat",
        "_manager",
        "_rng",
        "app_events",
        "background_events",
        "metrics",
        "quiet_answer",
        "stable_beat",
        "stable_poll",
    )

    def __init__(
        self,
        config: MembershipConfig,
        *,
        rng: random.Random | None = None,
        member_id_factory: Callable[[], str] | None = None,
        on_state_change: Callable[[StateChanged], None] | None = None,
        metrics: MembershipMetrics | None = None,
    ) -> None:
        self._rng = rng if rng is not None else random.Random()
        member_id = member_id_factory() if member_id_factory else new_member_id(self._rng)
        self.app_events: deque[ApplicationEvent] = deque()
        self.background_events: deque[BackgroundEvent] = deque()
        self.metrics = metrics if metrics is not None else MembershipMetrics()
        self._manager = MembershipManager(
            config,
            member_id,
            self.background_events.append,
            self.metrics,
            on_state_change,
        )
        self._heartbeat = HeartbeatRequestManager(self._manager, self.metrics, self._rng)
        #: A STABLE member's per-heartbeat fast paths, `poll` and `on_heartbeat_response`
        #: for the case where nothing changes (None: take those); see
        #: `HeartbeatRequestManager.stable_beat` and `quiet_answer`; and `stable_poll`, a STABLE
        #: member's `Poll` handled without the event. Bound here: no extra call per heartbeat.
        self.stable_beat = self._heartbeat.stable_beat
        self.quiet_answer = self._heartbeat.quiet_answer
        self.stable_poll = self._heartbeat.stable_poll

    # ------------------------------------------------------------------------------------------
    # Views
    # ------------------------------------------------------------------------------------------

    @property
    def config(self) -> MembershipConfig:
        return self._manager.config

    @property
    def group_id(self) -> str:
        return self._manager.config.group_id

    @property
    def member_id(self) -> str:
        return self._manager.member_id

    @property
    def member_epoch(self) -> int:
        return self._manager.member_epoch

    @property
    def state(self) -> MemberState:
        return self._manager.state

    @property
    def state_machine(self) -> StateMachine:
        """The member's state machine (``.state`` read without a call: hosts' hot paths)."""
        return self._manager.state_machine

    @property
    def assigned_partitions(self) -> frozenset[TopicPartition]:
        """Partitions the member holds (the subscription state's assignment)."""
        return self._manager.assigned_partitions

    @property
    def fetchable_partitions(self) -> frozenset[TopicPartition]:
        """Held partitions that may be fetched: not awaiting their ASSIGNED callback and not
        pending revocation."""
        return self._manager.fetchable_partitions

    @property
    def pending_revocation(self) -> frozenset[TopicPartition]:
        """Held partitions being revoked or lost: no new fetches, drop buffered records."""
        return self._manager.pending_revocation

    @property
    def awaiting_callback(self) -> frozenset[TopicPartition]:
        """Held partitions whose ASSIGNED callback has not completed successfully yet."""
        return self._manager.awaiting_callback

    @property
    def current_assignment(self) -> LocalAssignment:
        """The last reconciled (acked) assignment, by topic id."""
        return self._manager.current_assignment

    @property
    def target_assignment(self) -> LocalAssignment:
        """The last assignment received from the broker, by topic id."""
        return self._manager.target_assignment

    @property
    def coordinator_needed(self) -> bool:
        """True while the member wants to heartbeat but knows no coordinator: the host should
        run FindCoordinator and then call `on_coordinator_known`."""
        return self._heartbeat.coordinator_needed

    @property
    def coordinator_known(self) -> bool:
        return self._heartbeat.coordinator_known

    @property
    def metadata_needed(self) -> bool:
        """True when assigned topic ids could not be named: the host should fetch metadata
        (for `unresolved_topic_ids`) and call `on_metadata`."""
        return self._manager.metadata_needed

    @property
    def unresolved_topic_ids(self) -> frozenset[uuid.UUID]:
        return self._manager.unresolved_topic_ids

    @property
    def fatal_error(self) -> ErrorEvent | None:
        """The error that made the member FATAL, if any."""
        return self._manager.fatal_error

    @property
    def closed(self) -> bool:
        """`Close` was taken in: the member is leaving or has left for good."""
        return self._manager.closed

    @property
    def leave_in_progress(self) -> bool:
        return self._manager.leave_in_progress

    @property
    def in_flight_heartbeats(self) -> int:
        return self._heartbeat.in_flight

    @property
    def heartbeat_interval_ms(self) -> int:
        return self._heartbeat._timing.interval_ms

    @property
    def session_timeout_ms(self) -> int:
        """The group's session timeout: as the broker reported it (`set_session_timeout`),
        else the broker's default."""
        return self._heartbeat.effective_session_timeout_ms

    def set_session_timeout(self, session_timeout_ms: int) -> None:
        """The broker told the group's ``group.consumer.session.timeout.ms``."""
        self._heartbeat.session_timeout_ms = session_timeout_ms

    @property
    def confirmed_sent_ms(self) -> int | None:
        """When the last heartbeat answered without error was sent; None outside a group
        (unsubscribed, or never answered). See `consumer_sdk.membership.stall`."""
        if self._manager.state is MemberState.UNSUBSCRIBED:
            return None
        return self._heartbeat.confirmed_sent_ms

    def published(
        self,
    ) -> tuple[
        MemberState,
        str,
        int,
        frozenset[TopicPartition],
        frozenset[TopicPartition],
        bool,
        int,
        int | None,
        int | None,
    ]:
        """What a host publishes to its application after each run, in one read: state,
        member id, epoch, assigned partitions, those pending revocation, coordinator known,
        heartbeat interval, when the last heartbeat was answered (None: never), and until
        when records may be handed out (`consumer_sdk.membership.stall`; None: no bound).
        (Read after every run and heartbeat answer: it reads its parts' fields directly.)"""
        m = self._manager
        hb = self._heartbeat
        state = m._sm.state
        confirmed = None if state is MemberState.UNSUBSCRIBED else hb._confirmed_sent_ms
        # `handout_deadline_ms`, inline
        handout = (
            None
            if confirmed is None
            else confirmed + (hb.session_timeout_ms or DEFAULT_SESSION_TIMEOUT_MS)
        )
        assigned, revoking = m.held_views()
        return (
            state,
            m._member_id,
            m._epoch,
            assigned,
            revoking,
            hb._coordinator_known,
            hb._timing.interval_ms,
            self.metrics.last_heartbeat_response_ms,
            handout,
        )

    # ------------------------------------------------------------------------------------------
    # Application side
    # ------------------------------------------------------------------------------------------

    def submit(self, event: ApplicationEvent) -> None:
        """Queue an application event; the next `poll` processes it (thread-safe)."""
        self.app_events.append(event)

    def handle(self, event: ApplicationEvent, now_ms: int) -> None:
        """Process one application event now."""
        self._heartbeat._lane = None  # `close_lane`, inline
        m = self._manager
        if isinstance(event, Poll):
            m.handle_poll(event.now_ms)
            if not m._closed:
                self._heartbeat.reset_poll_timer(event.now_ms)
        elif isinstance(event, Subscribe):
            m.handle_subscribe(now_ms, event)
        elif isinstance(event, Unsubscribe):
            m.handle_unsubscribe(now_ms, unconfirmed=self._unconfirmed(now_ms))
        elif isinstance(event, CallbackCompleted):
            m.handle_callback_completed(now_ms, event)
        elif isinstance(event, CommitCompleted):
            m.handle_commit_completed(now_ms, event)
        elif isinstance(event, Close):
            m.handle_close(now_ms, event.option, unconfirmed=self._unconfirmed(now_ms))
        else:  # pragma: no cover - exhaustive over ApplicationEvent
            raise TypeError(f"not an application event: {event!r}")

    def _unconfirmed(self, now_ms: int) -> bool:
        """No heartbeat answer has confirmed the membership within the session timeout."""
        return not may_hand_out(now_ms, self.confirmed_sent_ms, self.session_timeout_ms)

    def drain_background_events(self) -> list[BackgroundEvent]:
        """Remove and return the queued background events, oldest first (thread-safe)."""
        out: list[BackgroundEvent] = []
        events = self.background_events
        while events:  # checked first: polls mostly find it empty (no exception raised)
            try:
                out.append(events.popleft())
            except IndexError:  # another thread drained it in between
                break
        return out

    # ------------------------------------------------------------------------------------------
    # Network side
    # ------------------------------------------------------------------------------------------

    def poll(self, now_ms: int) -> PollResult:
        """Process queued application events, reconcile (background pass: no revocation, no
        commit), and return the heartbeat to send now, if any."""
        events = self.app_events
        while events:  # the network side is the only consumer; mostly empty
            self.handle(events.popleft(), now_ms)
        m = self._manager
        if m._sm.state is MemberState.RECONCILING:  # (maybe_reconcile's first test, inline)
            m.maybe_reconcile(now_ms, can_commit=False)
        return self._heartbeat.poll(now_ms)

    def time_until_next_poll(self, now_ms: int) -> int:
        """Milliseconds the host may wait before the next `poll` (0: call it now)."""
        if self.app_events:
            return 0
        return self._heartbeat.time_until_next_poll(now_ms)

    def on_heartbeat_response(
        self, now_ms: int, response: HeartbeatResponse, request: HeartbeatRequest | None = None
    ) -> None:
        """A heartbeat was answered. Report each request sent exactly once (response or
        failure), in the order sent, or pass the ``request`` it answers."""
        self._heartbeat.on_response(now_ms, response, request)

    def on_heartbeat_failure(
        self, now_ms: int, failure: Failure, request: HeartbeatRequest | None = None
    ) -> None:
        """A heartbeat got no response (see `Failure`)."""
        self._heartbeat.on_failure(now_ms, failure, request)

    def on_metadata(self, now_ms: int, topic_names_by_id: Mapping[uuid.UUID, str]) -> None:
        """The host's current topic id -> name view (all known topics)."""
        self._heartbeat.close_lane()
        self._manager.on_metadata(now_ms, topic_names_by_id)

    def on_coordinator_known(self, now_ms: int, changed: bool = False) -> None:
        """The host found the group coordinator; ``changed``: it is another node than the
        one last heartbeated to (the next heartbeat goes at once)."""
        self._heartbeat.on_coordinator_known(now_ms, changed)

    def on_coordinator_unknown(self, now_ms: int) -> None:
        self._heartbeat.on_coordinator_unknown(now_ms)

    def on_coordinator_connection_lost(self) -> None:
        """The connection to the coordinator was replaced since the last answered heartbeat
        (even with no request on it to fail): the next heartbeat carries every field."""
        self._heartbeat.reset_sent_fields()
