"""When a send phase uses Spark, and what becomes of its sends when the
Spark batch gives no files (docs/spark.md, "When the agent uses it").

Rules of this file:
* Pure: no I/O, no clock, nothing imported but values.  What the
  decisions need (the engine, the backlog, the threshold in force, how the
  batch ended) is passed in; agent.preparing asks and carries out.
* ``spark`` always uses Spark, ``local`` never, ``auto`` from its threshold
  on, and only when PySpark is installed.
* A batch stopped because the agent stops is no failure: its sends wait
  for the next run, quietly, whatever the engine.  A batch that failed is
  packed here under ``auto``; under any other engine its sends wait for
  the next run and the run reports a local error (exit code 1).
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Literal

from ..errors import AgentError

ENGINES = ("local", "auto", "spark")

#: How a Spark batch ended without files: stopped from outside (the agent
#: is stopping: ``SparkBatchCancelled``), or failed (any other ``SparkBatchError``).
SparkEnd = Literal["cancelled", "failed"]


class SparkDecision(Enum):
    """What a send phase does with the sends of a Spark batch that gave no files."""

    LEAVE_QUIETLY = "left for the next run"
    PACK_HERE = "packed here in this run"
    LEAVE_AS_ERROR = "left for the next run, and the run reports a local error"

    @property
    def pack_here(self) -> bool:
        """The sends are packed here, in this run (else they wait for the next)."""
        return self is SparkDecision.PACK_HERE

    @property
    def error(self) -> bool:
        """The run reports the failure as a local error."""
        return self is SparkDecision.LEAVE_AS_ERROR


def uses_spark(engine: str, backlog: int, threshold: int | None, installed: Callable[[], bool]) -> bool:
    """Whether a send phase with ``backlog`` (log offsets) goes to Spark
    under ``engine``, with ``threshold`` the backlog from which ``auto``
    uses it (None: never).  ``installed()`` says whether PySpark can be
    used; it is asked only when the answer hangs on it."""
    _check_engine(engine)
    if engine == "spark":
        return True
    return engine == "auto" and threshold is not None and backlog >= threshold and installed()


def spark_fallback(engine: str, end: SparkEnd) -> SparkDecision:
    """What becomes of the sends of a Spark batch that ended as ``end``
    under ``engine``."""
    _check_engine(engine)
    if end == "cancelled":
        return SparkDecision.LEAVE_QUIETLY
    if end != "failed":
        raise AgentError(f"a Spark batch ends cancelled or failed, not {end!r}")
    return SparkDecision.PACK_HERE if engine == "auto" else SparkDecision.LEAVE_AS_ERROR


def _check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise AgentError(f"engine {engine!r} is not one of {', '.join(ENGINES)}")
