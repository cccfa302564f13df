"""A seed's parameters: what one seed draws (remotes, workload size, fault
rates, crash and extraction rates, timers), and the command that replays it.

Rules of this file:
* One seed decides everything: the same seed gives the same parameters,
  each drawn from a stream of its own (``params:<seed>``), later draws
  after the earlier ones so that adding one changes none before it.
* The timers are realistic: each seed draws its heartbeat (the default
  24 h in most seeds) and its confirm timeout (minutes to an hour, never
  above the heartbeat), and the agents run with them.
* Two seeds in three publish a follow chain (clients, their orders and the
  orders' lines, chain.py) and write to it; drawn after the rest.
* Half the seeds make schema changes at the consolidated while the faults
  last (schema_changes.py); drawn after the rest.
* Half the seeds change remotes' subscriptions while the faults last
  (resubscribe.py); drawn after the rest.
* A seed in four packs the consolidated's sends on two worker processes
  (agent.pack_workers), every send phase of two sends or more; drawn last
  of all.
* ``command()`` gives back exactly what differs from the seed's draws, so
  that ``agent chaos --seed N ...`` replays the run.
"""

from __future__ import annotations

import random
import shlex
from dataclasses import dataclass

from transports.faults import FaultRates

from ..run_options import DEFAULT_CONFIRM_TIMEOUT

# The timers each seed draws (seconds).  The heartbeat is `agent run`'s
# default of 24 h in three seeds of five, else 6 h or 1 h; the confirm
# timeout is one of a few values from five minutes to the default hour,
# never above the heartbeat.
DEFAULT_HEARTBEAT = 86400.0
HEARTBEATS = (DEFAULT_HEARTBEAT, DEFAULT_HEARTBEAT, DEFAULT_HEARTBEAT, 21600.0, 3600.0)
CONFIRM_TIMEOUTS = (300.0, 600.0, 1800.0, DEFAULT_CONFIRM_TIMEOUT)
# After the faults stop: the system must be at rest within this many clean
# rounds of every site, the virtual clock advancing by one confirm timeout
# a round (shared out over the round's site runs).  Ten rounds are at most
# ten hours, less than any 24 h heartbeat: only the probes can repair.
SETTLE_ROUNDS = 10
# The multi-process runs use real time: the default heartbeat, so it never
# repairs anything, and a confirm timeout of a second.
PROCESS_HEARTBEAT = "24h"
PROCESS_CONFIRM_TIMEOUT = "1s"
_DEFAULT_ADDRESS_TEMPLATE = "{root}/inbox/{site}"


def duration_text(seconds: float) -> str:
    """``5400`` -> ``1h30m``: a duration as `agent chaos` and `agent run` take it."""
    whole = int(seconds)
    if whole != seconds:
        return f"{seconds:g}s"
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return (f"{hours}h" if hours else "") + (f"{minutes}m" if minutes else "") + (f"{secs}s" if secs else "") or "0s"


@dataclass(frozen=True, slots=True)
class ChaosParams:
    seed: int
    remotes: int = 2
    steps: int = 8
    rates: FaultRates = FaultRates()
    crash_rate: float = 0.0
    max_message_size: int = 10_000
    patience: int = 1
    transport: str = "folder"
    # Where each site's inbox is, for transports other than folder; formatted
    # with {root} (the seed's folder) and {site}.
    address_template: str = _DEFAULT_ADDRESS_TEMPLATE
    # Where peers send to each site, when that is not the inbox address
    # (email: mailto:{site}@example.com, the inbox being an imaps:// URL).
    send_address_template: str | None = None
    # {root} and {site} in text values are replaced as in the templates
    # (email: from_address={site}@example.com).
    transport_options: tuple[tuple[str, object], ...] = ()
    reextract_rate: float = 0.0  # per step: a remote is extracted again while its mail is in flight
    heartbeat: float = DEFAULT_HEARTBEAT  # seconds: every agent's --heartbeat
    confirm_timeout: float = DEFAULT_CONFIRM_TIMEOUT  # seconds: every agent's --confirm-timeout
    chain: bool = False  # the follow chain is published and written (chain.py)
    schema: bool = False  # the consolidated makes schema changes (schema_changes.py)
    resubscribe: bool = False  # the consolidated changes remotes' subscriptions (resubscribe.py)
    pack_workers: bool = False  # the consolidated packs its sends on two worker processes (agent.pack_workers)
    unsafe_without_stale_rule: bool = False
    unsafe_without_duplicate_rule: bool = False
    # The consolidated: a PostgreSQL database (libpq URI, no password),
    # emptied and made again for every seed; None: a SQLite file.
    consolidated: str | None = None

    def __post_init__(self) -> None:
        if not 0 < self.confirm_timeout <= self.heartbeat:
            raise ValueError(f"the confirm timeout ({duration_text(self.confirm_timeout)}) must be positive and "
                             f"not above the heartbeat ({duration_text(self.heartbeat)})")

    @classmethod
    def random(cls, seed: int, **overrides: object) -> "ChaosParams":
        """Parameters drawn from the seed: k remotes, rates, workload size,
        timers, the follow chain, schema changes, subscription changes.  A
        heartbeat given without a confirm timeout lowers the drawn one to it."""
        rng = random.Random(f"params:{seed}")
        scale = rng.choice((0.0, 0.03, 0.08, 0.15))
        rates = FaultRates(drop=scale, corrupt=scale / 2, duplicate=scale, reorder=scale, delay=scale / 2,
                           partition=scale / 4, max_hold_ticks=rng.randint(1, 6), partition_ticks=rng.randint(1, 4))
        values = dict(seed=seed, remotes=rng.randint(1, 3), steps=rng.randint(3, 8), rates=rates,
                      crash_rate=rng.choice((0.0, 0.0, 0.05, 0.15)), patience=rng.randint(1, 2),
                      reextract_rate=rng.choice((0.0, 0.0, 0.0, 0.1)))
        # Drawn after the rest, so that the other draws of a seed stay what they were.
        heartbeat = rng.choice(HEARTBEATS)
        values.update(heartbeat=heartbeat, confirm_timeout=min(rng.choice(CONFIRM_TIMEOUTS), heartbeat))
        values.update(chain=rng.random() < 2 / 3)
        values.update(schema=rng.random() < 1 / 2)
        values.update(resubscribe=rng.random() < 1 / 2)
        values.update(pack_workers=rng.random() < 1 / 4)
        values.update(overrides)
        if "confirm_timeout" not in overrides:
            values["confirm_timeout"] = min(values["confirm_timeout"], values["heartbeat"])  # type: ignore[type-var]
        return cls(**values)  # type: ignore[arg-type]

    @property
    def timers(self) -> str:
        """``heartbeat 24h, confirm timeout 5m``."""
        return f"heartbeat {duration_text(self.heartbeat)}, confirm timeout {duration_text(self.confirm_timeout)}"

    def command(self) -> str:
        """A one-line command that replays this seed."""
        parts = [f"agent chaos --seed {self.seed}"]
        if self.consolidated is not None:
            parts.append(f"--consolidated {shlex.quote(self.consolidated)}")
        if self.transport != "folder":
            parts.append(f"--transport {self.transport}")
        if self.address_template != _DEFAULT_ADDRESS_TEMPLATE:
            parts.append(f"--address-template {shlex.quote(self.address_template)}")
        if self.send_address_template:
            parts.append(f"--send-address-template {shlex.quote(self.send_address_template)}")
        for name, value in self.transport_options:
            parts.append(f"-O {shlex.quote(f'{name}={value}')}")
        if self.unsafe_without_stale_rule:
            parts.append("--unsafe-without-stale-rule")
        if self.unsafe_without_duplicate_rule:
            parts.append("--unsafe-without-duplicate-rule")
        drawn = ChaosParams.random(self.seed, consolidated=self.consolidated)
        if self.steps != drawn.steps:
            parts.append(f"--steps {self.steps}")
        if self.crash_rate != drawn.crash_rate:
            parts.append(f"--crash-rate {self.crash_rate}")
        if self.reextract_rate != drawn.reextract_rate:
            parts.append(f"--reextract-rate {self.reextract_rate}")
        if self.heartbeat != drawn.heartbeat:
            parts.append(f"--heartbeat {duration_text(self.heartbeat)}")
        if self.confirm_timeout != min(drawn.confirm_timeout, self.heartbeat):
            parts.append(f"--confirm-timeout {duration_text(self.confirm_timeout)}")
        if self.chain != drawn.chain:
            parts.append("--follow-chain" if self.chain else "--no-follow-chain")
        if self.schema != drawn.schema:
            parts.append("--schema-changes" if self.schema else "--no-schema-changes")
        if self.resubscribe != drawn.resubscribe:
            parts.append("--resubscribe" if self.resubscribe else "--no-resubscribe")
        if self.pack_workers != drawn.pack_workers:
            parts.append("--pack-workers" if self.pack_workers else "--no-pack-workers")
        if self.rates != drawn.rates:
            default = FaultRates()
            changed = [name for name in FaultRates.__dataclass_fields__
                       if getattr(self.rates, name) != getattr(default, name)] or ["drop"]
            parts.extend(f"--fault-rate {name}={getattr(self.rates, name)}" for name in changed)
        return " ".join(parts)
