"""The fleet examples of docs/cli.md ("Many remotes at once", "Many remotes
into a folder", "Filters, for a fleet") run as written, in order, on the
first session's consolidated: each `$ cat FILE` block is written to FILE,
each `$ agent ...` line runs, and what the doc shows is what it prints
(numbers aside: rows, offsets and times differ from site to site)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tests.sqlfiles import connected

from .conftest import Agent

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
SECTIONS = ("#### Many remotes at once", "#### Many remotes into a folder", "#### Filters, for a fleet",
            "#### Errors in force, and their history")


def _blocks() -> list[str]:
    text = DOC.read_text()
    blocks = []
    for heading in SECTIONS:
        start = text.index(heading)
        end = text.index("\n#", start + len(heading))
        blocks += re.findall(r"```console\n(.*?)```", text[start:end], flags=re.S)
    return blocks


def _steps(block: str) -> list[tuple[str, list[str]]]:
    """``(command, shown output lines)`` of a console block."""
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        else:
            steps[-1][1].append(line)
    return steps


def _plain(line: str) -> str:
    return re.sub(r"[0-9]+(\.[0-9]+)?", "N", line.strip())


def _same_output(shown: list[str], printed: str) -> None:
    if shown == ["..."]:
        return
    if shown and shown[0].startswith("{"):
        kinds = [json.loads(line) for line in printed.splitlines()]
        expected = [re.match(r'\{"kind":"(\w+)"(?:,"name":"(\w+)")?', line).groups() for line in shown]
        assert [(item["kind"], item.get("name") if item["kind"] == "remote" else None) for item in kinds] == [
            (kind, name) for kind, name in expected]
        assert kinds[-1]["remotes"] == json.loads(shown[-1])["remotes"]
        return
    assert [_plain(line) for line in printed.splitlines() if line.strip()] == [_plain(line) for line in shown]


def test_the_fleet_examples_run_as_written(tmp_path: Path, agent: Agent, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for site in ("hq", "east", "west", "fjell", "vidde"):
        (tmp_path / "inbox" / site).mkdir(parents=True)
    assert agent("init", "hq.db", "--name", "hq", "--role", "consolidated", "--address", "inbox/hq").code == 0
    with connected(tmp_path / "hq.db") as conn:  # the first session's tables
        conn.execute("CREATE TABLE customer (id INTEGER PRIMARY KEY, region TEXT NOT NULL, name TEXT, phone TEXT,"
                     " rating TEXT)")
        conn.execute("CREATE TABLE product (sku TEXT PRIMARY KEY, name TEXT, price REAL)")
        conn.execute("INSERT INTO product VALUES ('P-001','Pump S',120.0), ('P-002','Valve M',45.5)")
    assert agent("publication", "create", "hq.db", "catalogue", "product").code == 0
    assert agent("publication", "create", "hq.db", "territory", "customer:id,region,name,phone@region").code == 0
    ran = 0
    for block in _blocks():
        for command, shown in _steps(block):
            words = shlex.split(command)
            if words[0] == "cat":
                Path(words[1]).write_text("\n".join(shown) + "\n")
                continue
            if words[0] == "mkdir":
                Path(words[1]).mkdir()
                continue
            assert words[0] == "agent", command
            result = agent(*words[1:])
            errors = [line for line in shown if line.startswith("agent: ")]
            if errors:
                assert result.code != 0 and result.err_lines == errors, (command, result.err)
            else:
                assert result.code == 0, (command, result.err)
                _same_output(shown, result.out)
            ran += 1
    assert ran >= 8
