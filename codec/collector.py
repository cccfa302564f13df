"""The cyclic garbage collector paused for the passes that make millions of
short-lived objects: reading a data payload (codec.payloads) and the pass
over the log that packs the due sends (agent.outbound).

Rules of this file:
* What such a pass makes (capture rows, runs, operations, encoded
  messages) holds no reference cycle: reference counting frees it.  The
  collector would only walk what the pass holds (the runs being packed
  for every subscriber, the runs a payload is read into) again and again
  as it ages through the generations: about 6% of the fan-out's time
  (docs/spark.md, "Measured") and a quarter of reading a payload into
  operations (docs/testing.md, the codec benchmark).  What outlives the
  pause it was made in is walked all at once when the collector runs
  again, which costs more than walking it as it was made: a reader of
  runs, which hands them back, does not pause it.
* Pauses nest and may come from several threads: the collector runs again
  when the last pause ends, and only if it ran when the first began (a
  process that switched it off keeps it off).  What a pause leaves behind
  (cycles the event loop made meanwhile) is collected at the next
  collection after it, as usual.
"""

from __future__ import annotations

import gc
import threading
from contextlib import contextmanager
from typing import Iterator

_lock = threading.Lock()
_pauses = 0
_resume = False  # whether the collector ran when the first pause began


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off for the ``with`` block (see the module)."""
    global _pauses, _resume
    with _lock:
        if _pauses == 0:
            _resume = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _resume:
                gc.enable()
