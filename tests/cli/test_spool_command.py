import json
from pathlib import Path

from agent.runner import agent_directory

from .conftest import Agent, World, sync


def test_spool_check_reports_a_healthy_spool_and_finds_damage(agent: Agent, world: World) -> None:
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'new at hq', 'x')")
    sync(agent, world)
    result = agent("spool", "check", world.hq)
    assert result.code == 0 and "OK" in result.out and "records" in result.out
    report = json.loads(agent("spool", "check", world.hq, "--json").out)
    assert report["ok"] and report["records"] > 0
    # Damage a byte in the middle of the log: reported with where it is, exit 1.
    segment = sorted((agent_directory(world.hq) / "spool").glob("*.seg"))[0]
    data = bytearray(segment.read_bytes())
    data[len(data) // 3] ^= 0xFF
    segment.write_bytes(bytes(data))
    damaged = agent("spool", "check", world.hq, "--json")
    assert damaged.code == 1
    assert not json.loads(damaged.out)["ok"]


def test_spool_check_before_the_first_run(agent: Agent, tmp_path: Path) -> None:
    database = tmp_path / "new.db"
    assert agent("init", database, "--name", "new", "--role", "consolidated", "--address", tmp_path).code == 0
    result = agent("spool", "check", database)
    assert result.code == 1 and "no spool yet" in result.err
