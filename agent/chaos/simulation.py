"""One seed in-process: the simulation that drives real agents, on real
SQLite files and a real transport, through the fault phase and the settle
phase, then has the checks run.

Rules of this file:
* One seed decides everything: which sites run when and where agents
  crash come from the run stream (``run:<seed>``); the fault phase's
  pauses and drain rounds from a stream of their own (``timing:<seed>``),
  so the workload, crash and extraction draws of a seed stay what they
  were before them.
* Agents run in one process on a virtual clock; a crash drops the agent
  object at a named crash point and a new one starts on the same files.
* Any transport can carry the files.  Inboxes that are not fresh folders
  of the seed (an SFTP server, mailboxes) are emptied when a seed starts,
  so no seed sees another's files, and quiescence also asks the transport
  that no data message is waiting.
* After the faults stop, every site runs at most SETTLE_ROUNDS clean
  rounds (each site once a round), the virtual clock advancing by one
  confirm timeout a round in all: the system must be at rest by then, so a
  lost confirmation or last message is repaired by the probes of rule 3,
  never by a heartbeat (docs/protocol.md, I5).  A seed still busy is
  *stuck*.  Then the invariants are checked (checks.py).
* A PostgreSQL consolidated (``--consolidated``) is made afresh for every
  seed (pgworld.py); while the faults last, some of its runs have an
  application transaction begun before and committed after them
  (``stragglers:<seed>`` draws which), as a server's sessions commit
  while its agent runs.
* Stale epochs (I3): in-process, every apply is watched: none may carry a
  message whose epoch is below the receiver's ``rereceive_count`` at the
  moment it commits.
"""

from __future__ import annotations

import dataclasses
import random
import shutil
from pathlib import Path

from transports import Transport
from transports.faults import FaultsTransport

from .. import crashpoints
from ..admin import extract_site
from ..errors import AgentError
from ..keyfiles import load_site_keys
from ..runner import Agent, RunOptions
from ..site import open_site
from . import checks, schema_changes
from .resubscribe import Resubscriptions
from .params import SETTLE_ROUNDS, ChaosParams, duration_text
from .pgworld import make_pg_sites
from .report import ChaosResult
from .sites import Sites
from .workload import Workload
from .world import Templates, add_arrival_journal, site_names

# Virtual seconds a site run takes while the faults last (a site running
# about once a minute, as in continuous mode).
FAULT_RUN_SECONDS = 60.0
# The chance that a round of the fault phase follows a pause of a few
# confirm timeouts.
PAUSE_RATE = 0.2
# The chance that a PostgreSQL consolidated's run has an application
# transaction begun before it and committed after it.
STRAGGLER_RATE = 0.3


class Simulation:
    """One seed, in-process: the sites' agents on a virtual clock, the
    workload and fault phase, the settle phase, then the checks."""

    def __init__(self, root: Path, params: ChaosParams, templates: Templates) -> None:
        self.root = root
        self.params = params
        self.rng = random.Random(f"run:{params.seed}")
        # The fault phase's pauses and drain rounds draw from a stream of
        # their own, so the workload, crash and extraction draws of a seed
        # stay what they were before them.
        self.timing = random.Random(f"timing:{params.seed}")
        # Application transactions left open across a PostgreSQL
        # consolidated's runs: a stream of their own too.
        self.stragglers = random.Random(f"stragglers:{params.seed}")
        self.sites = ["hq", *site_names(params.remotes)]
        self.agents: dict[str, Agent] = {}
        self._observers: dict[str, Transport] = {}
        self.result = ChaosResult(params)
        self.clock = 1_000_000.0
        self.places = Sites(root, params.consolidated)
        self.workload = Workload(self.places, self.sites, self.rng, chain=params.chain,
                                 schema_seed=params.seed if params.schema else None)
        self.resubscriptions = Resubscriptions(self.places, self.sites, params.seed) if params.resubscribe else None
        self.root.mkdir(parents=True, exist_ok=True)
        if params.consolidated is not None:  # made afresh: a database cannot be copied as a file
            make_pg_sites(params.consolidated, root, params.remotes, chain=params.chain)
        else:
            templates.copy(params.remotes, root, own_identities=not self.fresh_inboxes, chain=params.chain)
        for site in self.sites:
            if params.transport == "folder":  # the folders the templates name, wherever they are
                for folder in {self.address(site), self.send_address(site)}:
                    try:
                        Path(folder).expanduser().mkdir(parents=True, exist_ok=True)
                    except OSError as error:
                        raise AgentError(f"cannot make the inbox folder {folder} of site {site}: "
                                         f"{error.strerror or error}; check --address-template") from None
            with open_site(self.places.location(site)) as db:
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
        # Workers for every send phase of two sends or more, where the seed draws them.
        workers = dict(pack_workers=2, pack_workers_from=0) if self.params.pack_workers and index == 0 else \
            dict(pack_workers=1)
        return RunOptions(transport=f"faults+{self.params.transport}", address=self.address(site),
                          max_message_size=self.params.max_message_size, patience=self.params.patience,
                          resend_urgency=0.0, heartbeat=self.params.heartbeat,
                          confirm_timeout=self.params.confirm_timeout, named_options={"faults": fault_options},
                          transport_options=self.transport_options(site), **workers)

    def _settings_patch(self, agent: Agent) -> None:
        if self.params.unsafe_without_stale_rule or self.params.unsafe_without_duplicate_rule:
            agent.settings = dataclasses.replace(
                agent.settings, unsafe_without_stale_rule=self.params.unsafe_without_stale_rule,
                unsafe_without_duplicate_rule=self.params.unsafe_without_duplicate_rule)  # pairs built later
            for peer in agent.peers.values():
                peer.protocol.settings = dataclasses.replace(
                    peer.protocol.settings, unsafe_without_stale_rule=self.params.unsafe_without_stale_rule,
                    unsafe_without_duplicate_rule=self.params.unsafe_without_duplicate_rule)

    async def _agent(self, site: str, faults: bool) -> Agent:
        agent = self.agents.get(site)
        if agent is None:
            agent = Agent(self.places.location(site), self._options(site, faults), clock=lambda: self.clock)
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
        elif faults and site != "hq" and self.workload.schema is not None and self.workload.schema.crash_now():
            crashpoints.arm("apply.in-change")  # dies if this run applies a schema change (the seed's own stream)
        straggler = None
        if faults and self.places.in_postgres(site) and self.stragglers.random() < STRAGGLER_RATE:
            straggler = self.places.begin(site, self.workload.straggler(site, self.stragglers))
            self.result.stragglers += 1
        try:
            await agent.run_once()
        except crashpoints.Crash:
            self.result.crashes += 1
            self.result.consolidated_crashes += site == "hq"
            await self._drop(site)
        finally:
            crashpoints.disarm()
            if straggler is not None:
                straggler.commit()

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
            with open_site(self.root / f"{remote}.db") as old:
                keys = load_site_keys(old)
        at_hq = {row[0] for row in self.places.rows("hq", "ledger", ("entry",))}
        self.workload.forget(remote, kept=at_hq)
        for suffix in ("", "-wal", "-shm"):
            (self.root / f"{remote}.db{suffix}").unlink(missing_ok=True)
        shutil.rmtree(self.root / f"{remote}.db.agent", ignore_errors=True)
        with open_site(self.places.location("hq")) as hq:
            extract_site(hq, remote, self.root / f"{remote}.db", keys=keys)
        with open_site(self.root / f"{remote}.db") as copy:
            copy.update_remote("hq", address=self.send_address("hq"))
        add_arrival_journal(self.root / f"{remote}.db")
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
                self.workload.step()
                kinds = None if self.workload.schema is None else self.workload.schema.change()
                if kinds is not None:
                    self.result.schema_changes += 1
                    self.result.schema_kinds.update(kinds)
                if self.resubscriptions is not None and self.resubscriptions.change() is not None:
                    self.result.subscription_changes += 1
                if self.params.reextract_rate and self.rng.random() < self.params.reextract_rate:
                    await self.reextract(self.rng.choice(self.sites[1:]))
                await self.fault_round()
            # The last writes drain while the faults go on: the last data
            # messages and confirmations of a stream may be lost with no
            # data behind them to repair it (rule 3's probes must).
            for _ in range(self.timing.randint(0, 3)):
                await self.fault_round()
            await self._stop_faults()
            self.result.backoff_at_stop = max((row.probes for peers, _ in self.places.remote_rows(self.sites).values()
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
            observer = self._observers[site] = inner_transport(self.params.transport, self.transport_options(site))
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

    # -- checks (checks.py) ---------------------------------------------------------------

    def quiescent(self) -> bool:
        folders = None
        if self.params.transport == "folder":
            folders = [Path(self.address(site)).expanduser() for site in self.sites]
        return checks.quiescent(self.places, self.sites, folders)

    def describe(self) -> str:
        return checks.describe(self.places, self.sites)

    def check(self) -> None:
        if self.resubscriptions is not None:
            self.result.subscription_rows = self.resubscriptions.rows
        checks.check(self.places, self.sites, self.workload.ledger, self.result)
        if self.workload.chain is not None:
            checks.check_chain(self.places, self.sites, self.result)
            self.result.chain_moves = self.workload.chain.counts.moves
            self.result.chain_handovers = self.workload.chain.counts.handovers
        if self.workload.schema is not None:
            self.result.divergences += schema_changes.differences(self.places, self.sites)


def inner_transport(transport: str, options: dict) -> Transport:
    """The transport the faults wrapper wraps (without faults)."""
    from transports.registry import create_transport
    return create_transport(transport, **options)
