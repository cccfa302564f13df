"""The fault suite with processes: every agent run a real
``agent run --once`` process over the faults-wrapped transport, killed with
SIGKILL at random moments.

Rules of this file:
* The agents run in real time, with the default heartbeat (24 h) and a
  confirm timeout of a second; the virtual clock (and the fault phase's
  pauses) mean nothing here.
* The settle bound is the same number of rounds as in-process, each
  lasting at least the confirm timeout.
* Process runs cannot watch inside the agent: I3 (stale epochs) is not
  checked; the rest is, and an agent that fails (not killed) is a
  divergence.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from transports.faults import FaultsTransport
from transports.options import parse_seconds

from .params import PROCESS_CONFIRM_TIMEOUT, PROCESS_HEARTBEAT, SETTLE_ROUNDS, ChaosParams
from .report import ChaosResult
from .runs import fast_tmp
from .simulation import Simulation, inner_transport
from .world import Templates


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
        params = self.params
        index = self.sites.index(site)
        command = [sys.executable, "-m", "agent.cli", "run", str(self.places.location(site)), "--once",
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
        # Workers for every send phase of two sends or more, where the seed draws them (as in-process).
        command += ["--pack-workers", "2", "--pack-workers-from", "0"] if params.pack_workers and index == 0 else \
            ["--pack-workers", "1"]
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
                self.result.consolidated_crashes += site == self.sites[0]
                return
        stderr = (await process.stderr.read()).decode(errors="replace") if process.stderr else ""
        if process.returncode not in (0, 1) or "internal error" in stderr:
            self.result.divergences.append(f"{site}: agent run failed ({process.returncode}): {stderr[-300:]}")

    async def _stop_faults(self) -> None:
        # Later runs pass faults.active=false; deliver what the wrappers still hold.
        for site in self.sites:
            transport = FaultsTransport(inner_transport(self.params.transport, self.transport_options(site)),
                                        seed=0, hold_dir=self.root / "held" / site, active=False)
            await transport.flush()
            await transport.aclose()

    time_kind = "real"

    def __init__(self, root: Path, params: ChaosParams, templates: Templates, *,
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
            for line in record.read_text().splitlines():
                result.faults[json.loads(line)["kind"]] += 1
        return result



async def run_process_seed(params: ChaosParams) -> ChaosResult:
    base = Path(tempfile.mkdtemp(prefix="fieldsync-chaos-", dir=fast_tmp()))
    try:
        return await ProcessSimulation(base / f"seed-{params.seed}", params, Templates(base / "templates")).run()
    finally:
        shutil.rmtree(base, ignore_errors=True)
