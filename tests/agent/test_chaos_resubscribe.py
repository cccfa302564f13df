"""The fault-injection suite with subscription changes (agent/chaos/resubscribe.py):
seeds whose consolidated changes remotes' subscriptions while the faults
last come to rest with every remote holding exactly the rows of the
values it subscribes to, and the check that says so is not vacuous."""

import dataclasses
import os

import pytest

from agent.chaos import ChaosParams, run_seeds, summarize
from agent.site.capture import KIND_INSERT
from agent.site.sqlite import resubscribe

pytestmark = pytest.mark.timeout(900)

SEEDS = int(os.environ.get("FIELDSYNC_CHAOS_RESUBSCRIBE_SEEDS", "40"))


def test_half_the_seeds_draw_subscription_changes_drawn_after_everything_else():
    drawn = [ChaosParams.random(seed) for seed in range(1000)]
    assert 400 <= sum(params.resubscribe for params in drawn) <= 600
    changing = next(params for params in drawn if params.resubscribe)
    plain = next(params for params in drawn if not params.resubscribe)
    assert "resubscribe" not in changing.command() + plain.command()
    assert (ChaosParams.random(plain.seed, resubscribe=True).command()
            == f"agent chaos --seed {plain.seed} --resubscribe")
    assert (ChaosParams.random(changing.seed, resubscribe=False).command()
            == f"agent chaos --seed {changing.seed} --no-resubscribe")
    # A seed's other draws are what they were before subscription changes existed.
    assert dataclasses.replace(ChaosParams.random(plain.seed, resubscribe=True), resubscribe=False) == plain


async def test_seeds_with_subscription_changes_find_no_divergence_double_apply_or_loss():
    """Every seed changes remotes' subscriptions while the faults and
    crashes last (with the follow chain and schema changes as drawn):
    rows that enter or leave a remote's subset go through its stream only,
    and every remote ends with exactly the rows of its values."""
    results = await run_seeds(range(SEEDS), resubscribe=True)
    summary = summarize(results)
    assert summary["failing_seeds"] == [], summary["failing_seeds"][:5]
    moved = summary["resubscribe"]
    assert moved["seeds"] == SEEDS and moved["changes"] >= SEEDS and moved["rows"] >= SEEDS, moved
    assert summary["chain"]["seeds"] > 0 and summary["schema"]["seeds"] > 0
    assert summary["crashes"] > 0 and summary["faults_total"] > 0
    assert summary["rounds_to_rest"]["stuck"] == 0


async def test_a_remote_that_never_gets_the_rows_it_gained_is_a_divergence(monkeypatch):
    """The checks hold each remote to the values it subscribes to at the
    end: with the INSERTs of a subscription change never written, the
    seeds that gained rows diverge."""
    write = resubscribe._write

    def without_inserts(conn, shape, kind, rows):  # type: ignore[no-untyped-def]
        return 0 if kind == KIND_INSERT else write(conn, shape, kind, rows)

    monkeypatch.setattr(resubscribe, "_write", without_inserts)
    results = await run_seeds(range(10), resubscribe=True)
    assert any(any("differs from hq's" in problem or "differ from hq's subset" in problem
                   for problem in result.divergences) for result in results)
