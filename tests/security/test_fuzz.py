"""The receive path under mutated files (tests/security/fuzz.py)."""

from __future__ import annotations

import json
import re
import shlex
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tests.security.fuzz import MUTATIONS, Fuzzer, FuzzFailure, fuzz

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_twenty_thousand_mutated_files_through_the_agent() -> None:
    summary = fuzz(20_000, seed=1)
    assert summary.files == 20_000
    assert all(summary.mutations[name] > 1000 for name in MUTATIONS), summary.mutations
    assert summary.quarantined > 15_000  # nearly every file refused; the rest are signed and stale or duplicate


def test_the_documented_command_runs_as_written() -> None:
    text = (ROOT / "docs" / "testing.md").read_text()
    [command] = re.findall(r"^(\.venv/bin/python -m tests\.security\.fuzz --files 1000000 --json)$", text, re.M)
    arguments = shlex.split(command.replace("1000000", "300"))
    arguments[0] = sys.executable
    completed = subprocess.run(arguments, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr
    figures = json.loads(completed.stdout)
    assert figures["files"] == 300 and figures["files_per_s"] > 0


def test_a_row_no_peer_sent_is_reported(tmp_path: Path) -> None:
    fuzzer = Fuzzer(tmp_path, seed=2)
    fuzzer.batch(50)
    with sqlite3.connect(fuzzer.world.hq) as conn:
        conn.execute("INSERT INTO customer VALUES (99999, 'n1', 'never sent by n1', 'x')")
    with pytest.raises(FuzzFailure, match="rows n1 never committed"):
        fuzzer.check()


def test_a_file_left_in_the_inbox_is_reported(tmp_path: Path) -> None:
    fuzzer = Fuzzer(tmp_path, seed=3)
    name, data = next(iter(fuzzer.corpus.items()))
    (fuzzer.world.inbox("hq") / name).write_bytes(data)  # never run: still there
    with pytest.raises(FuzzFailure, match="left in the inbox"):
        fuzzer.check()
