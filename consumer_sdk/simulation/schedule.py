"""Turn a `SimConfig` into the run's event trace (a seeded, up-front schedule)."""

from __future__ import annotations

import random

from consumer_sdk.simulation.config import FaultMix, SimConfig
from consumer_sdk.simulation.trace import TraceEvent


def windows(config: SimConfig) -> list[tuple[int, int, int]]:
    """``(churn_start, churn_end, checkpoint)`` per cycle: faults only in ``[start, end)``,
    and the group must have converged at ``checkpoint`` (the end of the quiet window)."""
    out = []
    cycle = config.churn_ms + config.quiet_ms
    end = config.duration_ms
    start = 0
    while start + config.quiet_ms <= end:
        churn_end = min(start + config.churn_ms, end - config.quiet_ms)
        checkpoint = min(start + cycle, end) if start + cycle <= end else end
        out.append((start, churn_end, checkpoint))
        start += cycle
    return out


def topic_names(config: SimConfig) -> dict[str, int]:
    """The initial topics: ``topic-<i>`` with the partitions spread evenly."""
    n = config.topic_count
    base, extra = divmod(config.partitions, n)
    return {f"topic-{i}": base + (1 if i < extra else 0) for i in range(n) if base or i < extra}


REGEX = "topic-.*"


def generate(config: SimConfig) -> tuple[TraceEvent, ...]:
    """The joins of the initial members and the faults of every churn window."""
    rng = random.Random(f"{config.seed}/schedule")
    mix = config.mix
    events: list[TraceEvent] = []
    for slot in range(config.members):
        events.append(TraceEvent(rng.randint(0, config.join_spread_ms), "join", slot))
    alive = set(range(config.members))
    busy: dict[int, int] = {}
    next_slot = config.members
    topics = topic_names(config)
    created = 0
    weights = [w for _, w in mix.weights]
    kinds = [k for k, _ in mix.weights]
    rate = mix.events_rate_per_min(config.members) / 60_000.0

    for start, end, _ in windows(config):
        # Cluster events.
        for per_hour, kind in (
            (mix.failovers_per_hour, "failover"),
            (mix.partition_additions_per_hour, "add_partitions"),
            (mix.topic_creations_per_hour, "create_topic"),
        ):
            t = float(start)
            while per_hour > 0:
                t += rng.expovariate(per_hour / 3_600_000.0)
                if t >= end:
                    break
                at = int(t)
                if kind == "failover":
                    down = min(_draw(rng, mix.failover_down_ms), end - at)
                    load = min(_draw(rng, mix.failover_load_ms), max(0, end - at - down))
                    events.append(TraceEvent(at, "failover", -1, (max(1, down), load)))
                elif kind == "add_partitions":
                    name = rng.choice(sorted(topics))
                    count = rng.randint(1, max(1, topics[name] // 4))
                    topics[name] += count
                    events.append(TraceEvent(at, "add_partitions", -1, (name, count)))
                else:
                    name = f"topic-new{created}"
                    created += 1
                    parts = rng.randint(1, max(1, config.partitions // config.topic_count))
                    topics[name] = parts
                    events.append(TraceEvent(at, "create_topic", -1, (name, parts)))
        if not kinds or rate <= 0:
            continue
        t = float(start) + 1_000
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                break
            at = int(t)
            kind = rng.choices(kinds, weights)[0]
            if kind == "join":
                events.append(TraceEvent(at, "join", next_slot))
                alive.add(next_slot)
                next_slot += 1
                continue
            free = sorted(s for s in alive if busy.get(s, -1) < at)
            if not free:
                continue
            slot = rng.choice(free)
            event, until = _member_event(rng, mix, kind, at, end, slot, topics)
            if event is None:
                continue
            if event.kind == "leave" and not event.args[0]:
                alive.discard(slot)
            busy[slot] = until
            events.append(event)
    events.sort(key=lambda e: e.time_ms)
    return tuple(events)


def _member_event(
    rng: random.Random,
    mix: FaultMix,
    kind: str,
    at: int,
    end: int,
    slot: int,
    topics: dict[str, int],
) -> tuple[TraceEvent | None, int]:
    left = max(1, end - at)
    if kind == "leave":
        restart = (
            _draw(rng, mix.leave_restart_ms) if rng.random() < mix.leave_restart_probability else 0
        )
        restart = min(restart, left)
        return TraceEvent(at, "leave", slot, (restart,)), at + max(restart, 30_000)
    if kind == "crash":
        restart = min(_draw(rng, mix.crash_restart_ms), left)
        return TraceEvent(at, "crash", slot, (max(1, restart),)), at + restart
    if kind == "pause":
        span = mix.long_pause_ms if rng.random() < mix.long_pause_probability else mix.pause_ms
        d = min(_draw(rng, span), left)
        return TraceEvent(at, "pause", slot, (d,)), at + d
    if kind in ("freeze", "partition"):
        d = min(_draw(rng, mix.freeze_ms if kind == "freeze" else mix.partition_ms), left)
        return TraceEvent(at, kind, slot, (d,)), at + d
    if kind == "subscribe":
        names = sorted(topics)
        if rng.random() < 0.3:
            return TraceEvent(at, "subscribe", slot, ((), REGEX)), at
        chosen = tuple(sorted(rng.sample(names, rng.randint(1, len(names)))))
        return TraceEvent(at, "subscribe", slot, (chosen, None)), at
    if kind.startswith("inject_"):
        codes = {
            "inject_retriable": mix.retriable_codes,
            "inject_fencing": mix.fencing_codes,
            "inject_fatal": mix.fatal_codes,
        }[kind]
        if not codes:
            return None, at
        count = rng.randint(1, 3) if kind == "inject_retriable" else 1
        return TraceEvent(at, "inject", slot, (int(rng.choice(codes)), count)), at + 1_000
    return None, at


def _draw(rng: random.Random, span: tuple[int, int]) -> int:
    lo, hi = span
    return rng.randint(lo, hi) if hi > lo else lo
