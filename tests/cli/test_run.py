"""agent run: batch runs that replicate, options, exit codes, logging."""

from __future__ import annotations

import re
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

import agent.cli.run as run_module
from agent.runner import agent_directory, open_queues
from agent.site import SiteDatabase
from transports.registry import available_transports
from tests.spark.launchers import LAST_LINE, hanging_launcher, wait_gone
from tests.spool.helpers import flip_byte

from .conftest import AGENT_COMMAND, Agent, World, agent_process, stop_once_n1_has_data, sync


LEFT = "{} file(s) in the inbox were left there unread (not for this site, or refused by the transport)"


def _files_in_inboxes(world: World) -> int:
    return sum(1 for site in ("hq", "n1", "n2") for _ in world.inbox(site).iterdir())


def test_batch_rounds_replicate_both_ways(agent: Agent, world: World) -> None:
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'new at hq', 'x')")
    world.execute("hq", "UPDATE customer SET region = 'n2' WHERE id = 1")  # moves from n1 to n2
    world.execute("n2", "INSERT INTO customer VALUES (200, 'n2', 'new at n2')")
    before = _files_in_inboxes(world)
    result = agent("run", world.hq, "--once")
    assert result.code == 0, result.err
    # "sent" counts the files the transport took, data and control alike.
    assert "received 0 messages" in result.out and f"sent {_files_in_inboxes(world) - before}," in result.out
    assert len(list(world.inbox("n1").glob("*.d.*"))) >= 1 and len(list(world.inbox("n2").glob("*.d.*"))) >= 1
    sync(agent, world)
    assert world.rows("n1") == world.rows("hq", "SELECT id, region, name FROM customer WHERE region = 'n1' ORDER BY id")
    assert world.rows("n2") == world.rows("hq", "SELECT id, region, name FROM customer WHERE region = 'n2' ORDER BY id")
    assert (200, "n2", "new at n2") in world.rows("n2")
    assert world.rows("hq", "SELECT id FROM customer WHERE id = 200") == [(200,)]
    assert 1 not in [row[0] for row in world.rows("n1")]


def test_receive_only_and_send_only(agent: Agent, world: World) -> None:
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'new', 'x')")
    assert "sent 0" in agent("run", world.hq, "--once", "--receive-only").out
    before = _files_in_inboxes(world)
    result = agent("run", world.hq, "-b", "-s")
    assert f"sent {_files_in_inboxes(world) - before}," in result.out
    assert len(list(world.inbox("n1").glob("*.d.*"))) == 1  # data to n1; nothing for n2, so no data file
    assert not list(world.inbox("n2").glob("*.d.*"))
    result = agent("run", world.n1, "--once", "-r")
    assert result.code == 0 and "applied 1" in result.out and "sent 0" in result.out
    assert (100, "n1", "new") in world.rows("n1")


def test_keep_leaves_the_files_in_the_inbox(agent: Agent, world: World) -> None:
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'new', 'x')")
    assert agent("run", world.hq, "--once", "--send-only").code == 0
    inbox = world.inbox("n1")
    waiting = sorted(path.name for path in inbox.iterdir())
    assert any(".d." in name for name in waiting)
    result = agent("run", world.n1, "--once", "--receive-only", "--keep")
    assert result.code == 0 and "applied 1" in result.out, result.out
    assert sorted(path.name for path in inbox.iterdir()) == waiting
    result = agent("run", world.n1, "-b", "-r", "-p")  # dbremote's switches; nothing applied twice
    assert result.code == 0 and "applied 0" in result.out, result.out
    assert (100, "n1", "new") in world.rows("n1")


def test_receive_only_with_send_only_is_a_usage_error(agent: Agent, world: World) -> None:
    result = agent("run", world.hq, "--once", "--receive-only", "--send-only")
    assert result.code == 2
    assert len(result.err_lines) == 1
    assert result.err_lines[0].startswith("agent: --receive-only and --send-only exclude each other")


@pytest.mark.parametrize("arguments, text", [
    (("--receive-delay", "soon"), "'soon' is not a duration"),
    (("-rd", "5x"), "'5x' is not a duration"),
    (("-sd", "0"), "must be longer than zero"),
    (("-l", "1000"), "below the minimum of 10000"),
    (("--patience", "0"), "--patience"),
    (("-g", "0"), "--group"),
    (("--spark-timeout", "soon"), "'--spark-timeout': 'soon' is not a duration"),
    (("--spark-timeout", "-5"), "'--spark-timeout': '-5' is not a duration"),
    (("--spark-timeout", "1x"), "'--spark-timeout': '1x' is not a duration"),
    (("--message-format", "3"), "'3' is not one of '1', '2'"),
])
def test_bad_option_values_are_usage_errors(agent: Agent, world: World, arguments: tuple, text: str) -> None:
    result = agent("run", world.hq, "--once", *arguments)
    assert result.code == 2
    assert len(result.err_lines) == 1 and result.err_lines[0].startswith("agent: ")
    assert text in result.err


def test_message_format_chooses_the_version_of_the_data_files(agent: Agent, world: World) -> None:
    """--message-format 1 writes files a site that reads only version 1
    can take; the default writes version 2; a site reads both."""
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'in version 1', 'x')")
    assert agent("run", world.hq, "--once", "--message-format", "1").code == 0
    data = list(world.inbox("n1").glob("*.d.*"))
    assert data and {path.read_bytes()[4] for path in data} == {1}
    assert agent("run", world.n1, "--once").code == 0
    world.execute("hq", "INSERT INTO customer VALUES (101, 'n1', 'in version 2', 'x')")
    assert agent("run", world.hq, "--once").code == 0
    data = list(world.inbox("n1").glob("*.d.*"))
    assert data and {path.read_bytes()[4] for path in data} == {2}
    assert agent("run", world.n1, "--once").code == 0
    assert {(100, "n1", "in version 1"), (101, "n1", "in version 2")} <= set(world.rows("n1"))


def test_dbremote_style_switches_are_accepted(agent: Agent, world: World) -> None:
    result = agent("run", world.hq, "-b", "-rd", "90s", "-sd", "5m", "-rp", "3", "-ru", "1m", "-l", "48k", "-g", "30")
    assert result.code == 0, result.err


def test_missing_and_non_site_databases(tmp_path: Path, agent: Agent) -> None:
    result = agent("run", tmp_path / "missing.db", "--once")
    assert result.code == 1
    assert result.err_lines == [f"agent: {tmp_path / 'missing.db'}: no such site database; check the path, "
                                "or create the site with `agent init`"]
    plain = tmp_path / "plain.txt"
    plain.write_bytes(b"this is not a database" * 50)
    result = agent("run", plain, "--once")
    assert result.code == 1 and len(result.err_lines) == 1 and str(plain) in result.err
    assert "Traceback" not in result.err


def test_transport_errors_give_exit_1_one_line_each(agent: Agent, world: World) -> None:
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'new', 'x')")
    shutil.rmtree(world.inbox("n1"))  # n1's shared folder is not mounted
    result = agent("run", world.hq, "--once")
    assert result.code == 1
    problems = [line for line in result.err_lines if line.startswith("agent: transport error: ")]
    assert len(problems) == 1 and "sending to n1" in problems[0]
    # Printed once on the terminal (the summary's line), not also as a log line.
    assert sum("sending to n1" in line for line in result.err_lines) == 1, result.err
    # A log file keeps it as it happened.
    log_file = world.root / "run.log"
    again = agent("run", world.hq, "--once", "--log-file", log_file)
    assert again.code == 1 and sum("sending to n1" in line for line in again.err_lines) == 1, again.err
    assert "WARNING" in log_file.read_text() and "sending to n1" in log_file.read_text()
    with SiteDatabase.open(world.hq) as site:
        assert site.remote("n1").last_error is not None
        assert site.remote("n2").last_error is None
    # Once the folder is back, the queued messages go out and the run is clean.
    world.inbox("n1").mkdir()
    assert agent("run", world.hq, "--once").code == 0
    assert agent("run", world.n1, "--once").code == 0
    assert (100, "n1", "new") in world.rows("n1")


def test_unknown_transport_is_one_line(agent: Agent, world: World) -> None:
    result = agent("run", world.hq, "--once", "--transport", "carrier-pigeon")
    assert result.code == 1 and len(result.err_lines) >= 1
    assert all(line.startswith("agent: ") or " WARNING " in line for line in result.err_lines)
    assert "carrier-pigeon" in result.err


def test_log_file_and_verbose(tmp_path: Path, agent: Agent, world: World) -> None:
    log_file = tmp_path / "agent.log"
    junk = world.inbox("hq") / "hq.n1.d.junk.fsm"  # looks like a message name, and is not one
    junk.write_bytes(b"junk")
    result = agent("run", world.hq, "--once", "-v", "--log-file", log_file)
    assert result.code == 0
    assert "left 'hq.n1.d.junk.fsm' in the inbox" in result.err
    assert "left 'hq.n1.d.junk.fsm' in the inbox" in log_file.read_text()
    assert "DEBUG" in log_file.read_text()
    assert LEFT.format(1) in result.out
    assert junk.read_bytes() == b"junk"


def test_files_that_are_not_for_the_site_are_never_touched(agent: Agent, world: World) -> None:
    """A wrong --address (a folder of other files, another site's inbox)
    costs a warning per file, once, and moves nothing."""
    other = world.root / "documents"
    other.mkdir()
    (other / "passwd").write_text("root:x:0:0")
    (other / "notes.txt").write_text("keep me")
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'for n1', 'x')")
    assert agent("run", world.hq, "--once", "--send-only").code == 0
    for_n1 = sorted(path.name for path in world.inbox("n1").iterdir())[0]
    (other / for_n1).write_bytes((world.inbox("n1") / for_n1).read_bytes())  # addressed to n1
    result = agent("run", world.hq, "--once", "--receive-only", "--address", other)
    assert result.code == 0, result.err
    assert sorted(path.name for path in other.iterdir()) == sorted(["notes.txt", "passwd", for_n1])
    assert (other / "passwd").read_text() == "root:x:0:0"
    left = [line for line in result.err_lines if "left " in line]
    assert len(left) == 3 and any("addressed to n1, not hq" in line for line in left), result.err_lines
    assert LEFT.format(3) in result.out
    assert not list((world.root / "hq.db.agent").glob("quarantine/*"))
    # Each is warned about once, not at every run (nor at every poll of a
    # continuous run); the run's summary still counts them.
    again = agent("run", world.hq, "--once", "--receive-only", "--address", other)
    assert [line for line in again.err_lines if "left " in line] == []
    assert LEFT.format(3) in again.out
    # A new file is warned about, and only it.
    (other / "todo.txt").write_text("new")
    third = agent("run", world.hq, "--once", "--receive-only", "--address", other)
    assert [line for line in third.err_lines if "left " in line and "todo.txt" in line] != []
    assert len([line for line in third.err_lines if "left " in line]) == 1


def test_progress_bars_on_a_terminal(agent: Agent, world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(run_module, "show_progress", lambda out: True)
    for number in range(300):
        world.execute("hq", "INSERT INTO customer VALUES (?, ?, ?, ?)",
                      (1000 + number, "n1", "x" * 200 + str(number), "y"))
    result = agent("run", world.hq, "--once", "-l", "10000")
    assert result.code == 0, result.err
    assert agent("run", world.n1, "--once").code == 0
    assert len(world.rows("n1")) == 310


def test_continuous_mode_runs_until_sigterm(world: World) -> None:
    with agent_process("run", world.hq, "--receive-delay", "0.2s", "--send-delay", "0.2s") as process:
        world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'while running', 'x')")
        out, err = stop_once_n1_has_data(process, world)
    assert process.returncode == 0, err
    assert "running: receiving every 0.2s, sending every 0.2s" in err
    assert "stopped" in err
    assert re.search(r"sent [1-9]", out), out


def test_a_log_file_moved_away_is_reopened(world: World) -> None:
    """logrotate's default: rename the file, and the running agent writes a new one."""
    log_file = world.root / "agent.log"
    with agent_process("run", world.hq, "--receive-delay", "0.1s", "--send-delay", "0.1s", "-v",
                       "--log-file", log_file) as process:
        deadline = time.monotonic() + 30
        while "running: receiving" not in (log_file.read_text() if log_file.exists() else ""):
            assert process.poll() is None and time.monotonic() < deadline, process.communicate()
            time.sleep(0.05)
        log_file.rename(world.root / "agent.log.1")
        world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'after the rotation', 'x')")
        out, err = stop_once_n1_has_data(process, world)
    assert process.returncode == 0, err
    assert "running: receiving" in (world.root / "agent.log.1").read_text()
    assert "stopped" in log_file.read_text()


def test_a_run_refused_because_another_agent_holds_the_spool_changes_nothing(agent: Agent, world: World) -> None:
    assert agent("run", world.hq, "--once").code == 0
    marker = agent_directory(world.hq) / "state" / "site.json"
    before = (marker.read_bytes(), world.rows("hq", "SELECT generation FROM fieldsync_agent_run"))
    held = open_queues(world.hq)  # as a running agent holds them
    try:
        result = agent("run", world.hq, "--once")
    finally:
        held.close()
    assert result.code == 1 and result.err_lines == [
        f"agent: {agent_directory(world.hq) / 'spool'}: the spool is open in another object of this process "
        f"({os.getpid()}); stop that agent first"], result.err
    assert (marker.read_bytes(), world.rows("hq", "SELECT generation FROM fieldsync_agent_run")) == before


def test_a_folder_in_the_place_of_the_agents_state_file_is_named(agent: Agent, world: World) -> None:
    assert agent("run", world.hq, "--once").code == 0
    state = agent_directory(world.hq) / "state" / "site.json"
    state.unlink()
    state.mkdir()
    result = agent("run", world.hq, "--once")
    assert result.code == 1 and result.err_lines == [f"agent: {state} is a folder where a file is needed; move it aside"]
    assert not [path for path in state.parent.iterdir() if path.name.endswith(".tmp")]  # none left behind
    state.rmdir()
    assert agent("run", world.hq, "--once").code == 0


def test_transport_options_reach_the_transport_and_its_wrappers(agent: Agent, world: World) -> None:
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'through faults', 'x')")
    held = world.root / "held"
    result = agent("run", world.hq, "--once", "--transport", "faults+folder", "-O", "faults.seed=7",
                   "-O", f"faults.hold_dir={held}", "-O", "stale_temp_age=600")
    assert result.code == 0, result.err
    assert held.is_dir()  # the wrapper was built with the options given
    assert agent("run", world.n1, "--once").code == 0


def test_the_sites_own_transport_is_the_one_it_receives_on(agent: Agent, world: World) -> None:
    """A remote whose inbox is reached through faults+folder (its identity
    says so) receives through that transport without --transport."""
    (world.inbox("n3")).mkdir()
    assert agent("remote", "add", world.hq, "n3", "--address", world.inbox("n3"), "--transport", "faults+folder",
                 "--subscribe", "territory=n3").code == 0
    n3 = world.root / "n3.db"
    assert agent("extract", world.hq, "n3", n3).code == 0
    held = world.root / "held"
    result = agent("run", n3, "--once", "-O", "faults.hold_dir=" + str(held), "-O", "faults.seed=1")
    assert result.code == 0, result.err
    # Each call through the wrapper is a tick, kept in its hold folder; n3
    # sends to hq by folder, so only its receive can have ticked.
    assert int((held / "tick").read_text()) >= 1


def test_options_for_a_peers_transport_go_to_that_transport_only(agent: Agent, world: World) -> None:
    """hq receives on folder; n2 is reached by email.  A folder option and an
    email option in one run each reach their own transport."""
    with SiteDatabase.open(world.hq) as site:
        site.update_remote("n2", transport="email", address="n2@example.invalid")
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'for n1', 'x')")
    world.execute("hq", "INSERT INTO customer VALUES (101, 'n2', 'for n2', 'x')")
    result = agent("run", world.hq, "--once", "-O", "stale_temp_age=600", "-O", "email.smtp_host=127.0.0.1",
                   "-O", "email.smtp_port=9", "-O", "email.retries=0")
    # n1 (folder) got its message; n2's could not be sent (nothing listens on
    # port 9), which is a transport error, not a refused option.
    assert any(".d." in path.name for path in world.inbox("n1").iterdir())
    assert result.code == 1
    assert [line for line in result.err_lines if "n2" in line] and all(
        "does not accept" not in line for line in result.err_lines), result.err_lines
    # An option the email transport does not have is one line, before any work.
    result = agent("run", world.hq, "--once", "-O", "email.no_such_setting=1")
    assert result.code == 1 and len(result.err_lines) == 1, result.err_lines
    assert "'email'" in result.err and "no_such_setting" in result.err
    result = agent("run", world.hq, "--once", "-O", "emial.smtp_host=x")
    assert result.code == 2 and result.err_lines == [
        f"agent: --transport-option emial.smtp_host: there is no transport or wrapper named 'emial'; known: "
        f"{', '.join(available_transports())}"]


def test_bad_transport_options(agent: Agent, world: World) -> None:
    result = agent("run", world.hq, "--once", "-O", "no_such_setting=1")
    assert result.code == 1 and len(result.err_lines) == 1
    assert "no_such_setting" in result.err_lines[0]
    result = agent("run", world.hq, "--once", "-O", "novalue")
    assert result.code == 2 and len(result.err_lines) == 1 and "NAME=VALUE" in result.err
    result = agent("run", world.hq, "--once", "-O", "max_file_size=-5")
    assert result.code == 1 and len(result.err_lines) == 1 and "max_file_size" in result.err
    # A limit under the smallest message would leave every message unread.
    result = agent("run", world.hq, "--once", "-O", "max_file_size=0")
    assert result.code == 1 and result.err_lines == [
        "agent: transport 'folder': max_file_size must be a byte count of at least 10000 (the smallest message "
        "size), got 0"], result.err
    # A value that does not read as its option's type is one line naming both.
    for option, line in (
            ("stale_temp_age=forever", "agent: transport 'folder': stale_temp_age='forever' is not a number of "
                                       "seconds such as 30, 90s, 5m or 1h"),
            ("file_mode=rw-r-----", "agent: transport 'folder': file_mode='rw-r-----' is not permission bits in "
                                    "octal such as 640 or 0o640"),
            ("max_file_size=1t", "agent: transport 'folder': max_file_size='1t' is not a byte count such as 50000, "
                                 "48k, 64m or 1g")):
        result = agent("run", world.hq, "--once", "-O", option)
        assert (result.code, result.err_lines) == (1, [line]), option


def test_transport_option_texts_are_read_by_their_type(agent: Agent, world: World) -> None:
    """file_mode is octal as chmod reads it, sizes and ages take units."""
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'mode', 'x')")
    result = agent("run", world.hq, "--once", "-O", "file_mode=640", "-O", "max_file_size=64m",
                   "-O", "stale_temp_age=1h")
    assert result.code == 0, result.err
    sent = [path for path in world.inbox("n1").iterdir() if ".d." in path.name]
    assert sent and {path.stat().st_mode & 0o777 for path in sent} == {0o640}


# -- a Spark job that hangs or is interrupted (docs/spark.md, "A job that hangs") ------------
# The launcher stands in for spark-submit and hangs (tests/spark/launchers.py).


def _spark_run(world: World, launcher: Path, *options: str) -> list[str]:
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'new', 'x')")
    return ["run", str(world.hq), "--once", "--send-only", "--engine", "spark", "--spark-submit", str(launcher),
            "--spark-conf", "spark.ui.enabled=false", *options]


def _log_sent(world: World) -> dict[str, int]:
    with SiteDatabase.open(world.hq) as site:
        return {remote.name: remote.log_sent for remote in site.remotes()}


def _job_folders(world: World) -> list[Path]:
    work = agent_directory(world.hq) / "spark"
    return sorted(work.iterdir()) if work.exists() else []


def test_spark_timeout_stops_a_hanging_job(agent: Agent, world: World, tmp_path: Path) -> None:
    launcher = hanging_launcher(tmp_path / "bin")
    before = _log_sent(world)
    result = agent(*_spark_run(world, launcher.path, "--spark-timeout", "1"))
    assert result.code == 1
    problems = [line for line in result.err_lines if line.startswith("agent: ")]
    assert problems == ["agent: local error: Spark batch of 2 sends: the Spark job ran over its 1 s timeout "
                        f"and was stopped (its last line: {LAST_LINE}); give it longer with --spark-timeout "
                        "(0: no limit)"], result.err
    assert wait_gone(list(launcher.wait_started())) == []
    assert _log_sent(world) == before
    assert _job_folders(world) == []


def test_spark_timeout_0_is_no_limit(agent: Agent, world: World, tmp_path: Path) -> None:
    slow = tmp_path / "spark-submit-slow"
    slow.write_text("#!/bin/sh\nsleep 1.5\necho 'slow launcher gave up'\nexit 1\n")
    slow.chmod(0o755)
    result = agent(*_spark_run(world, slow, "--spark-timeout", "0"))
    assert result.code == 1
    assert ("agent: local error: Spark batch of 2 sends: the Spark job failed (exit code 1): "
            "slow launcher gave up") in result.err_lines, result.err


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_a_batch_run_and_its_spark_job(world: World, tmp_path: Path, signum: int) -> None:
    launcher = hanging_launcher(tmp_path / "bin")
    before = _log_sent(world)
    # As from a terminal: a shell's background job (a CI runner's, say)
    # starts with SIGINT ignored, which the agent then rightly leaves alone.
    with agent_process(*_spark_run(world, launcher.path, "--spark-timeout", "10m"),
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as process:
        pids = launcher.wait_started()
        process.send_signal(signum)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 1, err
    assert err.splitlines()[-1] == "agent: interrupted", err
    assert "" not in err.splitlines(), err  # no blank line: stderr is no terminal here
    assert wait_gone(list(pids)) == []
    assert _log_sent(world) == before
    assert _job_folders(world) == []


def test_a_refused_apply_is_a_local_error_line_and_exit_1(agent: Agent, world: World,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure on this site's side (its database refuses an apply) is said
    as what it is: a local error, never a transport error; the run fails."""
    from agent.site.errors import SiteError

    world.execute("n1", "INSERT INTO customer VALUES (300, 'n1', 'from n1')")
    assert agent("run", world.n1, "--once").code == 0

    def refused(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise SiteError("database is locked")

    monkeypatch.setattr(SiteDatabase, "apply", refused)
    result = agent("run", world.hq, "--once")
    assert result.code == 1
    assert [line for line in result.err_lines if line.startswith("agent: local error: applying from n1: "
                                                                 "database is locked")], result.err
    assert not [line for line in result.err_lines if line.startswith("agent: transport error")], result.err
    monkeypatch.undo()
    assert agent("run", world.hq, "--once").code == 0  # the messages stayed queued
    assert world.rows("hq", "SELECT id FROM customer WHERE id = 300") == [(300,)]


def test_a_problem_line_writes_control_characters_as_escapes(agent: Agent, world: World) -> None:
    """An address stored by a program, not the command line, can hold a
    terminal escape: the problem line shows it, it does not obey it."""
    with SiteDatabase.open(world.hq) as site:
        site.update_remote("n1", address=str(world.root / "gone\x1b[31m"))
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'for n1', 'x')")
    result = agent("run", world.hq, "--once")
    problems = [line for line in result.err_lines if line.startswith("agent: transport error")]
    assert result.code == 1 and problems, result.err_lines
    assert all("\x1b" not in line for line in problems) and "gone\\x1b[31m" in problems[0], problems


def test_a_torn_spool_write_is_reported_at_the_next_start(agent: Agent, world: World) -> None:
    """A crash in the middle of a write to the spool: the next run drops
    the unfinished write, says so once, and replicates as usual."""
    assert agent("run", world.n1, "--once").code == 0
    queues = open_queues(world.n1)
    end = queues._log.next_rba  # type: ignore[attr-defined]
    queues.put_inbound("hq", "hq.n1.d.unfinished.fsm", b"never acknowledged")
    queues.close()
    flip_byte(agent_directory(world.n1) / "spool", end + 12)
    checked = agent("spool", "check", world.n1, "--json")
    torn_tail = json.loads(checked.out)["torn_tail"]
    assert checked.code == 0 and torn_tail["rba"] == end and torn_tail["discarded"] > 0, checked.out
    world.execute("n1", "INSERT INTO customer VALUES (201, 'n1', 'after the crash')")
    result = agent("run", world.n1, "--once")
    assert result.code == 0, result.err
    torn = [line for line in result.err_lines if "did not stop cleanly" in line]
    assert len(torn) == 1 and " WARNING " in torn[0] and str(agent_directory(world.n1) / "spool") in torn[0]
    assert re.search(r"the last \d+ bytes of the spool's log", torn[0]), torn[0]
    assert open_and_close_inbound(world.n1) == []  # the unfinished message was backed out
    sync(agent, world)
    assert (201, "n1", "after the crash") in world.rows("hq", "SELECT id, region, name FROM customer")
    assert "did not stop cleanly" not in agent("run", world.n1, "--once").err  # once repaired, said once


def open_and_close_inbound(database: Path) -> list[str]:
    queues = open_queues(database)
    try:
        return queues.inbound("hq")
    finally:
        queues.close()


def test_messages_in_doubt_after_a_kill_are_reported_as_settled(agent: Agent, world: World) -> None:
    """Killed between an apply's commit and the dequeue's: the next start
    settles the dequeue from the database and says what it found."""
    world.execute("hq", "INSERT INTO customer VALUES (101, 'n1', 'in doubt', 'x')")
    assert agent("run", world.hq, "--once").code == 0
    killed = subprocess.run([*AGENT_COMMAND, "run", str(world.n1), "--once"], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "FIELDSYNC_CRASH": "apply.after-commit"})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (101, "n1", "in doubt") in world.rows("n1")  # applied, but still queued
    result = agent("run", world.n1, "--once")
    assert result.code == 0, result.err
    assert "after an unclean stop, 1 message(s) from hq were in doubt: 1 had been applied (now dequeued), " \
           "0 had not (queued again)" in result.err
    assert world.rows("n1", "SELECT count(*) FROM customer WHERE id = 101") == [(1,)]


def test_a_lost_confirmation_is_repaired_when_data_flows_back(agent: Agent, world: World) -> None:
    """From the CLI alone: n1 sends hq a row, hq applies it, hq's
    confirmation is lost on its way to n1, then hq sends n1 a row: n1's
    stream is confirmed at n1's next run (the confirmation travels with
    hq's data), not a heartbeat later (docs/protocol.md, rule 3)."""
    sync(agent, world)
    world.execute("n1", "INSERT INTO customer VALUES (301, 'n1', 'new at n1')")
    assert agent("run", world.n1, "--once").code == 0
    assert agent("run", world.hq, "--once").code == 0
    assert world.rows("hq", "SELECT id FROM customer WHERE id = 301") == [(301,)]
    confirmations = list(world.inbox("n1").glob("*.c.*"))
    assert len(confirmations) == 1
    confirmations[0].unlink()
    world.execute("hq", "INSERT INTO customer VALUES (302, 'n1', 'new at hq', 'x')")
    assert agent("run", world.hq, "--once").code == 0
    assert agent("run", world.n1, "--once").code == 0
    with SiteDatabase.open(world.n1) as n1:
        stream = n1.remote("hq")
    assert stream.confirm_sent == stream.log_sent > 0
    assert (302, "n1", "new at hq") in world.rows("n1")
