"""Model-based: random sequences of puts, deletes, purges, dequeues
(committed, aborted or left in doubt), checkpoints, crashes and reopens,
under random spool settings, against a plain Python model of the queues."""

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from agent.spool import SpoolQueues
from codec.header import Header
from codec.names import Kind, MessageName

from .helpers import payload

PEERS = ("hq", "f2")


class SpoolMachine(RuleBasedStateMachine):
    @initialize(checkpoint_every=st.integers(3, 40), cpl_pairs=st.integers(1, 4),
                relog=st.sampled_from(["selective", "selective", "all", "off"]),
                segment_bytes=st.sampled_from([4096, 16384, 1 << 20]),
                relog_by_reference=st.sampled_from([True, True, False]))
    def start(self, checkpoint_every, cpl_pairs, relog, segment_bytes, relog_by_reference):
        self.directory = Path(tempfile.mkdtemp(prefix="spool-model-"))
        self.options = dict(checkpoint_every=checkpoint_every, cpl_pairs=cpl_pairs, relog=relog,
                            segment_bytes=segment_bytes, relog_by_reference=relog_by_reference)
        self.spool = SpoolQueues(self.directory / "spool", **self.options)
        self.inbound = {peer: set() for peer in PEERS}
        self.outbound = {peer: [] for peer in PEERS}
        self.database = {peer: 0 for peer in PEERS}  # log_received, as the site database has it
        self.pending = {}  # peer -> (token, names, applied)
        self.counter = 0

    def teardown(self):
        spool = getattr(self, "spool", None)
        if spool is not None:
            spool.close()
            shutil.rmtree(self.directory, ignore_errors=True)

    def _name(self):
        self.counter += 1
        return self.counter

    @rule(peer=st.sampled_from(PEERS))
    def put_inbound(self, peer):
        name = f"in-{self._name():05d}.fsm"
        self.spool.put_inbound(peer, name, payload("in", peer, name))
        self.inbound[peer].add(name)

    @rule(peer=st.sampled_from(PEERS), epoch=st.integers(0, 3))
    def put_outbound(self, peer, epoch):
        number = self._name()
        name = str(MessageName("hq", peer, Kind.DATA, Header(epoch, number, number + 1)))
        self.spool.put_outbound(peer, name, payload("out", peer, name), epoch)
        self.outbound[peer].append(name)

    @rule(peer=st.sampled_from(PEERS), data=st.data())
    def put_again(self, peer, data):
        names = sorted(self.inbound[peer])
        if names:
            name = data.draw(st.sampled_from(names))
            self.spool.put_inbound(peer, name, b"a second copy is ignored")

    @rule(peer=st.sampled_from(PEERS), data=st.data())
    def delete_inbound(self, peer, data):
        busy = set(self.pending[peer][1]) if peer in self.pending else set()
        names = sorted(self.inbound[peer] - busy)
        if names:
            chosen = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
            self.spool.delete_inbound(peer, chosen + ["never-queued.fsm"])
            self.inbound[peer] -= set(chosen)

    @rule(peer=st.sampled_from(PEERS), data=st.data())
    def delete_outbound(self, peer, data):
        if self.outbound[peer]:
            name = data.draw(st.sampled_from(self.outbound[peer]))
            self.spool.delete_outbound(peer, name)
            self.outbound[peer].remove(name)

    @rule(peer=st.sampled_from(PEERS), below=st.integers(0, 4))
    def purge_outbound(self, peer, below):
        stale = [name for name in self.outbound[peer] if MessageName.parse(name).header.resend_count < below]
        assert self.spool.purge_outbound(peer, below) == len(stale)
        self.outbound[peer] = [name for name in self.outbound[peer] if name not in stale]

    @rule(peer=st.sampled_from(PEERS), data=st.data(), applied=st.booleans())
    def begin_dequeue(self, peer, data, applied):
        names = sorted(self.inbound[peer])
        if names and peer not in self.pending:
            chosen = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=2, unique=True))
            last = self.database[peer] + 10 * (1 + len(self.pending) + self.counter)
            token = self.spool.begin_dequeue(peer, chosen, last)
            if applied:  # the apply's database transaction commits
                self.database[peer] = last
            self.pending[peer] = (token, chosen, applied)

    @precondition(lambda self: self.pending)
    @rule(data=st.data())
    def finish_dequeue(self, data):
        peer = data.draw(st.sampled_from(sorted(self.pending)))
        token, names, applied = self.pending.pop(peer)
        if applied:
            self.spool.commit_dequeue(token)  # lazy: may be lost in a crash
            self.inbound[peer] -= set(names)
        else:
            self.spool.abort_dequeue(token)

    @rule()
    def checkpoint(self):
        self.spool.checkpoint()

    @rule(clean=st.booleans())
    def reopen(self, clean):
        if clean:
            self.spool.close()
        else:
            self.spool._abandon()  # kill -9: what was not yet written is gone
        self.spool = SpoolQueues(self.directory / "spool", **self.options)
        for peer in PEERS:  # the runner's first step, from its database
            self.spool.resolve_in_doubt(peer, self.database[peer])
        for peer, (_token, names, applied) in self.pending.items():
            if applied:
                self.inbound[peer] -= set(names)
        self.pending.clear()
        assert self.spool.in_doubt() == ()

    @invariant()
    def queues_match_the_model(self):
        if not hasattr(self, "spool"):
            return
        for peer in PEERS:
            assert self.spool.inbound(peer) == sorted(self.inbound[peer])
            assert self.spool.outbound(peer) == self.outbound[peer]
        doubts = {doubt.peer for doubt in self.spool.in_doubt()}
        assert doubts == set(self.pending)

    @invariant()
    def contents_match(self):
        if not hasattr(self, "spool") or self.counter % 5:
            return
        for peer in PEERS:
            for name in self.inbound[peer]:
                assert self.spool.read_inbound(peer, name) == payload("in", peer, name)
            for name in self.outbound[peer]:
                assert self.spool.read_outbound(peer, name) == payload("out", peer, name)


SpoolMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None,
                                          suppress_health_check=[HealthCheck.too_slow])
test_spool_against_a_model = SpoolMachine.TestCase
