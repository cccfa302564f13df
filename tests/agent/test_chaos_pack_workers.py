"""The fault-injection suite with the consolidated packing on workers
(agent.pack_workers, drawn in a seed in four): its sends go through the
workers at every send phase of two sends or more, while files are lost,
corrupted, duplicated and reordered and agents crash, and every seed still
comes to rest with nothing diverged, applied twice, lost or out of order."""

import dataclasses
import os

import pytest

from agent import pack_processes
from agent.chaos import ChaosParams, run_seeds, summarize

pytestmark = pytest.mark.timeout(900)

SEEDS = int(os.environ.get("FIELDSYNC_CHAOS_PACK_WORKERS_SEEDS", "16"))


def test_a_seed_in_four_draws_packing_workers_drawn_after_everything_else():
    drawn = [ChaosParams.random(seed) for seed in range(1000)]
    assert 200 <= sum(params.pack_workers for params in drawn) <= 300
    working = next(params for params in drawn if params.pack_workers)
    plain = next(params for params in drawn if not params.pack_workers)
    assert "pack-workers" not in working.command() + plain.command()
    assert (ChaosParams.random(plain.seed, pack_workers=True).command()
            == f"agent chaos --seed {plain.seed} --pack-workers")
    assert (ChaosParams.random(working.seed, pack_workers=False).command()
            == f"agent chaos --seed {working.seed} --no-pack-workers")
    # A seed's other draws are what they were before the workers were drawn.
    assert dataclasses.replace(ChaosParams.random(plain.seed, pack_workers=True), pack_workers=False) == plain


async def test_seeds_packing_on_workers_find_no_divergence_double_apply_or_loss(monkeypatch):
    batches: list[int] = []
    real = pack_processes.pack_in_workers

    def counted(*args, **options):  # type: ignore[no-untyped-def]
        batches.append(len(args[2]))
        return real(*args, **options)

    monkeypatch.setattr(pack_processes, "pack_in_workers", counted)
    results = await run_seeds(range(SEEDS), pack_workers=True)
    summary = summarize(results)
    assert summary["failing_seeds"] == [], summary["failing_seeds"][:5]
    assert summary["pack_workers"]["seeds"] == SEEDS
    # The workers did pack: many send phases, each of two sends or more.
    several = sum(1 for result in results if result.params.remotes > 1)
    assert several > 0 and len(batches) >= several and min(batches) >= 2, (several, batches)
    assert summary["crashes"] > 0 and summary["faults_total"] > 0
    assert summary["rounds_to_rest"]["stuck"] == 0


def _orphaned_servers() -> set[int]:
    """Workers' servers (and their workers) whose agent is gone: their
    parent is init."""
    return {pid for pid, parent in _servers() if parent == 1}


def _servers() -> list[tuple[int, int]]:
    """(pid, parent pid) of every workers' server and worker running."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read()
            with open(f"/proc/{entry}/stat") as handle:
                parent = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if b"multiprocessing.forkserver" in command:
            found.append((int(entry), parent))
    return found


@pytest.mark.slow
async def test_agent_processes_killed_while_workers_pack_leave_nothing_behind():
    """`agent run --once --pack-workers 2 --pack-workers-from 0` processes
    for the consolidated, SIGKILLed at random moments as the process suite
    does: every seed comes to rest clean, and no workers' server or worker
    outlives its agent for long."""
    import asyncio

    from agent.chaos import run_process_seed

    before = _orphaned_servers()
    seen: set[int] = set()

    async def watch() -> None:  # the workers' servers the agents start, seen while they run
        while True:
            seen.update(pid for pid, _ in _servers())
            await asyncio.sleep(0.05)

    watching = asyncio.create_task(watch())
    seeds = [seed for seed in range(1000, 1100) if ChaosParams.random(seed).remotes > 1][:4]
    failures, kills = [], 0
    try:
        for seed in seeds:
            result = await run_process_seed(ChaosParams.random(seed, steps=3, pack_workers=True))
            kills += result.crashes
            if not result.ok:
                failures.append(f"{result.params.command()}: {result.summary()}")
    finally:
        watching.cancel()
    assert not failures, failures
    assert kills > 0
    assert len(seen - before) >= 4, "the consolidated's agents packed on workers"
    for _ in range(50):  # a worker busy reading the log stops at its next message
        left = _orphaned_servers() - before
        if not left:
            break
        await asyncio.sleep(0.2)
    assert not left, f"left running after their agent was killed: {sorted(left)}"
