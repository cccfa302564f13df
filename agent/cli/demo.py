"""``agent demo``: a consolidated and three field sites replicating through
folder inboxes, with conflicting updates, until everything is confirmed.

Rules of this file:
* Everything it makes lives in one folder, marked as a demo folder by the
  file ``.fieldsync-demo``; a folder without the mark is never touched,
  and a marked one is emptied and rebuilt on every run.
* The agents run in this process, in batch rounds (`agent run --once` for
  each site in turn), so the demo needs no servers and takes seconds.
* It proves its result: every field site must hold exactly the rows of the
  consolidated it subscribes to, and every remote-user row must be at rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import shutil
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from codec.packing import DEFAULT_MAX_SIZE, MAX_MAX_SIZE, MIN_MAX_SIZE

from ..errors import AgentError
from ._common import ByteSize, Whole, console

MARKER = ".fieldsync-demo"
# What the first, codec-only demo left in its folder; such a folder is a demo folder too.
_EARLIER_DEMO = {"outbox", "hq.key", "field1.key"}
CONSOLIDATED = "hq"
FIELD_SITES = ("north", "south", "west")  # each field site covers the region of its name

SCHEMA = """
CREATE TABLE product (
    sku TEXT PRIMARY KEY, name TEXT NOT NULL, unit_price REAL NOT NULL, stock INTEGER NOT NULL);
CREATE TABLE document (
    id INTEGER PRIMARY KEY, title TEXT NOT NULL, body BLOB NOT NULL);
CREATE TABLE customer (
    id INTEGER PRIMARY KEY, region TEXT NOT NULL, name TEXT NOT NULL, city TEXT, phone TEXT,
    credit_limit REAL, internal_rating TEXT);
CREATE TABLE visit (
    id TEXT PRIMARY KEY, customer_id INTEGER NOT NULL, region TEXT NOT NULL, visited_on TEXT NOT NULL,
    technician TEXT, minutes INTEGER, outcome TEXT);
CREATE INDEX visit_customer ON visit (customer_id);
"""

_CITIES = {
    "north": ["Tromsø", "Bodø", "Alta", "Narvik", "Harstad"],
    "south": ["Kristiansand", "Arendal", "Mandal", "Grimstad", "Farsund"],
    "west": ["Bergen", "Stavanger", "Haugesund", "Florø", "Ålesund"],
}
_COMPANIES = ["Fjord", "Nordlys", "Havbruk", "Kyst", "Vidde", "Bre", "Skog", "Elv", "Myr", "Stein"]
_KINDS = ["Fiskeri", "Transport", "Bygg", "Energi", "Handel", "Verksted", "Maskin", "Service"]
_TECHNICIANS = ["Ingrid", "Lars", "Sigrid", "Ola", "Kari", "Nils", "Astrid", "Erik"]
_OUTCOMES = ["serviced", "quoted", "repaired", "inspected", "no access"]


@dataclass(frozen=True, slots=True)
class Story:
    """The rows the demo's narrative follows, to report on them at the end."""

    moved_by_hq: int          # customer HQ moves from north to south, with its visits
    handed_over: int          # customer the west field site hands over to north
    both_edited: int          # customer edited at HQ and at north before they sync
    contested_sku: str        # product whose stock north and south both correct


# -- the folder ----------------------------------------------------------------------------


def prepare_folder(folder: Path) -> None:
    """Make ``folder`` an empty demo folder, refusing anything that is not one."""
    if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
        raise AgentError(f"demo: {folder} exists and is not a folder; choose another folder")
    if folder.is_dir():
        entries = {entry.name for entry in folder.iterdir()}
        if entries and MARKER not in entries and not entries <= _EARLIER_DEMO:
            raise AgentError(f"demo: {folder} is not empty and is not a demo folder (it has no {MARKER} file); "
                             "choose another folder or empty it")
        for entry in folder.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    else:
        folder.mkdir(parents=True)
    (folder / MARKER).write_text("fieldsync demo folder: `agent demo` empties and rebuilds it on every run\n")


# -- building the sites ------------------------------------------------------------------


def _customer(rng: random.Random, number: int, region: str) -> tuple:
    name = f"{rng.choice(_COMPANIES)} {rng.choice(_KINDS)} AS"
    return (number, region, name, rng.choice(_CITIES[region]), f"+47 {rng.randint(40_000_000, 99_999_999)}",
            float(rng.choice([5_000, 10_000, 25_000, 50_000])), rng.choice(["A", "B", "C"]))


def _visit(rng: random.Random, key: str, customer: int, region: str, day: int) -> tuple:
    return (key, customer, region, f"2024-{1 + day // 28:02d}-{1 + day % 28:02d}", rng.choice(_TECHNICIANS),
            rng.choice([30, 45, 60, 90, 120]), rng.choice(_OUTCOMES))


def build_consolidated(folder: Path, rng: random.Random) -> dict[str, list[int]]:
    """The consolidated with its data, publications and three remotes;
    returns the customer ids of each region."""
    from ..admin import init_site
    from ..site import Article

    # Absolute: a relative folder address is taken from wherever the agent
    # runs, and the user looks around from anywhere afterwards.
    inbox = folder.absolute() / "inbox"
    for name in (CONSOLIDATED, *FIELD_SITES):
        (inbox / name).mkdir(parents=True)
    database = folder / f"{CONSOLIDATED}.db"
    site = init_site(database, name=CONSOLIDATED, role="consolidated", address=str(inbox / CONSOLIDATED),
                     transport="folder")
    customers: dict[str, list[int]] = {region: [] for region in FIELD_SITES}
    try:
        with contextlib.closing(sqlite3.connect(database)) as conn, conn:
            conn.executescript(SCHEMA)
            conn.executemany("INSERT INTO product VALUES (?, ?, ?, ?)", [
                (f"P-{number:03d}", f"{rng.choice(['Pump', 'Valve', 'Filter', 'Sensor', 'Hose'])} "
                 f"{rng.choice(['S', 'M', 'L', 'XL'])}-{number}", round(rng.uniform(40, 900), 2), rng.randint(0, 200))
                for number in range(1, 31)])
            number = 100
            visit_number = 0
            for region in FIELD_SITES:
                for _ in range(40):
                    number += 1
                    customers[region].append(number)
                    conn.execute("INSERT INTO customer VALUES (?, ?, ?, ?, ?, ?, ?)", _customer(rng, number, region))
                    for _ in range(rng.randint(2, 6)):
                        visit_number += 1
                        conn.execute("INSERT INTO visit VALUES (?, ?, ?, ?, ?, ?, ?)",
                                     _visit(rng, f"hq-{visit_number:05d}", number, region, rng.randint(0, 150)))
        site.create_publication("catalogue", ["product", "document"])
        # internal_rating stays at HQ: the remotes get the other columns only.
        site.create_publication("territory", [
            Article("customer", ("id", "region", "name", "city", "phone", "credit_limit"), "region"),
            Article("visit", None, "region")])
        for name in FIELD_SITES:
            site.add_remote(name, address=str(inbox / name), transport="folder")
            site.subscribe(name, "catalogue")
            site.subscribe(name, "territory", name)
    finally:
        site.close()
    return customers


def extract_field_sites(folder: Path) -> dict[str, dict[str, int]]:
    from ..admin import extract_site
    from ..site import open_site

    copied = {}
    with open_site(folder / f"{CONSOLIDATED}.db") as site:
        for name in FIELD_SITES:
            copied[name] = dict(extract_site(site, name, folder / f"{name}.db").rows)
    return copied


def work_offline(folder: Path, rng: random.Random, customers: dict[str, list[int]]) -> tuple[Story, list[str]]:
    """Changes at every site before any of them syncs, some of them conflicting."""
    story = Story(moved_by_hq=customers["north"][3], handed_over=customers["west"][5],
                  both_edited=customers["north"][0], contested_sku="P-007")
    said = []

    def connect(name: str) -> contextlib.closing[sqlite3.Connection]:
        return contextlib.closing(sqlite3.connect(folder / f"{name}.db"))

    with connect(CONSOLIDATED) as hq, hq:
        for sku in ("P-002", "P-011", "P-019", "P-024"):
            hq.execute("UPDATE product SET unit_price = round(unit_price * 1.08, 2) WHERE sku = ?", (sku,))
        hq.execute("INSERT INTO product VALUES ('P-031', 'Heat exchanger HX-31', 1450.0, 12)")
        # A scanned price list: larger than one message, so it travels in parts.
        hq.execute("INSERT INTO document VALUES (1, 'Price list 2024 (scan)', ?)", (rng.randbytes(70_000),))
        next_id = 500
        for region in FIELD_SITES:
            for _ in range(2):
                next_id += 1
                hq.execute("INSERT INTO customer VALUES (?, ?, ?, ?, ?, ?, ?)", _customer(rng, next_id, region))
        hq.execute("UPDATE customer SET internal_rating = 'A' WHERE region = 'south'")  # not published
        hq.execute("UPDATE customer SET phone = '+47 22 00 11 22' WHERE id = ?", (story.both_edited,))
        # Reassign a customer with its visits to another region, in one transaction.
        hq.execute("UPDATE customer SET region = 'south', city = 'Arendal' WHERE id = ?", (story.moved_by_hq,))
        hq.execute("UPDATE visit SET region = 'south' WHERE customer_id = ?", (story.moved_by_hq,))
    said.append(f"hq: price changes, a new product, a 70 kB price list, 6 new customers, customer "
                f"{story.moved_by_hq} moved north -> south with its visits, phone of customer {story.both_edited}")

    day = 200
    for name in FIELD_SITES:
        with connect(name) as field, field:
            mine = [row[0] for row in field.execute("SELECT id FROM customer ORDER BY id")]
            for number in range(1, 13):
                day += 1
                field.execute("INSERT INTO visit VALUES (?, ?, ?, ?, ?, ?, ?)",
                              _visit(rng, f"{name}-{number:04d}", rng.choice(mine), name, day % 300))
            for customer in rng.sample(mine[6:], 3):
                field.execute("UPDATE customer SET credit_limit = credit_limit + 5000 WHERE id = ?", (customer,))
            if name == "north":
                field.execute("UPDATE customer SET phone = '+47 77 60 00 00', credit_limit = 75000 WHERE id = ?",
                              (story.both_edited,))
                field.execute("UPDATE product SET stock = stock - 4 WHERE sku = ?", (story.contested_sku,))
            elif name == "south":
                field.execute("UPDATE product SET stock = stock - 9 WHERE sku = ?", (story.contested_sku,))
                field.execute("DELETE FROM visit WHERE id = (SELECT min(id) FROM visit WHERE id LIKE 'hq-%')")
            else:
                field.execute("INSERT INTO customer (id, region, name, city, phone, credit_limit)"
                              " VALUES (9001, 'west', 'Sjøbris Kafé', 'Florø', '+47 57 74 00 00', 5000)")
                field.execute("UPDATE customer SET region = 'north', city = 'Bodø' WHERE id = ?",
                              (story.handed_over,))
        said.append(f"{name}: 12 visits, 3 credit limits" + {
            "north": f", phone of customer {story.both_edited} (also changed at hq), stock of {story.contested_sku}",
            "south": f", stock of {story.contested_sku} (also changed at north), a cancelled visit",
            "west": f", a new customer, customer {story.handed_over} handed over to north"}[name])
    return story, said


# -- running the agents ------------------------------------------------------------------


def _sites() -> tuple[str, ...]:
    return (CONSOLIDATED, *FIELD_SITES)


async def _round(folder: Path, max_message_size: int) -> dict[str, Any]:
    from ..runner import Agent, RunOptions

    options = RunOptions(max_message_size=max_message_size)
    reports = {}
    for name in _sites():
        async with Agent(folder / f"{name}.db", options, batch=True) as agent:
            reports[name] = await agent.run_once()
    return reports


def remote_rows(folder: Path) -> dict[str, tuple[int, dict[str, Any]]]:
    """Each site's log end and remote-user rows."""
    from ..site import open_site

    found = {}
    for name in _sites():
        with open_site(folder / f"{name}.db") as site:
            found[name] = (site.log_end(), {row.name: row for row in site.remotes()})
    return found


def at_rest(rows: dict[str, tuple[int, dict[str, Any]]]) -> list[str]:
    """Why the sites are not at rest yet (empty: every stream is confirmed)."""
    unsettled = []
    for name, (log_end, peers) in rows.items():
        for peer, row in peers.items():
            # Rest (docs/protocol.md, I5): all that was sent is confirmed and the
            # log was read for the peer to its end (the tail held nothing for it).
            if not (row.confirm_sent == row.log_sent and row.read_through == log_end):
                unsettled.append(f"{name}->{peer} confirmed {row.confirm_sent} of {row.log_sent} sent, "
                                 f"read to {row.read_through} of {log_end}")
            back = rows[peer][1][name]
            if back.log_received != row.log_sent or back.confirm_received != back.log_received:
                unsettled.append(f"{peer} has applied {back.log_received} of {name}'s {row.log_sent}")
    return unsettled


def run_rounds(out: Console, folder: Path, max_message_size: int, limit: int) -> tuple[int, int, list[str]]:
    """Batch rounds until every stream is at rest; returns (rounds, files sent, what is still unsettled)."""
    sent = 0
    unsettled: list[str] = ["not started"]
    for number in range(1, limit + 1):
        reports = asyncio.run(_round(folder, max_message_size))
        sent += sum(report.sent for report in reports.values())
        problems = [f"{name}: {text}" for name, report in reports.items()
                    for text in (*report.transport_errors, *report.local_errors, *report.stopped_streams)]
        for problem in problems:
            out.print(f"  [red]problem[/] {escape(problem)}", soft_wrap=True, markup=True)
        unsettled = at_rest(remote_rows(folder))
        parts = [f"{name} got {r.received} applied {r.applied_messages} sent {r.sent}"
                 + (f" quarantined {r.quarantined}" if r.quarantined else "") for name, r in reports.items()]
        state = "[green]all confirmed[/]" if not unsettled else f"{len(unsettled)} stream(s) in flight"
        out.print(escape(f"  round {number}: " + " | ".join(parts) + "  -> ") + state, soft_wrap=True, markup=True)
        if not unsettled:
            return number, sent, []
    return limit, sent, unsettled


# -- checking ----------------------------------------------------------------------------


def _sort_key(row: tuple) -> tuple:
    return tuple((type(value).__name__, value if value is not None else 0) for value in row)


def subscribed_rows(hq: sqlite3.Connection, publications: Any, subscriptions: Any) -> dict[str, tuple]:
    """table -> (columns, rows) the consolidated holds for one remote."""
    values: dict[str, set] = {}
    for item in subscriptions:
        bucket = values.setdefault(item.publication, set())
        if item.value is not None:
            bucket.add(item.value)
    wanted = {}
    for publication in publications:
        if publication.name not in values:
            continue
        for article in publication.articles:
            all_columns = [row[1] for row in hq.execute(f'PRAGMA table_info("{article.table}")')]
            columns = list(article.columns or all_columns)
            selected = columns + ([article.subscribe_by] if article.subscribe_by
                                  and article.subscribe_by not in columns else [])
            rows = hq.execute(f"SELECT {', '.join(selected)} FROM {article.table}").fetchall()
            if article.subscribe_by:
                position = selected.index(article.subscribe_by)
                rows = [row for row in rows if row[position] in values[publication.name]]
            wanted[article.table] = (columns, sorted((row[:len(columns)] for row in rows), key=_sort_key))
    return wanted


def compare_sites(folder: Path) -> dict[str, list[str]]:
    """For each field site, how its rows differ from what it subscribes to at the consolidated."""
    from ..site import open_site

    differences: dict[str, list[str]] = {}
    with open_site(folder / f"{CONSOLIDATED}.db") as site:
        publications = site.publications()
        subscriptions = {name: site.subscriptions(name) for name in FIELD_SITES}
    with contextlib.closing(sqlite3.connect(folder / f"{CONSOLIDATED}.db")) as hq:
        for name in FIELD_SITES:
            found = []
            with contextlib.closing(sqlite3.connect(folder / f"{name}.db")) as field:
                for table, (columns, expected) in subscribed_rows(hq, publications, subscriptions[name]).items():
                    actual = sorted(field.execute(f"SELECT {', '.join(columns)} FROM {table}").fetchall(),
                                    key=_sort_key)
                    if actual != expected:
                        missing = [row for row in expected if row not in actual]
                        extra = [row for row in actual if row not in expected]
                        found.append(f"{table}: {len(expected)} rows expected, {len(actual)} held; "
                                     f"missing {[row[0] for row in missing[:5]]}, "
                                     f"not expected {[row[0] for row in extra[:5]]}")
            differences[name] = found
    return differences


# -- output ------------------------------------------------------------------------------


def status_table(rows: dict[str, tuple[int, dict[str, Any]]]) -> Table:
    table = Table(title="remote-user tables at rest (agent status DB shows every column)", title_justify="left")
    for column in ("site", "peer", "log end", "log_sent", "confirm_sent", "resend_count", "log_received",
                   "confirm_received", "rereceive_count", "sent", "received"):
        table.add_column(column, justify="left" if column in ("site", "peer") else "right")
    for name, (log_end, peers) in rows.items():
        for peer, row in peers.items():
            table.add_row(name, peer, str(log_end), str(row.log_sent), str(row.confirm_sent),
                          str(row.resend_count), str(row.log_received), str(row.confirm_received),
                          str(row.rereceive_count), str(row.send_count), str(row.receive_count))
    return table


def conflicts_table(folder: Path) -> Table | None:
    from ..site import open_site

    with open_site(folder / f"{CONSOLIDATED}.db") as site:
        conflicts = site.conflicts()
    if not conflicts:
        return None
    table = Table(title="conflicts resolved at hq (the consolidated decides; the result goes to every "
                        "subscriber, the origin included)", title_justify="left")
    for column in ("table", "key", "from", "hq had", "incoming", "resolution"):
        table.add_column(column, overflow="fold")
    for item in conflicts:
        changed = sorted((item.incoming_after or {}).keys())
        table.add_row(item.table, ", ".join(map(str, item.key)), item.peer,
                      ", ".join(f"{column}={item.local_row.get(column)!r}" for column in changed),
                      ", ".join(f"{column}={(item.incoming_after or {}).get(column)!r}" for column in changed),
                      item.resolution)
    return table


def _agent_command() -> str:
    """How to call ``agent`` from here: plain ``agent`` when that is on the
    PATH and is this installation's, else the path of this installation's
    script (``.venv/bin/agent`` after ``scripts/demo``)."""
    script = Path(sys.executable).parent / "agent"
    if not script.exists():
        return "agent"
    on_path = shutil.which("agent")
    if on_path is not None and Path(on_path).resolve() == script.resolve():
        return "agent"
    try:
        return str(script.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(script.absolute())


def _where(folder: Path, table: str, key: object) -> list[str]:
    holders = []
    for name in FIELD_SITES:
        with contextlib.closing(sqlite3.connect(folder / f"{name}.db")) as field:
            if field.execute(f"SELECT 1 FROM {table} WHERE id = ?", (key,)).fetchone():
                holders.append(name)
    return holders


@click.command()
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path), default=Path("demo"))
@click.option("-l", "--max-message-size", type=ByteSize(MIN_MAX_SIZE, MAX_MAX_SIZE), default=DEFAULT_MAX_SIZE,
              show_default=True, metavar="BYTES", help="Largest message file, in bytes.")
@click.option("--seed", type=Whole(min=0), default=7, show_default=True, help="Seed of the generated data.")
@click.option("--rounds", type=Whole(min=1), default=12, show_default=True,
              help="Give up if the sites are not at rest after this many rounds.")
def demo(folder: Path, max_message_size: int, seed: int, rounds: int) -> int:
    """Replicate a consolidated and three field sites in FOLDER (default ./demo).

    Builds hq.db with customers, visits and a product catalogue; publishes
    the catalogue to everyone and customers and visits by region; extracts
    north.db, south.db and west.db; changes data at every site while they
    are "offline" (including a row edited at two sites and rows moving
    between regions); then runs the four agents in batch rounds through
    folder inboxes until every message is applied and confirmed, and checks
    that every field site holds exactly its subscribed rows of hq.

    FOLDER is emptied and rebuilt on every run; a folder that was not made
    by the demo is refused.
    """
    out = console()
    started = time.monotonic()
    rng = random.Random(seed)
    prepare_folder(folder)
    out.print("[bold]fieldsync demo[/] " + escape(f"in {folder}: consolidated {CONSOLIDATED}, field sites "
              f"{', '.join(FIELD_SITES)}; inboxes are the folders in {folder / 'inbox'}"), soft_wrap=True, markup=True)
    customers = build_consolidated(folder, rng)
    out.print("1. hq.db: 30 products, 120 customers in 3 regions with their visits; publications catalogue "
              "(product, document: to everyone) and territory (customer without internal_rating, visit: "
              "SUBSCRIBE BY region)", soft_wrap=True)
    copied = extract_field_sites(folder)
    for name, tables in copied.items():
        out.print(f"2. extracted {name}.db: " + ", ".join(f"{count} {table}" for table, count in tables.items()),
                  soft_wrap=True)
    story, said = work_offline(folder, rng, customers)
    out.print("3. offline work before anyone syncs:")
    for line in said:
        out.print(f"   {line}", soft_wrap=True)
    out.print(f"4. running the agents in rounds (hq, then {', '.join(FIELD_SITES)}; -l {max_message_size}):")
    used, sent, unsettled = run_rounds(out, folder, max_message_size, rounds)
    rows = remote_rows(folder)
    out.print(status_table(rows))
    conflicts = conflicts_table(folder)
    if conflicts is not None:
        out.print(conflicts)
    out.print(f"customer {story.moved_by_hq} (moved by hq to south) is held by: "
              f"{', '.join(_where(folder, 'customer', story.moved_by_hq)) or 'nobody'}; "
              f"customer {story.handed_over} (handed over by west to north) is held by: "
              f"{', '.join(_where(folder, 'customer', story.handed_over)) or 'nobody'}", soft_wrap=True)
    differences = compare_sites(folder)
    failed = bool(unsettled) or any(differences.values())
    for name, found in differences.items():
        if found:
            for line in found:
                out.print(f"[red]DIFFERS[/] {escape(f'{name}.{line}')}", soft_wrap=True, markup=True)
        else:
            out.print(f"{name}: holds exactly its subscribed rows of hq", soft_wrap=True)
    for line in unsettled:
        out.print(f"[red]NOT AT REST[/] {escape(line)}", soft_wrap=True, markup=True)
    elapsed = time.monotonic() - started
    if failed:
        out.print(f"[bold red]FAILED[/]: the sites did not converge after {used} rounds ({elapsed:.1f}s)", markup=True)
        click.echo(f"agent: the demo's sites did not converge after {used} rounds: see what differs above", err=True)
        return 1
    out.print(f"[bold green]OK[/]: {len(FIELD_SITES)} field sites converged with hq in {used} rounds, "
              f"{sent} data messages, {elapsed:.1f}s; every stream confirmed (confirm_sent == log_sent, the log read to its end)",
              soft_wrap=True, markup=True)
    agent = _agent_command()
    out.print(f"Look around: {agent} status {folder / 'hq.db'} · {agent} inbox {folder / 'north.db'} · "
              f"sqlite3 {folder / 'north.db'} 'select * from customer'", soft_wrap=True)
    return 0
