"""Stopping a continuous agent with SIGINT or SIGTERM.

Rules of this file:
* The first signal asks the agent to stop cleanly after the current step
  (and whatever must stop at once, a running Spark job, to stop); the
  handlers are removed then, so a second signal gets the default action.
* On a loop or platform without signal handlers, nothing is installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def stop_on_signals(stop: asyncio.Event, at_once: Callable[[], None]) -> Iterator[None]:
    """While inside: SIGINT or SIGTERM set ``stop`` and call ``at_once``."""
    loop = asyncio.get_running_loop()

    def restore_handlers() -> None:
        for signum in SIGNALS:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(signum)

    def stopping() -> None:
        stop.set()
        at_once()
        restore_handlers()

    for signum in SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, stopping)
    try:
        yield
    finally:
        restore_handlers()
