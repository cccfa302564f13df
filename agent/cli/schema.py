"""``agent schema apply``: change the schema of the consolidated and of the
remotes that hold its tables, through their streams (docs/site-database.md,
"Schema changes")."""

from __future__ import annotations

from pathlib import Path

import click

from ..errors import AgentError, UsageError
from ._common import DATABASE, console, open_site


@click.group()
def schema() -> None:
    """Schema changes that travel to the remotes in order with the data."""


@schema.command("apply")
@click.argument("database", type=DATABASE)
@click.argument("sql", nargs=-1)
@click.option("--file", "-f", "files", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="A file of SQL statements (a migration), run after any SQL given as arguments. Repeatable.")
@click.option("--unchecked", is_flag=True,
              help="Also run statements the command does not check (data, views, triggers, pragmas, DROP TABLE "
                   "of an unpublished table) at the consolidated only; see docs/site-database.md for the risks.")
@click.option("--passthrough", is_flag=True,
              help="Send the data statements (INSERT, UPDATE, DELETE) to the --to remotes only, to run there as "
                   "their own writes, in order with the data; nothing runs here.")
@click.option("--to", "remotes", multiple=True, metavar="REMOTE",
              help="With --passthrough: a remote the statements go to. Repeatable.")
@click.option("--lock-timeout", type=click.FloatRange(min=0, max=86_400), default=None, metavar="SECONDS",
              help="PostgreSQL: how long a statement waits for its table's lock before the change gives up, with "
                   "nothing changed (default 10; 0: no limit). The table's other users queue behind a statement "
                   "that waits.")
def apply(database: Path, sql: tuple[str, ...], files: tuple[Path, ...], unchecked: bool, passthrough: bool,
          remotes: tuple[str, ...], lock_timeout: float | None) -> None:
    """Run SQL at the consolidated DATABASE as one schema change, in one
    transaction, and send it to every remote that holds the tables it
    changes, in order with the data.

    It takes ALTER TABLE ... ADD COLUMN, RENAME COLUMN and DROP COLUMN (of a
    column no article needs), ALTER TABLE ... RENAME TO (of a table in no
    follow chain), CREATE TABLE (publish it with `agent publication add` to
    send it with its rows), CREATE INDEX and DROP INDEX. It refuses, with
    nothing changed, dropping or re-keying a published table and dropping
    its key or SUBSCRIBE BY column.

    At a PostgreSQL consolidated (a URI), the published tables take ADD,
    RENAME and DROP COLUMN, RENAME TO (of a table in no follow chain), a
    type that travels as before, and CREATE and DROP INDEX (those SQLite
    can make alike reach the remotes) only so far;
    --passthrough works as on SQLite (docs/postgres.md, "Schema
    changes").

    With --passthrough --to REMOTE, data statements go to the named remotes
    only and run there as their own writes (SQL Remote's PASSTHROUGH ONLY
    FOR): a fix of one field site's data that then travels like its own.

    Example: agent schema apply hq.db "ALTER TABLE customer ADD COLUMN phone TEXT DEFAULT ''"
    """
    scripts = list(sql)
    for path in files:
        try:
            scripts.append(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as error:
            raise AgentError(f"cannot read the SQL file {path}: {error}") from None
    if not any(text.strip() for text in scripts):
        raise UsageError("give the SQL to run, as arguments or with --file")
    if remotes and not passthrough:
        raise UsageError("--to names the remotes of --passthrough; a schema change goes to every remote that holds "
                         "its tables")
    if passthrough and not remotes:
        raise UsageError("--passthrough needs the remotes it goes to: --to REMOTE")
    if passthrough and unchecked:
        raise UsageError("--passthrough sends data statements only: --unchecked does not apply")
    from ..site.locate import is_uri

    if lock_timeout is not None and not (isinstance(database, str) and is_uri(database)):
        raise UsageError("--lock-timeout is for a PostgreSQL consolidated (a URI): a SQLite one waits for its "
                         "write lock as every writer of the site does")

    if passthrough:
        with open_site(database) as site:
            offset = site.passthrough(scripts, remotes)
        console().print(f"Passthrough SQL at offset {offset}: it runs at {', '.join(dict.fromkeys(remotes))} only, "
                        "in order with the data, as their own writes, which travel back like theirs.",
                        soft_wrap=True, markup=False)
        return
    with open_site(database) as site:
        result = site.apply_schema(scripts, unchecked=unchecked, lock_timeout=lock_timeout)
        name = site.identity.name
    out = console()
    if not result.offsets:
        out.print(f"The {result.statements} statement(s) changed no table or index: nothing was logged.",
                  soft_wrap=True, markup=False)
        return
    out.print(f"Schema change at offset {', '.join(map(str, result.offsets))}: "
              + "; ".join(describe(step) for step in result.steps), soft_wrap=True, markup=False)
    if not result.published:
        out.print(f"It changes nothing a remote receives: it stays at {name}.", soft_wrap=True, markup=False)
    elif not result.subscribers:
        out.print(f"No extracted remote holds {', '.join(result.published)} yet.", soft_wrap=True, markup=False)
    else:
        out.print(f"It reaches {len(result.subscribers)} remote(s) that hold {', '.join(result.published)}, in "
                  f"order with the data: {', '.join(result.subscribers)}", soft_wrap=True, markup=False)
    breaking = breaking_steps(result.steps, result.published)
    if breaking:
        out.print("Applications at the field sites must be ready for it before it reaches them: it "
                  + " and ".join(describe(step) for step in breaking)
                  + ", so their SQL that still names the old ones fails there once it is applied.",
                  soft_wrap=True, markup=False)


# Steps that take away a name applications may use (a renamed or dropped column, table or index).
_BREAKING = frozenset({"rename_column", "drop_column", "rename_table", "drop_table", "drop_index"})


def breaking_steps(steps: tuple[tuple, ...], published: tuple[str, ...]) -> list[tuple]:
    """The steps of a change that rename or drop something on a table the
    remotes receive (``published``): what their applications must be ready for."""
    travelling = {table.lower() for table in published}
    return [step for step in steps if step[0] in _BREAKING
            and (step[2] if step[0] == "rename_table" else step[1]).lower() in travelling]


def describe(step: tuple) -> str:
    """One step (agent.site.sqlite.ddl.differences) in a few words."""
    verb, table = step[0], step[1]
    texts = {
        "add_column": lambda: f"added column {table}.{step[2]}",
        "rename_column": lambda: f"renamed column {table}.{step[2]} to {step[3]}",
        "drop_column": lambda: f"dropped column {table}.{step[2]}",
        "create_table": lambda: f"created table {table}",
        "drop_table": lambda: f"dropped table {table}",
        "rename_table": lambda: f"renamed table {table} to {step[2]}",
        "create_index": lambda: f"created index {step[2]} on {table}",
        "drop_index": lambda: f"dropped index {step[2]} of {table}",
        "retype_column": lambda: f"changed the type of {table}.{step[2]} (at the consolidated only: it travels as "
                                 "before)",
    }
    return texts.get(verb, lambda: f"redefined table {table}")()
