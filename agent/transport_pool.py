"""The transports one agent opened: which one reaches which peer, and the
wait of a continuous agent on its own inbox.

Rules of this file:
* One transport per spec, and one per peer that has options of its own,
  made when first asked for and kept until :meth:`TransportPool.aclose`.
* Its options are, in order: those stored with the site, those stored
  for the peer, then the run's ``-O`` (agent.transport_options).
* ``--transport`` overrides every spec: the remote rows' and the site's own.
* A transport that cannot wait on the inbox (its server is gone) is one
  warning line, then plain sleeps until it is tried again: when, the
  core decides (agent.schedule.InboxWait), with the agent's clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

from transports import Transport, TransportError
from transports.registry import parse_transport_spec

from .run_options import RunOptions
from .schedule import InboxWait
from .transport_options import TransportOptions

log = logging.getLogger("fieldsync.agent")


class TransportPool:
    """The transports of one agent: ``stored`` holds the transport options
    stored in its site database, by peer (``""``: the site's own);
    ``own`` is the transport its identity names, the one it receives on."""

    def __init__(self, options: RunOptions, stored: Mapping[str, Mapping[str, str]], own: str | None, *,
                 clock: Callable[[], float]) -> None:
        self.options = options
        self.stored = stored
        self.own = options.transport or own or "folder"
        self.clock = clock
        self.opened: dict[tuple[str, str | None], Transport] = {}
        self.inbox_wait = InboxWait()

    def transport_for(self, name: str | None, peer: str | None = None) -> Transport:
        """The transport to ``peer`` whose remote row names ``name`` (None:
        ``folder``); ``transport_for(pool.own)`` is the one this site
        receives on."""
        spec = self.options.transport or name or "folder"
        own_options = self.stored.get(peer, {}) if peer is not None else {}
        key = (spec, peer) if own_options else (spec, None)
        transport = self.opened.get(key)
        if transport is None:
            run = TransportOptions(self.options.transport_options, self.options.named_options)
            stored = TransportOptions.from_stored(self.stored.get("", {}))
            if own_options:
                plugin = parse_transport_spec(spec).inner
                stored = TransportOptions.from_stored(own_options, plugin=plugin).over(stored)
            transport = run.over(stored).create(spec, own=self.own)
            self.opened[key] = transport
        return transport

    async def wait_incoming(self, address: str | None, stop: asyncio.Event, timeout: float) -> bool:
        """Wait until ``stop``, the timeout, or the own transport's word that
        files arrived at ``address`` (True; None: the agent does not receive)."""
        if timeout <= 0:
            return False
        waiter = asyncio.ensure_future(stop.wait())
        arrived = waited = False
        try:
            if address and self.inbox_wait.ready(self.clock()):
                waited = True
                incoming = asyncio.ensure_future(self.transport_for(self.own).wait_incoming(address, timeout))
                try:
                    await asyncio.wait({waiter, incoming}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    incoming.cancel()
                    try:
                        arrived = await incoming
                        self.inbox_wait.worked()
                    except asyncio.CancelledError:
                        pass
                    except TransportError as error:
                        waited = False
                        delay = self.inbox_wait.failed(self.clock())
                        if self.inbox_wait.failures == 1:
                            log.warning("%s; receiving on schedule and trying again with backoff", error)
                        else:
                            log.debug("%s; trying again in %.0f s", error, delay)
            if not waited and not waiter.done():
                await asyncio.wait({waiter}, timeout=self.inbox_wait.sleep(self.clock(), timeout))
        finally:
            waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await waiter
        return arrived

    async def aclose(self) -> None:
        """Close every transport opened, in at most 10 seconds."""
        async with asyncio.timeout(10):
            for transport in self.opened.values():
                await transport.aclose()
