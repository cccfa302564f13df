"""The Python example at the top of docs/site-database.md runs as written."""

from __future__ import annotations

import re
import runpy
import sqlite3
from pathlib import Path

DOC = Path(__file__).resolve().parents[2] / "docs" / "site-database.md"


def test_the_site_database_example_runs(tmp_path: Path, monkeypatch) -> None:
    [first, *_] = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    script = tmp_path / "example.py"
    script.write_text(first)
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(script), run_name="__main__")  # its own assert checks log_received
    with sqlite3.connect(tmp_path / "north1.db") as north1:
        assert north1.execute("SELECT * FROM order_line").fetchall() == [(1, 1, "pump", 2)]
        assert north1.execute("SELECT * FROM customer").fetchall() == [(1, "Fjord Fiskeri AS", "north")]
    north1.close()
