"""docs/postgres.md, "A PostgreSQL consolidated from scratch": the section's
blocks run in order with bash, against this suite's PostgreSQL 15, with
two applications writing `customer` while the agents run; then every
field site holds exactly its region's customers.

Rules of this file:
* Blocks are found by their info string: ``sh pg-values`` (each line gets
  this test's value), ``sh pg-admin`` (run as the cluster's superuser),
  ``sh pg-run`` (run once, as the agent's user) and ``sh pg-round`` (one
  round of every agent, run as often as the test needs).
* The database ``sales`` and its owner role ``app`` are the section's
  starting point, made here; the role the section makes is dropped after.
"""

from __future__ import annotations

import os
import random
import re
import shlex
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest

from agent.site import open_site
from tests.pgserver import SUPERUSER

DOC = Path(__file__).resolve().parents[3] / "docs" / "postgres.md"
HEADING = "## A PostgreSQL consolidated from scratch"
REGIONS = ("north", "south", "east", "west")  # west: no field site


def blocks() -> dict[str, str]:
    text = DOC.read_text()
    assert HEADING in text, f"docs/postgres.md has no section {HEADING!r}"
    section = text[text.index(HEADING):]
    section = section[:section.index("\n## ", len(HEADING))]
    found: dict[str, str] = {}
    for info, body in re.findall(r"^```([^\n]*)\n(.*?)^```$", section, re.S | re.M):
        language, _, kind = info.partition(" ")
        assert language == "sh" and kind.startswith("pg-") and kind not in found, f"unexpected block {info!r}"
        found[kind] = body
    assert set(found) == {"pg-values", "pg-admin", "pg-run", "pg-round"}, sorted(found)
    return found


def values(block: str, given: dict[str, str]) -> str:
    lines = []
    for line in block.splitlines():
        name = line.removeprefix("export ").partition("=")[0]
        assert name in given, f"the section sets {name}, which the test does not know"
        lines.append(f"export {name}={shlex.quote(given[name])}")
    assert len(lines) == len(given), "the section's values changed"
    return "\n".join(lines) + "\n"


@pytest.fixture
def sales(postgres):
    """The company's database: sales, its tables owned by app."""
    with postgres.admin() as conn:
        conn.execute("DROP DATABASE IF EXISTS sales")
        conn.execute("DROP ROLE IF EXISTS fieldsync")
        conn.execute("DROP ROLE IF EXISTS app")
        conn.execute("CREATE ROLE app NOLOGIN")
        conn.execute("CREATE DATABASE sales OWNER app")
    with postgres.admin("sales") as conn:
        conn.execute("SET ROLE app")
        conn.execute("CREATE TABLE customer (id integer PRIMARY KEY, name text NOT NULL, region text NOT NULL,"
                     " balance numeric(10, 2))")
        conn.execute("INSERT INTO customer SELECT n, 'customer ' || n, (ARRAY['north','south','east','west'])"
                     "[1 + n % 4], n * 1.5 FROM generate_series(1, 40) AS n")
    yield "sales"
    with postgres.admin() as conn:
        conn.execute("DROP DATABASE IF EXISTS sales WITH (FORCE)")
        conn.execute("DROP ROLE IF EXISTS fieldsync")
        conn.execute("DROP ROLE IF EXISTS app")


def writer(postgres, seed: int, stop: threading.Event, errors: list) -> None:
    """An application writing customer while the agents run."""
    chance = random.Random(seed)
    try:
        with postgres.admin("sales") as conn:
            conn.execute("SET ROLE app")
            while not stop.is_set():
                with conn.transaction():
                    row = chance.randint(1, 60)
                    action = chance.random()
                    if action < 0.5:
                        conn.execute("INSERT INTO customer VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO UPDATE"
                                     " SET name = excluded.name", (row, f"written {seed}", chance.choice(REGIONS), 1))
                    elif action < 0.8:
                        conn.execute("UPDATE customer SET region = %s, balance = balance + 1 WHERE id = %s",
                                     (chance.choice(REGIONS), row))
                    else:
                        conn.execute("DELETE FROM customer WHERE id = %s", (row,))
                stop.wait(0.01)
    except Exception as error:  # noqa: BLE001 - reported by the test
        errors.append(error)


@pytest.mark.slow
def test_the_section_makes_three_field_sites_that_converge_while_applications_write(postgres, sales, tmp_path):
    found = blocks()
    field = tmp_path / "srv"
    password = tmp_path / "db-password"
    password.write_text("walk-through-pw\n")
    password.chmod(0o600)
    home = tmp_path / "home"
    home.mkdir()
    given = {"PGHOST": postgres.host, "PGPORT": str(postgres.port), "FIELD": str(field),
             "PASSWORD_FILE": str(password)}
    script = values(found["pg-values"], given)
    environment = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
    environment.update(HOME=str(home), PATH=f"{Path(sys.executable).parent}:/usr/lib/postgresql/15/bin:"
                                            f"{environment.get('PATH', '')}")

    def run(block: str, **extra: str) -> None:
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script + block], env={**environment, **extra},
                              capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, f"{block}\n{done.stdout}\n{done.stderr}"

    run(found["pg-admin"], PGUSER=SUPERUSER)
    run(found["pg-run"])
    assert (home / ".pgpass").stat().st_mode & 0o077 == 0
    stop, errors = threading.Event(), []
    writers = [threading.Thread(target=writer, args=(postgres, seed, stop, errors)) for seed in (1, 2)]
    for thread in writers:
        thread.start()
    try:
        for _ in range(3):
            run(found["pg-round"])
    finally:
        stop.set()
        for thread in writers:
            thread.join()
    assert errors == []
    for _ in range(3):  # the writes' last changes, their confirmations, and rest
        run(found["pg-round"])
    with postgres.admin("sales") as conn:
        rows = conn.execute("SELECT id, name, region, balance::text FROM customer ORDER BY id").fetchall()
    uri = f"postgresql://fieldsync@{postgres.host}:{postgres.port}/sales"
    for site in ("north", "south", "east"):
        with open_site(field / f"{site}.db") as remote:
            held = remote.connection.execute("SELECT id, name, region, balance FROM customer ORDER BY id").fetchall()
        assert held == [row for row in rows if row[2] == site], site
    os.environ["PGPASSFILE"] = str(home / ".pgpass")  # the agent's user's, which the section wrote
    try:
        with open_site(uri) as hq:
            assert [remote.name for remote in hq.remotes()] == ["east", "north", "south"]
            assert all(remote.confirm_sent == remote.log_sent == hq.log_end() for remote in hq.remotes())
            assert hq.apply_errors() == () and hq.conflicts() == ()
    finally:
        del os.environ["PGPASSFILE"]
    with psycopg.connect(host=postgres.host, port=postgres.port, dbname="sales", user=SUPERUSER) as conn:
        assert conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = 'fieldsync'").fetchone() == (False,)
