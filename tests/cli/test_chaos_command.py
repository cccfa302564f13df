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
