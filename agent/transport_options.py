"""Which transport gets which ``--transport-option`` (docs/cli.md, "Transport
options").

A site receives on its own transport and sends to each peer on the peer's,
so one agent may hold several (``email`` for its inbox, ``sftp`` for some
remotes).  Options are routed by name:

* ``NAME=VALUE`` goes to the site's own transport, and so to every
  transport of the same plugin (the agent builds one per transport spec);
* ``PLUGIN.NAME=VALUE`` goes to every transport of that plugin
  (``sftp.key_file=…``), ``WRAPPER.NAME=VALUE`` to every use of that
  wrapper (``faults.seed=7``).

Options stored with the site (agent/site/settings.py) are read the same
way and come first: the site's own, then a peer's own for the transport
to that peer, then what the run gives with ``-O``, each over the one before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from transports import Transport
from transports.registry import available_transports, create_transport, parse_transport_spec

from .errors import UsageError


@dataclass(frozen=True, slots=True)
class TransportOptions:
    """The ``-O`` values of a run: ``plain`` for the site's own transport,
    ``named`` per transport or wrapper name."""

    plain: Mapping[str, Any] = field(default_factory=dict)
    named: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_items(cls, items: Iterable[tuple[str | None, str, Any]]) -> "TransportOptions":
        """From ``(prefix or None, name, value)`` as the command line parses them."""
        plain: dict[str, Any] = {}
        named: dict[str, dict[str, Any]] = {}
        for prefix, name, value in items:
            (plain if prefix is None else named.setdefault(prefix, {}))[name] = value
        return cls(plain, named)

    @classmethod
    def from_stored(cls, stored: Mapping[str, str], *, plugin: str | None = None) -> "TransportOptions":
        """From stored ``NAME`` / ``PREFIX.NAME`` options; with ``plugin``, plain
        names go to that plugin (a peer's options go to the transport to it)."""
        items = []
        for key, value in stored.items():
            prefix, _, name = key.rpartition(".")
            items.append((prefix or plugin, name, value))
        return cls.from_items(items)

    def over(self, base: "TransportOptions") -> "TransportOptions":
        """These options, with ``base``'s where these have none."""
        named = {prefix: {**base.named.get(prefix, {}), **self.named.get(prefix, {})}
                 for prefix in (*base.named, *self.named)}
        return TransportOptions({**base.plain, **self.plain}, named)

    def check_names(self) -> None:
        """Every prefix must name a known transport or wrapper: a typo is one
        line, not an option silently never used."""
        known = available_transports()
        for prefix in sorted(self.named):
            if prefix not in known:
                first = next(iter(self.named[prefix]))
                raise UsageError(f"--transport-option {prefix}.{first}: there is no transport or wrapper named "
                                 f"{prefix!r}; known: {', '.join(known)}")

    def for_spec(self, spec: str, *, own: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
        """(inner options, options per wrapper) for the transport ``spec``, at
        a site whose own transport is ``own``."""
        parsed = parse_transport_spec(spec)
        inner = dict(self.plain) if parsed.inner == parse_transport_spec(own).inner else {}
        inner.update(self.named.get(parsed.inner, {}))
        wrappers = {wrapper: dict(self.named[wrapper]) for wrapper in parsed.wrappers if wrapper in self.named}
        return inner, wrappers

    def create(self, spec: str, *, own: str) -> Transport:
        """Build the transport ``spec`` with the options that are its."""
        inner, wrappers = self.for_spec(spec, own=own)
        return create_transport(spec, wrapper_options=wrappers, **inner)
