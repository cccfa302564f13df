"""agent run --metrics-file / --metrics-port (agent/metrics.py, docs/metrics.md):
real sites on disk, real runs, the output parsed as Prometheus parses it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from agent.site import SiteDatabase
from codec.header import Header
from codec.names import Kind, MessageName
from tests.transports.servers import free_port

from .conftest import Agent, World, agent_process

DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(text: str) -> Samples:
    """Every sample by (name, sorted labels), as Prometheus' parser reads the text."""
    found: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(found: Samples, name: str, **labels: str) -> float:
    return found[(name, tuple(sorted(labels.items())))]


def scrape(url: str, process: subprocess.Popen[str], seconds: float = 30) -> str:
    """The endpoint's text, once it answers (the agent starts in a process of its own)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                return response.read().decode()
        except (urllib.error.URLError, ConnectionError):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, f"nothing served at {url}"
            time.sleep(0.1)


def test_a_batch_run_writes_the_file_with_what_it_replicated(agent: Agent, world: World, tmp_path: Path) -> None:
    world.execute("n1", "INSERT INTO customer VALUES (500, 'n1', 'from n1')")
    assert agent("run", world.n1, "--once").code == 0
    folder = tmp_path / "textfile"
    folder.mkdir()
    target = folder / "fieldsync-hq.prom"
    before = time.time()
    result = agent("run", world.hq, "--once", "--metrics-file", target)
    after = time.time()
    assert result.code == 0, result.err
    assert world.rows("hq", "SELECT id FROM customer WHERE id = 500") == [(500,)]
    received = int(re.search(r"received (\d+) messages", result.out).group(1))
    found = samples(target.read_text())
    with SiteDatabase.open(world.hq) as site:
        rows = {remote.name: remote for remote in site.remotes()}
        end = site.log_end()
    with SiteDatabase.open(world.n1) as site:
        n1_end = site.log_end()
    assert value(found, "fieldsync_peers", site="hq") == 2
    assert value(found, "fieldsync_log_end_offset", site="hq") == end
    for peer in ("n1", "n2"):
        row = rows[peer]
        assert value(found, "fieldsync_peer_log_sent_offset", site="hq", peer=peer) == row.log_sent
        assert value(found, "fieldsync_peer_confirm_sent_offset", site="hq", peer=peer) == row.confirm_sent
        assert value(found, "fieldsync_peer_send_lag_offsets", site="hq", peer=peer) == end - row.horizon
        assert value(found, "fieldsync_peer_outbound_queue_messages", site="hq", peer=peer) == 0
        assert value(found, "fieldsync_peer_created_timestamp_seconds", site="hq", peer=peer) == \
            row.created_at.timestamp()
    # n1's row arrived: hq applied n1's log to its end, and knows it has all n1 said it sent.
    assert value(found, "fieldsync_peer_log_received_offset", site="hq", peer="n1") == n1_end > 0
    assert value(found, "fieldsync_peer_receive_lag_offsets", site="hq", peer="n1") == 0
    heard = value(found, "fieldsync_peer_last_received_timestamp_seconds", site="hq", peer="n1")
    assert heard == rows["n1"].last_received_at.timestamp() and before <= heard <= after
    assert ("fieldsync_peer_last_received_timestamp_seconds", (("peer", "n2"), ("site", "hq"))) not in found
    # The run's figures are the run's summary.
    assert value(found, "fieldsync_last_run_received_files", site="hq") == received > 0
    assert value(found, "fieldsync_last_run_applied_messages", site="hq") == 1
    assert value(found, "fieldsync_last_run_sent_files", site="hq") == int(re.search(r"sent (\d+)", result.out).group(1))
    assert value(found, "fieldsync_last_run_quarantined_files", site="hq") == 0
    assert value(found, "fieldsync_last_run_success", site="hq") == 1
    start = value(found, "fieldsync_last_run_start_timestamp_seconds", site="hq")
    ended = value(found, "fieldsync_last_run_end_timestamp_seconds", site="hq")
    assert before <= start <= ended <= after
    assert value(found, "fieldsync_last_run_duration_seconds", site="hq") == pytest.approx(ended - start)
    assert not any(name.startswith("fieldsync_") and name.endswith("_total") for name, _ in found)


def test_a_refused_apply_counts_as_a_local_error_not_a_transport_error(agent: Agent, world: World, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.site.errors import SiteError

    world.execute("n1", "INSERT INTO customer VALUES (501, 'n1', 'from n1')")
    assert agent("run", world.n1, "--once").code == 0

    def refused(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise SiteError("database is locked")

    monkeypatch.setattr(SiteDatabase, "apply", refused)
    target = tmp_path / "hq.prom"
    assert agent("run", world.hq, "--once", "--metrics-file", target).code == 1
    found = samples(target.read_text())
    assert value(found, "fieldsync_last_run_local_errors", site="hq") >= 1  # each attempt, repeats included
    assert value(found, "fieldsync_last_run_transport_errors", site="hq") == 0
    assert value(found, "fieldsync_last_run_success", site="hq") == 0


def test_the_file_is_replaced_whole_by_a_rename(agent: Agent, world: World, tmp_path: Path) -> None:
    target = tmp_path / "hq.prom"
    assert agent("run", world.hq, "--once", "--metrics-file", target).code == 0
    first = target.stat()
    reader = target.open()  # what a collector reading during the next run holds
    assert agent("run", world.hq, "--once", "--metrics-file", target).code == 0
    second = target.stat()
    # A new file took the name (an in-place write would keep the inode and
    # could be read half-written); the old one is intact for its reader.
    assert second.st_ino != first.st_ino
    assert samples(reader.read())[("fieldsync_peers", (("site", "hq"),))] == 2
    reader.close()
    assert oct(second.st_mode & 0o777) == oct(0o644)
    assert sorted(path.name for path in tmp_path.iterdir() if "prom" in path.name) == ["hq.prom"]


def test_quarantined_files_and_waiting_messages_are_counted(agent: Agent, world: World, tmp_path: Path) -> None:
    name = str(MessageName("n1", "hq", Kind.DATA, Header(1, 0, 9, 0)))
    (world.inbox("hq") / name).write_bytes(b"\x00garbage that claims to come from n1" * 20)
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'new', 'x')")
    target = tmp_path / "hq.prom"
    result = agent("run", world.hq, "--once", "--metrics-file", target)
    assert result.code == 0, result.err
    found = samples(target.read_text())
    assert value(found, "fieldsync_quarantine_files", site="hq") == 1
    assert value(found, "fieldsync_peer_quarantined_files", site="hq", peer="n1") == 1
    assert value(found, "fieldsync_peer_quarantined_files", site="hq", peer="n2") == 0
    assert value(found, "fieldsync_last_run_quarantined_files", site="hq") == 1


def test_the_endpoint_serves_a_continuous_agent_on_127_0_0_1(world: World, tmp_path: Path) -> None:
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'new', 'x')")
    port = free_port()
    target = tmp_path / "hq.prom"
    with agent_process("run", world.hq, "--metrics-port", port, "--metrics-file", target,
                       "-rd", "1s", "-sd", "1s") as process:
        url = f"http://127.0.0.1:{port}/metrics"
        deadline = time.monotonic() + 30
        while True:  # until the first send cycle has counted its files
            found = samples(scrape(url, process))
            sent = found.get(("fieldsync_sent_files_total", (("site", "hq"),)), 0)
            if sent >= 1:  # n1's row; n2 has nothing, so it is sent no file
                break
            assert time.monotonic() < deadline, found
            time.sleep(0.2)
        assert value(found, "fieldsync_peers", site="hq") == 2
        assert value(found, "fieldsync_peer_log_sent_offset", site="hq", peer="n1") > 0
        assert ("fieldsync_agent_start_timestamp_seconds", (("site", "hq"),)) in found
        with socket.socket() as listening:  # bound to the loopback address only, not to every interface
            assert listening.connect_ex(("127.0.0.1", port)) == 0
        while not target.exists():  # rewritten at every poll
            assert time.monotonic() < deadline + 30
            time.sleep(0.1)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
    assert f"metrics of {world.hq} at {url}" in err
    with socket.socket() as after:
        assert after.connect_ex(("127.0.0.1", port)) != 0  # the server stopped with the agent
    final = samples(target.read_text())  # written once more as the agent stopped
    assert value(final, "fieldsync_sent_files_total", site="hq") == sent


def test_the_server_listens_where_it_is_told(world: World) -> None:
    port = free_port()
    with agent_process("run", world.hq, "--metrics-port", port, "--metrics-address", "127.0.0.2",
                       "-rd", "1s") as process:
        text = scrape(f"http://127.0.0.2:{port}/metrics", process)
        with socket.socket() as other:
            assert other.connect_ex(("127.0.0.1", port)) != 0
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=60)
    assert "fieldsync_peers" in text


def test_a_port_in_use_stops_the_agent_with_one_line(agent: Agent, world: World) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = agent("run", world.hq, "--metrics-port", taken.getsockname()[1], "-rd", "1s")
    assert result.code == 1
    assert len(result.err_lines) == 1, result.err
    assert result.err_lines[0].startswith("agent: cannot serve metrics on 127.0.0.1 port ")
    assert "choose another --metrics-port" in result.err_lines[0]


@pytest.mark.parametrize("arguments, text", [
    (("--metrics-port", "0"), "'--metrics-port': 0 is not in the range 1<=x<=65535"),
    (("--metrics-port", "65536"), "'--metrics-port'"),
    (("--metrics-port", "soon"), "'soon' is not a whole number"),
    (("--metrics-port", "9817", "--metrics-address", "localhost"), "'localhost' is not an IP address"),
    (("--metrics-address", "127.0.0.1"), "--metrics-address is where --metrics-port listens"),
    (("--once", "--metrics-port", "9817"), "--metrics-port serves a continuous agent"),
    (("--once", "--metrics-file", "hq.txt"), "the name must end in .prom"),
    (("--once", "--metrics-file", "nosuch/hq.prom"), "there is no folder nosuch"),
])
def test_bad_metrics_options_are_one_line_and_exit_2(agent: Agent, world: World, monkeypatch: pytest.MonkeyPatch,
                                                     arguments: tuple[str, ...], text: str) -> None:
    monkeypatch.chdir(world.root)
    result = agent("run", world.hq, *arguments)
    assert result.code == 2, result
    assert len(result.err_lines) == 1, result.err
    assert result.err_lines[0].startswith("agent: ") and text in result.err_lines[0], result.err_lines
    assert "fieldsync_" not in result.out and not list(world.root.glob("*.prom"))


def test_a_folder_as_the_metrics_file_is_a_usage_error(agent: Agent, world: World, tmp_path: Path) -> None:
    folder = tmp_path / "taken.prom"
    folder.mkdir()
    result = agent("run", world.hq, "--once", "--metrics-file", folder)
    assert result.code == 2 and len(result.err_lines) == 1 and "is a directory" in result.err


# -- docs/metrics.md ------------------------------------------------------------------------------------


def doc_commands() -> list[list[str]]:
    """The `agent run` lines of the doc's sh blocks, split as a shell would."""
    blocks = re.findall(r"```sh\n(.*?)```", DOC.read_text(), re.S)
    return [shlex.split(line) for block in blocks for line in block.splitlines() if line.startswith("agent run ")]


def test_the_docs_commands_work(agent: Agent, world: World, tmp_path: Path) -> None:
    commands = doc_commands()
    assert len(commands) == 2
    textfiles = tmp_path / "node-exporter"
    textfiles.mkdir()

    def local(word: str) -> str:
        return (word.replace("/srv/fieldsync", str(world.root))
                .replace("/var/lib/prometheus/node-exporter", str(textfiles)))

    batch, continuous = commands
    assert "--once" in batch and "--once" not in continuous
    world.execute("n1", "INSERT INTO customer VALUES (500, 'n1', 'from n1')")
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'new', 'x')")
    # A schema change n1 applies and reports: the schema versions have samples.
    assert agent("schema", "apply", world.hq, "CREATE INDEX customer_name ON customer (name)").code == 0
    assert agent("run", world.hq, "--once").code == 0
    assert agent("run", world.n1, "--once").code == 0  # so that hq receives and sends
    assert agent(*[local(word) for word in batch[1:]]).code == 0
    written = samples((textfiles / "fieldsync-hq.prom").read_text())
    port = free_port()
    arguments = [local(word) if word != "9817" else str(port) for word in continuous[1:]]
    with agent_process(*arguments, "-rd", "1s") as process:
        # Served once the agent is open; the receive lag (the agent's own figure) shows it runs.
        text = scrape(f"http://127.0.0.1:{port}/metrics", process)
        deadline = time.monotonic() + 30
        while "fieldsync_peer_receive_lag_offsets{" not in text and time.monotonic() < deadline:
            time.sleep(0.1)
            text = scrape(f"http://127.0.0.1:{port}/metrics", process)
        served = samples(text)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    # Every metric the doc's tables and alert rules name is in the output of one of the two.
    text = DOC.read_text()
    named = set(re.findall(r"`(fieldsync_[a-z_]+)`", text)) | set(re.findall(r"\b(fieldsync_[a-z_]+)\b", text))
    produced = {name for name, _ in written} | {name for name, _ in served}
    named -= {"fieldsync_conflict", "fieldsync_apply_error"}  # the tables' names
    assert named <= produced, named - produced
    assert {name for name in produced if name.startswith("fieldsync_")} <= named


def test_the_site_label_keeps_two_sites_files_apart(agent: Agent, world: World, tmp_path: Path) -> None:
    for site in ("hq", "n1"):
        assert agent("run", world.root / f"{site}.db", "--once", "--metrics-file", tmp_path / f"{site}.prom").code == 0
    hq, n1 = (samples((tmp_path / f"{site}.prom").read_text()) for site in ("hq", "n1"))
    assert not set(hq) & set(n1)  # no series in both files: node_exporter would refuse a duplicate
    assert value(n1, "fieldsync_peers", site="n1") == 1
    assert os.path.exists(tmp_path / "hq.prom")


def test_a_peer_that_sends_no_data_is_heard_from(agent: Agent, world: World, tmp_path: Path) -> None:
    """n1 changes nothing: it sends hq only control messages (a heartbeat,
    then confirmations), and the alert's gauge still moves for it."""
    assert agent("run", world.n1, "--once").code == 0
    before = time.time()
    target = tmp_path / "hq.prom"
    assert agent("run", world.hq, "--once", "--metrics-file", target).code == 0
    found = samples(target.read_text())
    assert ("fieldsync_peer_last_received_timestamp_seconds", (("peer", "n1"), ("site", "hq"))) not in found
    heard = value(found, "fieldsync_peer_last_heard_timestamp_seconds", site="hq", peer="n1")
    assert before - 60 <= heard <= time.time()


def test_the_in_error_gauge_fires_and_resolves(agent: Agent, world: World, tmp_path: Path) -> None:
    """fieldsync_peer_in_error follows `agent status --errors`: 1 while n2's
    inbox is gone and while n1's apply error is not acknowledged, 0 once
    the queued files went out and the error was acknowledged."""
    target = tmp_path / "hq.prom"

    def in_error() -> dict[str, float]:
        assert agent("run", world.hq, "--once", "--metrics-file", target).code in (0, 1)
        found = samples(target.read_text())
        return {peer: value(found, "fieldsync_peer_in_error", site="hq", peer=peer) for peer in ("n1", "n2")}

    assert in_error() == {"n1": 0, "n2": 0}
    world.execute("n1", "INSERT INTO customer VALUES (2, 'n1', 'clashes with hq row 2')")  # an apply error at hq
    assert agent("run", world.n1, "--once").code == 0
    shutil.rmtree(world.inbox("n2"))
    world.execute("hq", "INSERT INTO customer VALUES (300, 'n2', 'for n2', 'x')")
    assert in_error() == {"n1": 1, "n2": 1}
    world.inbox("n2").mkdir()
    assert in_error() == {"n1": 1, "n2": 0}
    assert agent("remote", "ack-errors", world.hq, "n1").code == 0
    found = in_error()
    assert found == {"n1": 0, "n2": 0}
    assert value(samples(target.read_text()), "fieldsync_peer_apply_errors", site="hq", peer="n1") == 1  # history


def doc_meanings() -> dict[str, str]:
    """Each metric's meaning in docs/metrics.md's tables, as the rule at
    the top of the doc compares it: backquotes dropped, spacing normalised."""
    rows = re.findall(r"^\| `(fieldsync_[a-z_]+)` \| (?:gauge|counter) \| (.*) \|$", DOC.read_text(), re.M)
    meanings = {name: " ".join(cell.replace("`", "").split()) for name, cell in rows}
    assert len(meanings) == len(rows), "a metric has two rows"
    return meanings


def help_texts(text: str) -> dict[str, str]:
    """Each metric's HELP text as the exposition gives it (a counter under
    its name with _total, as the doc names it), unescaped as Prometheus does."""
    lines = re.findall(r"^# HELP (\S+) (.*)$", text, re.M)
    return {name: re.sub(r"\\(.)", lambda escape: "\n" if escape.group(1) == "n" else escape.group(1), help_text)
            for name, help_text in lines}


def help_drift(helps: dict[str, str], meanings: dict[str, str]) -> list[str]:
    """Where a HELP text breaks the doc's rule: the metric's meaning begins
    with it word for word, and anything after it starts a further sentence."""
    drift = []
    for name, help_text in sorted(helps.items()):
        said = " ".join(help_text.split())
        meaning = meanings.get(name)
        if meaning is None:
            drift.append(f"{name}: no row in docs/metrics.md")
        elif not said.endswith(".") or "|" in said or "`" in said:
            drift.append(f"{name}: HELP must be whole sentences with no | or backquote: {said!r}")
        elif meaning != said and not meaning.startswith(said + " "):
            drift.append(f"{name}:\n  HELP: {said}\n  doc:  {meaning}")
    return drift


def test_every_metric_means_in_the_doc_what_its_help_text_says(world: World, agent: Agent, tmp_path: Path) -> None:
    """The rule at the top of docs/metrics.md, for every metric a batch
    run's file, a continuous agent's file and its endpoint give."""
    world.execute("n1", "INSERT INTO customer VALUES (502, 'n1', 'from n1')")
    assert agent("run", world.n1, "--once").code == 0
    batch_file, continuous_file = tmp_path / "batch.prom", tmp_path / "continuous.prom"
    assert agent("run", world.hq, "--once", "--metrics-file", batch_file).code == 0
    port = free_port()
    with agent_process("run", world.hq, "--metrics-port", port, "--metrics-file", continuous_file,
                       "-rd", "1s", "-sd", "1s") as process:
        url = f"http://127.0.0.1:{port}/metrics"
        served = scrape(url, process)
        deadline = time.monotonic() + 30
        while "# HELP fieldsync_agent_start_timestamp_seconds " not in served:  # the agent has opened
            assert time.monotonic() < deadline, served
            time.sleep(0.1)
            served = scrape(url, process)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
    meanings = doc_meanings()
    outputs = {"batch file": batch_file.read_text(), "continuous file": continuous_file.read_text(),
               "endpoint": served}
    given: set[str] = set()
    for where, text in outputs.items():
        helps = help_texts(text)
        assert helps, where
        drift = help_drift(helps, meanings)
        assert not drift, f"{where}: the HELP text and docs/metrics.md disagree:\n" + "\n".join(drift)
        given |= set(helps)
    assert given == set(meanings), "documented without a HELP text, or the other way round"


def test_the_drift_check_catches_a_changed_meaning() -> None:
    """The check above fails when either side changes alone."""
    meanings = {"fieldsync_x": "Files sent. They are counted once."}
    assert help_drift({"fieldsync_x": "Files sent."}, meanings) == []
    assert help_drift({"fieldsync_x": "Files  sent.\nOnce."}, {"fieldsync_x": "Files sent. Once."}) == []
    assert help_drift({"fieldsync_x": "Data files sent."}, meanings)
    assert help_drift({"fieldsync_x": "Files sent"}, {"fieldsync_x": "Files sent out."})  # not a whole sentence
    assert help_drift({"fieldsync_y": "Files sent."}, meanings)
    assert help_texts("# HELP fieldsync_x a \\\\ b\\nc\n# TYPE fieldsync_x gauge\n") == {"fieldsync_x": "a \\ b\nc"}


def test_the_sent_metrics_say_data_and_control_as_the_doc_does() -> None:
    """Control files stamp last_sent_at and count as sent files too: the
    HELP texts and docs/metrics.md say so alike."""
    from agent.metrics import _PEER_GAUGES, _RUN_COUNTS

    help_of = {name: text for name, text, _ in _PEER_GAUGES}
    run_help = {f"fieldsync_last_run_{suffix}": text for suffix, _, text in _RUN_COUNTS}
    for name, text in (("fieldsync_peer_last_sent_timestamp_seconds", help_of),
                       ("fieldsync_last_run_sent_files", run_help)):
        row = re.search(rf"^\| `{name}` \| gauge \| (.*) \|$", DOC.read_text(), re.M)
        assert row is not None, name
        assert "data" in text[name] and "control" in text[name] and "data" in row.group(1) \
            and "control" in row.group(1), (name, text[name], row.group(1))
        assert "queued for sending" not in text[name]


def test_the_doc_lists_every_metric_and_no_other(agent: Agent, world: World, tmp_path: Path) -> None:
    """docs/metrics.md's tables name exactly the metrics a batch run's file
    holds plus a continuous agent's own (its start and its counters)."""
    from agent.metrics import _RUN_COUNTS

    documented = set(re.findall(r"^\| `(fieldsync_[a-z_]+)` \| (?:gauge|counter) \|", DOC.read_text(), re.M))
    target = tmp_path / "all.prom"
    world.execute("n1", "INSERT INTO customer VALUES (501, 'n1', 'from n1')")
    # A schema change n1 applies and reports: the schema versions have samples.
    assert agent("schema", "apply", world.hq, "CREATE INDEX customer_name ON customer (name)").code == 0
    assert agent("run", world.hq, "--once").code == 0
    assert agent("run", world.n1, "--once").code == 0
    assert agent("run", world.hq, "--once", "--metrics-file", target).code == 0
    batch = {name for name, _ in samples(target.read_text())}
    continuous = {"fieldsync_agent_start_timestamp_seconds"} | {f"fieldsync_{suffix}_total"
                                                               for suffix, _, _ in _RUN_COUNTS}
    assert documented == batch | continuous
