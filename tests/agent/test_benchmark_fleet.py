"""benchmarks.fleet on a small fleet: its figures are what a run writes
(no file when idle, one remote's files for its change, every remote's
when all changed), and its JSON has the layout the docs give."""

import json

from benchmarks import fleet


def test_fleet_benchmark_counts_the_files_each_kind_of_run_writes(capsys) -> None:
    assert fleet.main(["--json", "--sizes", "12", "--extract", "3", "--repeat", "2"]) == 0
    result = json.loads(capsys.readouterr().out)
    figures = result["by_n"]["12"]
    assert figures["idle_files"] == 0
    assert figures["one_change_files"] == 1  # the one remote whose row changed
    assert figures["all_change_files"] == 12
    assert figures["bulk_extract_n"] == 3 and len(figures["idle_runs_s"]) == 2
    assert len(figures["process_idle_runs_s"]) == 2
    for kind in ("status", "status_after_runs"):  # the median of as many calls
        calls = figures[f"{kind}_runs_s"]
        assert len(calls) == 2 and figures[f"{kind}_s"] == sum(calls) / 2
    # A change is written (its log, the pair's row, the spool, its file); an idle run writes less.
    assert figures["process_one_change_written_kb"] > figures["process_idle_written_kb"] >= 0
    # A process pays the interpreter's start and imports the in-process runs do not.
    assert figures["process_idle_s"] > figures["idle_s"]
    for key in ("idle_s", "one_change_s", "all_change_s", "all_change_ms_per_remote", "status_s", "bulk_add_s",
                "bulk_extract_s", "baseline_write_n_files_s", "process_idle_s", "process_idle_rss_mb",
                "process_one_change_written_kb"):
        assert figures[key] > 0, key
