"""Offline checks of a chaos run: lost and duplicate records, ownership overlaps, committed
offset regressions and slow closes. Pure functions over the JSON-lines logs.

Ownership intervals come from each incarnation's callbacks: ``assign`` opens one, ``revoke``
and ``lost`` close it. An incarnation killed with SIGKILL has its open intervals end at the
kill. One that was SIGSTOPped and later reports ``lost`` had been fenced by the broker one
session timeout after it stopped heartbeating, so its intervals open at the stop end then
(or at the ``lost``, if earlier). With a heartbeat trace (below) "stopped heartbeating" is
read from the trace rather than taken to be the stop: a heartbeat can hang unanswered from
well before the stop (a paused replica holds the coordinator's answers), and the broker
expires the session one session after the last heartbeat it read.

On a real cluster the driver also cuts members off from the coordinator: it SIGKILLs or
SIGSTOPs the coordinator's node. A member that reports ``lost`` after such a fault began was
fenced by the coordinator (no heartbeat of it for a session timeout), so its intervals end one
session after the fault began. The faulted node counts as the coordinator when the driver
found it so just before the fault, or when its coordinator watch (``coordinator_seen``) saw
the group there when the fault began or while the node was down, as for a SIGSTOPped member
(``fenced_unreachable``). Until it learns of the fencing it still owns the partitions in its
own view: the time from the next owner's assignment to the member's ``lost`` is reported as a
*zombie window*, not an overlap (no client can know it was fenced before it reaches the
coordinator again).

A member can also learn that it was fenced only from a commit the broker rejects as
UNKNOWN_MEMBER_ID or FENCED_MEMBER_EPOCH (e.g. in the ``on_revoke`` of its close, when a
heartbeat to a stalled coordinator never came back), or be fenced while it ran, with no fault
of its own or its coordinator's node (a heartbeat stalled behind a killed replica) and report
``lost`` (librdkafka times a heartbeat out after one interval and drops its answer, which
may have carried a new epoch; the next heartbeat is then fenced). Its ownership then ends
(``fenced_commit``, ``fenced_running``) when the broker can first have fenced it
(`_fencing_bound`): one session after the latest heartbeat answered without error was sent
(the broker restarts the session when it reads a heartbeat), or, when a later heartbeat was
answered with a fencing error, when the first heartbeat after that one was sent; never before
its latest successful commit was sent. Every member traces its heartbeats: the SDK through
``heartbeat_trace``, confluent-kafka through librdkafka's debug lines on its stderr
(`librdkafka_heartbeats`). A next owner assigned after that bound is a zombie window; one
assigned before stays an overlap. A ``lost`` of a member without a trace stays where it was
reported. A member closed while cut off past its session (a ``revoke`` after its ``closing``)
cannot know it was fenced and revokes (confluent-kafka does; its commit there times out):
traced, its ownership ends at the same bound (``fenced_close``) when that precedes the revoke.

On the mock, an overlap is counted apart as the mock's (``overlaps_mock_reset``) only with
proof that the owner never released the partition: librdkafka's mock forgets which partitions
a member owns when its connection to the coordinator closes (it resets the member's current
and last-returned assignment) and then gives them to the first other member to heartbeat,
while a real broker waits for the owner's heartbeat without them. For an SDK owner its
heartbeat trace is the proof (`_sdk_owner_evidence`); for a confluent-kafka owner, the SDK
taker's trace of the grant, before the owner's ``on_revoke`` ended (`_ck_owner_evidence`).
Records the taker redid meanwhile are counted apart with it. Any other overlap stays a
violation.

A record processed more than once is *explained* when every processing but the last was done
by an incarnation whose ownership ended by a kill, a ``lost`` or fencing (not by a revoke),
and which never committed past that record: it is uncommitted work redone by the next owner.

A member that takes a partition looks its committed offset up after its ``on_assign`` (both
clients do), so it must start at or above the last commit any member logged before that
``assign``: a commit is logged only once the broker acknowledged it. An ownership whose first
record is below it is a *rewind* (`_rewinds`). An SDK member's rewind is a violation. A
confluent-kafka member's is counted apart (seen on the real broker: librdkafka, taking a
partition right after it was fenced and rejoined, started at offset 0 below a commit of 623),
with the records it redid below that commit and the committed-offset regressions its own
commits in that ownership caused; the checks resume from the regressed offset.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from consumer_sdk.error_codes import ErrorCode

Partition = int

#: driver events counted as chaos actions (``stop``: a member SIGSTOPped past its session)
ACTION_EVENTS = (
    "kill",
    "stop",
    "restart",
    "coordinator",
    "broker_down",
    "node_kill",
    "node_pause",
    "net_coord",
    "net_coord_one_way",
    "net_isolate",
    "net_coord_cut",
)
#: real-cluster driver events that cut members off from the coordinator (when they name it)
CUT_OFF_EVENTS = ("coordinator", "node_kill", "node_pause")
#: ownerships that ended because the broker fenced the member (module doc)
FENCED_KINDS = ("fenced", "fenced_unreachable", "fenced_commit", "fenced_running", "fenced_close")


@dataclass
class Interval:
    incarnation: str
    partition: Partition
    start: float
    end: float
    end_kind: str  # revoke | lost | kill | open | one of FENCED_KINDS
    lost_at: float = 0.0  # when the incarnation reported the loss (fenced intervals)


@dataclass
class Incarnation:
    name: str
    events: list[dict[str, Any]] = field(default_factory=list)
    killed_at: float | None = None
    stopped_at: list[float] = field(default_factory=list)
    cut_off_at: list[float] = field(default_factory=list)  # the coordinator's node faulted


@dataclass(frozen=True)
class Rewind:
    """An ownership whose first record was below the partition's committed offset when it
    began (module doc)."""

    interval: Interval
    first: int  # the first offset it processed
    committed: int  # the last commit logged before it began
    committer: str
    committed_at: float


@dataclass
class Summary:
    produced: int = 0
    acked_by_producer: int = 0
    processed: int = 0
    processed_unique: int = 0
    lost: int = 0
    duplicates: int = 0
    duplicates_explained: int = 0
    duplicates_unexplained: int = 0
    duplicates_mock_readoption: int = 0
    duplicates_mock_reset: int = 0
    #: records a confluent-kafka owner processed before librdkafka acknowledged their
    #: partition's revocation ahead of on_revoke (see ``overlaps_ck_early_ack``), committed
    #: only after the SDK taker had the partition, and redone by that taker
    duplicates_ck_early_ack: int = 0
    #: records a confluent-kafka member redid below the committed offset it should have
    #: started from (its rewinds, see ``rewinds``)
    duplicates_ck_rewind: int = 0
    #: ownerships that began below the partition's committed offset, per client (``sdk`` /
    #: ``ck``); an SDK member's is a violation
    rewinds: dict[str, int] = field(default_factory=dict)
    overlaps: int = 0
    overlaps_mock_readoption: int = 0
    overlaps_mock_reset: int = 0
    #: a confluent-kafka owner's revocation acknowledged before its on_revoke began: the SDK
    #: taker had the broker's grant and the owner processed nothing of the partition after
    overlaps_ck_early_ack: int = 0
    zombie_windows: int = 0
    zombie_max_s: float = 0.0
    #: records a member processed inside its zombie windows after its session could have
    #: expired (one session after its last answered heartbeat was sent) and before it
    #: learned it was fenced, per client: ``sdk`` / ``ck``
    zombie_records: dict[str, int] = field(default_factory=dict)
    committed_regressions: int = 0
    #: regressions to an offset a rewinding confluent-kafka member committed
    committed_regressions_ck_rewind: int = 0
    uncommitted_at_end: int = 0
    close_failures: int = 0
    incarnations: int = 0
    actions: dict[str, int] = field(default_factory=dict)
    commit_failures: int = 0
    fatal_errors: int = 0
    fault_errors: int = 0  # a broker fault the driver could not cause or undo
    broker: str = "mock"
    examples: dict[str, list[str]] = field(default_factory=dict)

    @property
    def violations(self) -> dict[str, int]:
        checks = {
            "lost": self.lost,
            "duplicates_unexplained": self.duplicates_unexplained,
            "overlaps": self.overlaps,
            "committed_regressions": self.committed_regressions,
            "rewinds_sdk": self.rewinds.get("sdk", 0),
            "uncommitted_at_end": self.uncommitted_at_end,
            "close_failures": self.close_failures,
            "fatal_errors": self.fatal_errors,
            "fault_errors": self.fault_errors,
        }
        return {k: v for k, v in checks.items() if v}

    @property
    def duplicates_librdkafka(self) -> int:
        """Duplicates counted apart as confluent-kafka's own: its early acknowledgements and
        its rewinds (the real broker's only categories besides the explained ones)."""
        return self.duplicates_ck_early_ack + self.duplicates_ck_rewind

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["violations"] = self.violations
        out["duplicates_librdkafka"] = self.duplicates_librdkafka
        return out

    def format(self) -> str:
        lines = [
            f"broker:                      {self.broker}",
            f"records produced:            {self.produced} (acked by the producer: "
            f"{self.acked_by_producer})",
            f"records processed:           {self.processed} ({self.processed_unique} distinct)",
            f"lost:                        {self.lost}",
            f"duplicates:                  {self.duplicates} (explained by killed/fenced "
            f"members' uncommitted work: {self.duplicates_explained}, unexplained: "
            f"{self.duplicates_unexplained}; redone after the mock re-adopted a fenced member: "
            f"{self.duplicates_mock_readoption}; redone by a member the mock gave an owned "
            f"partition: {self.duplicates_mock_reset}; redone by the taker of a partition "
            "librdkafka acknowledged before on_revoke, committed only after: "
            f"{self.duplicates_ck_early_ack}; redone by a confluent-kafka member that started "
            f"below the committed offset: {self.duplicates_ck_rewind})",
            f"overlapping ownership:       {self.overlaps} (plus {self.overlaps_mock_readoption} "
            "from the mock re-adopting a fenced member's stale partitions, "
            f"{self.overlaps_mock_reset} from the mock forgetting an owner's partitions when "
            "the coordinator's connections closed, "
            f"{self.overlaps_ck_early_ack} from librdkafka acknowledging a revocation before "
            "its on_revoke began, with no record processed by both)",
            f"zombie windows:              {self.zombie_windows} (a fenced member not yet "
            f"aware while the next owner had the partition; longest {self.zombie_max_s:.2f}s)",
            f"zombie records:              SDK {self.zombie_records.get('sdk', 0)}, "
            f"confluent-kafka {self.zombie_records.get('ck', 0)} (processed inside those "
            "windows, after the broker could have fenced the member; not committed)",
            f"committed-offset regressions: {self.committed_regressions} (plus "
            f"{self.committed_regressions_ck_rewind} to a rewinding confluent-kafka member's "
            "commit)",
            f"rewinds:                     SDK {self.rewinds.get('sdk', 0)}, confluent-kafka "
            f"{self.rewinds.get('ck', 0)} (an ownership that began below the committed offset)",
            f"uncommitted at the end:      {self.uncommitted_at_end}",
            f"members failing to close:    {self.close_failures}",
            f"fatal errors in members:     {self.fatal_errors}",
            f"broker faults that failed:   {self.fault_errors}",
            f"commit failures (logged):    {self.commit_failures}",
            f"member incarnations:         {self.incarnations}",
            "chaos actions:               "
            + ", ".join(f"{k}={v}" for k, v in sorted(self.actions.items())),
        ]
        for kind, examples in self.examples.items():
            if examples:
                lines.append(f"examples of {kind}:")
                lines.extend(f"  {e}" for e in examples[:10])
        verdict = "PASS" if not self.violations else f"FAIL {self.violations}"
        lines.append(f"result:                      {verdict}")
        return "\n".join(lines)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Parse a JSON-lines file; a torn last line (a process killed mid-write) is skipped."""
    out: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def read_member_events(members_dir: Path) -> list[dict[str, Any]]:
    """Every member's events (``*.jsonl``) and, for the incarnations among them, the
    heartbeat traces librdkafka wrote to the members' stderr (``*.stderr``)."""
    events: list[dict[str, Any]] = []
    for path in sorted(members_dir.glob("*.jsonl")):
        events.extend(read_jsonl(path))
    known = {ev["inc"] for ev in events}
    for path in sorted(members_dir.glob("*.stderr")):
        with path.open(encoding="utf-8", errors="replace") as f:
            lines = f.readlines()
        events.extend(ev for ev in librdkafka_heartbeats(lines) if ev["inc"] in known)
        events.extend(ev for ev in librdkafka_start_offsets(lines) if ev["inc"] in known)
    return events


def incarnations(
    member_events: Iterable[dict[str, Any]], driver_events: Iterable[dict[str, Any]]
) -> dict[str, Incarnation]:
    incs: dict[str, Incarnation] = {}
    for ev in member_events:
        inc = incs.setdefault(ev["inc"], Incarnation(ev["inc"]))
        inc.events.append(ev)
    drivers = list(driver_events)
    for ev in drivers:
        name = ev.get("inc")
        if name is None or name not in incs:
            continue
        if ev["ev"] == "kill":
            incs[name].killed_at = ev["t"]
        elif ev["ev"] == "stop":
            incs[name].stopped_at.append(ev["t"])
    cut_offs = [
        ev["t"]
        for ev in drivers
        if ev["ev"] in CUT_OFF_EVENTS
        and (ev.get("how") == "stop" or ev.get("coordinator") or _was_coordinator(ev, drivers))
    ]
    # On the mock, a confluent-kafka member can outlast its session cut off by a coordinator
    # outage (librdkafka's reconnect backoff grows to reconnect.backoff.max.ms, 10 s); the SDK
    # member gets no such allowance (its backoff is capped at 1 s: fencing it is a violation).
    outages = [
        ev["t"] for ev in driver_events if ev["ev"] == "broker_down" and ev.get("coordinator")
    ]
    for inc in incs.values():
        inc.cut_off_at.extend(cut_offs)
        if _impl(inc) == "ck":
            inc.cut_off_at.extend(outages)
            inc.cut_off_at.sort()
    for inc in incs.values():
        inc.events.sort(key=lambda e: e["t"])
    return incs


def _was_coordinator(fault: dict[str, Any], driver_events: list[dict[str, Any]]) -> bool:
    """Whether the driver's coordinator watch (``coordinator_seen``) shows the faulted node
    as the group's coordinator when the fault began or at any time until the node was back."""
    node, start = fault.get("node"), fault["t"]
    back = min(
        (
            ev["t"]
            for ev in driver_events
            if ev["ev"] in ("node_resume", "node_started")
            and ev.get("node") == node
            and ev["t"] >= start
        ),
        default=float("inf"),
    )
    seen = sorted((ev["t"], ev["node"]) for ev in driver_events if ev["ev"] == "coordinator_seen")
    before = [n for t, n in seen if t <= start]
    return (bool(before) and before[-1] == node) or any(
        n == node for t, n in seen if start < t <= back
    )


def intervals(inc: Incarnation, session_s: float, interval_s: float = 0.0) -> list[Interval]:
    out: list[Interval] = []
    open_: dict[Partition, float] = {}
    # When a confluent-kafka member's on_revoke began, per partition: librdkafka may
    # acknowledge the revocation while the callback (a synchronous commit inside) still
    # runs, and the member processes nothing once it began. An SDK member acknowledges
    # only after on_revoke returned: its ownership ends at the callback's end.
    revoking: dict[Partition, float] = {}
    ck_owner = _impl(inc) == "ck"

    def close(p: Partition, t: float, kind: str) -> None:
        start = open_.pop(p)
        lost_at = t
        if kind == "lost":
            # fenced after a SIGSTOP of its own or of its coordinator's node: the broker
            # dropped it one session after the earlier of the two (its last heartbeat may
            # precede that by up to one interval), or, traced, after its last heartbeat
            stops = [(s, "fenced") for s in inc.stopped_at if start <= s <= t]
            stops += [(s, "fenced_unreachable") for s in inc.cut_off_at if start <= s <= t]
            if traced:
                # its trace says when it last heartbeated (a heartbeat can hang from well
                # before a stop, e.g. behind a paused replica)
                bound = _fencing_bound(inc, start, t, session_s, interval_s)
                if bound is not None and bound < t:
                    kind = min(stops)[1] if stops else "fenced_running"
                    t = max(start, bound)
            elif stops:
                first, kind = min(stops)
                t = min(t, first + session_s - interval_s)
        elif kind == "revoke":
            error_at = _fencing_commit_error(inc, start, t)
            if error_at is not None:
                bound = _fencing_bound(inc, start, error_at, session_s, interval_s)
                if bound is not None:
                    kind, t, lost_at = "fenced_commit", max(start, min(t, bound)), error_at
            elif traced and closing is not None and start <= closing <= t:
                # revoked in its close while cut off: it cannot know it was fenced
                bound = _fencing_bound(inc, start, t, session_s, interval_s)
                if bound is not None and bound < t:
                    kind, t, lost_at = "fenced_close", max(start, bound), t
            began = revoking.pop(p, None)
            if ck_owner and began is not None and start <= began < t:
                t = began
        out.append(Interval(inc.name, p, start, t, kind, lost_at))

    traced = _traced(inc)
    closing = next((ev["t"] for ev in inc.events if ev["ev"] == "closing"), None)
    last_t = 0.0
    for ev in inc.events:
        last_t = ev["t"]
        if inc.killed_at is not None and ev["t"] > inc.killed_at:
            break
        kind = ev["ev"]
        if kind == "assign":
            for p in ev["parts"]:
                open_.setdefault(p, ev["t"])
        elif kind == "revoking":
            for p in ev["parts"]:
                revoking[p] = ev["t"]
        elif kind in ("revoke", "lost"):
            for p in ev["parts"]:
                if p in open_:
                    close(p, ev["t"], kind)
    for p in list(open_):
        if inc.killed_at is not None:
            end = lost_at = inc.killed_at
            start = open_[p]
            # a stop before this ownership began (the member was resumed since) does not end it
            stops = [s for s in inc.stopped_at if start <= s <= end]
            bound = _fencing_bound(inc, start, end, session_s, interval_s) if traced else None
            if bound is not None:
                end = max(start, min(end, bound))
            elif stops:
                end = min(end, stops[-1] + session_s - interval_s)
            out.append(Interval(inc.name, p, open_.pop(p), end, "kill", lost_at))
        else:
            out.append(Interval(inc.name, p, open_.pop(p), last_t, "open"))
    return out


#: errors with which the broker tells a member it no longer has it (it had been fenced)
FENCING_ERRORS = (ErrorCode.UNKNOWN_MEMBER_ID, ErrorCode.FENCED_MEMBER_EPOCH)
#: the same, as a commit error's text names them
FENCING_COMMIT_ERRORS = tuple(code.name for code in FENCING_ERRORS)


def _fencing_commit_error(inc: Incarnation, start: float, end: float) -> float | None:
    """When a commit of ``inc`` first failed with a fencing error between ``start`` and
    ``end``, else None."""
    return next(
        (
            ev["t"]
            for ev in inc.events
            if ev["ev"] == "commit_failed"
            and start <= ev["t"] <= end
            and any(code in str(ev.get("error")) for code in FENCING_COMMIT_ERRORS)
        ),
        None,
    )


def _traced(inc: Incarnation) -> bool:
    return any(ev["ev"] == "hb" for ev in inc.events)


def _fencing_bound(
    inc: Incarnation, start: float, before: float, session_s: float, interval_s: float
) -> float | None:
    """The earliest time the broker can have fenced ``inc``, from its proofs of membership
    before ``before`` (module doc); None when a traced member has none.

    A traced member: the broker read its last heartbeat answered without error no earlier
    than it was sent, and then fences it either when its session expires (one session
    later) or, when a heartbeat was answered with a fencing error, when it reads a heartbeat
    it no longer accepts (no earlier than the next heartbeat sent, answered or not: librdkafka
    drops the answer to a heartbeat it timed out, which may have carried a new epoch). A
    successful commit shows the member was in the group when it was sent. A member without a
    heartbeat trace is taken to heartbeat every interval: its last heartbeat was at most one
    interval before its latest successful commit (or its ownership's start)."""
    commits: list[float] = [
        ev.get("sent", ev["t"]) for ev in inc.events if ev["ev"] == "commit" and ev["t"] < before
    ]
    if not _traced(inc):
        return max(commits, default=start) + session_s - interval_s
    beats = [ev for ev in inc.events if ev["ev"] in ("hb", "hb_sent") and ev["t"] <= before]
    answered = [
        ev["sent"]
        for ev in beats
        if ev["ev"] == "hb" and ev.get("err") == 0 and ev.get("sent") is not None
    ]
    if not answered:
        return max(commits, default=None)
    last_ok: float = max(answered)
    bound = last_ok + session_s
    later = [ev for ev in beats if (ev.get("sent") or 0.0) > last_ok]
    if any(ev["ev"] == "hb" and ev.get("err") in FENCING_ERRORS for ev in later):
        bound = min([bound, *(ev["sent"] for ev in later)])
    return max([bound, *commits])


_LIBRDKAFKA_HEARTBEAT = re.compile(
    r"^%7\|(?P<t>\d+\.\d+)\|HEARTBEAT\|(?P<inc>[^|]+)#consumer-\d+\| .*ConsumerGroupHeartbeat "
    r'(?:(?P<sent>of member id )|response received for member id "(?P<mid>[^"]*)" '
    r"with epoch (?P<ep>-?\d+)\s*$|failed due to: (?P<error>.*): will rejoin the group\s*$)"
)
#: librdkafka's texts of the fencing heartbeat errors
_LIBRDKAFKA_FENCING = {
    "Broker: Unknown member": ErrorCode.UNKNOWN_MEMBER_ID,
    "Broker: The member epoch is fenced by the group coordinator": ErrorCode.FENCED_MEMBER_EPOCH,
}


_LIBRDKAFKA_START_OFFSET = re.compile(
    r"^%7\|(?P<t>\d+\.\d+)\|OFFSETFETCH\|(?P<inc>[^|]+)#consumer-\d+\| .*Adding "
    r"(?P<topic>\S+) \[(?P<p>\d+)\] back to pending list (?P<why>.*?)\s*$"
)


def librdkafka_start_offsets(lines: Iterable[str]) -> list[dict[str, Any]]:
    """What librdkafka made of the committed offsets it looked up for its assignment, from its
    ``debug=cgrp`` lines: an ``rdk_offset`` event per partition (``p``, and ``why``: e.g.
    "with offset 623", "with offset INVALID" for no commit, or why it asks again), the
    evidence printed with a confluent-kafka rewind."""
    out: list[dict[str, Any]] = []
    for line in lines:
        m = _LIBRDKAFKA_START_OFFSET.match(line)
        if m is not None:
            out.append(
                {
                    "t": float(m["t"]),
                    "ev": "rdk_offset",
                    "inc": m["inc"],
                    "p": int(m["p"]),
                    "why": m["why"],
                }
            )
    return out


def librdkafka_heartbeats(lines: Iterable[str]) -> list[dict[str, Any]]:
    """The heartbeat trace of confluent-kafka members from librdkafka's ``debug=cgrp,consumer``
    lines (its own timestamps; the member's ``client.id`` is its incarnation): an ``hb_sent``
    event per heartbeat request as librdkafka builds it, an ``hb`` event per answer read
    (``err`` 0, or the fencing error it rejoins on). librdkafka keeps one heartbeat in flight
    (the answer to one it timed out is dropped), so an answer is to the latest request logged
    before it (``sent``)."""
    out: list[dict[str, Any]] = []
    sent: dict[str, float] = {}
    for line in lines:
        m = _LIBRDKAFKA_HEARTBEAT.match(line)
        if m is None:
            continue
        inc, t = m["inc"], float(m["t"])
        if m["sent"] is not None:
            sent[inc] = t
            out.append({"t": t, "ev": "hb_sent", "inc": inc, "sent": t})
        elif m["error"] is not None:
            out.append(
                {
                    "t": t,
                    "ev": "hb",
                    "inc": inc,
                    "sent": sent.get(inc),
                    "err": int(_LIBRDKAFKA_FENCING.get(m["error"], -1)),
                }
            )
        else:
            out.append(
                {
                    "t": t,
                    "ev": "hb",
                    "inc": inc,
                    "mid": m["mid"],
                    "err": 0,
                    "resp_ep": int(m["ep"]),
                    "sent": sent.get(inc),
                }
            )
    return out


def _commits(inc: Incarnation) -> dict[Partition, list[tuple[float, int]]]:
    out: dict[Partition, list[tuple[float, int]]] = defaultdict(list)
    for ev in inc.events:
        if ev["ev"] == "commit":
            for p, o in ev["offsets"].items():
                out[int(p)].append((ev["t"], int(o)))
    return out


def _readopted(ivs: list[Interval], iv: Interval) -> bool:
    """``iv`` began right after the same incarnation lost the partition as a SIGSTOPped,
    fenced member. librdkafka's mock re-creates such a member from its first (stale, full)
    heartbeat after SIGCONT, taking the partitions that heartbeat still lists as owned, and
    gives them back on the rejoin while their new owner still holds them (a real broker
    answers UNKNOWN_MEMBER_ID and creates nothing)."""
    return any(
        x.partition == iv.partition and x.end_kind == "fenced" and 0 <= iv.start - x.lost_at < 2.0
        for x in ivs
    )


def _mock_reset_evidence(
    owner: Incarnation,
    taker: Incarnation,
    a: Interval,
    b: Interval,
    coordinator_faults: list[tuple[float, str]],
) -> str | None:
    """Why ``b`` taking ``a``'s partition is the mock's fault (module doc), or None.

    ``b.start`` (its ``assign`` callback) is no earlier than when the broker gave it the
    partition, so a release by ``a`` that the broker could have read must come before it."""
    if a.end_kind != "revoke":
        return None
    if _impl(owner) == "sdk":
        return _sdk_owner_evidence(owner, a, b, coordinator_faults)
    if _impl(owner) == "ck" and _impl(taker) == "sdk":
        return _ck_owner_evidence(taker, a, b, coordinator_faults)
    return None


def _session_bound(inc: Incarnation, before: float, session_s: float) -> float:
    """When the member's session could first have expired on the broker: one session after
    the send of its last heartbeat answered without error before ``before`` (records it
    handed out until then were its own); ``-inf`` for a member without a trace."""
    sent = [
        ev["sent"]
        for ev in inc.events
        if ev["ev"] == "hb" and ev.get("err") == 0 and ev.get("sent") and ev["t"] <= before
    ]
    return max(sent) + session_s if sent else float("-inf")


def _impl(inc: Incarnation) -> str:
    return next((str(e.get("impl")) for e in inc.events if e["ev"] == "start"), "")


def _sdk_owner_evidence(
    owner: Incarnation, a: Interval, b: Interval, coordinator_faults: list[tuple[float, str]]
) -> str | None:
    """The owner's trace: every heartbeat it sent from its ``assign`` until ``b`` had the
    partition that reported owned partitions listed it (none a leave), one did before the
    coordinator broker went down (the mock then forgot it)."""
    trace = [e for e in owner.events if e["ev"] == "hb" and a.start <= e["sent"] <= b.start]
    if any(e["req_ep"] < 0 for e in trace):
        return None  # a leave heartbeat releases everything
    reports = [e for e in trace if e["tp"] is not None]
    if any(a.partition not in e["tp"] for e in reports):
        return None
    # The latest outage of the coordinator broker (a coordinator move leaves the SDK's
    # connection to the old coordinator open, so the mock keeps its state then).
    for fault, what in reversed(coordinator_faults):
        before = [e for e in reports if e["sent"] < fault]
        if what == "went down" and a.start <= fault <= b.start and before:
            after = [e for e in reports if e["sent"] >= fault]
            last = before[-1]
            return (
                f"{a.incarnation} still reported it owned: its heartbeat at {last['sent']:.3f} "
                f"(epoch {last['req_ep']}) listed {last['tp']}, the coordinator {what} at "
                f"{fault:.3f} (the mock forgets a member's partitions when its connection "
                f"closes), and of the {len(trace)} heartbeats it sent until "
                f"{b.incarnation} had the partition none released it"
                + (f" ({len(after)} after that listed it again)" if after else "")
            )
    return None


def _grants(taker: Incarnation, partition: Partition, until: float) -> list[dict[str, Any]]:
    """The heartbeat answers in an SDK member's trace, up to ``until``, whose assignment gave
    it ``partition``."""
    return [
        e
        for e in taker.events
        if e["ev"] == "hb"
        and e.get("assigned") is not None
        and partition in e["assigned"]
        and e["t"] <= until
    ]


def _ck_owner_evidence(
    taker: Incarnation, a: Interval, b: Interval, coordinator_faults: list[tuple[float, str]]
) -> str | None:
    """A confluent-kafka owner acknowledges a revocation only after its revoke callback has
    returned (``a.end``); the SDK taker's trace shows the broker granted the partition before
    that, after the coordinator went down or moved (librdkafka closes its coordinator
    connection when the coordinator changes, and the mock then forgets its partitions)."""
    grants = [e for e in _grants(taker, a.partition, b.start) if b.start - e["t"] < 10.0]
    if not grants:
        return None
    grant = grants[-1]
    if grant["t"] >= a.end:
        return None
    for fault, what in reversed(coordinator_faults):  # the latest before the grant
        if a.start <= fault <= grant["t"]:
            return (
                f"the broker gave it to {b.incarnation} at {grant['t']:.3f} (heartbeat "
                f"response, epoch {grant['resp_ep']}, assigned {grant['assigned']}) while "
                f"{a.incarnation} (confluent-kafka, which acknowledges a revocation only after "
                f"on_revoke returns) was still to release it: its on_revoke ended at "
                f"{a.end:.3f}; the coordinator {what} at {fault:.3f} (librdkafka closes its "
                "coordinator connection on a coordinator change, and the mock forgets a "
                "member's partitions when its connection closes)"
            )
    return None


def _ck_early_ack_evidence(
    owner: Incarnation, taker: Incarnation, a: Interval, b: Interval
) -> str | None:
    """A confluent-kafka owner whose revocation librdkafka acknowledged before on_revoke
    began: the SDK taker's trace shows the broker's grant no later than it took the partition,
    and the owner processed no record of it from then until its callback began."""
    if _impl(owner) != "ck" or _impl(taker) != "sdk":
        return None
    if not any(
        e["ev"] == "revoking" and e["t"] == a.end and a.partition in e["parts"]
        for e in owner.events
    ):
        return None  # its ownership did not end where its on_revoke began
    if not any(a.start <= e["t"] for e in _grants(taker, a.partition, b.start)):
        return None
    if any(
        e["ev"] == "rec" and e["p"] == a.partition and b.start <= e["t"] <= a.end
        for e in owner.events
    ):
        return None
    return (
        f"the broker gave it to {b.incarnation} before {a.incarnation} (confluent-kafka) "
        f"began its on_revoke at {a.end:.3f}, and {a.incarnation} processed no record of it "
        "from then on"
    )


def _next_start(ivs: list[Interval], iv: Interval) -> float:
    """When the same incarnation next took ``iv``'s partition (its commits after that belong
    to the later ownership)."""
    later = [x.start for x in ivs if x.partition == iv.partition and x.start > iv.start]
    return min(later, default=float("inf"))


def _rewinds(
    incs: Mapping[str, Incarnation],
    by_inc: Mapping[str, list[Interval]],
    commits: Mapping[str, dict[Partition, list[tuple[float, int]]]],
) -> dict[tuple[str, Partition, float], Rewind]:
    """Each ownership whose first record was below the last commit of its partition that any
    member logged before the ownership began (module doc), keyed like ``early_acks``;
    ``commits``: each incarnation's `_commits`."""
    logged: dict[Partition, list[tuple[float, int, str]]] = defaultdict(list)
    for name, own_commits in commits.items():
        for p, own in own_commits.items():
            logged[p].extend((t, o, name) for t, o in own)
    for partition_commits in logged.values():
        partition_commits.sort()
    out: dict[tuple[str, Partition, float], Rewind] = {}
    for name, ivs in by_inc.items():
        for iv in ivs:
            first = next(
                (
                    ev["o"]
                    for ev in incs[name].events
                    if ev["ev"] == "rec"
                    and ev["p"] == iv.partition
                    and iv.start <= ev["t"] <= iv.end
                ),
                None,
            )
            before = [c for c in logged.get(iv.partition, []) if c[0] < iv.start]
            if first is None or not before:
                continue
            at, committed, committer = before[-1]
            if first < committed:
                out[(name, iv.partition, iv.start)] = Rewind(iv, first, committed, committer, at)
    return out


def _rewind_commit(
    by_inc: Mapping[str, list[Interval]],
    commits: Mapping[str, dict[Partition, list[tuple[float, int]]]],
    ck_rewinds: Iterable[Rewind],
    partition: Partition,
    offset: int,
    sampled_at: float,
) -> Rewind | None:
    """The confluent-kafka rewind whose member committed ``offset`` (at most the commit it
    should have started from) in that ownership (its ``on_revoke`` included), by
    ``sampled_at`` (give or take the second between a commit's answer and its log line)."""
    for r in ck_rewinds:
        iv = r.interval
        if iv.partition != partition or offset > r.committed:
            continue
        until = min(_next_start(by_inc[iv.incarnation], iv), sampled_at + 1.0)
        if any(
            o == offset and iv.start <= t < until
            for t, o in commits[iv.incarnation].get(partition, [])
        ):
            return r
    return None


def analyze(
    member_events: list[dict[str, Any]],
    driver_events: list[dict[str, Any]],
    end_offsets: Mapping[Partition, int],
    committed_samples: list[tuple[float, dict[Partition, int]]],
    *,
    session_s: float,
    close_timeout_s: float,
    acked_by_producer: int = 0,
    overlap_tolerance_s: float = 0.0,
    heartbeat_interval_s: float = 0.0,
) -> Summary:
    s = Summary(acked_by_producer=acked_by_producer)
    s.produced = sum(end_offsets.values())
    incs = incarnations(member_events, driver_events)
    s.incarnations = len(incs)
    s.examples = {
        "lost": [],
        "unexplained duplicates": [],
        "overlaps": [],
        "regressions": [],
        "close failures": [],
        "fatal errors": [],
        "zombie windows": [],
        "mock-reset overlaps": [],
        "confluent-kafka early acknowledgements": [],
        "rewinds": [],
    }
    for ev in driver_events:
        if ev["ev"] in ACTION_EVENTS:
            s.actions[ev["ev"]] = s.actions.get(ev["ev"], 0) + 1

    # records
    seen: dict[tuple[Partition, int], list[tuple[float, str]]] = defaultdict(list)
    for inc in incs.values():
        for ev in inc.events:
            if ev["ev"] == "rec":
                seen[(ev["p"], ev["o"])].append((ev["t"], inc.name))
            elif ev["ev"] == "commit_failed":
                s.commit_failures += 1
            elif ev["ev"] == "error" and ev.get("fatal"):
                s.fatal_errors += 1
                s.examples["fatal errors"].append(f"{inc.name}: {ev.get('error')}")
    s.processed = sum(len(v) for v in seen.values())
    s.processed_unique = len(seen)
    for p, end in sorted(end_offsets.items()):
        for o in range(end):
            if (p, o) not in seen:
                s.lost += 1
                s.examples["lost"].append(f"partition {p} offset {o}")

    # ownership
    broker = next(
        (ev.get("args", {}).get("broker", "mock") for ev in driver_events if ev["ev"] == "start"),
        "mock",
    )
    # the mock's connection-close fault (module doc); a real broker has none
    coordinator_faults = sorted(
        (ev["t"], "went down" if ev["ev"] == "broker_down" else "moved")
        for ev in driver_events
        if broker == "mock"
        and ((ev["ev"] == "broker_down" and ev.get("coordinator")) or ev["ev"] == "coordinator")
    )
    mock_reset_intervals: set[tuple[str, Partition, float]] = set()
    # (owner incarnation, partition, owner's start) -> the taker's interval, for each
    # confluent-kafka early acknowledgement
    early_acks: dict[tuple[str, Partition, float], Interval] = {}
    all_intervals: dict[Partition, list[Interval]] = defaultdict(list)
    by_inc: dict[str, list[Interval]] = {}
    for inc in incs.values():
        ivs = intervals(inc, session_s, heartbeat_interval_s)
        by_inc[inc.name] = ivs
        for iv in ivs:
            all_intervals[iv.partition].append(iv)
    zombie_seen: set[tuple[str, Partition, int]] = set()
    for p, ivs in all_intervals.items():
        ivs.sort(key=lambda iv: iv.start)
        for i, a in enumerate(ivs):
            for b in ivs[i + 1 :]:
                if a.end <= b.start < a.lost_at and a.incarnation != b.incarnation:
                    since = max(a.end, _session_bound(incs[a.incarnation], a.lost_at, session_s))
                    for ev in incs[a.incarnation].events:
                        if ev["ev"] == "rec" and ev["p"] == p and since <= ev["t"] < a.lost_at:
                            key = (a.incarnation, p, ev["o"])
                            if key not in zombie_seen:
                                zombie_seen.add(key)
                                impl = _impl(incs[a.incarnation])
                                s.zombie_records[impl] = s.zombie_records.get(impl, 0) + 1
                    s.zombie_windows += 1
                    s.zombie_max_s = max(s.zombie_max_s, a.lost_at - b.start)
                    s.examples["zombie windows"].append(
                        f"partition {p}: {a.incarnation} ({a.end_kind}) learned at "
                        f"{a.lost_at:.3f}, {a.lost_at - b.start:.3f}s after {b.incarnation} "
                        f"took it at {b.start:.3f}"
                    )
                if b.start >= a.end:
                    continue
                if a.incarnation == b.incarnation:
                    continue
                overlap = min(a.end, b.end) - b.start
                if overlap <= overlap_tolerance_s:
                    continue
                reset = _mock_reset_evidence(
                    incs[a.incarnation], incs[b.incarnation], a, b, coordinator_faults
                )
                if _readopted(by_inc[b.incarnation], b):
                    s.overlaps_mock_readoption += 1
                elif reset is not None:
                    s.overlaps_mock_reset += 1
                    for iv in (a, b):
                        mock_reset_intervals.add((iv.incarnation, iv.partition, iv.start))
                    s.examples["mock-reset overlaps"].append(
                        f"partition {p}: {a.incarnation} [{a.start:.3f}, {a.end:.3f} "
                        f"{a.end_kind}] and {b.incarnation} [{b.start:.3f}, {b.end:.3f}] "
                        f"overlap {overlap:.3f}s: {reset}"
                    )
                elif (
                    early := _ck_early_ack_evidence(incs[a.incarnation], incs[b.incarnation], a, b)
                ) is not None:
                    s.overlaps_ck_early_ack += 1
                    early_acks[(a.incarnation, p, a.start)] = b
                    s.examples["confluent-kafka early acknowledgements"].append(
                        f"partition {p}: {a.incarnation} [{a.start:.3f}, {a.end:.3f}] and "
                        f"{b.incarnation} [{b.start:.3f}, {b.end:.3f}] overlap {overlap:.3f}s: "
                        f"{early}"
                    )
                else:
                    s.overlaps += 1
                    s.examples["overlaps"].append(
                        f"partition {p}: {a.incarnation} [{a.start:.3f}, {a.end:.3f} "
                        f"{a.end_kind}] and {b.incarnation} [{b.start:.3f}, {b.end:.3f}] "
                        f"overlap {overlap:.3f}s"
                    )

    # rewinds
    commits = {name: _commits(inc) for name, inc in incs.items()}
    rewinds = _rewinds(incs, by_inc, commits)
    for r in sorted(rewinds.values(), key=lambda r: r.interval.start):
        iv = r.interval
        impl = _impl(incs[iv.incarnation])
        s.rewinds[impl] = s.rewinds.get(impl, 0) + 1
        # librdkafka's own account of the committed offset it read, if it logged one
        looked_up = [
            f"{ev['why']} at {ev['t']:.3f}"
            for ev in incs[iv.incarnation].events
            if ev["ev"] == "rdk_offset"
            and ev["p"] == iv.partition
            and iv.start - 5.0 <= ev["t"]
            and ev["t"] <= iv.end
        ]
        s.examples["rewinds"].append(
            f"partition {iv.partition}: {iv.incarnation} "
            f"({'confluent-kafka' if impl == 'ck' else 'SDK'}) took it at "
            f"{iv.start:.3f} and began at offset {r.first}, below {r.committed} "
            f"committed by {r.committer} at {r.committed_at:.3f}"
            + (f" (librdkafka: {'; '.join(looked_up)})" if looked_up else "")
        )
    ck_rewinds = {k: r for k, r in rewinds.items() if _impl(incs[k[0]]) == "ck"}

    # duplicates
    for (p, o), instances in seen.items():
        if len(instances) < 2:
            continue
        s.duplicates += len(instances) - 1
        instances.sort()
        explained = 0
        readopted = 0
        reset_redone = 0
        early_redone = 0
        rewind_redone = 0
        reasons = []
        for t, name in instances:
            owned = [iv for iv in by_inc.get(name, []) if iv.partition == p and iv.start <= t]
            covering = max(owned, key=lambda iv: iv.start) if owned else None
            committed_past = covering is not None and any(
                c > o and covering.start <= ct < _next_start(by_inc[name], covering)
                for ct, c in commits[name].get(p, [])
            )
            if (
                covering is not None
                and covering.end_kind in ("kill", "lost", *FENCED_KINDS)
                and not committed_past
            ):
                explained += 1
            elif covering is not None and _readopted(by_inc[name], covering):
                readopted += 1  # the overlap counted apart above made it process this again
            elif covering is not None and (name, p, covering.start) in mock_reset_intervals:
                reset_redone += 1  # processed during an overlap the mock made (counted apart)
            elif (
                covering is not None
                and (taker := early_acks.get((name, p, covering.start))) is not None
                and t < taker.start
                and not any(
                    c > o and covering.start <= ct < taker.start
                    for ct, c in commits[name].get(p, [])
                )
                and any(
                    n == taker.incarnation and taker.start <= u <= taker.end for u, n in instances
                )
            ):
                # librdkafka gave the partition up before on_revoke committed this record, so
                # the taker started from the older committed offset (counted apart)
                early_redone += 1
            elif (
                covering is not None
                and (rewind := ck_rewinds.get((name, p, covering.start))) is not None
                and o < rewind.committed
                and t <= covering.end
            ):
                rewind_redone += 1  # librdkafka started below the committed offset
            reasons.append(
                f"{name}@{t:.3f}:{covering.end_kind if covering else 'unowned'}"
                f"{'+committed' if committed_past else ''}"
            )
        # One processing may be the final, committed one; every other must be redone work.
        unexplained = max(0, len(instances) - 1 - explained)
        by_mock = min(unexplained, readopted)
        unexplained -= by_mock
        by_reset = min(unexplained, reset_redone)
        unexplained -= by_reset
        by_early = min(unexplained, early_redone)
        unexplained -= by_early
        by_rewind = min(unexplained, rewind_redone)
        unexplained -= by_rewind
        s.duplicates_ck_early_ack += by_early
        s.duplicates_ck_rewind += by_rewind
        s.duplicates_mock_readoption += by_mock
        s.duplicates_mock_reset += by_reset
        s.duplicates_explained += (
            len(instances) - 1 - unexplained - by_mock - by_reset - by_early - by_rewind
        )
        s.duplicates_unexplained += unexplained
        if unexplained:
            s.examples["unexplained duplicates"].append(
                f"partition {p} offset {o}: {', '.join(reasons)}"
            )

    # committed offsets never go back; everything is committed at the end
    high: dict[Partition, tuple[float, int]] = {}
    for t, sample in sorted(committed_samples, key=lambda x: x[0]):
        for p, offset in sample.items():
            if offset < 0:
                continue
            if p in high and offset < high[p][1]:
                rewind = _rewind_commit(by_inc, commits, ck_rewinds.values(), p, offset, t)
                if rewind is not None:
                    # counted apart; the offsets never go back again from here
                    s.committed_regressions_ck_rewind += 1
                    high[p] = (t, offset)
                    continue
                s.committed_regressions += 1
                s.examples["regressions"].append(
                    f"partition {p}: {high[p][1]} at {high[p][0]:.3f} -> {offset} at {t:.3f}"
                )
            if p not in high or offset > high[p][1]:
                high[p] = (t, offset)
    if committed_samples:
        final = max(committed_samples, key=lambda x: x[0])[1]
        for p, end in end_offsets.items():
            if final.get(p, -1) < end:
                s.uncommitted_at_end += 1
                s.examples["regressions"].append(
                    f"partition {p}: committed {final.get(p, -1)} < end {end} at the end"
                )

    # closes
    for ev in driver_events:
        if ev["ev"] == "close_timeout":
            s.close_failures += 1
            s.examples["close failures"].append(f"{ev.get('inc')}: did not exit")
    for inc in incs.values():
        for ev in inc.events:
            if ev["ev"] == "closed" and ev["took"] > close_timeout_s + 1.0:
                s.close_failures += 1
                s.examples["close failures"].append(f"{inc.name}: close took {ev['took']:.1f}s")
    return s
