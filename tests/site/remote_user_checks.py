"""The remote-user table's behaviour, checked the same way on every site
backend: tests/site/test_remotes.py runs these checks on a SQLite site,
tests/site/postgres/test_remotes.py on a PostgreSQL one.

A backend's test class derives from :class:`RemoteUserChecks` and gives the
fixture ``world``: an object with ``site`` (a consolidated site named hq
whose table customer is published in publication p) and

* ``grow_log(rows=3)``: an application inserts ``rows`` customers, one
  transaction each, and the log end grows by ``rows`` at least; returns
  the log end after a scan;
* ``add_apply_error(peer)``: an apply error of a message from ``peer``,
  not acknowledged;
* ``refuse_remote(name)``: adding the remote ``name`` will fail in the
  database (a trigger), with "refused by a test trigger";
* ``in_transaction()``: whether the site's connection is inside a
  transaction.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime, time, timedelta, timezone

import pytest

from agent.site import InvalidSetting, InvariantViolation, RemoteExists, RemoteUser, UnknownPublication, UnknownRemote
from agent.site.remote_rules import COLUMNS, NewRemote, RemoteFilter, plain_values
from agent.site.errors import RemoteRejected

DESIGN_COLUMNS = {
    "name", "log_send", "log_sent", "confirm_sent", "resend_count", "log_received", "confirm_received",
    "rereceive_count", "send_count", "last_sent_at", "receive_count", "last_received_at", "transport", "address",
    "public_key", "send_every", "send_at", "peer_incarnation", "last_error",
}
NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
LATER = datetime(2026, 3, 1, 13, 0, tzinfo=timezone.utc)


def in_error(site) -> list[str]:
    return [row.name for row in site.iter_remotes(RemoteFilter(with_errors=True))]


def fleet(count: int, **extra) -> list[NewRemote]:  # type: ignore[no-untyped-def]
    return [NewRemote(f"r{number:05d}", address=f"inbox/r{number}", transport="folder", **extra)
            for number in range(count)]


class RemoteUserChecks:
    """The checks; ``world`` is the backend's fixture (see the module)."""

    def test_rows_hold_every_design_column(self, world):
        site = world.site
        assert DESIGN_COLUMNS <= {field.name for field in dataclasses.fields(RemoteUser)}
        row = site.add_remote("r1", address="r1@example.org", transport="email",
                              public_key="fieldsync-public r1 A B", send_every=3600, peer_incarnation=b"\x01" * 16,
                              now=NOW)
        assert row == site.remote("r1")
        assert (row.log_send, row.log_sent, row.confirm_sent, row.resend_count) == (0, 0, 0, 0)
        assert (row.log_received, row.confirm_received, row.rereceive_count) == (0, 0, 0)
        assert (row.send_count, row.receive_count, row.last_sent_at, row.last_received_at) == (0, 0, None, None)
        assert (row.address, row.transport, row.send_every, row.send_at) == ("r1@example.org", "email", 3600, None)
        assert row.public_key == "fieldsync-public r1 A B" and row.peer_incarnation == b"\x01" * 16
        assert row.created_at == NOW and row.created_at.tzinfo == timezone.utc
        with pytest.raises(dataclasses.FrozenInstanceError):
            row.log_sent = 5  # type: ignore[misc]

    def test_a_new_remote_starts_at_the_log_end(self, world):
        site = world.site
        end = world.grow_log()
        row = site.add_remote("r1")
        assert end > 0 and row.log_sent == row.confirm_sent == row.log_send == end
        assert site.add_remote("r0", start=0).log_sent == 0
        with pytest.raises(InvariantViolation):
            site.add_remote("r9", start=end + 1)

    def test_list_add_remove(self, world):
        site = world.site
        site.add_remote("b")
        site.add_remote("a")
        assert [row.name for row in site.remotes()] == ["a", "b"]
        with pytest.raises(RemoteExists):
            site.add_remote("a")
        with pytest.raises(InvalidSetting, match="its own remote"):
            site.add_remote("hq")
        site.subscribe("a", "p")
        site.set_transport(peer="a", options={"smtp_host": "mail.example.org"})
        site.remove_remote("a")
        assert [row.name for row in site.remotes()] == ["b"]
        assert site.subscriptions() == ()
        assert site.transport_options("a") == {}
        with pytest.raises(UnknownRemote):
            site.remove_remote("a")
        with pytest.raises(UnknownRemote):
            site.remote("a")

    def test_protocol_fields_are_updated_in_short_transactions(self, world):
        site = world.site
        end = world.grow_log()
        site.add_remote("r1", start=0)
        row = site.update_remote("r1", log_send=end, log_sent=end, confirm_sent=2, resend_count=1,
                                 log_received=40, confirm_received=40, rereceive_count=3)
        assert (row.log_send, row.log_sent, row.confirm_sent, row.resend_count) == (end, end, 2, 1)
        assert (row.log_received, row.confirm_received, row.rereceive_count) == (40, 40, 3)
        assert not world.in_transaction()
        # A resend request: log_sent goes back to confirm_sent.
        assert site.update_remote("r1", log_sent=2).log_sent == 2

    @pytest.mark.parametrize("changes, message", [
        ({"confirm_sent": 3}, "exceed log_sent"),
        ({"log_sent": 10_000}, "beyond the log end"),
    ])
    def test_invariants_are_kept(self, world, changes, message):
        world.grow_log()
        world.site.add_remote("r1", start=0)
        with pytest.raises(InvariantViolation, match=message):
            world.site.update_remote("r1", **changes)

    @pytest.mark.parametrize("column", ["confirm_sent", "resend_count", "log_received", "confirm_received",
                                        "rereceive_count"])
    def test_counters_never_go_back(self, world, column):
        site = world.site
        end = world.grow_log()
        site.add_remote("r1", start=0)
        site.update_remote("r1", log_sent=end)
        site.update_remote("r1", **{column: 2})
        with pytest.raises(InvariantViolation, match="cannot go back"):
            site.update_remote("r1", **{column: 1})
        assert getattr(site.remote("r1"), column) == 2

    def test_bad_updates_are_refused(self, world):
        site = world.site
        site.add_remote("r1")
        with pytest.raises(InvalidSetting, match="cannot be updated"):
            site.update_remote("r1", name="other")
        with pytest.raises(InvalidSetting):
            site.update_remote("r1", log_sent=-1)
        with pytest.raises(InvalidSetting):
            site.update_remote("r1", resend_count="2")
        with pytest.raises(UnknownRemote):
            site.update_remote("ghost", log_sent=0)

    def test_send_schedule(self, world):
        site = world.site
        assert site.add_remote("r1", send_at="18:30").send_at == time(18, 30)
        with pytest.raises(InvalidSetting, match="not both"):
            site.add_remote("r2", send_every=60, send_at="18:30")
        with pytest.raises(InvalidSetting):
            site.add_remote("r3", send_every=0)
        with pytest.raises(InvalidSetting):
            site.add_remote("r4", send_at="half past six")
        row = site.update_remote("r1", send_every=900, send_at=None)
        assert (row.send_every, row.send_at) == (900, None)
        with pytest.raises(InvalidSetting, match="not both"):
            site.update_remote("r1", send_at=time(6, 0))

    def test_sends_and_errors_are_recorded(self, world):
        site = world.site
        end = world.grow_log()
        site.add_remote("r1", start=0)
        row = site.record_send("r1", log_sent=end, messages=3, now=NOW)
        assert (row.log_sent, row.send_count, row.last_sent_at) == (end, 3, NOW)
        assert site.record_send("r1", log_sent=end, now=NOW).send_count == 4
        row = site.record_transport_error("r1", "SMTP 421 try again later", now=NOW)
        assert (row.last_error, row.last_error_at) == ("SMTP 421 try again later", NOW)
        assert (row.error_count, row.error_seen_at) == (1, NOW)
        row = site.record_transport_error("r1", None)
        assert (row.last_error, row.last_error_at) == (None, None)
        assert (row.error_count, row.error_seen_at) == (1, NOW)  # the history stays

    def test_record_sends_records_each_in_one_transaction(self, world):
        site = world.site
        end = world.grow_log()
        site.add_remote("r1", start=0)
        site.add_remote("r2", start=0)
        site.record_sends([("r1", end, 2), ("r2", end, 1)], now=NOW)
        assert [(row.log_sent, row.send_count, row.last_sent_at) for row in site.remotes()] == [
            (end, 2, NOW), (end, 1, NOW)]
        with pytest.raises(InvariantViolation):
            site.record_sends([("r1", end, 1), ("r2", end + 1, 1)], now=LATER)
        assert site.remote("r1").send_count == 2  # nothing of the refused transaction stays

    def test_a_delivery_ends_the_transport_error_in_force_and_not_a_stopped_stream(self, world):
        site = world.site
        site.add_remote("r1")
        site.add_remote("r2")
        site.record_transport_error("r1", "folder gone", now=NOW)
        site.record_stream_stopped("r2", "r2 changed its incarnation id", now=NOW)
        site.record_transport_error("r2", "folder gone", now=NOW)
        assert in_error(site) == ["r1", "r2"]
        site.record_delivered({"r1": 2, "r2": 1}, now=LATER)
        r1, r2 = site.remote("r1"), site.remote("r2")
        assert (r1.last_error, r1.last_error_at, r1.error_count, r1.error_seen_at) == (None, None, 1, NOW)
        assert (r1.send_count, r1.last_sent_at) == (2, LATER)
        assert (r2.last_error, r2.stream_stopped, r2.stream_stopped_at) == (None, "r2 changed its incarnation id", NOW)
        assert r2.error_count == 2
        assert in_error(site) == ["r2"]

    def test_hearing_from_a_peer_ends_its_errors_in_force_and_only_its_own(self, world):
        site = world.site
        site.add_remote("r1")
        site.add_remote("r2")
        site.record_stream_stopped("r1", "stopped", now=NOW)
        site.record_transport_error("r1", "folder gone", now=NOW)
        site.record_transport_error("r2", "folder gone", now=LATER)
        site.update_remotes({"r1": {"heard_at": 12.5}}, heard=["r1"])
        r1, r2 = site.remote("r1"), site.remote("r2")
        assert (r1.heard_at, r1.last_error, r1.stream_stopped, r1.stream_stopped_at) == (12.5, None, None, None)
        assert (r1.error_count, r1.error_seen_at) == (2, NOW)
        assert (r2.last_error, r2.error_seen_at) == ("folder gone", LATER)
        assert in_error(site) == ["r2"]
        site.record_transport_error("r2", "again", now=LATER)
        site.record_heard(["r2"])
        assert in_error(site) == []
        with pytest.raises(InvalidSetting):
            site.record_stream_stopped("r2", "")
        with pytest.raises(UnknownRemote):
            site.record_stream_stopped("nobody", "stopped")

    def test_sending_due(self, world):
        end = world.grow_log()
        row = world.site.add_remote("r1", start=0)
        assert not row.sending_due
        assert world.site.update_remote("r1", log_send=end).sending_due

    def test_update_remotes_checks_each_row_as_update_remote_does(self, world):
        """The bulk path the agent saves its pairs with keeps every
        invariant: one bad row refuses the whole transaction."""
        site = world.site
        for name in ("r1", "r2"):
            site.add_remote(name)
        site.update_remotes({"r1": {"control_sent_at": 12.5, "confirm_received": 0}, "r2": {"log_read": 0}})
        assert site.remote("r1").control_sent_at == 12.5
        with pytest.raises(InvariantViolation, match="log_read"):
            site.update_remotes({"r1": {"control_sent_at": 13.0}, "r2": {"log_read": site.log_end() + 5}})
        assert site.remote("r1").control_sent_at == 12.5  # nothing of the refused transaction stays
        with pytest.raises(InvariantViolation, match="confirm_sent"):
            site.update_remotes({"r2": {"confirm_sent": 1}})
        incarnation = b"\x07" * 16  # not a pair column: through update_remote, in the same transaction
        site.update_remotes({"r1": {"peer_incarnation": incarnation, "confirm_owed": True}})
        assert (site.remote("r1").peer_incarnation, site.remote("r1").confirm_owed) == (incarnation, True)

    def test_update_remotes_stores_each_rows_own_values_exactly(self, world):
        """Rows saved together, with different sets of pair columns: each
        row gets its own values, clock readings to the last bit (infinite
        ones too), and a row left out keeps its own."""
        site = world.site
        end = world.grow_log()
        for name in ("r1", "r2", "r3", "r4"):
            site.add_remote(name, start=0)
        site.update_remotes({
            "r1": {"log_read": end, "log_sent": end, "confirm_sent": 1, "heard_at": 1717000000.1234567,
                   "confirm_owed": True, "probes": 2},
            "r2": {"log_read": 1, "log_sent": 2, "confirm_sent": 0, "heard_at": float("inf"), "confirm_owed": False,
                   "probes": 0},
            "r3": {"control_sent_at": 0.1, "data_sent_at": None, "resend_count": 2 ** 40}})
        r1, r2, r3, r4 = (site.remote(name) for name in ("r1", "r2", "r3", "r4"))
        assert (r1.log_read, r1.log_sent, r1.confirm_sent, r1.heard_at, r1.confirm_owed, r1.probes) == (
            end, end, 1, 1717000000.1234567, True, 2)
        assert (r2.log_read, r2.log_sent, r2.confirm_sent, r2.heard_at, r2.confirm_owed, r2.probes) == (
            1, 2, 0, float("inf"), False, 0)
        assert (r3.control_sent_at, r3.data_sent_at, r3.resend_count, r3.log_sent) == (0.1, None, 2 ** 40, 0)
        assert (r4.log_sent, r4.heard_at, r4.probes) == (0, None, 0)

    def test_update_remotes_writes_read_moves_in_groups_with_every_check(self, world):
        """Rows whose only change is where the log was read (``log_send``,
        ``log_read``: a send phase moves them for every idle peer of a
        fleet) are written a statement per group of values: each row gets
        its own, the others keep theirs, and a bad value or a name that is
        no remote refuses the whole transaction."""
        site = world.site
        end = world.grow_log()
        for name in ("r1", "r2", "r3", "r4"):
            site.add_remote(name, start=0)
        site.update_remotes({"r1": {"log_send": end, "log_read": end}, "r2": {"log_send": end, "log_read": end},
                             "r3": {"log_read": 1}})
        rows = {name: site.remote(name) for name in ("r1", "r2", "r3", "r4")}
        assert [(rows[name].log_send, rows[name].log_read) for name in ("r1", "r2", "r3", "r4")] == [
            (end, end), (end, end), (0, 1), (0, 0)]
        with pytest.raises(UnknownRemote):
            site.update_remotes({"r4": {"log_read": end}, "nobody": {"log_read": end}})
        assert site.remote("r4").log_read == 0  # nothing of the refused transaction stays
        with pytest.raises(InvalidSetting, match="log_send"):
            site.update_remotes({"r4": {"log_read": end}, "r3": {"log_send": -1}})
        with pytest.raises(InvariantViolation, match="log_read"):
            site.update_remotes({"r4": {"log_read": end}, "r3": {"log_send": end, "log_read": end + 1}})
        # A change is checked once for all given it, by value and type: True is no 1.
        with pytest.raises(InvalidSetting, match="log_read"):
            site.update_remotes({"r4": {"log_read": 1}, "r3": {"log_read": True}})
        assert (site.remote("r4").log_read, site.remote("r3").log_send) == (0, 0)

    # --- a fleet at once (add_remotes) -----------------------------------------------

    def test_add_remotes_adds_rows_and_subscriptions_at_the_log_end(self, world) -> None:
        site = world.site
        world.grow_log()
        end = site.log_end()
        remotes = [NewRemote("north", address="inbox/north", send_at="18:30", subscriptions=(("p", None),)),
                   NewRemote("south", address="inbox/south", send_every=600, subscriptions=(("p", 7), ("p", 7.5)))]
        assert site.add_remotes(remotes, now=NOW) == 3
        north, south = site.remote("north"), site.remote("south")
        assert (north.log_send, north.log_sent, north.confirm_sent) == (end, end, end)
        assert (north.send_at, north.send_every, north.created_at) == (time(18, 30), None, NOW)
        assert (south.send_every, south.address) == (600, "inbox/south")
        assert [(item.remote, item.value) for item in site.subscriptions()] == [
            ("north", None), ("south", 7), ("south", 7.5)]

    def test_add_remotes_keeps_one_of_a_repeated_subscription(self, world) -> None:
        world.site.add_remotes([NewRemote("north", subscriptions=(("p", 7), ("p", 7), ("p", "7")))])
        assert [item.value for item in world.site.subscriptions("north")] == [7, "7"]

    @pytest.mark.parametrize("problem, index, error", [
        ("taken", 1500, RemoteExists), ("twice", 2500, InvalidSetting), ("own name", 10, InvalidSetting),
        ("unknown publication", 2999, UnknownPublication),
    ])
    def test_add_remotes_refuses_the_whole_list_naming_the_remote(self, world, problem, index, error) -> None:
        site = world.site
        site.add_remote("taken")
        remotes = fleet(3000)
        replacement = {"taken": NewRemote("taken"), "twice": NewRemote("r00001"), "own name": NewRemote("hq"),
                       "unknown publication": NewRemote("r02999", subscriptions=(("nosuch", None),))}[problem]
        remotes[index] = replacement
        with pytest.raises(RemoteRejected) as raised:
            site.add_remotes(remotes)
        assert raised.value.index == index
        assert isinstance(raised.value.reason, error)
        assert [row.name for row in site.remotes()] == ["taken"]

    def test_add_remotes_is_one_transaction(self, world) -> None:
        # A failure while the third chunk is written leaves none of the first two.
        world.refuse_remote("r02500")
        with pytest.raises(Exception, match="refused by a test trigger"):
            world.site.add_remotes(fleet(3000))
        assert world.site.remotes() == ()
        assert world.site.subscriptions() == ()

    def test_add_remotes_reports_progress_by_chunk(self, world) -> None:
        seen: list[int] = []
        world.site.add_remotes(fleet(2500), progress=seen.append)
        assert seen == [1000, 1000, 500]
        assert len(world.site.remotes()) == 2500

    # --- reading a fleet's rows (iter_remotes, RemoteFilter) -----------------------------

    def test_iter_remotes_reads_every_row_by_name_a_chunk_at_a_time(self, world) -> None:
        site = world.site
        site.add_remotes(list(reversed(fleet(25))))
        rows = site.iter_remotes(chunk=10)
        assert next(rows).name == "r00000"
        assert [row.name for row in rows] == [f"r{number:05d}" for number in range(1, 25)]
        assert tuple(site.iter_remotes()) == site.remotes()

    def test_iter_remote_values_are_the_rows_plain_values(self, world) -> None:
        """The rows iter_remotes reads, as remote_rules.plain_values makes
        them, whatever wrote their columns: times in UTC, a time of day, an
        incarnation id, a flag, the agent's clock, errors."""
        site = world.site
        site.add_remotes(fleet(3, send_at="18:30"), now=NOW)
        site.add_remote("east", address="east@example.org", transport="email", public_key="fieldsync-public e A B",
                        send_every=3600, peer_incarnation=bytes(range(16)), now=NOW)
        site.add_remote("west", send_at=time(6, 15, 30, 250), peer_incarnation=b"\xff" * 16,
                        now=datetime(2026, 3, 1, 14, 0, tzinfo=timezone(timedelta(hours=2))))
        end = world.grow_log()
        site.record_send("east", log_sent=end, now=LATER)
        site.update_remote("east", last_received_at=LATER.replace(microsecond=0), heard_at=1795239284.75,
                           control_sent_at=1795239284.0, confirm_owed=True, heartbeat=600, peer_schema_version=3)
        site.record_transport_error("r00001", "no route to host", now=NOW)
        site.record_stream_stopped("r00002", "the peer's copy changed", now=LATER)
        rows = site.remotes()
        values = tuple(site.iter_remote_values(chunk=2))
        assert values == tuple(map(plain_values, rows))
        assert {type(value) for row in values for value in row} == {str, int, float, type(None)}
        east = dict(zip(COLUMNS, values[0]))
        assert (east["name"], east["peer_incarnation"], east["confirm_owed"]) == (
            "east", "00010203-0405-0607-0809-0a0b0c0d0e0f", 1)
        assert east["last_sent_at"] == LATER.isoformat() and east["send_at"] is None
        west = dict(zip(COLUMNS, values[-1]))
        assert (west["send_at"], west["created_at"]) == ("06:15:30.000250", "2026-03-01T12:00:00+00:00")
        assert dict(zip(COLUMNS, values[1]))["send_at"] == "18:30:00"
        for which in ({"with_errors": True}, {"lagging": True}, {"silent_since": LATER}):
            assert [row[0] for row in site.iter_remote_values(RemoteFilter(**which))] == [
                row.name for row in site.iter_remotes(RemoteFilter(**which))], which

    def test_remote_filters(self, world) -> None:
        site = world.site
        site.add_remotes(fleet(4), now=NOW)
        world.grow_log()
        end = site.scan()
        site.record_send("r00000", log_sent=end)
        site.update_remote("r00000", confirm_sent=end, last_received_at=NOW.replace(day=5))
        site.record_transport_error("r00002", "no route to host", now=NOW)
        world.add_apply_error("r00003")

        def names(**which):  # type: ignore[no-untyped-def]
            return [row.name for row in site.iter_remotes(RemoteFilter(**which))]

        assert names() == ["r00000", "r00001", "r00002", "r00003"]
        assert names(lagging=True) == ["r00001", "r00002", "r00003"]
        assert names(with_errors=True) == ["r00002", "r00003"]
        # Heard from on the 5th; the others never, and were added on the 1st.
        assert names(silent_since=NOW.replace(day=3)) == ["r00001", "r00002", "r00003"]
        assert names(silent_since=NOW.replace(day=6)) == ["r00000", "r00001", "r00002", "r00003"]
        assert names(silent_since=NOW) == []
        assert names(lagging=True, with_errors=True, silent_since=NOW.replace(day=3)) == ["r00002", "r00003"]
        site.update_remote("r00001", heard_at=NOW.replace(day=7).timestamp())
        assert names(silent_since=NOW.replace(day=6)) == ["r00000", "r00002", "r00003"]
        with pytest.raises(InvalidSetting):
            RemoteFilter(silent_since=datetime(2026, 3, 1))

    def test_counts(self, world) -> None:
        world.site.add_remotes(fleet(3))
        world.add_apply_error("r00001")
        assert world.site.counts() == {"remotes": 3, "conflicts": 0, "apply_errors": 1}

    def test_remote_transports_lists_each_once_none_first(self, world) -> None:
        site = world.site
        for name, transport in (("a", "sftp"), ("b", None), ("c", "email"), ("d", "sftp")):
            site.add_remote(name, transport=transport)
        assert site.remote_transports() == (None, "email", "sftp")

    def test_replaced_incarnations_start_empty(self, world) -> None:
        world.site.add_remote("r1")
        assert world.site.replaced_incarnations("r1") == frozenset()
        assert world.site.all_replaced_incarnations() == {}

    def test_transport_settings(self, world) -> None:
        site = world.site
        site.add_remote("north", address="inbox/north")
        site.set_transport(address="imaps://mail.example.org/hq", reply_address="mailto:hq@example.org",
                           transport="email", options={"smtp_host": "mail.example.org", "imap_port": "993"})
        identity = site.identity
        assert (identity.address, identity.reply_address, identity.transport) == (
            "imaps://mail.example.org/hq", "mailto:hq@example.org", "email")
        assert identity.send_address == "mailto:hq@example.org"
        site.set_transport(peer="north", inbox="imaps://mail.example.org/north", options={"smtp_port": "2525"})
        assert site.remote("north").inbox == "imaps://mail.example.org/north"
        assert site.transport_options() == {"imap_port": "993", "smtp_host": "mail.example.org"}
        assert site.transport_options("north") == {"smtp_port": "2525"}
        assert site.all_transport_options() == {"": {"imap_port": "993", "smtp_host": "mail.example.org"},
                                                "north": {"smtp_port": "2525"}}
        site.set_transport(reply_address="", options={"imap_port": None})
        assert site.identity.reply_address is None and site.transport_options() == {"smtp_host": "mail.example.org"}
        with pytest.raises(InvalidSetting, match="secret"):
            site.set_transport(options={"smtp_password": "hunter2"})
        with pytest.raises(UnknownRemote):
            site.set_transport(peer="ghost", options={"smtp_port": "25"})
