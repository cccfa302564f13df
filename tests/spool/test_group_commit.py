"""Group commit: one fsync covers the units of recovery that commit
together, and nobody returns before its records are durable."""

import threading

from agent.spool import SpoolQueues
from agent.spool._format import Direction


def test_concurrent_units_share_fsyncs(tmp_path):
    spool = SpoolQueues(tmp_path / "spool", checkpoint_every=10**9)
    before = spool.counters.group_commits
    barrier = threading.Barrier(8)
    durable_at_return = []

    def producer(index):
        barrier.wait()
        for number in range(40):
            name = f"m-{index}-{number}.fsm"
            spool.put_outbound(f"site{index}", name, b"x" * 1024, 0)
            block = spool._lookup[(Direction.OUTBOUND, f"site{index}")].by_name(name)
            durable_at_return.append(spool._log.durable_rba >= block.crba + block.length)
            spool.delete_outbound(f"site{index}", name)

    threads = [threading.Thread(target=producer, args=(index,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    units = 8 * 40 * 2
    fsyncs = spool.counters.group_commits - before
    assert all(durable_at_return) and len(durable_at_return) == 320
    assert fsyncs < units * 0.75, f"{fsyncs} fsyncs for {units} units"
    spool.close()


def test_a_group_commit_block_waits_once(tmp_path):
    spool = SpoolQueues(tmp_path / "spool", checkpoint_every=10**9)
    before = spool.counters.group_commits
    with spool.group_commit():
        for number in range(100):
            spool.put_inbound("hq", f"m{number:03d}.fsm", b"y" * 100)
        assert spool._log.durable_rba < spool._log.next_rba  # nothing waited yet
    assert spool._log.durable_rba == spool._log.next_rba
    assert spool.counters.group_commits - before == 1
    spool._abandon()
    spool = SpoolQueues(tmp_path / "spool")
    assert len(spool.inbound("hq")) == 100
    spool.close()


def test_a_large_group_commit_block_writes_as_it_goes(tmp_path, monkeypatch):
    """A block's records wait in memory until written: past
    GROUP_COMMIT_BUFFER a put waits for them, so a send of thousands of
    messages holds that much, not all of them."""
    import agent.spool._spool

    monkeypatch.setattr(agent.spool._spool, "GROUP_COMMIT_BUFFER", 10_000)
    spool = SpoolQueues(tmp_path / "spool", checkpoint_every=10**9)
    before = spool.counters.group_commits
    with spool.group_commit():
        for number in range(100):
            spool.put_outbound("r1", f"m{number:03d}.fsm", b"z" * 1000, 0)
            assert spool._log.next_rba - spool._log.durable_rba <= 10_000 + 2000
    assert spool._log.durable_rba == spool._log.next_rba
    assert 5 <= spool.counters.group_commits - before <= 12
    spool._abandon()
    spool = SpoolQueues(tmp_path / "spool")
    assert len(spool.outbound("r1")) == 100
    spool.close()
