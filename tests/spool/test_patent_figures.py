"""The worked example of EP 0 280 773, Figures 1-4: messages 1-7 over
checkpoints CB1-CB5 with three CPL entries.

After every interval the spool is crashed and restarted; the restart must
position where the patent's interval table says (a failure in interval 4
restarts from CB2, in interval 5 from CB3) and rebuild the figure's state
table.  Selective relogging writes 2 relog records at CB4 and CB5 where
relogging every queued message would write 7."""

from agent.spool import SpoolQueues

PEER = "hq"


def name(number: int) -> str:
    return f"message-{number}"


def content(number: int) -> bytes:
    return f"content of message {number}".encode() * 20


class Figures:
    def __init__(self, path, relog="selective"):
        self.path = path
        self.relog = relog
        self.spool = self._open()
        self.begins = {1: self.spool.last_checkpoint.begin_rba}  # creating the spool is CB1
        self.relogged = {1: self.spool.last_checkpoint.relogged}

    def _open(self):
        return SpoolQueues(self.path, checkpoint_every=10**9, cpl_pairs=3, relog=self.relog)

    def add(self, number):
        self.spool.put_inbound(PEER, name(number), content(number))

    def delete(self, number):
        self.spool.delete_inbound(PEER, [name(number)])

    def checkpoint(self, number):
        stats = self.spool.checkpoint()
        self.begins[number] = stats.begin_rba
        self.relogged[number] = stats.relogged
        return stats

    def crash_and_restart(self):
        """A failure now: drop the process, restart from the log."""
        self.spool._abandon()
        self.spool = self._open()
        return self.spool.last_restart

    def queued(self):
        return self.spool.inbound(PEER)


def expect_queue(figures, numbers):
    assert figures.queued() == sorted(name(number) for number in numbers)
    for number in numbers:
        assert figures.spool.read_inbound(PEER, name(number)) == content(number)


def test_figures_1_to_4_restart_positions_and_state_tables(tmp_path):
    figures = Figures(tmp_path / "spool")

    # Interval 1: 1+ 2+ 3+ 1-.  A failure now rereads from CB1.
    for number in (1, 2, 3):
        figures.add(number)
    figures.delete(1)
    restart = figures.crash_and_restart()
    assert restart.restart_rba == figures.begins[1]
    expect_queue(figures, [2, 3])

    # Figure 1: CB2, nothing old enough to relog; a failure in interval 2 rereads from CB1.
    stats = figures.checkpoint(2)
    assert stats.relogged == 0 and stats.restart_rba == figures.begins[1]
    restart = figures.crash_and_restart()
    assert restart.restart_rba == figures.begins[1]
    expect_queue(figures, [2, 3])

    # Figure 2: 4+ 5+ 3-, CB3; IT3 holds CB1, CB2, CB3.  A failure in interval 3 rereads from CB1.
    figures.add(4)
    figures.add(5)
    figures.delete(3)
    stats = figures.checkpoint(3)
    assert stats.relogged == 0 and stats.restart_rba == figures.begins[1]
    assert [begin for begin, _end in figures.spool.cpl] == [figures.begins[1], figures.begins[2], figures.begins[3]]
    restart = figures.crash_and_restart()
    assert restart.restart_rba == figures.begins[1]
    expect_queue(figures, [2, 4, 5])

    # Figure 3: 4- 6+, CB4 relogs message 2 (2R); IT4 drops CB1.  A failure in
    # interval 4 rereads from CB2: 3- matches nothing, 2R brings message 2 back.
    figures.delete(4)
    figures.add(6)
    stats = figures.checkpoint(4)
    assert stats.relogged == 1 and stats.restart_rba == figures.begins[2]
    assert [begin for begin, _end in figures.spool.cpl] == [figures.begins[2], figures.begins[3], figures.begins[4]]
    restart = figures.crash_and_restart()
    assert restart.restart_rba == figures.begins[2]
    assert restart.relogs_honoured == 1
    assert restart.pending_deletes == 1 and restart.pending_deletes_matched == 0  # "3-: ignored"
    expect_queue(figures, [2, 5, 6])

    # Figure 4: 7+, CB5 relogs message 5 (5R).  A failure in interval 5 rereads from CB3.
    figures.add(7)
    restart = figures.crash_and_restart()  # a failure late in interval 4 still rereads from CB2
    assert restart.restart_rba == figures.begins[2]
    expect_queue(figures, [2, 5, 6, 7])
    stats = figures.checkpoint(5)
    assert stats.relogged == 1 and stats.restart_rba == figures.begins[3]
    restart = figures.crash_and_restart()
    assert restart.restart_rba == figures.begins[3]
    assert restart.relogs_honoured == 2  # 2R and 5R
    expect_queue(figures, [2, 5, 6, 7])

    # Two relog records in all, and the interval-1 records are no longer read.
    assert figures.relogged[4] + figures.relogged[5] == 2
    assert restart.bytes_read < figures.spool.status().end_rba - figures.begins[2]


def test_relogging_everything_writes_seven_records(tmp_path):
    """The prior art the patent improves on (IMS/SNAP): every queued message
    at every checkpoint — 3 at CB4 (2, 5, 6) and 4 at CB5 (2, 5, 6, 7)."""
    figures = Figures(tmp_path / "spool", relog="all")
    for number in (1, 2, 3):
        figures.add(number)
    figures.delete(1)
    figures.checkpoint(2)
    figures.add(4)
    figures.add(5)
    figures.delete(3)
    figures.checkpoint(3)
    figures.delete(4)
    figures.add(6)
    figures.checkpoint(4)
    figures.add(7)
    stats = figures.checkpoint(5)
    assert figures.relogged[4] + figures.relogged[5] == 7
    assert stats.restart_rba == figures.begins[5]  # everything was just relogged
    figures.crash_and_restart()
    expect_queue(figures, [2, 5, 6, 7])


def test_without_relogging_a_failure_in_interval_5_goes_back_to_interval_1(tmp_path):
    figures = Figures(tmp_path / "spool", relog="off")
    for number in (1, 2, 3):
        figures.add(number)
    figures.delete(1)
    figures.checkpoint(2)
    figures.add(4)
    figures.add(5)
    figures.delete(3)
    figures.checkpoint(3)
    figures.delete(4)
    figures.add(6)
    figures.checkpoint(4)
    figures.add(7)
    stats = figures.checkpoint(5)
    assert figures.relogged[4] + figures.relogged[5] == 0
    assert figures.begins[1] < stats.restart_rba < figures.begins[2]  # message 2's first copy, in interval 1
    restart = figures.crash_and_restart()
    assert restart.restart_rba == stats.restart_rba
    expect_queue(figures, [2, 5, 6, 7])


def test_an_empty_queue_points_every_entry_at_the_current_checkpoint(tmp_path):
    """Figure 1's rule, and the optimisation of Figure 3's text: with only
    message 2 left after CB4 its relog copy is all a restart needs."""
    figures = Figures(tmp_path / "spool")
    figures.add(1)
    figures.delete(1)
    stats = figures.checkpoint(2)
    assert stats.restart_rba == figures.begins[2]
    assert {begin for begin, _end in figures.spool.cpl} == {figures.begins[2]}
    for number in (2, 5, 6):
        figures.add(number)
    figures.checkpoint(3)
    figures.checkpoint(4)
    figures.checkpoint(5)  # message 2, 5 and 6 relogged here
    figures.delete(5)
    figures.delete(6)
    stats = figures.checkpoint(6)
    assert stats.restart_rba == figures.begins[5]  # where message 2's relog copy is
    figures.crash_and_restart()
    expect_queue(figures, [2])
