import json

import pytest

from agent.cli import main


def test_chaos_runs_seeds_and_prints_a_json_summary(capsys):
    assert main(["chaos", "--seeds", "6", "--start", "40", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["seeds"] == 6 and summary["failing_seeds"] == []
    assert {"faults", "crashes", "apply_errors", "divergences", "double_applies", "losses"} <= set(summary)


def test_chaos_replays_one_seed_with_a_table(capsys):
    assert main(["chaos", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "seeds run" in out and "OK" in out


def test_chaos_refuses_wrapper_options(capsys):
    assert main(["chaos", "--seeds", "1", "-O", "faults.seed=3"]) == 2
    assert "faults wrapper" in capsys.readouterr().err


@pytest.mark.parametrize("layout", ["{root}/boxes/x-{site}", "{shared}/{site}"])
def test_chaos_makes_the_inbox_folders_its_template_names(capsys, tmp_path, layout):
    """Any folder layout works, not only the default {root}/inbox/{site}."""
    template = layout.replace("{shared}", str(tmp_path / "shared"))
    assert main(["chaos", "--seeds", "3", "--start", "7", "--address-template", template, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["failing_seeds"] == [] and summary["faults_total"] > 0, summary
    if layout.startswith("{shared}"):
        assert {"hq", "f1"} <= {path.name for path in (tmp_path / "shared").iterdir()}


def test_chaos_says_which_inbox_folder_it_cannot_make(capsys, tmp_path):
    (tmp_path / "file").write_text("not a folder")
    assert main(["chaos", "--seeds", "1", "--address-template", f"{tmp_path}/file/{{site}}"]) == 1
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert err == [f"agent: cannot make the inbox folder {tmp_path}/file/hq of site hq: Not a directory; "
                   "check --address-template"]


def test_a_replay_command_carries_the_rates_a_run_was_given(capsys):
    """The replay line of a failing seed run with other rates than its own
    draws them again from the command line: the same seed fails the same way."""
    from agent.chaos import ChaosParams
    from transports.faults import FaultRates

    params = ChaosParams.random(5, unsafe_without_stale_rule=True, reextract_rate=0.3, chain=False,
                                rates=FaultRates(drop=0.05, duplicate=0.3, reorder=0.1, max_hold_ticks=6))
    command = params.command()
    assert command.startswith("agent chaos --seed 5 ") and "--no-follow-chain" in command
    assert main(command.split()[1:] + ["--json"]) == 1
    summary = json.loads(capsys.readouterr().out)
    (failing,) = summary["failing_seeds"]
    assert failing["replay"] == command and summary["double_applies"] > 0
    # The replay shrinks the run, and prints the smaller case as a command
    # that fails in its turn.
    smallest = summary["smallest_failing_case"]
    assert smallest != command and smallest.startswith("agent chaos --seed 5 ")
    assert main(smallest.split()[1:] + ["--json"]) == 1
    again = json.loads(capsys.readouterr().out)
    assert again["failing_seeds"][0]["replay"] == smallest


@pytest.mark.parametrize("option, message", [
    ("bogus=1", "expected NAME=VALUE with NAME one of drop, corrupt"),
    ("drop", "expected NAME=VALUE"),
    ("drop=often", "'often' is not a number"),
    ("max_hold_ticks=1.5", "'1.5' is not a whole number"),
    ("drop=2", "rate drop must be between 0 and 1, got 2.0"),
])
def test_bad_fault_rates_are_refused_in_one_line(capsys, option, message):
    assert main(["chaos", "--seeds", "1", "--fault-rate", option]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
