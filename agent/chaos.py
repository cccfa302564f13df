"""The protocol fault-injection suite: random workloads, faults and crashes
against real agents, real SQLite files and a real transport.

Rules of this file:
* One seed decides everything: the number of remotes, the workload, the
  fault rates, which sites run when, and where agents crash.  The same seed
  gives the same run (``agent chaos --seed N`` replays one).
* Agents run in one process on a virtual clock; a crash drops the agent
  object at a named crash point and a new one starts on the same files.
* Any transport can carry the files.  Inboxes that are not fresh folders
  of the seed (an SFTP server, mailboxes) are emptied when a seed starts,
  so no seed sees another's files, and quiescence also asks the transport
  that no data message is waiting.
* The timers are realistic: each seed draws its heartbeat (the default
  24 h in most seeds) and its confirm timeout (minutes to an hour, never
  above the heartbeat), and the agents run with them.
* After the faults stop, every site runs at most SETTLE_ROUNDS clean
  rounds (each site once a round), the virtual clock advancing by one
  confirm timeout a round in all: the system must be at rest by then, so a
  lost confirmation or last message is repaired by the probes of rule 3,
  never by a heartbeat (docs/protocol.md, I5).  A seed still busy is
  *stuck*.  Then the invariants are checked: every remote holds exactly the
  consolidated's subscribed rows (I5), every ledger entry made anywhere is
  everywhere exactly once (no loss, no double apply: a second apply of a
  ledger INSERT is an error row; every workload transaction writes ledger
  entries), every stream is confirmed to its end, and I1 holds on every
  remote-user row.  Apply errors on customers come from concurrent changes
  (an UPDATE of a row another site deleted) and are only counted.
* Order (I2): each site journals the ledger entries as they arrive, in a
  local table fed by a trigger (``chaos_arrival``, not published).  Entry
  numbers grow in commit order at their origin, so at every site each
  origin's entries must arrive in increasing order.
* Stale epochs (I3): in-process, every apply is watched: none may carry a
  message whose epoch is below the receiver's ``rereceive_count`` at the
  moment it commits.  (Process runs cannot watch inside the agent; they
  check the rest.)
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import random
import shlex
import shutil
import sqlite3
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from transports import Transport
from transports.faults import FaultRates, FaultsTransport
from transports.options import parse_seconds

from . import crashpoints
from .admin import extract_site, init_site
from .errors import AgentError
from .keyfiles import copy_site_keys, load_site_keys
from .run_options import DEFAULT_CONFIRM_TIMEOUT
from .runner import Agent, RunOptions
from .site import SiteDatabase
from .site.publications import Article

SCHEMA = [
    "CREATE TABLE customer (id INTEGER PRIMARY KEY, region TEXT NOT NULL, name TEXT, balance REAL, scan BLOB)",
    "CREATE TABLE product (sku TEXT PRIMARY KEY, title TEXT, price REAL)",
    "CREATE TABLE ledger (entry TEXT PRIMARY KEY, site TEXT NOT NULL, amount INTEGER NOT NULL)",
]
# The arrival journal (I2): local to each site, never published.
ARRIVALS = [
    "CREATE TABLE IF NOT EXISTS chaos_arrival (n INTEGER PRIMARY KEY AUTOINCREMENT, entry TEXT NOT NULL)",
    "CREATE TRIGGER IF NOT EXISTS chaos_arrival_journal AFTER INSERT ON ledger"
    " BEGIN INSERT INTO chaos_arrival (entry) VALUES (NEW.entry); END",
]
PRODUCTS = ("tea", "jam", "rice", "soap")
# The timers each seed draws (seconds).  The heartbeat is `agent run`'s
# default of 24 h in three seeds of five, else 6 h or 1 h; the confirm
# timeout is one of a few values from five minutes to the default hour,
# never above the heartbeat.
DEFAULT_HEARTBEAT = 86400.0
HEARTBEATS = (DEFAULT_HEARTBEAT, DEFAULT_HEARTBEAT, DEFAULT_HEARTBEAT, 21600.0, 3600.0)
CONFIRM_TIMEOUTS = (300.0, 600.0, 1800.0, DEFAULT_CONFIRM_TIMEOUT)
# Virtual seconds a site run takes while the faults last (a site running
# about once a minute, as in continuous mode).
FAULT_RUN_SECONDS = 60.0
# The chance that a round of the fault phase follows a pause of a few
# confirm timeouts.
PAUSE_RATE = 0.2
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
    unsafe_without_stale_rule: bool = False
    unsafe_without_duplicate_rule: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.confirm_timeout <= self.heartbeat:
            raise ValueError(f"the confirm timeout ({duration_text(self.confirm_timeout)}) must be positive and "
                             f"not above the heartbeat ({duration_text(self.heartbeat)})")

    @classmethod
    def random(cls, seed: int, **overrides: object) -> "ChaosParams":
        """Parameters drawn from the seed: k remotes, rates, workload size,
        timers.  A heartbeat given without a confirm timeout lowers the
        drawn one to it."""
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
        drawn = ChaosParams.random(self.seed)
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
        if self.rates != drawn.rates:
            default = FaultRates()
            changed = [name for name in FaultRates.__dataclass_fields__
                       if getattr(self.rates, name) != getattr(default, name)] or ["drop"]
            parts.extend(f"--fault-rate {name}={getattr(self.rates, name)}" for name in changed)
        return " ".join(parts)


@dataclass(slots=True)
class ChaosResult:
    params: ChaosParams
    faults: Counter = field(default_factory=Counter)
    crashes: int = 0
    reextractions: int = 0
    resends: int = 0
    quarantined: int = 0
    # Operations on customers that found no row (or a taken key) because
    # another site changed the row meanwhile: the sites still converge.
    apply_errors: int = 0
    probes: int = 0  # probes sent (rule 3): control messages asking for a confirmation after a silence
    # The most probes any stream had sent since it last changed when the
    # faults stopped: its next probe waits the confirm timeout doubled as often.
    backoff_at_stop: int = 0
    # Clean rounds of every site until the system was at rest (0: stuck),
    # and the virtual seconds they took.
    rounds_to_quiesce: int = 0
    settle_seconds: float = 0.0
    divergences: list[str] = field(default_factory=list)
    double_applies: list[str] = field(default_factory=list)
    losses: list[str] = field(default_factory=list)
    out_of_order: list[str] = field(default_factory=list)
    stale_applies: list[str] = field(default_factory=list)
    stuck: str | None = None

    @property
    def ok(self) -> bool:
        return not (self.divergences or self.double_applies or self.losses or self.out_of_order
                    or self.stale_applies or self.stuck)

    def summary(self) -> str:
        problems = (self.divergences + self.double_applies + self.losses + self.out_of_order
                    + self.stale_applies + ([self.stuck] if self.stuck else []))
        return "; ".join(problems[:3]) if problems else "ok"


class _Templates:
    """Site files made once per number of remotes and copied for each seed."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._made: set[int] = set()

    def copy(self, remotes: int, target: Path, *, own_identities: bool = False) -> None:
        """Copy the sites of ``remotes`` remotes into ``target``.
        ``own_identities``: make them afresh instead (new keys and
        incarnations), for inboxes that outlive a seed: mail of an earlier
        seed that a server delivers late (Postfix's queue) then fails its
        checks as another site's, where a copy would take it as its own."""
        if own_identities:
            _make_sites(target / "sites", remotes)
            for path in (target / "sites").glob("*.db"):
                shutil.copyfile(path, target / path.name)
                copy_site_keys(path, target / path.name)
            shutil.rmtree(target / "sites")
            return
        source = self.root / f"k{remotes}"
        if remotes not in self._made:
            if source.exists():
                shutil.rmtree(source)
            _make_sites(source, remotes)
            self._made.add(remotes)
        for path in source.glob("*.db"):
            shutil.copyfile(path, target / path.name)
            copy_site_keys(path, target / path.name)  # a site's key lives beside its database


def _site_names(remotes: int) -> list[str]:
    return [f"f{index}" for index in range(1, remotes + 1)]


def _make_sites(root: Path, remotes: int) -> None:
    root.mkdir(parents=True)
    hq = init_site(root / "hq.db", name="hq", role="consolidated", address="inbox/hq", transport="folder")
    for statement in SCHEMA:
        hq.connection.execute(statement)
    hq.connection.executemany("INSERT INTO product VALUES (?, ?, 1.0)", [(sku, sku) for sku in PRODUCTS])
    hq.create_publication("field", [Article("customer", subscribe_by="region"), "product", "ledger"])
    for remote in _site_names(remotes):
        hq.add_remote(remote, address=f"inbox/{remote}", transport="folder")
        hq.subscribe(remote, "field", remote)
    for remote in _site_names(remotes):
        extract_site(hq, remote, root / f"{remote}.db")
    hq.close()
    for site in ["hq", *_site_names(remotes)]:
        _add_arrival_journal(root / f"{site}.db")


def _add_arrival_journal(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in ARRIVALS:
            conn.execute(statement)
    finally:
        conn.close()


class Simulation:
    def __init__(self, root: Path, params: ChaosParams, templates: _Templates) -> None:
        self.root = root
        self.params = params
        self.rng = random.Random(f"run:{params.seed}")
        # The fault phase's pauses and drain rounds draw from a stream of
        # their own, so the workload, crash and extraction draws of a seed
        # stay what they were before them.
        self.timing = random.Random(f"timing:{params.seed}")
        self.sites = ["hq", *_site_names(params.remotes)]
        self.agents: dict[str, Agent] = {}
        self._observers: dict[str, Transport] = {}
        self.result = ChaosResult(params)
        self.clock = 1_000_000.0
        self.ledger: set[str] = set()
        self.next_id = 1
        self.root.mkdir(parents=True, exist_ok=True)
        templates.copy(params.remotes, root, own_identities=not self.fresh_inboxes)
        for site in self.sites:
            if params.transport == "folder":  # the folders the templates name, wherever they are
                for folder in {self.address(site), self.send_address(site)}:
                    try:
                        Path(folder).expanduser().mkdir(parents=True, exist_ok=True)
                    except OSError as error:
                        raise AgentError(f"cannot make the inbox folder {folder} of site {site}: "
                                         f"{error.strerror or error}; check --address-template") from None
            with SiteDatabase.open(root / f"{site}.db") as db:
                # Addresses in the template are relative: point them here.
                for remote in db.remotes():
                    db.update_remote(remote.name, address=self.send_address(remote.name))

    def address(self, site: str) -> str:
        """``site``'s inbox, where its agent receives."""
        return self.params.address_template.format(root=self.root, site=site)

    def send_address(self, site: str) -> str:
        """Where peers send to ``site``."""
        template = self.params.send_address_template or self.params.address_template
        return template.format(root=self.root, site=site)

    def transport_options(self, site: str) -> dict[str, object]:
        return {name: value.replace("{root}", str(self.root)).replace("{site}", site)
                if isinstance(value, str) else value for name, value in self.params.transport_options}

    @property
    def fresh_inboxes(self) -> bool:
        """Whether every inbox is a new folder of this seed (under ``{root}``)."""
        templates = [self.params.address_template, self.params.send_address_template or ""]
        return self.params.transport == "folder" and all(template.startswith("{root}") or not template
                                                         for template in templates)

    # -- agents --------------------------------------------------------------------------

    def _options(self, site: str, faults: bool) -> RunOptions:
        index = self.sites.index(site)
        fault_options = {"seed": self.params.seed * 100 + index, "rates": self.params.rates,
                         "hold_dir": str(self.root / "held" / site), "active": faults}
        return RunOptions(transport=f"faults+{self.params.transport}", address=self.address(site),
                          max_message_size=self.params.max_message_size, patience=self.params.patience,
                          resend_urgency=0.0, heartbeat=self.params.heartbeat,
                          confirm_timeout=self.params.confirm_timeout, named_options={"faults": fault_options},
                          transport_options=self.transport_options(site))

    def _settings_patch(self, agent: Agent) -> None:
        if self.params.unsafe_without_stale_rule or self.params.unsafe_without_duplicate_rule:
            for peer in agent.peers.values():
                peer.protocol.settings = dataclasses.replace(
                    peer.protocol.settings, unsafe_without_stale_rule=self.params.unsafe_without_stale_rule,
                    unsafe_without_duplicate_rule=self.params.unsafe_without_duplicate_rule)

    async def _agent(self, site: str, faults: bool) -> Agent:
        agent = self.agents.get(site)
        if agent is None:
            agent = Agent(self.root / f"{site}.db", self._options(site, faults), clock=lambda: self.clock)
            await agent.__aenter__()
            self._settings_patch(agent)
            self._watch_applies(site, agent)
            self.agents[site] = agent
        return agent

    def _watch_applies(self, site: str, agent: Agent) -> None:
        """I3: record every committed apply that carried a stale-epoch message."""
        apply = agent.apply

        async def watched(peer, action):  # type: ignore[no-untyped-def]
            protocol = peer.protocol
            rereceive_count = protocol.state.rereceive_count
            epochs = [protocol.pending_header(message_id).resend_count for message_id in action.message_ids]
            more = await apply(peer, action)
            committed = protocol.state.log_received == action.log_received
            if committed and min(epochs) < rereceive_count:
                self.result.stale_applies.append(
                    f"I3: {site} applied {peer.name}'s message {action.message_ids[0]} of epoch {min(epochs)} "
                    f"after asking for epoch {rereceive_count}")
            return more

        agent.apply = watched  # type: ignore[method-assign]

    async def _drop(self, site: str) -> None:
        agent = self.agents.pop(site, None)
        if agent is not None:
            self._collect(agent)
            await agent.aclose()

    def _collect(self, agent: Agent) -> None:
        for transport in agent.transports.values():
            if isinstance(transport, FaultsTransport):
                self.result.faults.update(transport.counts())
                transport.injected.clear()
        self.result.resends += agent.report.resend_requests
        self.result.quarantined += agent.report.quarantined
        agent.report.resend_requests = agent.report.quarantined = 0
        for peer in agent.peers.values():
            counters = peer.protocol.counters
            self.result.probes += counters.probes_sent
            peer.protocol.counters = dataclasses.replace(counters, probes_sent=0)

    async def run_site(self, site: str, *, faults: bool, seconds: float = FAULT_RUN_SECONDS) -> None:
        """One run of ``site``'s agent (a receive and a send phase), the
        virtual clock first advancing by ``seconds``."""
        self.clock += seconds
        agent = await self._agent(site, faults)
        armed = faults and self.rng.random() < self.params.crash_rate
        if armed:
            crashpoints.arm(self.rng.choice(crashpoints.POINTS), self.rng.randint(0, 3))
        try:
            await agent.run_once()
        except crashpoints.Crash:
            self.result.crashes += 1
            await self._drop(site)
        finally:
            crashpoints.disarm()

    # -- workload ----------------------------------------------------------------------

    def _write(self, site: str, statements: Iterable[tuple[str, tuple]]) -> None:
        conn = sqlite3.connect(self.root / f"{site}.db", timeout=30, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            for sql, values in statements:
                conn.execute(sql, values)
            conn.execute("COMMIT")
        finally:
            conn.close()

    def _customers(self, site: str) -> list[tuple[int, str]]:
        conn = sqlite3.connect(self.root / f"{site}.db")
        try:
            return conn.execute("SELECT id, region FROM customer ORDER BY id").fetchall()
        finally:
            conn.close()

    def workload_step(self) -> None:
        rng = self.rng
        remotes = self.sites[1:]
        for site in self.sites:
            if rng.random() < 0.3:
                continue
            statements: list[tuple[str, tuple]] = []
            for _ in range(rng.randint(1, 3)):
                entry = f"{site}-{self.next_id}"
                self.next_id += 1
                self.ledger.add(entry)
                statements.append(("INSERT INTO ledger VALUES (?, ?, ?)", (entry, site, rng.randint(1, 99))))
            if rng.random() < 0.4:
                statements.append(("UPDATE product SET price = ?, title = ? WHERE sku = ?",
                                   (round(rng.uniform(1, 9), 2), f"{site} price", rng.choice(PRODUCTS))))
            if site != "hq" and rng.random() < 0.6:
                statements += self._remote_customer_writes(site)
            if site == "hq":
                customers = self._customers("hq")
                for _ in range(rng.randint(0, 4)):
                    statements.append(("INSERT INTO customer VALUES (?, ?, ?, ?, NULL)",
                                       (self.next_id, rng.choice(remotes), f"c{self.next_id}", 0.0)))
                    self.next_id += 1
                if customers and rng.random() < 0.5:
                    row_id, _ = rng.choice(customers)
                    statements.append(("UPDATE customer SET balance = balance + 1 WHERE id = ?", (row_id,)))
                if customers and rng.random() < 0.3:  # a row moves between subsets
                    row_id, region = rng.choice(customers)
                    statements.append(("UPDATE customer SET region = ? WHERE id = ?",
                                       (rng.choice(remotes), row_id)))
                if customers and rng.random() < 0.2:
                    statements.append(("DELETE FROM customer WHERE id = ?", (rng.choice(customers)[0],)))
                if rng.random() < 0.15:  # a transaction larger than the message size
                    for _ in range(rng.randint(3, 6)):
                        statements.append(("INSERT INTO customer VALUES (?, ?, 'scan', 0, ?)",
                                           (self.next_id, rng.choice(remotes), rng.randbytes(3000))))
                        self.next_id += 1
            self._write(site, statements)

    def _remote_customer_writes(self, site: str) -> list[tuple[str, tuple]]:
        """A remote changes customers of its own subset: it updates them,
        gives them new keys, deletes them, inserts them, and hands one to
        another remote, all while the consolidated changes the same rows.
        Every written value is new (names and keys from the run's counter,
        balances only grow), so no change can pass for another."""
        rng = self.rng
        statements: list[tuple[str, tuple]] = []
        customers = [row_id for row_id, region in self._customers(site) if region == site]
        for _ in range(rng.randint(1, 2)):
            roll = rng.random()
            self.next_id += 1
            if roll < 0.2 or not customers:
                statements.append(("INSERT INTO customer VALUES (?, ?, ?, 0.5, NULL)",
                                   (self.next_id, site, f"{site}c{self.next_id}")))
                continue
            row_id = rng.choice(customers)
            if roll < 0.65:
                statements.append(("UPDATE customer SET name = ?, balance = balance + 1 WHERE id = ?",
                                   (f"{site}n{self.next_id}", row_id)))
            elif roll < 0.8:
                statements.append(("UPDATE customer SET id = ? WHERE id = ?", (self.next_id, row_id)))
                customers.remove(row_id)
                customers.append(self.next_id)
            elif roll < 0.9:
                statements.append(("DELETE FROM customer WHERE id = ?", (row_id,)))
                customers.remove(row_id)
            else:
                statements.append(("UPDATE customer SET region = ? WHERE id = ?",
                                   (rng.choice(self.sites[1:]), row_id)))
                customers.remove(row_id)
        return statements

    async def reextract(self, remote: str) -> None:
        """Replace ``remote``'s database with a new extraction, as an operator
        does after losing a field device.  Mail from the old copy may still be
        in flight (inboxes, files the faults wrapper holds): it must be set
        aside, never applied.  Ledger entries the old copy made that never
        reached the consolidated are gone with it.  Half the time the new
        copy keeps the device's keys, so the old copy's files still verify
        and only their epoch marks them stale (rule 1)."""
        await self._drop(remote)
        await self._drop("hq")  # the extraction rewrites hq's remote-user row
        keys = None
        if self.rng.random() < 0.5:
            with SiteDatabase.open(self.root / f"{remote}.db") as old:
                keys = load_site_keys(old)
        at_hq = {row[0] for row in self._rows("hq", "SELECT entry FROM ledger")}
        self.ledger = {entry for entry in self.ledger if not entry.startswith(f"{remote}-") or entry in at_hq}
        for suffix in ("", "-wal", "-shm"):
            (self.root / f"{remote}.db{suffix}").unlink(missing_ok=True)
        shutil.rmtree(self.root / f"{remote}.db.agent", ignore_errors=True)
        with SiteDatabase.open(self.root / "hq.db") as hq:
            extract_site(hq, remote, self.root / f"{remote}.db", keys=keys)
        with SiteDatabase.open(self.root / f"{remote}.db") as copy:
            copy.update_remote("hq", address=self.send_address("hq"))
        _add_arrival_journal(self.root / f"{remote}.db")
        self.result.reextractions += 1

    # -- the run -----------------------------------------------------------------------

    # What the settle phase's time is, for the report of a stuck seed.
    time_kind = "virtual"

    def timers(self) -> str:
        return self.params.timers

    def now(self) -> float:
        return self.clock

    async def fault_round(self) -> None:
        """The sites in a random order, each running or not (four in five).
        One round in five follows a pause of one, two or four confirm
        timeouts (the sites idle), so that probes go, and get lost, while
        the faults last."""
        if self.timing.random() < PAUSE_RATE:
            self.clock += self.params.confirm_timeout * self.timing.choice((1, 2, 4))
        order = self.sites[:]
        self.rng.shuffle(order)
        for site in order:
            if self.rng.random() < 0.8:
                await self.run_site(site, faults=True)

    async def settle_round(self) -> None:
        """Every site runs once, the virtual clock advancing by one confirm
        timeout over the round."""
        seconds = self.params.confirm_timeout / len(self.sites)
        for site in self.sites:
            await self.run_site(site, faults=False, seconds=seconds)

    async def settle(self, rounds: int) -> None:
        """The faults are off: clean rounds of every site until the system
        is at rest; after ``rounds`` rounds it is stuck."""
        start = self.now()
        for number in range(1, rounds + 1):
            await self.settle_round()
            if self.quiescent() and not await self._data_waiting():
                self.result.rounds_to_quiesce = number
                break
        self.result.settle_seconds = self.now() - start
        if not self.result.rounds_to_quiesce:
            self.result.stuck = (f"not at rest after {rounds} clean rounds "
                                 f"({duration_text(round(self.result.settle_seconds, 1))} of {self.time_kind} time; "
                                 f"{self.timers()}; {self.result.backoff_at_stop} probes of backoff when the "
                                 f"faults stopped): {self.describe()}")

    async def run(self, settle_rounds: int = SETTLE_ROUNDS) -> ChaosResult:
        try:
            if not self.fresh_inboxes:
                await self._empty_inboxes()
            for _ in range(self.params.steps):
                self.workload_step()
                if self.params.reextract_rate and self.rng.random() < self.params.reextract_rate:
                    await self.reextract(self.rng.choice(self.sites[1:]))
                await self.fault_round()
            # The last writes drain while the faults go on: the last data
            # messages and confirmations of a stream may be lost with no
            # data behind them to repair it (rule 3's probes must).
            for _ in range(self.timing.randint(0, 3)):
                await self.fault_round()
            await self._stop_faults()
            self.result.backoff_at_stop = max((row.probes for peers, _ in self._remote_rows().values()
                                               for row in peers.values()), default=0)
            await self.settle(settle_rounds)
            self.check()
        finally:
            for site in list(self.agents):
                await self._drop(site)
            for observer in self._observers.values():
                await observer.aclose()
            self._observers.clear()
        return self.result

    # -- inboxes behind a transport ------------------------------------------------------

    def _observer(self, site: str) -> Transport:
        """A transport of ``site``'s own, without faults, to look into its inbox."""
        observer = self._observers.get(site)
        if observer is None:
            observer = self._observers[site] = _inner(self.params.transport, self.transport_options(site))
        return observer

    async def _empty_inboxes(self) -> None:
        """Remove what an earlier seed (or anything else) left in the inboxes."""
        for site in self.sites:
            observer = self._observer(site)
            async for incoming in observer.receive(self.address(site)):
                await observer.ack(incoming)

    async def _data_waiting(self) -> bool:
        """Whether a data message still waits in an inbox that quiescent() cannot list
        (one behind a transport other than folder)."""
        if self.params.transport == "folder":
            return False
        for site in self.sites:
            async for incoming in self._observer(site).receive(self.address(site)):
                if ".d." in incoming.name:
                    return True
        return False

    async def _stop_faults(self) -> None:
        for site in self.sites:
            agent = await self._agent(site, faults=True)
            for transport in agent.transports.values():
                if isinstance(transport, FaultsTransport):
                    transport.active = False
                    transport._partitioned_until.clear()
                    await transport.flush()
            # Agents started from now on run without faults.
            self._collect(agent)
            await self._drop(site)
        for site in self.sites:
            await self._agent(site, faults=False)

    # -- checks ------------------------------------------------------------------------

    def _rows(self, site: str, sql: str, values: tuple = ()) -> list[tuple]:
        conn = sqlite3.connect(self.root / f"{site}.db")
        try:
            return sorted(conn.execute(sql, values).fetchall(), key=repr)
        finally:
            conn.close()

    def _remote_rows(self) -> dict[str, tuple[dict, int]]:
        found = {}
        for site in self.sites:
            with SiteDatabase.open(self.root / f"{site}.db") as db:
                found[site] = ({row.name: row for row in db.remotes()}, db.log_end())
        return found

    def quiescent(self) -> bool:
        rows = self._remote_rows()
        for site, (peers, end) in rows.items():
            for peer, row in peers.items():
                # I5: all that was sent is confirmed, and the log was read to its end.
                if not row.confirm_sent == row.log_sent or not row.horizon == row.read_through == end:
                    return False
                if row.log_received != rows[peer][0][site].log_sent:
                    return False
        if self.params.transport == "folder":
            for site in self.sites:
                inbox = Path(self.address(site)).expanduser()
                if any(".d." in path.name for path in inbox.iterdir()):
                    return False
        return True

    def describe(self) -> str:
        parts = []
        for site, (peers, end) in self._remote_rows().items():
            for peer, row in peers.items():
                parts.append(f"{site}->{peer} end={end} read={row.read_through} sent={row.log_sent} "
                             f"confirmed={row.confirm_sent} "
                             f"received={row.log_received} epochs={row.resend_count}/{row.rereceive_count} "
                             f"probes={row.probes}{' owed' if row.confirm_owed else ''}")
        return ", ".join(parts)

    def check(self) -> None:
        result = self.result
        for site, (peers, end) in self._remote_rows().items():
            for row in peers.values():
                if not row.confirm_sent <= row.log_sent <= end:
                    result.divergences.append(f"I1 broken at {site} for {row.name}")
            with SiteDatabase.open(self.root / f"{site}.db") as db:
                for error in db.apply_errors():
                    # The ledger only ever gets new entries: an error there
                    # is a second apply.  Customers change at several sites
                    # at once: an UPDATE of a row another site deleted fails
                    # by design (and I5 shows the sites converge).
                    if error.table == "ledger":
                        key = ", ".join(map(str, error.key or ()))
                        result.double_applies.append(
                            f"{site}: ledger entry {key} from {error.peer} (its commit {error.peer_commit}) applied "
                            f"again: {error.problem}")
                    else:
                        result.apply_errors += 1
        hq_ledger = self._rows("hq", "SELECT entry, site, amount FROM ledger")
        for site in self.sites:
            ledger = self._rows(site, "SELECT entry FROM ledger")
            entries = [row[0] for row in ledger]
            missing = self.ledger - set(entries)
            if missing:
                result.losses.append(f"{site} lacks ledger entries {sorted(missing)[:5]}")
            if len(entries) != len(set(entries)):
                result.double_applies.append(f"{site} holds a ledger entry twice")
            self._check_arrival_order(site)
            if site != "hq":
                if self._rows(site, "SELECT entry, site, amount FROM ledger") != hq_ledger:
                    result.divergences.append(f"{site}: ledger differs from hq")
                subset = self._rows("hq", "SELECT * FROM customer WHERE region = ?", (site,))
                if self._rows(site, "SELECT * FROM customer") != subset:
                    result.divergences.append(f"{site}: customers differ from hq's subset")
                if self._rows(site, "SELECT * FROM product") != self._rows("hq", "SELECT * FROM product"):
                    result.divergences.append(f"{site}: products differ from hq")


    def _check_arrival_order(self, site: str) -> None:
        """I2: at ``site`` each origin's entries arrived in their commit order."""
        conn = sqlite3.connect(self.root / f"{site}.db")
        try:
            arrivals = [row[0] for row in conn.execute("SELECT entry FROM chaos_arrival ORDER BY n")]
        finally:
            conn.close()
        last: dict[str, int] = {}
        for entry in arrivals:
            origin, _, number = entry.rpartition("-")
            if int(number) <= last.get(origin, 0):
                self.result.out_of_order.append(
                    f"I2: {site} applied {entry} after {origin}-{last[origin]}, against {origin}'s commit order")
                return
            last[origin] = int(number)


async def run_seed(params: ChaosParams, *, workdir: Path | None = None,
                   templates: _Templates | None = None) -> ChaosResult:
    own = workdir is None
    base = Path(tempfile.mkdtemp(prefix="fieldsync-chaos-", dir=_fast_tmp())) if own else workdir
    try:
        templates = templates or _Templates(base / "templates")
        return await Simulation(base / f"seed-{params.seed}", params, templates).run()
    finally:
        if own:
            shutil.rmtree(base, ignore_errors=True)


async def run_seeds(seeds: Iterable[int], *, keep_going: bool = True, progress=None,
                    **overrides: object) -> list[ChaosResult]:
    """Run many seeds; each in a fresh folder, site templates shared.
    ``progress(result)`` is called after each seed."""
    base = Path(tempfile.mkdtemp(prefix="fieldsync-chaos-", dir=_fast_tmp()))
    templates = _Templates(base / "templates")
    results = []
    try:
        for seed in seeds:
            params = ChaosParams.random(seed, **overrides)
            result = await run_seed(params, workdir=base, templates=templates)
            shutil.rmtree(base / f"seed-{seed}", ignore_errors=True)
            results.append(result)
            if progress is not None:
                progress(result)
            if not result.ok and not keep_going:
                break
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return results


def shrink(params: ChaosParams) -> ChaosParams:
    """A smaller failing case, where one exists: fewer steps, then no crashes,
    then fewer fault kinds."""
    def fails(candidate: ChaosParams) -> bool:
        return not asyncio.run(run_seed(candidate)).ok

    best = params
    for steps in range(1, params.steps):
        candidate = dataclasses.replace(best, steps=steps)
        if fails(candidate):
            best = candidate
            break
    if best.crash_rate and fails(dataclasses.replace(best, crash_rate=0.0)):
        best = dataclasses.replace(best, crash_rate=0.0)
    for kind in ("partition", "delay", "reorder", "duplicate", "corrupt", "drop"):
        if getattr(best.rates, kind):
            candidate = dataclasses.replace(best, rates=dataclasses.replace(best.rates, **{kind: 0.0}))
            if fails(candidate):
                best = candidate
    return best


def _percentile(values: list[int], share: float) -> int:
    """The nearest-rank percentile of ``values`` (sorted, not empty)."""
    return values[max(0, math.ceil(share * len(values)) - 1)]


def rest_figures(results: list[ChaosResult]) -> dict:
    """How many clean rounds the seeds needed to come to rest: the most,
    percentiles, and how many seeds needed each count (stuck seeds apart)."""
    rounds = sorted(r.rounds_to_quiesce for r in results if not r.stuck)
    figures: dict = {"bound": SETTLE_ROUNDS, "stuck": sum(1 for r in results if r.stuck)}
    if rounds:
        figures.update(max=rounds[-1], p50=_percentile(rounds, 0.5), p90=_percentile(rounds, 0.9),
                       p99=_percentile(rounds, 0.99))
    figures["histogram"] = {str(number): count for number, count in sorted(Counter(rounds).items())}
    return figures


def summarize(results: list[ChaosResult]) -> dict:
    faults: Counter = Counter()
    for result in results:
        faults.update(result.faults)
    failing = [r for r in results if not r.ok]
    return {
        "seeds": len(results),
        "faults": dict(sorted(faults.items())),
        "faults_total": sum(faults.values()),
        "crashes": sum(r.crashes for r in results),
        "reextractions": sum(r.reextractions for r in results),
        "resend_requests": sum(r.resends for r in results),
        "quarantined": sum(r.quarantined for r in results),
        "apply_errors": sum(r.apply_errors for r in results),
        "divergences": sum(len(r.divergences) for r in results),
        "double_applies": sum(len(r.double_applies) for r in results),
        "losses": sum(len(r.losses) for r in results),
        "out_of_order": sum(len(r.out_of_order) for r in results),
        "stale_applies": sum(len(r.stale_applies) for r in results),
        "stuck": sum(1 for r in results if r.stuck),
        "probes": sum(r.probes for r in results),
        "rounds_to_rest": rest_figures(results),
        "timers": {
            "heartbeat": _counts(duration_text(r.params.heartbeat) for r in results),
            "confirm_timeout": _counts(duration_text(r.params.confirm_timeout) for r in results),
        },
        "failing_seeds": [{"seed": r.params.seed, "replay": r.params.command(), "problem": r.summary(),
                           "heartbeat": r.params.heartbeat, "confirm_timeout": r.params.confirm_timeout,
                           "rounds_to_quiesce": r.rounds_to_quiesce, "backoff_at_stop": r.backoff_at_stop}
                          for r in failing],
    }


def _counts(values: Iterable[str]) -> dict[str, int]:
    return dict(Counter(values).most_common())


def _fast_tmp() -> str | None:
    """Where the seeds' folders go: the ``TMPDIR`` the user set, else
    ``/dev/shm`` (memory: many small synchronous writes), else the system's
    temporary folder."""
    if os.environ.get("TMPDIR"):
        return None
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and shm.stat().st_mode & 0o002 else None




class ProcessSimulation(Simulation):
    """The same suite with every agent run a real ``agent run --once``
    process over the faults-wrapped transport, killed with SIGKILL at random
    moments.  The agents run in real time, with the default heartbeat (24 h)
    and a confirm timeout of a second; the virtual clock (and the fault
    phase's pauses) mean nothing here.  The settle bound is the same number
    of rounds, each lasting at least the confirm timeout."""

    kill_rate = 0.25

    async def run_site(self, site: str, *, faults: bool, seconds: float = 0.0) -> None:
        """One ``agent run --once`` of ``site``, in real time (``seconds`` does not apply)."""
        import sys

        params = self.params
        index = self.sites.index(site)
        command = [sys.executable, "-m", "agent.cli", "run", str(self.root / f"{site}.db"), "--once",
                   "--transport", f"faults+{params.transport}", "--address", self.address(site),
                   "-l", str(params.max_message_size), "--patience", str(params.patience), "--resend-urgency", "0",
                   # Real time here: the default heartbeat, which repairs nothing within the run, and a
                   # confirm timeout of a second, so that probes repair a lost last message or confirmation.
                   "--heartbeat", PROCESS_HEARTBEAT, "--confirm-timeout", PROCESS_CONFIRM_TIMEOUT,
                   "-O", f"faults.seed={params.seed * 100 + index}", "-O", f"faults.hold_dir={self.root / 'held' / site}",
                   "-O", f"faults.active={'true' if faults else 'false'}",
                   "-O", f"faults.record={self.root / 'faults.jsonl'}"]
        for kind in ("drop", "corrupt", "duplicate", "reorder", "delay", "partition"):
            command += ["-O", f"faults.{kind}={getattr(params.rates, kind)}"]
        command += ["-O", f"faults.max_hold_ticks={params.rates.max_hold_ticks}",
                    "-O", f"faults.partition_ticks={params.rates.partition_ticks}"]
        for name, value in self.transport_options(site).items():
            command += ["-O", f"{name}={value}"]
        process = await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.DEVNULL,
                                                       stderr=asyncio.subprocess.PIPE)
        kill_after = self.rng.uniform(0.2, 1.0) if faults and self.rng.random() < self.kill_rate else None
        try:
            await asyncio.wait_for(process.wait(), timeout=kill_after or 120)
        except asyncio.TimeoutError:
            try:
                process.kill()
            except ProcessLookupError:
                pass  # it ended by itself just as the kill was due: checked below as a normal exit
            else:
                await process.wait()
                self.result.crashes += 1
                return
        stderr = (await process.stderr.read()).decode(errors="replace") if process.stderr else ""
        if process.returncode not in (0, 1) or "internal error" in stderr:
            self.result.divergences.append(f"{site}: agent run failed ({process.returncode}): {stderr[-300:]}")

    async def _stop_faults(self) -> None:
        # Later runs pass faults.active=false; deliver what the wrappers still hold.
        for site in self.sites:
            transport = FaultsTransport(_inner(self.params.transport, self.transport_options(site)),
                                        seed=0, hold_dir=self.root / "held" / site, active=False)
            await transport.flush()
            await transport.aclose()

    time_kind = "real"

    def __init__(self, root: Path, params: ChaosParams, templates: _Templates, *,
                 real_clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(root, params, templates)
        self.real_clock = real_clock

    def timers(self) -> str:
        return f"heartbeat {PROCESS_HEARTBEAT}, confirm timeout {PROCESS_CONFIRM_TIMEOUT}"

    def now(self) -> float:
        return self.real_clock()

    async def settle_round(self) -> None:
        """Every site runs once; a round lasts at least the confirm timeout
        (real time), so a stream still unconfirmed is probed every round
        while its backoff lasts."""
        start = self.now()
        for site in self.sites:
            await self.run_site(site, faults=False)
        await asyncio.sleep(max(0.0, parse_seconds(PROCESS_CONFIRM_TIMEOUT) - (self.now() - start)))

    async def run(self, settle_rounds: int = SETTLE_ROUNDS) -> ChaosResult:
        result = await super().run(settle_rounds)
        record = self.root / "faults.jsonl"
        if record.exists():
            import json
            for line in record.read_text().splitlines():
                result.faults[json.loads(line)["kind"]] += 1
        return result


def _inner(transport: str, options: dict):
    from transports.registry import create_transport
    return create_transport(transport, **options)


async def run_process_seed(params: ChaosParams) -> ChaosResult:
    base = Path(tempfile.mkdtemp(prefix="fieldsync-chaos-", dir=_fast_tmp()))
    try:
        return await ProcessSimulation(base / f"seed-{params.seed}", params, _Templates(base / "templates")).run()
    finally:
        shutil.rmtree(base, ignore_errors=True)
