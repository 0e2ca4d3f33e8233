"""Deterministic virtual-time simulation of a KIP-848 consumer group.

Runs N real members (`consumer_sdk.membership.GroupMembership` driven by the runtime's
`MemberDriver`) against the
coordinator model (`consumer_sdk.coordinator.GroupCoordinator`) over simulated links with
latency, loss, reordering and network partitions, while members join, leave, crash, pause,
freeze and restart, the coordinator fails over and topics change. Invariants are checked as the
run goes (no partition owned by two members, clients agree with the coordinator, epochs only
move forward, no unexplained FATAL, no member stuck reconciling, convergence after faults stop).

    from consumer_sdk.simulation import SimConfig, Simulation

    report = Simulation(SimConfig(members=50, partitions=300, minutes=20, seed=7)).run()
    print(report.summary())
    assert report.ok

A failing run is replayed from its trace (`replay`) and shrunk (`shrink`). The CLI
is ``python -m consumer_sdk.simulation --help``. See ``docs/simulation.md``.

Each member runs the runtime's own `consumer_sdk.runtime.driver.MemberDriver` (the core
with the coordinator, metadata and commit request managers and their ordering) over a
virtual transport, so the request ordering the simulator checks is the one the runtime runs.

Imports: `consumer_sdk.membership`, `consumer_sdk.runtime.driver` (sans I/O),
`consumer_sdk.coordinator`, `consumer_sdk.domain` and `consumer_sdk.error_codes`; no sockets
or threads. Threads: a run is single-threaded, on the caller's thread, in virtual time: one
event queue orders every message and timer. The only clock read is the wall time a report
states (``time.perf_counter``).
"""

from __future__ import annotations

from consumer_sdk.simulation._base import (
    CoreFactory,
    DriverFactory,
    default_core_factory,
    default_driver_factory,
)
from consumer_sdk.simulation.config import FAULT_MIXES, FaultMix, SimConfig
from consumer_sdk.simulation.engine import Simulation, run
from consumer_sdk.simulation.report import VIOLATION_KINDS, SimReport, Violation
from consumer_sdk.simulation.shrink import replay, shrink
from consumer_sdk.simulation.trace import EVENT_KINDS, Trace, TraceEvent

__all__ = [
    "EVENT_KINDS",
    "FAULT_MIXES",
    "VIOLATION_KINDS",
    "CoreFactory",
    "DriverFactory",
    "FaultMix",
    "SimConfig",
    "SimReport",
    "Simulation",
    "Trace",
    "TraceEvent",
    "Violation",
    "default_core_factory",
    "default_driver_factory",
    "replay",
    "run",
    "shrink",
]
