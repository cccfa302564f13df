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
    assert (report["torn_tail"], report["corruption"], report["problems"]) == (None, [], [])
    assert {queue["queue"] for queue in report["queues"]} <= {"in/n1", "in/n2", "out/n1", "out/n2"}
    # Damage a byte in the middle of the log: reported with where it is, exit 1.
    segment = sorted((agent_directory(world.hq) / "spool").glob("*.seg"))[0]
    data = bytearray(segment.read_bytes())
    data[len(bytes(data).rstrip(b"\0")) // 3] ^= 0xFF  # within the records, not the spare zeros after them
    segment.write_bytes(bytes(data))
    damaged = agent("spool", "check", world.hq, "--json")
    assert damaged.code == 1
    found = json.loads(damaged.out)
    assert not found["ok"]
    [bad] = found["corruption"]
    assert bad["segment"] == segment.name and bad["rba"] > 0 and bad["reason"] and isinstance(bad["needed"], bool)


def test_spool_check_before_the_first_run(agent: Agent, tmp_path: Path) -> None:
    database = tmp_path / "new.db"
    assert agent("init", database, "--name", "new", "--role", "consolidated", "--address", tmp_path).code == 0
    result = agent("spool", "check", database)
    assert result.code == 1 and "no spool yet" in result.err
    spool = tmp_path / "new.db.agent" / "spool"
    assert spool.parent.is_dir()  # init made it, for the site's key
    spool.write_text("not a folder")
    result = agent("spool", "check", database)
    assert result.code == 1 and result.err_lines == [
        f"agent: {spool} is in the way: it exists and is not the spool folder; move it aside"]


def test_spool_check_of_no_site_is_one_line(agent: Agent, tmp_path: Path) -> None:
    for argument, code, says in ((tmp_path / "nosuch.db", 1, "no such site database"),
                                 ("", 2, "the path is empty"), (tmp_path, 2, "is a directory")):
        result = agent("spool", "check", argument)
        assert result.code == code and len(result.err_lines) == 1 and says in result.err, (argument, result.err)
        assert "internal error" not in result.err


def test_a_run_refuses_a_spool_whose_log_was_removed(agent: Agent, world: World) -> None:
    """Queued messages live in the log: a run must not start an empty one."""
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'queued', 'x')")
    (world.inbox("n1")).rename(world.root / "n1-inbox-gone")  # so the files stay queued
    assert agent("run", world.hq, "--once").code == 1
    spool = world.root / "hq.db.agent" / "spool"
    for segment in spool.glob("*.seg"):
        segment.unlink()
    result = agent("run", world.hq, "--once")
    assert result.code == 1 and len(result.err_lines) == 1, result.err_lines
    assert "segment files are missing" in result.err and "agent spool check" in result.err
    check = agent("spool", "check", world.hq)
    assert check.code == 1 and "the spool's log is missing" in check.out
