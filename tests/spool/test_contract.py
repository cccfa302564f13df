"""The MessageQueues contract: the same behavioural checks against every
implementation (``DirectoryQueues`` and the spool), like a conformance suite."""

import pytest

from agent.queues import DirectoryQueues, QueueDepth, QueueError
from agent.spool import SpoolQueues
from codec.header import Header
from codec.names import Kind, MessageName


def data_name(epoch, prev, last, sender="hq", recipient="f1", seq=0):
    return str(MessageName(sender, recipient, Kind.DATA, Header(epoch, prev, last, seq)))


def control_name(digest, sender="hq", recipient="f1", log_sent=10):
    return str(MessageName(sender, recipient, Kind.CONTROL, Header(0, 0, log_sent, 0), digest))


class Directory:
    def __init__(self, path):
        self.path = path

    def open(self):
        return DirectoryQueues(self.path)


class Spool:
    def __init__(self, path):
        self.path = path

    def open(self):
        return SpoolQueues(self.path, checkpoint_every=7)  # checkpoints in the middle of everything


@pytest.fixture(params=[Directory, Spool], ids=["directory", "spool"])
def store(request, tmp_path):
    store = request.param(tmp_path / "queues")
    opened = []

    def open_():
        queues = store.open()
        opened.append(queues)
        return queues

    store.open_ = open_
    yield store
    for queues in opened:
        queues.close()


def reopen(store, queues):
    queues.close()
    return store.open_()


def test_inbound_put_list_read_delete(store):
    queues = store.open_()
    names = [data_name(0, 10 * i, 10 * i + 10) for i in range(5)]
    for name in reversed(names):  # arrival order is not name order
        queues.put_inbound("hq", name, name.encode() * 3)
    assert queues.inbound("hq") == names
    assert queues.read_inbound("hq", names[2]) == names[2].encode() * 3
    queues.delete_inbound("hq", [names[0], names[3]])
    assert queues.inbound("hq") == [names[1], names[2], names[4]]
    queues.delete_inbound("hq", [names[0], "never-queued.fsm"])  # deleting what is not there is fine
    assert queues.inbound("hq") == [names[1], names[2], names[4]]
    with pytest.raises(QueueError):
        queues.read_inbound("hq", names[0])


def test_outbound_keeps_queue_order_and_reads_back(store):
    queues = store.open_()
    names = [data_name(0, 20, 30), data_name(0, 0, 10), control_name("0123456789abcdef"), data_name(0, 10, 20)]
    for index, name in enumerate(names):
        epoch = None if MessageName.parse(name).kind is Kind.CONTROL else 0
        queues.put_outbound("f1", name, bytes([index]) * 100, epoch)
    assert queues.outbound("f1") == names  # oldest first, not name order
    for index, name in enumerate(names):
        assert queues.read_outbound("f1", name) == bytes([index]) * 100
    queues.delete_outbound("f1", names[1])
    queues.delete_outbound("f1", names[1])
    assert queues.outbound("f1") == [names[0], names[2], names[3]]
    with pytest.raises(QueueError):
        queues.read_outbound("f1", names[1])


def test_putting_a_queued_name_again_keeps_one_copy(store):
    queues = store.open_()
    name = data_name(0, 0, 10)
    queues.put_inbound("hq", name, b"first")
    queues.put_inbound("hq", name, b"second")
    queues.put_outbound("f1", name, b"first", 0)
    queues.put_outbound("f1", name, b"second", 0)
    assert queues.inbound("hq") == [name]
    assert queues.outbound("f1") == [name]
    assert queues.read_inbound("hq", name) == b"first"
    assert queues.read_outbound("f1", name) == b"first"
    queues = reopen(store, queues)
    assert queues.inbound("hq") == [name] and queues.outbound("f1") == [name]


def test_a_name_can_be_queued_again_after_its_delete(store):
    queues = store.open_()
    name = data_name(0, 0, 10)
    queues.put_inbound("hq", name, b"first")
    queues.delete_inbound("hq", [name])
    queues.put_inbound("hq", name, b"again")
    assert queues.read_inbound("hq", name) == b"again"
    queues = reopen(store, queues)
    assert queues.read_inbound("hq", name) == b"again"


def test_purge_outbound_drops_older_epochs_and_keeps_controls(store):
    queues = store.open_()
    old = [data_name(0, 0, 10), data_name(1, 10, 20)]
    current = [data_name(2, 20, 30), data_name(3, 30, 40)]
    control = control_name("fedcba9876543210")
    queues.put_outbound("f1", old[0], b"a", 0)
    queues.put_outbound("f1", control, b"c", None)
    queues.put_outbound("f1", old[1], b"b", 1)
    queues.put_outbound("f1", current[0], b"d", 2)
    queues.put_outbound("f1", current[1], b"e", 3)
    queues.put_outbound("f1", "not-a-message-name", b"f", None)
    assert queues.purge_outbound("f1", 2) == 2
    assert queues.outbound("f1") == [control, current[0], current[1], "not-a-message-name"]
    assert queues.purge_outbound("f1", 2) == 0
    queues = reopen(store, queues)
    assert queues.outbound("f1") == [control, current[0], current[1], "not-a-message-name"]


def test_depths_per_peer(store):
    queues = store.open_()
    queues.put_inbound("hq", data_name(0, 0, 10), b"x")
    queues.put_inbound("hq", data_name(0, 10, 20), b"x")
    queues.put_outbound("hq", data_name(0, 0, 5, "f1", "hq"), b"x", 0)
    queues.put_outbound("f2", data_name(0, 0, 5, "hq", "f2"), b"x", 0)
    assert queues.depths() == [QueueDepth("f2", 0, 1), QueueDepth("hq", 2, 1)]
    queues.delete_outbound("f2", data_name(0, 0, 5, "hq", "f2"))
    assert QueueDepth("f2", 0, 0) in queues.depths()


def test_queues_are_separate_per_peer_and_direction(store):
    queues = store.open_()
    name = data_name(0, 0, 10)
    queues.put_inbound("hq", name, b"in from hq")
    queues.put_outbound("hq", name, b"out to hq", 0)
    queues.put_inbound("f2", name, b"in from f2")
    assert queues.read_inbound("hq", name) == b"in from hq"
    assert queues.read_outbound("hq", name) == b"out to hq"
    assert queues.read_inbound("f2", name) == b"in from f2"
    queues.delete_inbound("hq", [name])
    assert queues.outbound("hq") == [name] and queues.inbound("f2") == [name] and queues.inbound("hq") == []


def test_everything_survives_reopen(store):
    queues = store.open_()
    inbound = [data_name(0, 10 * i, 10 * i + 10) for i in range(12)]
    outbound = [data_name(0, 10 * i, 10 * i + 10, "hq", "f1") for i in range(12)]
    for index, (name_in, name_out) in enumerate(zip(inbound, outbound)):
        queues.put_inbound("f1", name_in, bytes([index]) * (index * 997))
        queues.put_outbound("f1", name_out, bytes([index]) * 31, 0)
        if index % 3 == 0:
            queues.delete_inbound("f1", [name_in])
            queues.delete_outbound("f1", name_out)
    expected_in = [name for index, name in enumerate(inbound) if index % 3]
    expected_out = [name for index, name in enumerate(outbound) if index % 3]
    for _ in range(3):
        queues = reopen(store, queues)
        assert queues.inbound("f1") == expected_in
        assert queues.outbound("f1") == expected_out
        for index, name in enumerate(inbound):
            if index % 3:
                assert queues.read_inbound("f1", name) == bytes([index]) * (index * 997)
    assert queues.depths() == [QueueDepth("f1", len(expected_in), len(expected_out))]


def test_empty_messages_and_large_ones(store):
    queues = store.open_()
    big = bytes(range(256)) * 4096  # 1 MiB
    queues.put_inbound("hq", "empty.fsm", b"")
    queues.put_inbound("hq", "big.fsm", big)
    queues = reopen(store, queues)
    assert queues.read_inbound("hq", "empty.fsm") == b""
    assert queues.read_inbound("hq", "big.fsm") == big


@pytest.mark.parametrize("bad", ["", "../escape", "a/b", ".hidden", "nul\x00byte"])
def test_unsafe_names_are_refused(store, bad):
    queues = store.open_()
    with pytest.raises(QueueError):
        queues.put_inbound("hq", bad, b"x")
    with pytest.raises(QueueError):
        queues.put_outbound("hq", bad, b"x", 0)


def test_close_is_idempotent(store):
    queues = store.open_()
    queues.put_inbound("hq", "a.fsm", b"x")
    queues.close()
    queues.close()
