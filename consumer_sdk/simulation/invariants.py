"""The invariants checked as things change (ownership, epochs, FATAL, reconciling) and at the
checkpoints (convergence), and the statistics they feed."""

from __future__ import annotations

import re

from consumer_sdk.coordinator import (
    CoordinatorEvent,
    EventKind,
    GroupState,
)
from consumer_sdk.membership import (
    StateChanged,
)
from consumer_sdk.simulation._base import (
    IN_GROUP,
    NON_FATAL_CODES,
    E,
    S,
    SimBase,
    _Member,
)


class Invariants(SimBase):
    """Invariant checks and convergence statistics."""

    def _check_epoch(self, m: _Member) -> None:
        """Member epochs only move forward, except through a rejoin (0) or a leave (< 0)."""
        epoch = m.core.member_epoch
        if epoch != m.last_epoch:
            self.report.checks += 1
            if epoch > 0 and epoch < m.last_epoch:
                self._violate(
                    "epoch-regressed",
                    f"member epoch went from {m.last_epoch} to {epoch} without a rejoin",
                    m,
                )
            m.last_epoch = epoch

    def _on_state_changed(self, m: _Member, event: StateChanged) -> None:
        now = self.now
        report = self.report
        if event.new is S.RECONCILING and event.old is not S.RECONCILING:
            m.reconciling_since = now
        elif event.old is S.RECONCILING and event.new is not S.RECONCILING:
            self._check_reconciling(m)
            m.reconciling_since = -1
        if event.new is S.FATAL:
            report.checks += 1
            if m.last_error in NON_FATAL_CODES:
                self._violate(
                    "unexpected-fatal",
                    f"member went FATAL ({event.reason}) but its last heartbeat error was "
                    f"{E.name_of(m.last_error)}, which is not fatal",
                    m,
                )

    def _check_reconciling(self, m: _Member) -> None:
        since = m.reconciling_since
        if since < 0:
            return
        self.report.checks += 1
        healthy_from = max(m.unhealthy_until, self._coord_unhealthy_until)
        if since < healthy_from or m.frozen or not m.app_active or m.partitioned_until > self.now:
            return
        stuck = self.now - since
        if stuck > self.config.rebalance_timeout_ms:
            self._violate(
                "stuck-reconciling",
                f"RECONCILING for {stuck} ms (> rebalance timeout "
                f"{self.config.rebalance_timeout_ms} ms) while polling",
                m,
            )

    def _set_owned(self, m: _Member, owned: frozenset[tuple[str, int]]) -> None:
        old = m.owned
        if owned == old:
            return
        owners = self._owners
        for tp in old - owned:
            holders = owners.get(tp)
            if holders is not None:
                holders.discard(m)
                if not holders:
                    del owners[tp]
        m.owned = owned
        added = owned - old
        if not added or not m.alive:
            return
        report = self.report
        coordinator = self.coordinator
        group = self.config.group_id
        live = self._live_in_group(m)
        server_holds = coordinator.member_holds(group, m.member_id) if live else None
        topics = coordinator.topics
        for tp in added:
            report.checks += 1
            holders = owners.setdefault(tp, set())
            for other in holders:
                if live and self._live_in_group(other):
                    self._violate(
                        "double-ownership",
                        f"{tp[0]}-{tp[1]} owned by slot {other.slot} ({other.member_id}, "
                        f"{other.core.state}) and slot {m.slot} ({m.member_id}, "
                        f"{m.core.state}) at once",
                        m,
                    )
                else:
                    report.zombie_overlaps += 1
            holders.add(m)
            if server_holds is not None:
                tid = topics.topic_id(tp[0])
                if tid is not None and (tid, tp[1]) not in server_holds:
                    self._violate(
                        "owned-not-held",
                        f"{tp[0]}-{tp[1]} owned by the member but not assigned to it (nor pending "
                        f"revocation) at the coordinator",
                        m,
                    )

    def _live_in_group(self, m: _Member) -> bool:
        """In the group as both sides see it: the core is in a group state and the coordinator
        knows its member id with a non-negative epoch (else it is a zombie whose commits fail)."""
        if not m.alive or m.core.state not in IN_GROUP:
            return False
        epoch = self.coordinator.member_epoch(self.config.group_id, m.member_id)
        return epoch is not None and epoch >= 0

    def _on_coordinator_event(self, event: CoordinatorEvent) -> None:
        if event.kind is EventKind.TARGET_COMPUTED:
            self.report.rebalances += 1
        elif event.kind is EventKind.GROUP_STATE_CHANGED:
            interval = self.config.heartbeat_interval_ms
            if event.detail.endswith(str(GroupState.STABLE)):
                self._stable_since = event.time_ms
                if self._episode_start is not None:
                    self.report.convergence_hb.append(
                        (event.time_ms - self._episode_start) / interval
                    )
                    self._episode_start = None
            elif self._episode_start is None and not event.detail.endswith(str(GroupState.EMPTY)):
                self._episode_start = event.time_ms

    def _checkpoint(self, churn_end: int) -> None:
        """The end of a quiet window: the group must have converged."""
        report = self.report
        report.checkpoints += 1
        group = self.config.group_id
        coordinator = self.coordinator
        live = [m for m in self._slots.values() if m.alive and not m.closing]
        problems: list[str] = []
        problems += [f"server: {p}" for p in coordinator.check_exclusive(group)]
        report.checks += 1
        if live:
            state = coordinator.group_state(group)
            if state is not GroupState.STABLE:
                problems.append(f"group is {state} (epoch {coordinator.group_epoch(group)})")
        assignment_epoch = coordinator.assignment_epoch(group)
        topics = coordinator.topics
        subscribed: set[str] = set()
        owned: dict[tuple[str, int], list[int]] = {}
        for m in live:
            report.checks += 1
            core = m.core
            described = coordinator.member(group, m.member_id)
            if core.state is not S.STABLE:
                problems.append(f"slot {m.slot} is {core.state}")
                continue
            if described is None:
                problems.append(f"slot {m.slot} ({m.member_id}) is unknown to the coordinator")
                continue
            if core.member_epoch != described.member_epoch or core.member_epoch != assignment_epoch:
                problems.append(
                    f"slot {m.slot} epoch {core.member_epoch}, coordinator says "
                    f"{described.member_epoch}, assignment epoch {assignment_epoch}"
                )
            server = frozenset((topics.name(tid) or str(tid), p) for tid, p in described.assigned)
            if server != m.owned:
                problems.append(
                    f"slot {m.slot} owns {len(m.owned)} partitions, the coordinator assigned "
                    f"{len(server)} ({sorted(server ^ m.owned)[:4]} differ)"
                )
            names = described.subscribed_topic_names
            regex = described.subscribed_topic_regex
            subscribed |= {t for t in topics.names() if t in names} | (
                {t for t in topics.names() if regex and re.fullmatch(regex, t)}
            )
            for tp in m.owned:
                owned.setdefault(tp, []).append(m.slot)
        for name in sorted(subscribed):
            topic = topics.get(name)
            assert topic is not None
            for p in range(topic.partitions):
                report.checks += 1
                holders = owned.get((name, p), [])
                if len(holders) != 1:
                    problems.append(f"{name}-{p} owned by {len(holders)} members {holders[:4]}")
        if problems:
            self._violate(
                "not-converged",
                f"{len(problems)} problems after the quiet window: " + "; ".join(problems[:6]),
            )
        stable_at = max(self._stable_since, churn_end)
        report.checkpoint_convergence_hb.append(
            (stable_at - churn_end) / self.config.heartbeat_interval_ms
        )
