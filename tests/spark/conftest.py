"""Real Spark in local mode for the batch tests: one session per test run
(starting a JVM takes seconds), its Python workers on this interpreter."""

from __future__ import annotations

import os
import sys

import pytest


def spark_builder(master: str = "local[2]", **conf: str):  # type: ignore[no-untyped-def]
    from pyspark.sql import SparkSession

    # A session made from Python starts its workers with PYSPARK_PYTHON;
    # spark.pyspark.python is read by spark-submit only.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    builder = (SparkSession.builder.master(master).appName("fieldsync-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.pyspark.python", sys.executable)
               .config("spark.sql.shuffle.partitions", "4"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder


@pytest.fixture(scope="session")
def spark():
    session = spark_builder().getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
