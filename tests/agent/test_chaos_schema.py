"""The fault-injection suite with schema changes (agent/chaos/schema_changes.py):
seeds whose consolidated changes its published tables while the faults
last come to rest with every remote in the consolidated's shape, and the
check that says so is not vacuous."""

import dataclasses
import os
import sqlite3
from contextlib import closing

import pytest

from agent.chaos import ChaosParams, ChaosResult, Simulation, run_seeds, summarize
from agent.chaos import Templates as _Templates
from agent.chaos.world import columns
from transports.faults import FaultRates

pytestmark = pytest.mark.timeout(900)

SEEDS = int(os.environ.get("FIELDSYNC_CHAOS_SCHEMA_SEEDS", "50"))


def test_half_the_seeds_draw_schema_changes_and_a_replay_names_a_choice_of_its_own():
    drawn = [ChaosParams.random(seed) for seed in range(1000)]
    assert 400 <= sum(params.schema for params in drawn) <= 600
    changing = next(params for params in drawn if params.schema)
    plain = next(params for params in drawn if not params.schema)
    assert "schema-changes" not in changing.command() + plain.command()
    assert (ChaosParams.random(changing.seed, schema=False).command()
            == f"agent chaos --seed {changing.seed} --no-schema-changes")
    assert ChaosParams.random(plain.seed, schema=True).command() == f"agent chaos --seed {plain.seed} --schema-changes"
    # Drawn after everything else: a seed's other draws are what they were.
    assert dataclasses.replace(ChaosParams.random(plain.seed, schema=True), schema=False) == plain
    # A PostgreSQL consolidated draws them as a SQLite one does (the kinds it takes: schema_changes.py).
    assert [ChaosParams.random(seed, consolidated="postgresql:///x").schema for seed in range(50)] == [
        params.schema for params in drawn[:50]]


@pytest.mark.slow
async def test_seeds_with_schema_changes_find_no_divergence_double_apply_or_loss():
    """Every seed makes schema changes (each kind among them) while the
    faults and crashes last, the sites writing the new shapes as soon as
    they have them: every remote ends in the consolidated's shape and
    schema version, holding exactly its rows."""
    results = await run_seeds(range(SEEDS), schema=True)
    summary = summarize(results)
    assert summary["failing_seeds"] == [], summary["failing_seeds"][:5]
    schema = summary["schema"]
    assert schema["seeds"] == SEEDS and schema["changes"] >= SEEDS, schema
    assert set(schema["kinds"]) == {"add customer column", "add product column", "create index", "drop index",
                                    "rename customer column", "drop customer column", "create table",
                                    "rename table", "passthrough", "remove table"}, schema
    assert summary["crashes"] > 0 and summary["faults_total"] > 0
    assert summary["rounds_to_rest"]["stuck"] == 0


async def test_the_schema_check_finds_a_remote_in_another_shape(tmp_path):
    """At rest every remote has hq's schema version, columns and new
    tables' rows: a column a remote lacks, or a row of a new table it
    lacks, is a divergence."""
    params = ChaosParams.random(3, rates=FaultRates(), schema=True, steps=8, crash_rate=0.0)
    simulation = Simulation(tmp_path / "seed", params, _Templates(tmp_path / "templates"))
    result = await simulation.run()
    assert result.ok, result.summary()
    assert result.schema_changes > 0
    path = tmp_path / "seed" / "f1.db"
    with closing(sqlite3.connect(path)) as conn, conn:
        conn.execute("ALTER TABLE product ADD COLUMN by_hand TEXT")
    simulation.result = ChaosResult(params)
    simulation.check()
    assert any(problem.startswith("f1: product has columns") and "by_hand" in problem
               for problem in simulation.result.divergences), simulation.result.divergences
    assert "by_hand" in columns(path, "product")
    assert not simulation.result.ok


async def test_the_schema_check_finds_a_remote_whose_new_tables_are_named_otherwise(tmp_path):
    """At rest every remote holds hq's new tables under hq's names (a
    renamed one renamed alike): a table of another name is a divergence."""
    params = ChaosParams.random(3, rates=FaultRates(), schema=True, steps=8, crash_rate=0.0)
    simulation = Simulation(tmp_path / "seed", params, _Templates(tmp_path / "templates"))
    result = await simulation.run()
    assert result.ok, result.summary()
    with closing(sqlite3.connect(tmp_path / "seed" / "f1.db")) as conn, conn:
        conn.execute("CREATE TABLE note_by_hand (id INTEGER PRIMARY KEY, region TEXT, body TEXT)")
    simulation.result = ChaosResult(params)
    simulation.check()
    assert any(problem.startswith("f1: holds the new tables") and "note_by_hand" in problem
               for problem in simulation.result.divergences), simulation.result.divergences
