"""Schema changes while the faults last (a seed that draws them): the
consolidated changes its published tables with ``agent schema apply``
(``Site.apply_schema``) between the sites' runs, and every site writes
the new shape as soon as it has it.

Rules of this file:
* Every draw comes from a stream of its own (``schema:<seed>``), so a
  seed's other draws stay what they were without schema changes.
* The changes are those docs/site-database.md ("Schema changes") says a
  change takes, on the tables every remote receives: a column added to
  ``customer`` (which its article publishes whole) or to ``product`` (with
  a default), one of those columns renamed or dropped, an index made or
  dropped, a new table made and then published (``publication add``:
  its rows reach the remotes without a new extraction), such a table
  renamed (``RENAME TO``, now and then with a column added in the same
  change: rows logged under the old name still reach every site); and passthrough
  SQL to one remote, which runs there as its own writes and travels back.
  Now and then, beside a change, a new table's article is removed
  (``publication remove``, drawn from a stream of its own): the remotes
  stop capturing it once they apply the removal, and keep their copies,
  which every site goes on writing.
  Names are never given twice: a retired name always means the old column
  or table.
* A site writes what its own schema has (read before each write): the
  extra customer columns of its own subset, the new tables' rows of its
  own region.  A remote still behind writes the old shape (and a renamed
  table's old name), and its rows reach the consolidated after the
  change, mapped there by the change history (renamed, dropped, given the
  default).
* Every written value is new (from the run's counter), as in workload.py.
* With a PostgreSQL consolidated (``--consolidated URI``), the changes are
  those it takes (docs/postgres.md, "Schema changes"): a column added to
  ``customer`` or to ``product``, one of customer's renamed or dropped, an
  index made (on customer's name or on one of its added columns, which
  then goes with the column) or dropped, a new table made and published
  and renamed (no passthrough).
"""

from __future__ import annotations

import random

from ..site import open_site
from .resubscribe import region_rows, subscribed
from .sites import Sites

# The chance that the consolidated makes a schema change at a step.
CHANGE_RATE = 0.4
# The chance that a site's transaction of a step writes the new shape.
WRITE_RATE = 0.6
# The chance that a remote's run of the fault phase dies inside the apply of
# a schema change or passthrough, if it applies one.
CRASH_RATE = 0.1
# The publication of chaos's world (world.py) and its partitioned table.
PUBLICATION = "field"
# The chance that a new table's article is removed beside a change.
REMOVE_RATE = 0.15


class SchemaChanges:
    """The schema changes of one seed and the writes of the new shapes."""

    def __init__(self, places: Sites, sites: list[str], seed: int, new_key) -> None:  # type: ignore[no-untyped-def]
        self.places = places
        self.sites = sites
        self.rng = random.Random(f"schema:{seed}")
        self._new_key = new_key
        self.number = 0
        self.extra: list[str] = []  # customer's columns added and not dropped, as hq names them now
        self.indexes: list[tuple[str, str]] = []  # (index, the customer column it is on), as hq names them now
        self.index_rng = random.Random(f"schema-index:{seed}")  # _pg_index's own draws
        self.index_number = 0
        self.notes: list[str] = []  # the new tables published, as hq names them now
        self.remove_rng = random.Random(f"schema-remove:{seed}")  # _remove's own draws

    def crash_now(self) -> bool:
        """Whether a remote's next run dies if it applies a schema change
        (the crash point ``apply.in-change``, inside the apply)."""
        return self.rng.random() < CRASH_RATE

    def _name(self, stem: str) -> str:
        self.number += 1
        return f"{stem}{self.number}"

    def change(self) -> tuple[str, ...] | None:
        """Maybe one schema change at the consolidated; the kinds of what
        it made (one, or with an index made or dropped beside it)."""
        rng = self.rng
        if rng.random() >= CHANGE_RATE:
            return None
        sqlite = self.places.consolidated is None
        kinds = ["add customer column", "add product column"]
        kinds += ["create index", "create table", "passthrough"] if sqlite else ["create table"]
        if self.extra:
            kinds += ["rename customer column", "drop customer column"]
        if self.indexes and sqlite:
            kinds.append("drop index")
        if self.notes and sqlite:  # twice: a table is there to rename late in a seed, if at all
            kinds += ["rename table", "rename table"]
        kind = rng.choice(kinds)
        publish = to = None
        if kind == "add customer column":
            name = self._name("x")
            statements = [f"ALTER TABLE customer ADD COLUMN {name} TEXT"]
            self.extra.append(name)
        elif kind == "add product column":
            statements = [f"ALTER TABLE product ADD COLUMN {self._name('p')} INTEGER NOT NULL DEFAULT 7"]
        elif kind == "create index":
            name = self._name("customer_name_")
            statements = [f"CREATE INDEX {name} ON customer (name)"]
            self.indexes.append((name, "name"))
        elif kind == "drop index":
            name = self.indexes.pop(rng.randrange(len(self.indexes)))[0]
            statements = [f"DROP INDEX {name}"]
        elif kind == "rename customer column":
            index = rng.randrange(len(self.extra))
            old, new = self.extra[index], self._name("x")
            statements = [f"ALTER TABLE customer RENAME COLUMN {old} TO {new}"]
            self.extra[index] = new
            self.indexes = [(index_name, new if column == old else column) for index_name, column in self.indexes]
        elif kind == "rename table":
            index = rng.randrange(len(self.notes))
            old, new = self.notes[index], self._name("note")
            statements = [f"ALTER TABLE {old} RENAME TO {new}"]
            if rng.random() < 0.5:  # a column of the table's new name in the same change
                statements.append(f"ALTER TABLE {new} ADD COLUMN {self._name('n')} TEXT")
            self.notes[index] = new
        elif kind == "drop customer column":
            name = self.extra.pop(rng.randrange(len(self.extra)))
            statements = [f"ALTER TABLE customer DROP COLUMN {name}"]
            self.indexes = [(index_name, column) for index_name, column in self.indexes if column != name]
        elif kind == "passthrough":  # a data fix one remote makes as its own writes
            to = rng.choice(self.sites[1:])
            fix = self._name("fix")
            statements = [f"UPDATE product SET title = '{to} {fix}' WHERE sku = 'tea'",
                          f"UPDATE customer SET name = '{fix}' WHERE id = (SELECT min(id) FROM customer"
                          f" WHERE region = '{to}')"]
        else:
            publish = self._name("note")
            statements = [f"CREATE TABLE {publish} (id INTEGER PRIMARY KEY, region TEXT NOT NULL, body TEXT)"]
        also = () if sqlite else self._pg_index()
        statements += [statement for statement, _kind in also]
        with open_site(self.places.location("hq")) as hq:
            if to is not None:
                hq.passthrough(statements, [to])
            else:
                hq.apply_schema(statements)
            if publish is not None:
                hq.add_article(PUBLICATION, publish, subscribe_by="region")
                self.notes.append(publish)
            removed = self._remove(hq)
        return (kind, *(index_kind for _statement, index_kind in also), *removed)

    def _remove(self, hq) -> tuple[str, ...]:  # type: ignore[no-untyped-def]
        """Now and then a new table's article removed at ``hq`` (drawn
        apart, as _pg_index's draws are): the table stays at every site,
        unpublished."""
        rng = self.remove_rng
        if not self.notes or rng.random() >= REMOVE_RATE:
            return ()
        hq.remove_article(self.notes.pop(rng.randrange(len(self.notes))))
        return ("remove table",)

    def _pg_index(self) -> list[tuple[str, str]]:
        """With a PostgreSQL consolidated, now and then an index of customer
        made or dropped, or a new table renamed, in the same change, drawn
        apart so that the seed's other draws stay as they were: an index on
        customer's name or on a column added, which takes the index with it
        when it is dropped (the remotes then drop the index before the
        column)."""
        rng = self.index_rng
        roll = rng.random()
        if roll < 0.3:
            self.index_number += 1
            name, column = f"customer_i{self.index_number}", rng.choice(["name", *self.extra])
            self.indexes.append((name, column))
            return [(f"CREATE INDEX {name} ON customer ({column})", "create index")]
        if roll < 0.4 and self.indexes:
            return [(f"DROP INDEX {self.indexes.pop(rng.randrange(len(self.indexes)))[0]}", "drop index")]
        if roll < 0.5 and self.notes:  # a published table renamed (its rows' old name mapped at hq)
            index = rng.randrange(len(self.notes))
            self.index_number += 1
            old, new = self.notes[index], f"note_r{self.index_number}"  # still a new table by its name (pgworld)
            self.notes[index] = new
            return [(f"ALTER TABLE {old} RENAME TO {new}", "rename table")]
        return []

    def writes(self, site: str) -> list[tuple[str, tuple]]:
        """Writes of the new shapes at ``site``, as its own schema has them
        now: a customer's extra column, a new table's rows."""
        rng = self.rng
        if rng.random() >= WRITE_RATE:
            return []
        places = self.places
        statements: list[tuple[str, tuple]] = []
        extra = [name for name in places.columns(site, "customer") if name.startswith("x")]
        if extra:
            ids = sorted(row_id for (row_id,) in places.rows(site, "customer", ("id",), None if site == "hq"
                                                             else "region = ?", () if site == "hq" else (site,)))
            if ids:
                column = rng.choice(extra)
                statements.append((f"UPDATE customer SET {column} = ? WHERE id = ?",
                                   (f"{site}:{column}:{self._new_key()}", rng.choice(ids))))
        for table in places.tables(site, "note"):
            region = rng.choice(self.sites[1:]) if site == "hq" else site
            statements.append((f"INSERT INTO {table} (id, region, body) VALUES (?, ?, ?)",
                               (self._new_key(), region, f"{site} wrote")))
            if rng.random() < 0.5:  # and a row of its own (at hq: any) changes
                statements.append((f"UPDATE {table} SET body = ? WHERE id = (SELECT min(id) FROM {table}"
                                   f"{'' if site == 'hq' else ' WHERE region = ?'})",
                                   (f"{site} changed {self._new_key()}",) + (() if site == "hq" else (site,))))
        return statements


def differences(places: Sites, sites: list[str]) -> list[str]:
    """What a remote holds otherwise than the consolidated once at rest: the
    schema version, the new tables' names (renamed alike), the columns of
    the tables it receives, the new tables' rows of the regions it
    subscribes to (its own, and those a subscription change gave it:
    resubscribe.py).  A new table hq removed is each site's own from then
    on, as far as its stream had brought it, under the name it had then
    (docs/site-database.md, "Removing an article"): no remote may still
    publish it."""
    found = []
    with open_site(places.location("hq")) as site:
        version = site.schema_version()
        published = _published(site)
        renames = site.table_renames()
    removed = {table.lower() for table in places.tables("hq", "note")} - published
    leftovers = removed | {old for old, now in renames.items() if now.lower() in removed}
    notes = [table for table in places.tables("hq", "note") if table.lower() not in removed]
    values = subscribed(places, sites[1:])
    for remote in sites[1:]:
        held = places.tables(remote, "note")
        with open_site(places.location(remote)) as site:
            if site.schema_version() != version:
                found.append(f"{remote}: schema version {site.schema_version()}, hq's is {version}")
            kept = [table for table in held if table.lower() in leftovers and table.lower() in _published(site)]
            if kept:
                found.append(f"{remote}: still publishes {', '.join(kept)}, which hq removed")
        if [table for table in held if table.lower() not in leftovers] != notes:
            found.append(f"{remote}: holds the new tables {held}, hq {notes}")
        for table in ("customer", "product", *notes):
            held, made = places.columns(remote, table), places.columns("hq", table)
            if held != made:
                found.append(f"{remote}: {table} has columns {held}, hq's {made}")
        for table in notes:
            if places.rows(remote, table) != region_rows(places, table, values[remote]):
                found.append(f"{remote}: {table} differs from hq's subset")
    return found


def _published(site) -> set[str]:  # type: ignore[no-untyped-def]
    """The tables (lowered) an article of ``site`` publishes."""
    return {article.table.lower() for publication in site.publications() for article in publication.articles}
