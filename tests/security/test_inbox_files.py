"""Files in a folder inbox the agent must not read: a hard link to a file
elsewhere, and a file larger than any message (docs/security.md, "The inbox").
Each against the real agent, in a process of its own."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from codec.header import Header
from codec.names import Kind, MessageName
from tests.cli.conftest import World
from tests.security.sites import build_world, run_in_process


@pytest.fixture
def world(tmp_path: Path) -> World:
    return build_world(tmp_path)


def a_name(last: int = 1) -> str:
    return str(MessageName("n1", "hq", Kind.DATA, Header(1, last - 1, last, 0)))


def test_a_hard_link_into_the_inbox_is_not_read(world: World) -> None:
    secret = world.root / "private.key"
    secret.write_bytes(b"someone's secret, readable by the agent's user only")
    os.chmod(secret, 0o600)
    os.link(secret, world.inbox("hq") / a_name())
    code, _, errors = run_in_process(world.hq)
    assert code == 0, errors
    assert "links" in errors and a_name() in errors
    # Neither read into the quarantine nor removed: left where it is.
    assert (world.inbox("hq") / a_name()).exists()
    assert secret.read_bytes().startswith(b"someone's secret")
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    quarantine = world.root / "hq.db.agent" / "quarantine"
    assert not any(b"someone's secret" in path.read_bytes() for path in quarantine.iterdir())


def test_a_file_of_200_mb_is_never_read(world: World) -> None:
    path = world.inbox("hq") / a_name()
    with open(path, "wb") as handle:
        handle.truncate(200 * 1000 * 1000)  # sparse: costs no disk here, 200 MB to whoever reads it
    code, peak_mb, errors = run_in_process(world.hq)
    assert code == 0, errors
    assert peak_mb < 100, peak_mb  # 457 MB before
    assert "over the 16777216 byte limit" in errors
    assert path.stat().st_size == 200 * 1000 * 1000  # left in place
    quarantine = world.root / "hq.db.agent" / "quarantine"
    assert sum(entry.stat().st_size for entry in quarantine.iterdir()) < 1000 * 1000
