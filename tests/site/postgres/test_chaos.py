"""The fault-injection suite with a PostgreSQL consolidated (``agent chaos
--consolidated URI``): seeds with the drawn timers, faults, crashes and
re-extractions against a real PostgreSQL 15, every seed clean; and proof
that its checks see a PostgreSQL row that differs from a remote's (the
follow chain's too), an arrival out of order there, and the damage a
safety rule turned off does."""

from __future__ import annotations

import json
import os

import psycopg
import pytest

from agent.chaos import ChaosParams, ChaosResult, Simulation, Templates
from agent.cli import main
from tests.pgserver import write_pgpass
from transports.faults import FaultRates

pytestmark = pytest.mark.timeout(600)

SEEDS = int(os.environ.get("FIELDSYNC_CHAOS_PG_SEEDS", "20"))


def _clean(summary: dict) -> None:
    assert summary["failing_seeds"] == [], summary["failing_seeds"][:3]
    assert (summary["divergences"], summary["double_applies"], summary["losses"], summary["out_of_order"],
            summary["stale_applies"], summary["stuck"]) == (0, 0, 0, 0, 0, 0), summary


@pytest.fixture
def own_database(postgres, tmp_path, monkeypatch) -> str:
    """The URI of a database of the suite's own, owned by a plain role (no
    superuser) whose password is in the pgpass file PGPASSFILE names."""
    role, password = postgres.create_role(password="chaos-pw"), "chaos-pw"
    database = postgres.create_database(owner=role)
    monkeypatch.setenv("PGPASSFILE", str(write_pgpass(tmp_path / "pgpass",
                                                      [("127.0.0.1", postgres.port, database, role, password)])))
    return f"postgresql://{role}@127.0.0.1:{postgres.port}/{database}"


@pytest.mark.slow
def test_seeds_with_a_postgresql_consolidated_are_clean(own_database, capsys):
    """The seeds as `agent chaos` draws them (timers included: a 24 h
    heartbeat in most, probes alone repair), the consolidated in PostgreSQL
    under a role that owns the database and is no superuser."""
    uri = own_database
    assert main(["chaos", "--consolidated", uri, "--seeds", str(SEEDS), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["seeds"] == SEEDS
    _clean(summary)
    assert summary["faults_total"] > 0 and summary["resend_requests"] > 0, summary
    # Application transactions were open across the consolidated's runs.
    assert summary["stragglers"] > 0, summary
    assert summary["timers"]["heartbeat"].get("24h", 0) > 0, summary["timers"]
    rest = summary["rounds_to_rest"]
    assert rest["stuck"] == 0 and 1 <= rest["max"] <= rest["bound"], rest
    # Most seeds publish the follow chain at PostgreSQL too, and move clients and orders.
    chain = summary["chain"]
    assert chain["seeds"] >= SEEDS // 3 and chain["moves"] > 0 and chain["handovers"] > 0, chain
    # Half of them add columns at PostgreSQL while the faults last (docs/postgres.md, "Schema changes").
    schema = summary["schema"]
    assert schema["seeds"] >= SEEDS // 4 and set(schema["kinds"]) <= {
        "add customer column", "add product column", "rename customer column", "drop customer column",
        "create table", "create index", "drop index", "rename table", "remove table"}, schema
    assert {"add customer column", "rename customer column", "create index"} <= set(schema["kinds"]), schema
    # Half of them change remotes' subscriptions at PostgreSQL (docs/postgres.md, "Changing a remote's
    # subscriptions"), rows moving through the streams.
    moved = summary["resubscribe"]
    assert moved["seeds"] >= SEEDS // 4 and moved["changes"] > 0 and moved["rows"] > 0, moved


def test_seed_98_whose_chain_of_messages_writes_a_row_back_twice_is_clean(postgres, capsys):
    """Seed 98 applies two messages of f2 in one transaction at the
    consolidated, the first a conflict on a product whose result goes back
    to f2, the second a newer change of f2's to it: the row must go back
    again as the second leaves it (docs/postgres.md, "Apply").  It diverged
    ("f2: products differ from hq") while the second message did not count
    the first's row written back in the same transaction."""
    uri = postgres.uri(postgres.create_database())
    assert main(["chaos", "--consolidated", uri, "--seed", "98", "--no-resubscribe", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["seeds"] == 1 and summary["faults_total"] > 0
    _clean(summary)


def test_seed_221_whose_remote_changed_a_column_hq_renamed_meanwhile_is_clean(postgres, capsys):
    """Seed 221: f1 writes customer.x1 twice while hq renames x1 to x3; hq
    applies the first write (mapped to x3) against its own unconfirmed
    change and writes the row back to f1, which applies the rename first.
    f1's second write is pending there, logged under x1: the pending rule
    must know x1 as x3 and keep it.  It diverged ("f1: customers differ
    from hq's subset") while the pending rule compared the old name."""
    uri = postgres.uri(postgres.create_database())
    assert main(["chaos", "--consolidated", uri, "--seed", "221", "--schema-changes", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["schema"]["kinds"].get("rename customer column") == 1
    _clean(summary)


def test_crashes_of_the_consolidated_and_reextractions_from_it(postgres, capsys):
    """Crash points in the PostgreSQL consolidated's agent, and remotes
    extracted again from it while their mail is in flight."""
    uri = postgres.uri(postgres.create_database())
    assert main(["chaos", "--consolidated", uri, "--seeds", "4", "--start", "100", "--crash-rate", "0.4",
                 "--reextract-rate", "0.3", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    _clean(summary)
    assert summary["consolidated_crashes"] > 0 and summary["reextractions"] > 0, summary


@pytest.mark.slow
async def test_real_agent_processes_killed_at_random_with_a_postgresql_consolidated(postgres):
    """`agent run URI --once` processes for the consolidated (its agent's
    folder recorded in the database) and `agent run FILE --once` for the
    remotes, over the faults-wrapped folder transport, each killed with
    SIGKILL at random moments while the faults last
    (agent/chaos/processes.py): every seed clean, the consolidated's
    process among those killed."""
    from agent.chaos import run_process_seed

    uri = postgres.uri(postgres.create_database())
    failures, faults, kills, consolidated_kills = [], 0, 0, 0
    for seed in range(1000, 1005):
        result = await run_process_seed(ChaosParams.random(seed, steps=3, consolidated=uri))
        faults += sum(result.faults.values())
        kills += result.crashes
        consolidated_kills += result.consolidated_crashes
        if not result.ok:
            failures.append(f"{result.params.command()}: {result.summary()}")
    assert not failures, failures
    assert faults > 0 and kills > 0 and consolidated_kills > 0, (faults, kills, consolidated_kills)


async def test_the_checks_compare_postgresql_rows_with_the_remotes(postgres, tmp_path):
    """A seed at rest, then one PostgreSQL value changed behind the agents'
    back (a balance off by a quarter, a row's bytes) and one arrival
    journalled twice: each is reported."""
    uri = postgres.uri(postgres.create_database())
    params = ChaosParams.random(5, rates=FaultRates(), consolidated=uri)
    simulation = Simulation(tmp_path / "seed", params, Templates(tmp_path / "templates"))
    result = await simulation.run()
    assert result.ok, result.summary()
    with psycopg.connect(uri, autocommit=True) as conn:
        (region,) = conn.execute("SELECT region FROM customer ORDER BY id LIMIT 1").fetchone()
        conn.execute("UPDATE customer SET balance = balance + 0.25 WHERE id = (SELECT min(id) FROM customer)")
        conn.execute("UPDATE product SET title = title || 'x' WHERE sku = 'tea'")
        (first,) = conn.execute("SELECT entry FROM chaos_arrival WHERE entry LIKE 'f1-%' ORDER BY n LIMIT 1"
                                ).fetchone()
        conn.execute("INSERT INTO chaos_arrival (entry) VALUES (%s)", (first,))
    simulation.result = ChaosResult(params)
    simulation.check()
    found = simulation.result
    assert f"{region}: customers differ from hq's subset" in found.divergences
    assert all(f"f{n}: products differ from hq" in found.divergences for n in range(1, params.remotes + 1))
    assert found.out_of_order and found.out_of_order[0].startswith(f"I2: hq applied {first} after f1-")
    assert not found.ok


async def test_the_chain_check_follows_the_postgresql_rows_foreign_keys(postgres, tmp_path):
    """A seed with the follow chain at rest, then, behind the agents' back,
    one of f1's clients given to no remote at PostgreSQL and one order there
    changed: f1 then holds a client, its orders and lines that no longer
    route to it, and an order that differs; both are reported."""
    uri = postgres.uri(postgres.create_database())
    params = ChaosParams.random(5, rates=FaultRates(), consolidated=uri, chain=True)
    simulation = Simulation(tmp_path / "seed", params, Templates(tmp_path / "templates"))
    result = await simulation.run()
    assert result.ok, result.summary()
    with psycopg.connect(uri, autocommit=True) as conn:
        (client,) = conn.execute("SELECT min(id) FROM client WHERE rep = 'f1' AND"
                                 " EXISTS (SELECT 1 FROM orders WHERE client_id = client.id)").fetchone()
        conn.execute("UPDATE client SET rep = 'hq' WHERE id = %s", (client,))
        (order, owner) = conn.execute("SELECT o.id, o.client_id FROM orders o JOIN client c ON c.id = o.client_id"
                                      " WHERE c.rep = 'f1' ORDER BY o.id LIMIT 1").fetchone()
        conn.execute("UPDATE orders SET note = 'changed at hq' WHERE id = %s", (order,))
    simulation.result = ChaosResult(params)
    simulation.check()
    found = simulation.result.divergences
    assert any(problem.startswith("f1: client differs from hq's rows routed to it (missing [], extra [(" + str(client))
               for problem in found), found
    assert any(problem.startswith("f1: orders differs from hq's rows routed to it (missing [(" + str(order)
                                  + f", {owner}, 'changed at hq')") for problem in found), found
    assert not simulation.result.ok


async def test_without_the_stale_rule_the_suite_finds_a_double_apply_at_postgresql(postgres):
    """Late files of a remote extracted again with its keys kept, applied
    at the PostgreSQL consolidated as the new copy's: its ledger entries go
    in a second time, an apply error the checks report."""
    from agent.chaos import run_seed

    uri = postgres.uri(postgres.create_database())
    late_mail = dict(reextract_rate=0.3, rates=FaultRates(drop=0.05, duplicate=0.3, reorder=0.1, max_hold_ticks=6))
    found = None
    for seed in range(5, 25):
        result = await run_seed(ChaosParams.random(seed, unsafe_without_stale_rule=True, consolidated=uri,
                                                   **late_mail))
        if result.double_applies:
            found = result
            break
    assert found is not None, "the suite should notice that stale-epoch messages apply transactions twice"
    assert any(problem.startswith("hq: ledger entry ") and " applied again: " in problem
               for problem in found.double_applies), found.double_applies
    assert f"--consolidated {uri}" in found.params.command()


def test_a_database_holding_other_tables_is_refused(postgres, capsys):
    database = postgres.create_database()
    with postgres.admin(database) as conn:
        conn.execute("CREATE TABLE payroll (id int PRIMARY KEY)")
    assert main(["chaos", "--consolidated", postgres.uri(database), "--seeds", "1"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"agent: agent chaos empties the database {postgres.uri(database)} for every seed, but it holds "
                   "public.payroll, which the suite did not make: give --consolidated a database of its own "
                   "(CREATE DATABASE chaos)")
    with postgres.admin(database) as conn:
        assert conn.execute("SELECT count(*) FROM payroll").fetchone() == (0,)


@pytest.mark.parametrize("value, message", [
    ("postgresql://app:secret@127.0.0.1/chaos", "carries a password"),
    ("chaos.db", "is not a PostgreSQL URI"),
])
def test_a_consolidated_that_is_not_a_uri_without_password_is_a_usage_error(capsys, value, message):
    assert main(["chaos", "--seeds", "1", "--consolidated", value]) == 2
    err = capsys.readouterr().err
    assert message in err and "secret" not in err


def test_the_replay_command_names_the_database_and_a_choice_of_the_chain_of_its_own():
    uri = "postgresql://app@db.example:5432/chaos"
    params = ChaosParams.random(3, consolidated=uri)
    assert params.command() == f"agent chaos --seed 3 --consolidated {uri}"
    # A PostgreSQL consolidated draws the follow chain as a SQLite one does (seed 3 does not, 5 does).
    assert [ChaosParams.random(seed, consolidated=uri).chain for seed in (3, 5)] == [False, True]
    assert ChaosParams.random(3, consolidated=uri, chain=True).command() == f"{params.command()} --follow-chain"
    assert (ChaosParams.random(5, consolidated=uri, chain=False).command()
            == f"agent chaos --seed 5 --consolidated {uri} --no-follow-chain")
