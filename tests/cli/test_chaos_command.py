import json

from agent.cli import main


def test_chaos_runs_seeds_and_prints_a_json_summary(capsys):
    assert main(["chaos", "--seeds", "6", "--start", "40", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["seeds"] == 6 and summary["failing_seeds"] == []
    assert {"faults", "crashes", "divergences", "double_applies", "losses"} <= set(summary)


def test_chaos_replays_one_seed_with_a_table(capsys):
    assert main(["chaos", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "seeds run" in out and "OK" in out


def test_chaos_refuses_wrapper_options(capsys):
    assert main(["chaos", "--seeds", "1", "-O", "faults.seed=3"]) == 2
    assert "faults wrapper" in capsys.readouterr().err
