"""contrib/systemd: the agent commands the unit files start work as the
docs say (run here as a service manager would, on a real world of sites)."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from .conftest import AGENT_COMMAND, Agent, World, agent_process, make_world, stop_once_n1_has_data

UNITS = Path(__file__).resolve().parents[2] / "contrib" / "systemd"
AGENT = "/opt/fieldsync/.venv/bin/agent"


def settings(unit: str) -> dict[str, str]:
    found = {}
    for line in (UNITS / unit).read_text().splitlines():
        key, equals, value = line.partition("=")
        if equals and not line.startswith(("#", "[")):
            found[key.strip()] = value.strip()
    return found


def command(unit: str, root: Path, site: str, options: str = "", env_file: dict[str, str] | None = None) -> list[str]:
    """The arguments of the unit's ExecStart for ``site``, as systemd would
    expand them, with the sites in ``root``: ``Environment=`` first, then
    what the instance's env file (``env_file``) sets over it."""
    environment = dict(line.split("=", 1) for line in [settings(unit)["Environment"]])
    environment = {key: value.replace("%i", site).replace("/srv/fieldsync", str(root))
                   for key, value in environment.items()}
    environment.update(env_file or {})
    words = []
    for word in shlex.split(settings(unit)["ExecStart"]):
        if word == "$AGENT_OPTIONS":
            words.extend(options.split())  # systemd: split at whitespace, zero or more words
        elif word.startswith("${") and word.endswith("}"):
            words.append(environment[word[2:-1]])  # systemd: ${NAME} is one word, as it is
        else:
            words.append(word.replace("%i", site).replace("/srv/fieldsync", str(root)))
    assert words[0] == AGENT
    return words[1:]


def test_the_units_run_the_site_the_instance_env_file_names() -> None:
    for unit in ("fieldsync-agent@.service", "fieldsync-agent-batch@.service"):
        assert settings(unit)["EnvironmentFile"] == "-/etc/fieldsync/%i.env"
        uri = "postgresql://fieldsync@db.example.com/sales"
        assert command(unit, Path("/srv/fieldsync"), "hq", env_file={"AGENT_SITE": uri})[:2] == ["run", uri]
        assert command(unit, Path("/srv/fieldsync"), "hq")[:2] == ["run", "/srv/fieldsync/hq.db"]


def test_the_batch_unit_runs_one_batch_and_the_timer_starts_it(tmp_path: Path, agent: Agent) -> None:
    world = make_world(tmp_path, agent)
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'new', 'x')")
    assert settings("fieldsync-agent-batch@.service")["Type"] == "oneshot"
    assert settings("fieldsync-agent-batch@.timer")["OnCalendar"] == "*:0/15"
    done = subprocess.run([*AGENT_COMMAND, *command("fieldsync-agent-batch@.service", tmp_path, "hq", "-O min_age=0")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "hq.db: received 0 messages" in done.stdout
    done = subprocess.run([*AGENT_COMMAND, *command("fieldsync-agent-batch@.service", tmp_path, "n1")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (100, "n1", "new") in world.rows("n1")


def test_the_continuous_unit_stops_on_its_kill_signal_with_exit_code_0(tmp_path: Path, agent: Agent) -> None:
    world: World = make_world(tmp_path, agent)
    unit = settings("fieldsync-agent@.service")
    assert unit["KillSignal"] == "SIGTERM" and unit["Restart"] == "on-failure"
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'while running', 'x')")
    options = "--receive-delay 0.2s --send-delay 0.2s"
    with agent_process(*command("fieldsync-agent@.service", tmp_path, "hq", options), cwd=tmp_path) as process:
        out, err = stop_once_n1_has_data(process, world)
    assert process.returncode == 0, err
    assert "stopped" in err
