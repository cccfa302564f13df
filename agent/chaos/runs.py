"""Running seeds: one seed in a folder of its own, many seeds with shared
site templates, and shrinking a failing seed to a smaller failing case.

Rules of this file:
* Each seed runs in a fresh folder, removed after it; the folders go under
  the ``TMPDIR`` the user set, else ``/dev/shm`` (memory: many small
  synchronous writes), else the system's temporary folder.
* Shrinking only ever keeps a candidate that still fails: fewer steps,
  then no crashes, then no follow chain, then no schema changes, then no
  subscription changes, then fewer fault kinds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable

from .params import ChaosParams
from .report import ChaosResult
from .simulation import Simulation
from .world import Templates

async def run_seed(params: ChaosParams, *, workdir: Path | None = None,
                   templates: Templates | None = None) -> ChaosResult:
    own = workdir is None
    base = Path(tempfile.mkdtemp(prefix="fieldsync-chaos-", dir=fast_tmp())) if own else workdir
    try:
        templates = templates or Templates(base / "templates")
        return await Simulation(base / f"seed-{params.seed}", params, templates).run()
    finally:
        if own:
            shutil.rmtree(base, ignore_errors=True)


async def run_seeds(seeds: Iterable[int], *, keep_going: bool = True, progress=None,
                    **overrides: object) -> list[ChaosResult]:
    """Run many seeds; each in a fresh folder, site templates shared.
    ``progress(result)`` is called after each seed."""
    base = Path(tempfile.mkdtemp(prefix="fieldsync-chaos-", dir=fast_tmp()))
    templates = Templates(base / "templates")
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
    then no follow chain, then no schema changes, then no subscription
    changes, then no packing workers, then fewer fault kinds."""
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
    if best.chain and fails(dataclasses.replace(best, chain=False)):
        best = dataclasses.replace(best, chain=False)
    if best.schema and fails(dataclasses.replace(best, schema=False)):
        best = dataclasses.replace(best, schema=False)
    if best.resubscribe and fails(dataclasses.replace(best, resubscribe=False)):
        best = dataclasses.replace(best, resubscribe=False)
    if best.pack_workers and fails(dataclasses.replace(best, pack_workers=False)):
        best = dataclasses.replace(best, pack_workers=False)
    for kind in ("partition", "delay", "reorder", "duplicate", "corrupt", "drop"):
        if getattr(best.rates, kind):
            candidate = dataclasses.replace(best, rates=dataclasses.replace(best.rates, **{kind: 0.0}))
            if fails(candidate):
                best = candidate
    return best



def fast_tmp() -> str | None:
    """Where the seeds' folders go: the ``TMPDIR`` the user set, else
    ``/dev/shm`` (memory: many small synchronous writes), else the system's
    temporary folder."""
    if os.environ.get("TMPDIR"):
        return None
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and shm.stat().st_mode & 0o002 else None


