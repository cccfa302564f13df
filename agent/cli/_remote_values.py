"""Values the ``agent remote`` commands and fleet files read alike: a
remote's public key line, the typed value of a subscription, the
refusal of this site's own inbox (used by agent.cli.remote and
agent.cli._fleet, neither of which imports the other's commands)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from transports.options import parse_float, parse_int

from ..errors import AgentError


def public_key_line(name: str, line: str | None, path: Path | None) -> str | None:
    from codec.errors import CodecError
    from codec.keys import PUBLIC_MAGIC, PublicKeys

    if line is not None and path is not None:
        raise click.UsageError("give the key either with --public-key or with --public-key-file, not both")
    source = "--public-key"
    if path is not None:
        source = str(path)
        try:
            text = path.read_text(encoding="utf-8-sig")  # as some editors save it, with a byte-order mark
        except (OSError, UnicodeDecodeError) as error:
            raise AgentError(f"cannot read the public key file {path}: {error}") from None
        lines = [candidate for candidate in text.splitlines() if candidate.strip().startswith(PUBLIC_MAGIC)]
        if not lines:
            raise AgentError(f"{path} holds no public key line (one starting with {PUBLIC_MAGIC!r}); "
                             "make one with `agent key DB > FILE` at the other site")
        line = lines[0]
    if line is None:
        return None
    try:
        public = PublicKeys.from_line(line)
    except CodecError as error:
        raise AgentError(f"{source}: {error}") from None
    if public.site != name:
        raise AgentError(f"{source} is the key of site {public.site!r}, not of {name!r}")
    return public.to_line()


def _affinity(declared: str) -> str:
    """SQLite's type affinity of a declared column type (section 3.1 of its datatype page)."""
    text = declared.upper()
    if "INT" in text:
        return "integer"
    if any(word in text for word in ("CHAR", "CLOB", "TEXT")):
        return "text"
    if not text or "BLOB" in text:
        return "blob"
    if any(word in text for word in ("REAL", "FLOA", "DOUB")):
        return "real"
    return "numeric"


def _as_number(text: str) -> int | float | None:
    """``text`` as the number SQLite would store for it in a numeric
    column (ASCII digits only: SQLite keeps ``'٣'`` as text), or None."""
    for parse in (parse_int, parse_float):
        try:
            return parse(text)
        except ValueError:
            pass
    return None


def subscription_value(site: "Site", publication: str, text: str | None) -> object:  # noqa: F821
    """The typed value a subscription to ``publication`` needs for ``text``.

    SUBSCRIBE BY compares values exactly (7 and '7' differ), so the text
    from the command line takes the type SQLite stores in the SUBSCRIBE BY
    columns: a number for INTEGER/REAL/NUMERIC columns, text otherwise.
    """
    return SubscriptionTypes(site).value(publication, text)


class SubscriptionTypes:
    """:func:`subscription_value` for many subscriptions of one site: each
    publication's SUBSCRIBE BY columns are read once (a fleet file names
    the same few publications ten thousand times)."""

    def __init__(self, site: "Site") -> None:  # noqa: F821
        self._site = site
        self._publications = {item.name: item for item in site.publications()}
        self._affinities: dict[str, tuple[list[tuple[str, str]], set[str]]] = {}

    def _columns(self, publication: str) -> tuple[list[tuple[str, str]], set[str]]:
        known = self._affinities.get(publication)
        if known is not None:
            return known
        item = self._publications.get(publication)
        if item is None:
            names = ", ".join(self._publications) or "none yet"
            raise AgentError(f"{self._site.path} has no publication named {publication!r} (publications: {names}); "
                             "create it with `agent publication create`")
        columns = [(article.table, article.subscribe_by) for article in item.articles if article.subscribe_by]
        affinities = set()
        for table, column in columns:
            declared = self._site.declared_type(table, column)
            if declared is not None:
                affinities.add(_affinity(declared))
        self._affinities[publication] = (columns, affinities)
        return columns, affinities

    def value(self, publication: str, text: str | None) -> object:
        columns, affinities = self._columns(publication)
        if not columns:
            if text is not None:
                raise AgentError(f"publication {publication!r} has no SUBSCRIBE BY column, so it takes no value; "
                                 f"subscribe with --subscribe {publication}")
            return None
        if text is None:
            by = ", ".join(f"{table}.{column}" for table, column in columns)
            raise AgentError(f"publication {publication!r} is subscribed by {by}; give the value: "
                             f"--subscribe {publication}=VALUE")
        if affinities & {"integer", "real", "numeric"}:
            number = _as_number(text)
            if number is None:
                if affinities <= {"integer", "real", "numeric"}:
                    raise AgentError(f"publication {publication!r} is subscribed by a numeric column; "
                                     f"{text!r} is not a number")
                return text
            if isinstance(number, float) and affinities == {"integer"} and number.is_integer():
                return int(number)
            if affinities == {"real"}:
                return float(number)
            return number
        return text


def split_subscription(text: str) -> tuple[str, str | None]:
    name, equals, value = text.partition("=")
    if not name:
        raise click.UsageError(f"bad subscription {text!r}: write PUBLICATION or PUBLICATION=VALUE")
    return name, (value if equals else None)


def refuse_own_inbox(site: "Site", name: str, address: str | None,  # noqa: F821
                      transport: str | None) -> None:
    """A remote sent to at this site's own inbox would have this site read
    its own messages to the remote and leave them there (addressed to
    another site): a slip worth one clear line."""
    identity = site.identity
    if not address or not identity.address or (transport or "folder") != (identity.transport or "folder"):
        return

    def place(text: str) -> str:
        return os.path.abspath(os.path.expanduser(text)) if (transport or "folder") == "folder" else text
    if place(address) == place(identity.address):
        raise AgentError(f"{address} is this site's own inbox ({identity.name} reads it): give {name}'s inbox")
