"""The fault-injection suite in CI: many seeds of random workloads, faults
and crashes; and proof that the suite notices when a safety rule is off."""

import asyncio
import os

import pytest

from agent.chaos import ChaosParams, run_seed, run_seeds, summarize

pytestmark = pytest.mark.timeout(900)

SEEDS = int(os.environ.get("FIELDSYNC_CHAOS_SEEDS", "500"))


async def test_many_seeds_find_no_divergence_double_apply_or_loss():
    results = await run_seeds(range(SEEDS))
    summary = summarize(results)
    assert summary["seeds"] == SEEDS
    # The suite really injected faults of every kind, and crashes.
    assert all(summary["faults"].get(kind, 0) > 0
               for kind in ("drop", "corrupt", "duplicate", "reorder", "delay", "partition")), summary["faults"]
    assert summary["crashes"] > 0 and summary["resend_requests"] > 0
    assert summary["failing_seeds"] == [], summary["failing_seeds"][:5]


async def test_without_the_duplicate_rule_the_suite_finds_a_double_apply():
    found = None
    for seed in range(200):
        params = ChaosParams.random(seed, unsafe_without_duplicate_rule=True, crash_rate=0.3)
        result = await run_seed(params)
        if result.double_applies or result.divergences:
            found = result
            break
    assert found is not None, "the suite should notice that duplicates are applied again"
    assert "--unsafe-without-duplicate-rule" in found.params.command()


async def test_the_stale_rule_and_the_duplicate_rule_are_each_enough_alone():
    """Defence in depth: with only the stale-epoch rule off, the duplicate
    rule (skip what was applied) still keeps every seed right; with both
    off, the suite finds the damage."""
    stale_only = await run_seeds(range(40), unsafe_without_stale_rule=True, reextract_rate=0.3, crash_rate=0.2)
    assert summarize(stale_only)["failing_seeds"] == []
    found = None
    for seed in range(200):
        result = await run_seed(ChaosParams.random(seed, unsafe_without_stale_rule=True,
                                                   unsafe_without_duplicate_rule=True, crash_rate=0.3,
                                                   reextract_rate=0.3))
        if result.double_applies or result.divergences:
            found = result
            break
    assert found is not None, "with both rules off the suite should find a double apply"


async def test_a_failing_seed_prints_a_command_that_replays_it():
    params = ChaosParams.random(17, unsafe_without_stale_rule=True)
    assert params.command().startswith("agent chaos --seed 17") and "--unsafe-without-stale-rule" in params.command()
    again = await run_seed(ChaosParams.random(3))
    same = await run_seed(ChaosParams.random(3))
    assert (again.faults, again.crashes, again.ok) == (same.faults, same.crashes, same.ok)
