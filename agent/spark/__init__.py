"""Large outbound batches on Spark: export, the job run, take-over (docs/spark.md)."""
