"""Files a transport refuses to read (too large, a hard link), through the
real agent: left where they are and warned about once across runs, as
files that are not this site's are (agent.left_files); a new file under
the same name is warned about again."""

from __future__ import annotations

import logging
import os
import random

from codec.header import Header
from codec.names import Kind, MessageName
from tests.agent.world import World, random_rows


def warnings_naming(caplog, name: str) -> list[str]:
    return [record.getMessage() for record in caplog.records
            if record.levelno >= logging.WARNING and name in record.getMessage()]


async def test_a_refused_file_is_warned_about_once_across_runs(tmp_path, caplog) -> None:
    world = World(tmp_path / "world")
    world.write("hq", *random_rows(random.Random(1), 3, ("f1",)))
    world.extract_all()
    inbox = world.inbox("f1")
    too_large = str(MessageName("hq", "f1", Kind.DATA, Header(9, 0, 1, 0)))
    linked = str(MessageName("hq", "f1", Kind.DATA, Header(9, 1, 2, 0)))
    (inbox / too_large).write_bytes(b"x" * 20_000)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"someone else's file")
    os.link(elsewhere, inbox / linked)
    caplog.set_level(logging.WARNING)
    for run in range(3):
        caplog.clear()
        report = await world.run("f1", transport_options={"max_file_size": 10_000})
        expected = 1 if run == 0 else 0
        assert len(warnings_naming(caplog, too_large)) == expected, (run, caplog.text)
        assert len(warnings_naming(caplog, linked)) == expected, (run, caplog.text)
        assert report.left_in_inbox == 2, report
    assert (inbox / too_large).exists() and (inbox / linked).exists()
    # Another file under the same name is news: warned about once more.
    (inbox / too_large).write_bytes(b"y" * 30_000)
    for run in range(2):
        caplog.clear()
        await world.run("f1", transport_options={"max_file_size": 10_000})
        warnings = warnings_naming(caplog, too_large)
        assert len(warnings) == (1 if run == 0 else 0), caplog.text
        if warnings:
            assert "30000 bytes, over the 10000 byte limit" in warnings[0]
            assert "warned once" in warnings[0]
