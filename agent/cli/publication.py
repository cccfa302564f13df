"""``agent publication``: publish tables (whole, some columns, subscribed by a column).

An article is written ``TABLE[:COL1,COL2,...][@COLUMN | @->PARENT]``:

* ``product``                     every column, every row to every subscriber
* ``customer@region``             every column; a subscriber gets the rows whose
                                  ``region`` equals its subscription value
* ``customer:id,name,region@region``  only those columns (the key is always added)
* ``orders@->customer``           a subscriber gets the orders of the customers it
                                  gets (through orders' foreign key to customer;
                                  ``orders@customer_id->customer`` or
                                  ``line@(order_id,shop)->orders`` names the key)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import click
from rich.table import Table

from ._common import DATABASE, console, open_site

ARTICLE_SYNTAX = ("TABLE, TABLE:COL1,COL2, TABLE@COLUMN, TABLE:COL1,COL2@COLUMN, TABLE@->PARENT, "
                  "TABLE@COLUMN->PARENT or TABLE@(COL1,COL2)->PARENT")
_NAME = r"[^\s:@,()>-][^\s:@,()>]*?"
_ARTICLE = re.compile(rf"(?P<table>{_NAME})(?::(?P<columns>[^\s:@]+))?"
                      rf"(?:@(?:(?P<subscribe_by>{_NAME})|(?P<key>{_NAME}|\([^\s()]+\))?->(?P<parent>{_NAME})))?\Z")


def parse_article(text: str) -> "Article":  # noqa: F821 - imported lazily
    """An :class:`Article` from ``TABLE[:COL1,COL2][@COLUMN]``; ValueError if malformed."""
    from ..site import Article

    match = _ARTICLE.match(text.strip())
    columns = None
    if match is not None and match["columns"] is not None:
        columns = tuple(match["columns"].split(","))
        if not all(columns):
            match = None
    key = None
    if match is not None and match["key"] is not None:
        key = tuple(match["key"].strip("()").split(","))
        if not all(key):
            match = None
    if match is None:
        raise ValueError(f"bad article {text!r}: write {ARTICLE_SYNTAX}")
    return Article(match["table"], columns, match["subscribe_by"], match["parent"], key)


class PublicationName(click.ParamType):
    """A publication's name: 1-128 printable characters (agent.site)."""

    name = "name"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from ..site.errors import InvalidSetting
        from ..site.publication_rules import check_publication_name

        try:
            return check_publication_name(str(value))
        except InvalidSetting as error:
            self.fail(str(error), param, ctx)


class ArticleSpec(click.ParamType):
    name = "article"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> object:
        if not isinstance(value, str):
            return value
        try:
            return parse_article(value)
        except ValueError as error:
            self.fail(str(error), param, ctx)


def article_text(article: "Article") -> str:  # noqa: F821
    text = article.table
    if article.columns is not None:
        text += ":" + ",".join(article.columns)
    if article.subscribe_by is not None:
        text += "@" + article.subscribe_by
    if article.follows is not None:
        key = article.follow_columns or ()
        text += "@" + (key[0] if len(key) == 1 else f"({','.join(key)})" if key else "") + "->" + article.follows
    return text


@click.group()
def publication() -> None:
    """Create, extend, shrink, drop and list publications: the tables a site replicates.

    An article is TABLE[:COL1,COL2,...][@COLUMN | @->PARENT]: a table,
    optionally only some of its columns (the primary key is always
    included), optionally SUBSCRIBE BY a column (a remote subscribed with
    value V gets only the rows whose COLUMN equals V) or following a parent
    article through its foreign key (a remote gets the rows whose parent
    it gets; @COLUMN->PARENT or @(COL1,COL2)->PARENT names the key).
    """


@publication.command("create")
@click.argument("database", type=DATABASE)
@click.argument("name", type=PublicationName())
@click.argument("articles", nargs=-1, required=True, type=ArticleSpec())
def create(database: Path, name: str, articles: tuple) -> None:
    """Create publication NAME of ARTICLES in DATABASE and start capturing
    changes of their tables.

    Example: agent publication create hq.db territory customer@region visit@region
    """
    with open_site(database) as site:
        created = site.create_publication(name, list(articles))
    console().print(f"Created publication {created.name}: "
                    + ", ".join(article_text(article) for article in created.articles), soft_wrap=True)


@publication.command("add")
@click.argument("database", type=DATABASE)
@click.argument("name", type=PublicationName())
@click.argument("articles", nargs=-1, required=True, type=ArticleSpec())
def add(database: Path, name: str, articles: tuple) -> None:
    """Add ARTICLES to the existing publication NAME.

    At the consolidated, remotes subscribed already get each new table
    through their stream: created, with its existing rows of their subset,
    then its changes (no new extraction).
    """
    with open_site(database) as site:
        added = [site.add_article(name, article.table, columns=article.columns, subscribe_by=article.subscribe_by,
                                  follows=article.follows, follow_columns=article.follow_columns)
                 for article in articles]
    console().print(f"Added to {name}: " + ", ".join(article_text(article) for article in added), soft_wrap=True)


@publication.command("remove")
@click.argument("database", type=DATABASE)
@click.argument("tables", nargs=-1, required=True)
@click.option("--publication", "-p", "name", type=PublicationName(), default=None,
              help="Stop publishing them in this publication only (default: in every publication that holds them).")
def remove(database: Path, tables: tuple[str, ...], name: str | None) -> None:
    """Stop publishing TABLES (in every publication that holds them, or
    in the one --publication names).

    A table no publication holds any more is no longer captured.  The
    extracted remotes subscribed to those publications stop capturing them
    too, once their streams bring them the change; remotes keep their
    copies of the tables and the rows in them.
    """
    reached: set[str] = set()
    with open_site(database) as site:
        published = {article.table for item in site.publications() if name in (None, item.name)
                     for article in item.articles}
        unknown = [table for table in dict.fromkeys(tables) if table not in published]
        if unknown:  # all or nothing
            where = database if name is None else f"{name!r} of {database}"
            raise click.ClickException(f"not published in {where}: {', '.join(map(repr, unknown))}; nothing "
                                       "was changed (`agent publication list` shows what is)")
        for table in dict.fromkeys(tables):
            reached.update(site.remove_article(table, name))
    console().print(f"Stopped publishing: {', '.join(dict.fromkeys(tables))}"
                    + ("" if name is None else f" in {name}"), soft_wrap=True, markup=False)
    _reached(sorted(reached))


def _reached(remotes: list[str]) -> None:
    """The line that says which remotes a removal goes to (none: no line)."""
    if remotes:
        console().print(f"It reaches {len(remotes)} extracted remote(s), in order with the data, which stop "
                        f"capturing it there and keep their rows: {', '.join(remotes)}", soft_wrap=True,
                        markup=False)


@publication.command("drop")
@click.argument("database", type=DATABASE)
@click.argument("name", type=PublicationName())
def drop(database: Path, name: str) -> None:
    """Drop publication NAME: its tables are no longer published and its
    subscriptions end.  Its extracted remotes stop capturing the tables
    too, once their streams bring them the change; remotes keep their
    copies of the tables."""
    with open_site(database) as site:
        reached = site.drop_publication(name)
    console().print(f"Dropped publication {name}", soft_wrap=True, markup=False)
    _reached(list(reached))


@publication.command("list")
@click.argument("database", type=DATABASE)
@click.option("--subscribers", "show_subscribers", is_flag=True,
              help="List each publication's subscribers with their values, not only how many.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (format fieldsync.publications/1), "
                                                       "subscribers included.")
def list_(database: Path, show_subscribers: bool, as_json: bool) -> None:
    """List the publications of DATABASE, their articles and how many
    subscribers each has (the subscribers themselves with --subscribers or
    --json)."""
    with open_site(database) as site:
        publications = site.publications()
        subscriptions = site.subscriptions()
    subscribers: dict[str, list[tuple[str, object]]] = {}
    for subscription in subscriptions:
        subscribers.setdefault(subscription.publication, []).append((subscription.remote, subscription.value))
    if as_json:
        document = {"format": "fieldsync.publications/1", "publications": [
            {"name": item.name,
             "articles": [{"table": article.table, "columns": None if article.columns is None else list(article.columns),
                           "subscribe_by": article.subscribe_by, "follows": article.follows,
                           "follow_columns": None if article.follows is None else list(article.follow_columns or ())}
                          for article in item.articles],
             "subscribers": [{"remote": remote, "value": _json_value(value)}
                             for remote, value in subscribers.get(item.name, [])]}
            for item in publications]}
        click.echo(json.dumps(document, ensure_ascii=False))
        return
    out = console()
    if not publications:
        out.print(f"{database} has no publications; create one with `agent publication create`.", soft_wrap=True)
        return
    table = Table(title=f"publications of {database}")
    for column in ("publication", "table", "columns", "subscribe by", "subscribers"):
        table.add_column(column, overflow="fold")
    for item in publications:
        who = _who(subscribers.get(item.name, []), listed=show_subscribers)
        if not item.articles:
            table.add_row(item.name, "-", "-", "-", who)
        for number, article in enumerate(item.articles):
            table.add_row(item.name if number == 0 else "", article.table,
                          "all" if article.columns is None else ", ".join(article.columns),
                          article.subscribe_by or _follow_text(article) or "-", who if number == 0 else "")
    out.print(table)


def _who(subscribers: list[tuple[str, object]], *, listed: bool) -> str:
    """A publication's subscribers as a table cell: how many (a fleet's list
    would fill the screen), or the list itself."""
    if not subscribers:
        return "-"
    if listed:
        return ", ".join(remote if value is None else f"{remote}={value}" for remote, value in subscribers)
    remotes = len({remote for remote, _ in subscribers})
    text = f"{remotes} remote" + ("" if remotes == 1 else "s")
    if len(subscribers) != remotes:
        text += f" ({len(subscribers)} subscriptions)"
    return text


def _json_value(value: object) -> object:
    """A subscription value in JSON: a blob as its hex digits."""
    return {"blob": value.hex()} if isinstance(value, bytes) else value


def _follow_text(article: "Article") -> str | None:  # noqa: F821
    """How a follow article is subscribed: through its parent, by its key."""
    if article.follows is None:
        return None
    return f"{','.join(article.follow_columns or ())} -> {article.follows}"
