"""The protocol fault-injection suite (``agent chaos``): random workloads,
faults and crashes against real agents, real SQLite files and a real
transport.

Rules of this package, one module each, in the order a seed meets them:
* ``params``: one seed decides everything (remotes, workload, fault rates,
  timers, which sites run when, where agents crash); the same seed gives
  the same run, and ``agent chaos --seed N`` replays one.
* ``world``: the sites' files, made from templates; the arrival journal
  each site keeps (I2).  ``pgworld``: a consolidated in a PostgreSQL
  database instead, made afresh for every seed; ``sites``: where each
  site is, and its rows as they travel.
* ``chain``: the follow chain most seeds publish (clients, their orders,
  the orders' lines): its schema, what the sites write to it, and the rows
  each remote must end up holding.
* ``workload``: what the sites write; every transaction writes ledger
  entries.
* ``simulation``: agents in one process on a virtual clock, the fault
  phase, then at most SETTLE_ROUNDS clean rounds to come to rest (probes,
  never a heartbeat, repair); every apply is watched for stale epochs (I3).
* ``checks``: at rest, then the invariants (I1, I2, I5; no loss, no
  double apply; the chain's subsets).
* ``report``: what a seed found and the summary of many.
* ``runs``: seeds in fresh folders; shrinking a failing one.
* ``processes``: the same with real ``agent run --once`` processes killed
  at random.
"""

from .params import (CONFIRM_TIMEOUTS, DEFAULT_HEARTBEAT, HEARTBEATS, PROCESS_CONFIRM_TIMEOUT, PROCESS_HEARTBEAT,
                     SETTLE_ROUNDS, ChaosParams, duration_text)
from .processes import ProcessSimulation, run_process_seed
from .report import ChaosResult, rest_figures, summarize
from .runs import run_seed, run_seeds, shrink
from .simulation import FAULT_RUN_SECONDS, PAUSE_RATE, Simulation
from .world import ARRIVALS, PRODUCTS, SCHEMA, Templates

__all__ = [
    "ARRIVALS", "CONFIRM_TIMEOUTS", "DEFAULT_HEARTBEAT", "FAULT_RUN_SECONDS", "HEARTBEATS", "PAUSE_RATE",
    "PROCESS_CONFIRM_TIMEOUT", "PROCESS_HEARTBEAT", "PRODUCTS", "SCHEMA", "SETTLE_ROUNDS", "ChaosParams",
    "ChaosResult", "ProcessSimulation", "Simulation", "Templates", "duration_text", "rest_figures", "run_process_seed",
    "run_seed", "run_seeds", "shrink", "summarize",
]
