"""Schema versions (docs/protocol.md, "Schema versions"): each site's, and
the one each remote reports to its consolidated, in ``agent status`` and
the metrics."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import msgpack
from prometheus_client.parser import text_string_to_metric_families

from agent.keyfiles import load_site_keys
from agent.site import open_site
from codec.header import Header
from codec.message import compress, frame
from codec.names import Kind, MessageName

from .conftest import Agent, World, sync


def status(agent: Agent, database: Path) -> dict:
    result = agent("status", database, "--json")
    assert result.code == 0, result.err
    return json.loads(result.out)


def reported(agent: Agent, world: World) -> dict[str, int | None]:
    return {row["name"]: row["peer_schema_version"] for row in status(agent, world.hq)["remotes"]}


def gauges(path: Path) -> dict[tuple[str, str | None], float]:
    return {(sample.name, sample.labels.get("peer")): sample.value
            for family in text_string_to_metric_families(path.read_text()) for sample in family.samples
            if sample.name in ("fieldsync_schema_version", "fieldsync_peer_schema_version")}


def control_versions(world: World) -> list[int]:
    """The format versions of the control files waiting in hq's inbox."""
    return [path.read_bytes()[4] for path in sorted(world.inbox("hq").glob("n1.hq.c.*.fsm"))]


def change_offset(agent: Agent, world: World, sql: str) -> int:
    changed = agent("schema", "apply", world.hq, sql)
    assert changed.code == 0, changed.err
    return int(changed.out.split("Schema change at offset ")[1].split(":")[0])


def test_a_remote_reports_the_change_it_applied_and_hq_shows_it_after_a_round(agent: Agent, whole: World,
                                                                               tmp_path: Path) -> None:
    world = whole
    # Before any change: no site has a schema version, no remote reports one
    # (their control messages are the version-1 files of before).
    assert status(agent, world.hq)["site"]["schema_version"] is None
    assert reported(agent, world) == {"n1": None, "n2": None}
    world.execute("hq", "INSERT INTO customer VALUES (100, 'n1', 'data', NULL)")
    assert agent("run", world.hq, "--once").code == 0
    assert agent("run", world.n1, "--once").code == 0  # n1 confirms in a version-1 file, as before
    assert control_versions(world) == [1]
    assert agent("run", world.hq, "--once").code == 0

    offset = change_offset(agent, world, "ALTER TABLE customer ADD COLUMN phone TEXT DEFAULT ''")
    assert status(agent, world.hq)["site"]["schema_version"] == offset
    assert agent("run", world.hq, "--once").code == 0
    assert agent("run", world.n1, "--once").code == 0  # n1 applies it and confirms, telling its version
    assert status(agent, world.n1)["site"]["schema_version"] == offset
    assert control_versions(world) == [3]
    assert reported(agent, world) == {"n1": None, "n2": None}  # not yet read at hq
    metrics = tmp_path / "hq.prom"
    assert agent("run", world.hq, "--once", "--metrics-file", metrics).code == 0
    assert reported(agent, world) == {"n1": offset, "n2": None}  # n2 has not applied it: it says nothing
    assert gauges(metrics) == {("fieldsync_schema_version", None): offset,
                               ("fieldsync_peer_schema_version", "n1"): offset}
    human = agent("status", world.hq)
    assert f"schema version {offset} · log end" in human.out

    later = change_offset(agent, world, "CREATE INDEX customer_name ON customer (name)")
    sync(agent, world)
    assert reported(agent, world) == {"n1": later, "n2": later}
    # An idle round writes nothing for it: the value did not change.
    before = world.rows("hq", "SELECT name, peer_schema_version, heard_at FROM fieldsync_remote ORDER BY name")
    assert agent("run", world.hq, "--once").code == 0
    assert world.rows("hq", "SELECT name, peer_schema_version, heard_at FROM fieldsync_remote ORDER BY name") == before


def test_a_remote_extracted_after_a_change_starts_at_hq_s_version(agent: Agent, whole: World) -> None:
    world = whole
    offset = change_offset(agent, world, "ALTER TABLE customer ADD COLUMN phone TEXT DEFAULT ''")
    sync(agent, world)
    assert reported(agent, world)["n2"] == offset
    world.n2.unlink()
    for leftover in world.root.glob("n2.db-*"):
        leftover.unlink()
    shutil.rmtree(world.root / "n2.db.agent")
    extracted = agent("extract", world.hq, "n2", world.n2)
    assert extracted.code == 0, extracted.err
    assert status(agent, world.n2)["site"]["schema_version"] == offset
    assert reported(agent, world)["n2"] is None  # the new copy has not reported yet
    sync(agent, world)
    assert reported(agent, world)["n2"] == offset


def test_a_hostile_schema_version_is_set_aside_with_one_line(agent: Agent, whole: World) -> None:
    world = whole
    with open_site(world.n1) as n1:
        keys, incarnation = load_site_keys(n1), n1.identity.incarnation
    for hostile in (-1, 2**63, "923400"):
        payload = msgpack.packb([0, 1, 0, 1, hostile])
        header = Header(1, 0, 0, 0)
        data = frame(Kind.CONTROL, header, keys=keys, recipient="hq", incarnation=incarnation,
                     raw_length=len(payload), compressed=compress(payload), version=3)
        name = MessageName("n1", "hq", Kind.CONTROL, header, hashlib.sha256(data).hexdigest()[:16])
        (world.inbox("hq") / str(name)).write_bytes(data)
    result = agent("run", world.hq, "--once")
    assert result.code == 0, result.err
    assert "quarantined 3" in result.out, result.out
    reasons = [json.loads(path.read_text())["reason"]
               for path in (world.root / "hq.db.agent" / "quarantine").glob("*.reason.json")]
    assert len(reasons) == 3 and all("\n" not in reason for reason in reasons)
    assert all(reason.startswith("n1.hq.c.") and "schema_version must be an integer in 0..9223372036854775807"
               in reason for reason in reasons), reasons
    assert reported(agent, world) == {"n1": None, "n2": None}


def test_a_change_that_reaches_no_remote_leaves_them_current_once_they_confirmed_it(agent: Agent, whole: World,
                                                                                     tmp_path: Path) -> None:
    """A table no remote receives: the consolidated's version moves, the
    remotes' do not (nothing reached them), yet once they confirmed the log
    through the change they run hq's schema of now: `schema_current` and
    its gauge say so; before, they say behind."""
    world = whole
    assert status(agent, world.hq)["remotes"][0]["schema_current"] is None  # no change yet
    changed = agent("schema", "apply", world.hq, "CREATE TABLE visit_log (id INTEGER PRIMARY KEY, note TEXT)",
                    "CREATE INDEX visit_note ON visit_log (note)")
    assert "It changes nothing a remote receives" in changed.out, changed.err
    offset = status(agent, world.hq)["site"]["schema_version"]
    assert offset is not None
    before = {row["name"]: row["schema_current"] for row in status(agent, world.hq)["remotes"]}
    assert before == {"n1": False, "n2": False}
    assert "behind" in agent("status", world.hq).out
    sync(agent, world)
    remotes = {row["name"]: row for row in status(agent, world.hq)["remotes"]}
    assert {name: (row["peer_schema_version"], row["schema_current"]) for name, row in remotes.items()} == {
        "n1": (None, True), "n2": (None, True)}
    # Nothing was sent them: they confirmed all they were sent, and the log was read for them through the change.
    assert all(row["confirm_sent"] < offset <= row["log_read"] for row in remotes.values())
    assert "behind" not in agent("status", world.hq).out
    metrics = tmp_path / "hq.prom"
    assert agent("run", world.hq, "--once", "--metrics-file", metrics).code == 0
    current = {sample.labels["peer"]: sample.value for family in text_string_to_metric_families(metrics.read_text())
               for sample in family.samples if sample.name == "fieldsync_peer_schema_current"}
    assert current == {"n1": 1.0, "n2": 1.0}
    # At a remote the key is null and the gauge absent: its peer is the consolidated.
    assert [row["schema_current"] for row in status(agent, world.n1)["remotes"]] == [None]
