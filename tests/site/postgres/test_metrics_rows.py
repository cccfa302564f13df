"""The metrics of a PostgreSQL consolidated (agent/site/postgres/metrics_rows.py):
the rows agent/metrics.py reads of a SQLite site, read here from the
database, and the one horizon rule in PostgreSQL's SQL."""

from __future__ import annotations

from datetime import datetime, timezone
from itertools import product

from prometheus_client import generate_latest

from agent.metrics import SiteMetrics, read_site
from agent.site.remote_rules import horizon
from agent.site.postgres.metrics_rows import HORIZON_SQL

MOMENT = datetime(2026, 5, 1, 8, 30, tzinfo=timezone.utc)


def test_the_horizon_sql_is_the_one_horizon_rule(site) -> None:
    # A row that follows the common read position (here 2) reads its log_read as at least there.
    site.execute("UPDATE fieldsync.site SET common_read = 2")
    combos = [(read, sent, confirmed, follows) for read, sent, confirmed in product(range(4), repeat=3)
              for follows in (False, True) if confirmed <= sent]
    values = ", ".join(f"({read}, {sent}, {confirmed}, {follows})" for read, sent, confirmed, follows in combos)
    found = site.execute(f"SELECT {HORIZON_SQL} FROM (VALUES {values})"
                         " AS t(log_read, log_sent, confirm_sent, follows_common)").fetchall()
    assert [row[0] for row in found] == [horizon(max(read, 2) if follows else read, sent, confirmed)
                                         for read, sent, confirmed, follows in combos]


def test_read_site_gives_the_rows_a_sqlite_site_gives(hq, app) -> None:
    hq.add_remote("r1", address="inbox/r1", now=MOMENT)
    hq.add_remote("r2", address="inbox/r2", now=MOMENT)
    app.execute("INSERT INTO customer (name, region) VALUES ('Ann', 'north')")
    end = hq.scan()
    hq.record_send("r1", log_sent=end, now=MOMENT)
    hq.record_transport_error("r2", "host unreachable", now=MOMENT)
    rows = read_site(hq.path)
    assert (rows.site, rows.log_end, rows.conflicts, rows.apply_errors) == ("hq", end, {}, {})
    by_name = {row[0]: row for row in rows.remotes}
    # name, log_sent, confirm_sent, log_received, created_at, last_received_at, last_sent_at, horizon, heard_at,
    # in error
    assert by_name["r1"][:8] == ("r1", end, 0, 0, MOMENT.isoformat(), None, MOMENT.isoformat(), 0)
    assert not by_name["r1"][9]
    assert by_name["r2"][7] == 0 and by_name["r2"][9]  # nothing read for it yet; its error in force


def test_a_metrics_file_of_a_postgresql_site_names_its_remotes(hq) -> None:
    hq.add_remote("r1", address="inbox/r1", now=MOMENT)
    text = generate_latest(SiteMetrics(hq.path, "batch").registry()).decode()
    assert 'fieldsync_peer_log_sent_offset{peer="r1",site="hq"} 0.0' in text


def test_the_schema_version_metric_is_the_last_change_s_offset(hq) -> None:
    text = generate_latest(SiteMetrics(hq.path, "batch").registry()).decode()
    assert "fieldsync_schema_version{" not in text  # absent while there is none
    [offset] = hq.apply_schema(["ALTER TABLE customer ADD COLUMN note text"]).offsets
    assert read_site(hq.path).schema_version == offset
    text = generate_latest(SiteMetrics(hq.path, "batch").registry()).decode()
    assert f'fieldsync_schema_version{{site="hq"}} {float(offset)}' in text

