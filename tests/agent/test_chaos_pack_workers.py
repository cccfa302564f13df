"""The fault-injection suite with the consolidated packing on workers
(agent.pack_workers, drawn in a seed in four): its sends go through the
workers at every send phase of two sends or more, while files are lost,
corrupted, duplicated and reordered and agents crash, and every seed still
comes to rest with nothing diverged, applied twice, lost or out of order."""

import dataclasses
import os

import pytest

from agent import pack_workers
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
    real = pack_workers.pack_in_workers

    def counted(*args, **options):  # type: ignore[no-untyped-def]
        batches.append(len(args[2]))
        return real(*args, **options)

    monkeypatch.setattr(pack_workers, "pack_in_workers", counted)
    results = await run_seeds(range(SEEDS), pack_workers=True)
    summary = summarize(results)
    assert summary["failing_seeds"] == [], summary["failing_seeds"][:5]
    assert summary["pack_workers"]["seeds"] == SEEDS
    # The workers did pack: many send phases, each of two sends or more.
    several = sum(1 for result in results if result.params.remotes > 1)
    assert several > 0 and len(batches) >= several and min(batches) >= 2, (several, batches)
    assert summary["crashes"] > 0 and summary["faults_total"] > 0
    assert summary["rounds_to_rest"]["stuck"] == 0
