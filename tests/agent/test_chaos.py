"""The fault-injection suite in CI: many seeds of random workloads, faults
and crashes; and proof that the suite notices when a safety rule is off."""

import os
import sqlite3

import pytest

from agent.chaos import ChaosParams, ChaosResult, Simulation, _Templates, run_seed, run_seeds, summarize
from transports.faults import FaultRates

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
    if SEEDS >= 100:
        # Sites changed the same customers at once (an UPDATE of a row the
        # other deleted fails by design), and still converged.
        assert summary["apply_errors"] > 0
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


async def test_without_the_stale_rule_the_suite_finds_a_stale_epoch_apply():
    """I3 is watched at every apply: with the stale-epoch rule off, old-epoch
    copies that arrive late get applied, and the suite says so."""
    found = None
    for seed in range(200):
        result = await run_seed(ChaosParams.random(seed, unsafe_without_stale_rule=True))
        if result.stale_applies:
            found = result
            break
    assert found is not None, "the suite should notice that stale-epoch messages are applied"
    assert not found.ok and found.stale_applies[0].startswith("I3: ")
    assert "--unsafe-without-stale-rule" in found.params.command()


# Late mail of a remote extracted again with its keys kept: copies of files
# the consolidated applied before the extraction (duplicates and reordered
# files the faults wrapper releases late) arrive after it.
LATE_MAIL = dict(reextract_rate=0.3, rates=FaultRates(drop=0.05, duplicate=0.3, reorder=0.1, max_hold_ticks=6))


async def test_without_the_stale_rule_the_suite_finds_a_double_apply():
    """Extraction starts a new epoch both ways, so rule 1 finds every file of
    the copy it replaced stale.  Without the rule, such a file is applied as
    the new copy's, whose log counts offsets afresh: transactions the
    consolidated applied before the extraction are applied a second time."""
    found = None
    for seed in range(200):
        result = await run_seed(ChaosParams.random(seed, unsafe_without_stale_rule=True, **LATE_MAIL))
        if result.double_applies:
            found = result
            break
    assert found is not None, "the suite should notice that stale-epoch messages apply transactions twice"
    assert found.reextractions > 0
    assert any(problem.startswith("hq: ledger entry ") and " applied again: INSERT of an existing key" in problem
               for problem in found.double_applies), found.double_applies
    command = found.params.command()
    assert "--unsafe-without-stale-rule" in command and "--reextract-rate 0.3" in command
    assert "--fault-rate duplicate=0.3" in command


async def test_within_one_copy_the_duplicate_rule_alone_keeps_applies_single():
    """Defence in depth: with the stale rule off but no remote extracted
    again, late old-epoch copies are applied (I3 says so), yet rule 2 skips
    every transaction at or below log_received, so each is applied once and
    in order; with the duplicate rule off as well, the suite finds damage."""
    stale_only = []
    for seed in range(300):  # at least 40 seeds, and on until one applies a stale-epoch message
        stale_only.append(await run_seed(ChaosParams.random(seed, unsafe_without_stale_rule=True,
                                                            reextract_rate=0.0, crash_rate=0.2)))
        if len(stale_only) >= 40 and any(result.stale_applies for result in stale_only):
            break
    summary = summarize(stale_only)
    assert summary["stale_applies"] > 0
    assert (summary["double_applies"], summary["divergences"], summary["losses"], summary["out_of_order"],
            summary["stuck"]) == (0, 0, 0, 0, 0)
    found = None
    for seed in range(200):
        result = await run_seed(ChaosParams.random(seed, unsafe_without_stale_rule=True,
                                                   unsafe_without_duplicate_rule=True, crash_rate=0.3,
                                                   reextract_rate=0.0))
        if result.double_applies or result.divergences:
            found = result
            break
    assert found is not None, "with both rules off the suite should find a double apply"


async def test_the_order_check_finds_entries_applied_against_their_commit_order(tmp_path):
    """I2: the arrival journal each site keeps is read in order; an origin's
    entry arriving after a later one of the same origin is reported."""
    params = ChaosParams.random(5, rates=FaultRates())
    simulation = Simulation(tmp_path / "seed", params, _Templates(tmp_path / "templates"))
    result = await simulation.run()
    assert result.ok, result.summary()
    conn = sqlite3.connect(tmp_path / "seed" / "f1.db")
    with conn:
        arrivals = conn.execute("SELECT entry FROM chaos_arrival WHERE entry LIKE 'hq-%' ORDER BY n").fetchall()
        assert len(arrivals) >= 2
        # The first of hq's entries arrives once more, after the others.
        conn.execute("INSERT INTO chaos_arrival (entry) VALUES (?)", arrivals[0])
    conn.close()
    simulation.result = ChaosResult(params)
    simulation.check()
    assert simulation.result.out_of_order == [
        f"I2: f1 applied {arrivals[0][0]} after {arrivals[-1][0]}, against hq's commit order"]
    assert not simulation.result.ok


async def test_a_failing_seed_prints_a_command_that_replays_it():
    params = ChaosParams.random(17, unsafe_without_stale_rule=True)
    assert params.command().startswith("agent chaos --seed 17") and "--unsafe-without-stale-rule" in params.command()
    again = await run_seed(ChaosParams.random(3))
    same = await run_seed(ChaosParams.random(3))
    assert (again.faults, again.crashes, again.ok) == (same.faults, same.crashes, same.ok)


async def test_the_seeds_folders_go_under_the_tmpdir_the_user_set(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    seen = []
    results = await run_seeds([5], progress=lambda result: seen.append(sorted(p.name for p in tmp_path.iterdir())))
    assert results[0].ok, results[0].summary()
    assert len(seen[0]) == 1 and seen[0][0].startswith("fieldsync-chaos-")
    assert list(tmp_path.iterdir()) == []  # and deleted after the run
