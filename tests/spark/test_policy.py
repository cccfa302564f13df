"""agent.spark.policy, pure: when a send phase uses Spark, and what becomes
of its sends when the Spark batch gives no files.  No Spark, no files."""

from __future__ import annotations

import pytest

from agent.errors import AgentError
from agent.spark.policy import ENGINES, SparkDecision, spark_fallback, uses_spark


def never_asked() -> bool:
    raise AssertionError("PySpark was looked for where the answer does not hang on it")


# -- whether a send phase uses Spark -----------------------------------------------------


def test_engine_spark_always_uses_spark_without_looking_for_pyspark() -> None:
    assert uses_spark("spark", 0, None, never_asked) is True
    assert uses_spark("spark", 10 ** 12, 5, never_asked) is True


def test_engine_local_never_uses_spark_without_looking_for_pyspark() -> None:
    assert uses_spark("local", 10 ** 12, 0, never_asked) is False


def test_auto_uses_spark_from_its_threshold_on() -> None:
    assert uses_spark("auto", 1_000, 1_000, lambda: True) is True
    assert uses_spark("auto", 1_001, 1_000, lambda: True) is True
    assert uses_spark("auto", 999, 1_000, never_asked) is False


def test_auto_without_a_threshold_never_uses_spark() -> None:
    assert uses_spark("auto", 10 ** 12, None, never_asked) is False


def test_auto_stays_local_when_pyspark_is_not_installed() -> None:
    assert uses_spark("auto", 1_000, 0, lambda: False) is False


# -- what becomes of the sends of a batch that gave no files -----------------------------


@pytest.mark.parametrize("engine", ENGINES)
def test_a_batch_stopped_because_the_agent_stops_is_left_quietly(engine: str) -> None:
    decision = spark_fallback(engine, "cancelled")
    assert decision is SparkDecision.LEAVE_QUIETLY
    assert not decision.pack_here and not decision.error


def test_a_failed_batch_under_auto_is_packed_here() -> None:
    decision = spark_fallback("auto", "failed")
    assert decision is SparkDecision.PACK_HERE
    assert decision.pack_here and not decision.error


@pytest.mark.parametrize("engine", ["spark", "local"])
def test_a_failed_batch_under_another_engine_is_left_as_a_local_error(engine: str) -> None:
    decision = spark_fallback(engine, "failed")
    assert decision is SparkDecision.LEAVE_AS_ERROR
    assert not decision.pack_here and decision.error


def test_an_unknown_engine_or_end_is_refused() -> None:
    with pytest.raises(AgentError, match="engine 'cluster' is not one of local, auto, spark"):
        spark_fallback("cluster", "failed")
    with pytest.raises(AgentError, match="engine 'cluster'"):
        uses_spark("cluster", 0, 0, never_asked)
    with pytest.raises(AgentError, match="cancelled or failed, not 'done'"):
        spark_fallback("auto", "done")  # type: ignore[arg-type]
