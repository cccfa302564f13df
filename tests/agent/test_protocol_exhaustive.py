"""An exhaustive check of the pure protocol core (docs/protocol.md, rules 1-8
and the Invariants), on the two-way simulation of tests/agent/duplexsim.py.

Two sites, A and B, each with commits made at the start and packed one per
message (so up to 3 data messages each way, more after resends); every
schedule of up to two faults (three in a few cases), each injected at any
point between two site runs on any file in flight (data or control):

* ``drop``: the file is lost;
* ``duplicate``: a copy arrives one delivery after the original;
* ``delay``: the file skips one delivery, so it arrives after files sent
  later (the sites receive a delivery in name order, as the folder
  transport lists it, so this is how a reorder shows);
* ``corrupt``: the file fails its checks (set aside, ``message_rejected``);
* ``redeliver``: the data file a site applied last arrives there again (a
  late duplicate, after the original was applied).

Between the faults, and after them, the sites run in turn (A, B, A, ...),
each run a whole ``agent run --once``; virtual time advances by half a
confirm timeout a run, so one confirm timeout per clean round (a run of
each site).  The heartbeat is disabled: only rule 3's confirmations,
answers and probes, and rule 4's resend requests repair a loss.

The exploration is breadth-first over the sans-I/O states, deduplicated by
a canonical key (``Duplex.key``: both sites' persisted PairStates, inboxes,
logs, truncation points, applied lists and in-flight files; times as ages
capped where no rule can tell them apart, and ``heard_at``, which no rule
reads, left out).  The protocol objects are rebuilt at every run from the
persisted state and the inbox (as ``run --once`` does), and the simulation
asserts at the end of each run that nothing is left in them: no Apply or
SendData under way, no resend timer, the pending messages are the inbox's.
So their in-memory fields (_pending, _by_prev, _applying, _sending,
_resend_request; _stopped stays None, _log_start comes from the site's
truncation point) hold nothing between runs, and the key is the whole
state.  Since the clean continuation of a state is deterministic, every
state is a possible "after the last fault" point, and the check is: from
every reachable state the clean runs reach rest (``Duplex.at_rest``) within
the bound, and then go quiet (nothing in flight, nothing sent any more).
The invariants I1, I2, I3 and rule 8 are asserted after every run of every
schedule.

Run time: about 8 s for the whole file on a 2-core machine (the largest
exploration, three faults on 3+3 commits, visits about 20,000 states).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import pytest

from agent.protocol import DeleteInbound, PairProtocol, PairState, Settings
from codec.header import Header

from .duplexsim import INCARNATION, OTHER, Duplex

CONFIRM_TIMEOUT = 3600.0
STEP = CONFIRM_TIMEOUT / 2  # a run; a clean round (one run of each site) is one confirm timeout
FAULTS = ("drop", "duplicate", "delay", "corrupt", "redeliver")
LIMIT = 60  # runs without reaching a known state: the chain is taken to go on for ever


@dataclass
class Exploration:
    states: int = 0
    seconds: float = 0.0
    worst_rest: int = 0  # runs from the worst state to rest
    worst_quiet: int = 0  # runs from the worst state until nothing is sent any more
    witness: list[str] = field(default_factory=list)  # a schedule to the worst state
    errors: list[str] = field(default_factory=list)  # sends that failed (the runner reports them)


def _faulted(sim: Duplex, kinds: tuple[str, ...]):
    """Every way one fault of ``kinds`` can hit what is in flight now."""
    for dest in ("A", "B"):
        applied = sim.sites[dest].last_applied
        if "redeliver" in kinds and applied is not None:
            copy = sim.clone()
            copy.flight[dest].append((0, applied))
            yield f"redeliver {applied.name} to {dest}", copy
        seen = set()
        for index, (hold, file) in enumerate(sim.flight[dest]):
            if (hold, file.name, file.corrupt) in seen:
                continue
            seen.add((hold, file.name, file.corrupt))
            for kind in kinds:
                if kind.endswith("-control"):  # the same fault, of control messages only
                    if file.is_data:
                        continue
                    kind = kind.removesuffix("-control")
                if kind == "redeliver" or (kind == "corrupt" and file.corrupt):
                    continue
                copy = sim.clone()
                files = copy.flight[dest]
                if kind == "drop":
                    del files[index]
                elif kind == "duplicate":
                    files.append((hold + 1, file))
                elif kind == "delay":
                    files[index] = (hold + 1, file)
                else:
                    files[index] = (hold, replace(file, corrupt=True))
                yield f"{kind} {file.name} to {dest}", copy


def explore(start: Duplex, layers: list[tuple[str, ...]], *, every_state: bool = True) -> Exploration:
    """Breadth-first over the states of every schedule whose i-th fault is
    one of ``layers[i]``, each at any point between two runs.  With
    ``every_state`` a schedule may stop making faults at any point, and
    every state is checked; otherwise it makes them all, and only the
    states after its last fault are.  A state is known by its key (and,
    when the layers' fault kinds differ, the number of faults made; with
    the same kinds at every step a state reached again after more faults
    has no future the first one, reached with the fewest, lacks)."""
    began = time.perf_counter()
    uniform = len(set(layers)) <= 1
    ids: dict[tuple, int] = {}
    clean: list[int] = []  # each state's successor by the next clean run (-1: none yet)
    at_rest: list[bool] = []
    quiet: list[bool] = []  # at rest, nothing in flight, nothing owed: nothing is sent any more
    parent: list[tuple[int, str]] = []
    errors: set[str] = set()

    def known(number: int, turn: str, sim: Duplex) -> tuple[tuple, int | None]:
        key = (0 if uniform else number, turn, sim.key())
        return key, ids.get(key)

    def register(key: tuple, sim: Duplex, before: int, label: str) -> int:
        ids[key] = len(clean)
        clean.append(-1)
        at_rest.append(sim.at_rest())
        quiet.append(at_rest[-1] and not any(sim.flight.values())
                     and not any(site.state.confirm_owed for site in sim.sites.values()))
        parent.append((before, label))
        return ids[key]

    def follow(sim: Duplex, turn: str, index: int, number: int) -> list[tuple[Duplex, str, int]]:
        """The clean runs from a state, until one reaches a known state."""
        reached = []
        for _ in range(LIMIT):
            sim = sim.clone()
            sim.now += STEP
            sim.run(turn)
            sim.check_invariants()
            errors.update(sim.errors)
            turn = OTHER[turn]
            key, seen = known(number, turn, sim)
            if seen is not None:
                clean[index] = seen
                return reached
            clean[index] = index = register(key, sim, index, f"run {OTHER[turn]}")
            reached.append((sim, turn, index))
        raise AssertionError(f"no end after {LIMIT} clean runs: {_schedule(parent, index)}")

    key, _ = known(0, "A", start)
    root = register(key, start, -1, "start")
    layer = [(start, "A", root)] + follow(start, "A", root, 0)
    heads: dict[int, tuple[int, str]] = {}  # the states after the last fault, and how each was reached
    for number, kinds in enumerate(layers, 1):
        following = []
        for sim, turn, index in layer:
            for label, faulty in _faulted(sim, kinds):
                key, seen = known(number, turn, faulty)
                if seen is None:
                    seen = register(key, faulty, index, label)
                    reached = follow(faulty, turn, seen, number)
                    if number < len(layers):  # more faults to come from these
                        following += [(faulty, turn, seen)] + reached
                if number == len(layers):
                    heads[seen] = (index, label)
        layer = following
    if every_state:
        heads = {index: parent[index] for index in range(len(clean))}
    rest_distance = _distances(clean, at_rest)
    quiet_distance = _distances(clean, quiet)
    for index in range(len(clean)):  # quiet is for ever: a quiet state's clean run is quiet
        assert not quiet[index] or quiet[clean[index]], f"quiet, then sent again: {_schedule(parent, index)}"
    worst_rest = max(heads, key=lambda index: rest_distance[index])
    worst_quiet = max(quiet_distance[index] for index in heads)
    before, label = heads[worst_rest]
    return Exploration(len(clean), time.perf_counter() - began, rest_distance[worst_rest], worst_quiet,
                       _schedule(parent, before) + [label], sorted(errors))


def _distances(successor: list[int], goal: list[bool]) -> list[float]:
    """Clean runs from each state until ``goal`` (inf: never)."""
    distance: list[float | None] = [0 if reached else None for reached in goal]
    for start in range(len(successor)):
        path, index, on_path = [], start, set()
        while distance[index] is None and index not in on_path and successor[index] >= 0:
            on_path.add(index)
            path.append(index)
            index = successor[index]
        if distance[index] is None:
            distance[index] = math.inf  # a cycle, or the end of a chain, without reaching the goal
        runs = distance[index]
        for index in reversed(path):
            runs += 1
            distance[index] = runs
    return distance  # type: ignore[return-value]


def _schedule(parent: list[tuple[int, str]], index: int) -> list[str]:
    steps = []
    while index >= 0:
        index, label = parent[index][0], parent[index][1]
        steps.append(label)
    return steps[::-1]


def duplex(commits_a: int = 3, commits_b: int = 3, **options) -> Duplex:
    options.setdefault("confirm_timeout", CONFIRM_TIMEOUT)
    return Duplex(commits_a, commits_b, heartbeat=None, **options)


# The bound, in runs from any state (in particular the one right after the
# last fault) to rest, with patience p (polls), resend urgency 0 (batch
# runs) and a run every half confirm timeout.  A repair is a chain: the
# receiver learns of a loss from the publisher's log_sent (its next data or
# control, at the latest the probe a confirm timeout, two of its runs,
# after its last message), waits p more polls (2p runs) with the gap, asks
# for a resend (rule 4); the publisher resends in its next run, the
# receiver applies and confirms in its next, the publisher has the
# confirmation in its next (3 runs).  One fault, the last data message
# lost: 2 + 1 + 2p + 3 = 6 + 2p.  Each further fault can hit the repair
# and double one of its waits (a lost confirmation, probe answer or resend
# is repaired sooner: by the probe, the answer to it, or the next request):
#   * k probes lost: the next one goes 2^k confirm timeouts (2^(k+1) runs)
#     after the last, then as above: 2^(k+1) + 1 + 2p + 3;
#   * k resend requests lost: the next one needs 2^k p polls, so it goes at
#     the receiver's (2^k p + 1)-th run, then 3 runs: 2^(k+1) p + 5 at most;
#     sooner when the publisher's probe (a confirm timeout after its last
#     message) still announces the gap, which sets the patience back to p
#     (rule 4): the worst cases below are under this branch of the bound.
# With f faults, k = f - 1 (a mix only shortens it: once the receiver knows
# of the gap, a lost probe delays nothing).  Data flowing back tells the
# receiver of the gap sooner, so publishing both ways only shortens it.
def bound(patience: int, faults: int = 2) -> int:
    """Runs to rest after the last of ``faults`` faults (2 faults, p = 1:
    10 runs, 5 clean rounds)."""
    return max(2 ** faults + 2 * patience + 4, 2 ** faults * patience + 5)


@pytest.mark.parametrize("commits, options, faults, worst", [
    # A and B both publish; data flowing back repairs a lost probe sooner: 8 runs.
    ((3, 3), {}, 2, 8),
    # Only A publishes: a lost probe is repaired by the next one, 8 + 2p runs.
    ((3, 0), {}, 2, bound(1)),
    ((0, 3), {}, 2, bound(1)),
    # Two messages of three commits and one of one each way.
    ((4, 4), {"per_message": 3}, 2, 8),
    # A lost resend request: the doubled patience, cut short by the probe: 2p + 6 runs.
    ((3, 3), {"patience": 2}, 2, 10),
    ((1, 1), {"patience": 3}, 2, 12),
    # The peer's commits applied here add nothing to the log for it (no echo entries).
    ((3, 3), {"echo": False}, 2, 8),
    # Three faults: two probes lost (12 + 2p), or two requests (under 8p + 5).
    ((3, 0), {}, 3, bound(1, 3)),
    ((3, 3), {}, 3, 10),
    ((2, 2), {"patience": 3}, 3, 17),
], ids=["3+3", "3+0", "0+3", "4+4-by-3", "3+3-patience-2", "1+1-patience-3", "3+3-no-echo",
        "3+0-three-faults", "3+3-three-faults", "2+2-patience-3-three-faults"])
def test_every_schedule_of_faults_reaches_rest_within_the_bound(commits, options, faults, worst):
    """Rule 3's bounds and I5 for the pure core: after any two (or three)
    faults, every state comes to rest within ``bound(patience, faults)``
    runs (half a confirm timeout each: ceil(bound / 2) clean rounds of
    virtual time, a confirm timeout each), then goes quiet; the invariants
    hold all along."""
    options = dict(options)
    patience = options.pop("patience", 1)
    start = duplex(*commits, settings=Settings(patience=patience, resend_urgency=0.0), **options)
    result = explore(start, [FAULTS] * faults)
    assert result.errors == []
    assert result.worst_rest <= bound(patience, faults), result.witness
    assert result.worst_quiet <= bound(patience, faults), "rest, then nothing more is sent (no heartbeat)"
    # The exploration is not vacuous: its worst schedule takes what the
    # derivation says (a change here means the derivation needs a new look).
    assert result.worst_rest == worst, result.witness
    assert result.states > 500


@pytest.mark.parametrize("switch, found", [("unsafe_without_stale_rule", "I3: stale applied"),
                                           ("unsafe_without_duplicate_rule", "quiet, then sent again")])
def test_the_exploration_notices_a_safety_rule_gone(switch, found):
    """Rule 1 off (the protocol's test-only switches): one fault is enough
    for the exploration to apply a stale message (I3), or, with a
    duplicate kept pending, to see a pair at rest ask for resends again."""
    start = duplex(3, 3, settings=Settings(resend_urgency=0.0, **{switch: True}))
    with pytest.raises(AssertionError, match=found):
        explore(start, [FAULTS])


def test_fault_free_runs_and_single_faults_need_less():
    start = duplex(3, 3)
    assert explore(start, []).worst_rest == 4  # send, apply and confirm both ways, confirmed
    assert explore(start, [FAULTS]).worst_rest == bound(1, 1) == 6 + 2  # one lost message: 6 + 2p


ANSWER = [("drop-control", "corrupt-control"), ("redeliver",)]


@pytest.mark.parametrize("commits", [(3, 3), (3, 0), (0, 3)], ids=["3+3", "3+0", "0+3"])
def test_without_probes_a_duplicate_after_a_lost_control_message_brings_rest(commits):
    """Rule 3's answer to a duplicate: a data message arriving again after it
    was applied says the peer lacks a confirmation.  With probes and
    heartbeats off, the only repair of a lost control message left is
    that answer (or data flowing back): every schedule of one control
    message lost (dropped or corrupt), then a copy of a data message its
    receiver applied delivered again, at any later point, comes to rest
    within two clean rounds."""
    result = explore(duplex(*commits, confirm_timeout=None), ANSWER, every_state=False)
    assert result.errors == [] and result.states > 10
    assert result.worst_rest <= 4, result.witness


def _without_the_answer_to_a_duplicate(monkeypatch) -> None:
    """The mutation: PairProtocol.message_queued no longer sets confirm_owed
    for a data message that log_received covers already (its branch
    ``if not superseded and self._covered(header) and not
    self._state.confirm_owed: ... confirm_owed=True``, the only place the
    method sets it): the duplicate is deleted and not answered."""
    original = PairProtocol.message_queued

    def message_queued(self, now, message_id, header, incarnation, **keywords):
        owed = self.state.confirm_owed
        actions = original(self, now, message_id, header, incarnation, **keywords)
        if not owed and self.state.confirm_owed:
            self._state = replace(self._state, confirm_owed=False)
        return actions

    monkeypatch.setattr(PairProtocol, "message_queued", message_queued)


def test_dropping_the_answer_to_a_duplicate_is_found(monkeypatch):
    """The exhaustive check notices the answer to a duplicate gone, but only
    the exploration without probes does.  With probes (the main
    exploration) the mutant still comes to rest within the same bound: a
    lost confirmation is repaired by the publisher's probe a confirm
    timeout after its last message, and a duplicate arriving later is
    only a faster way to the same repair; within two faults nothing makes
    the answer necessary.  Without probes and heartbeats, a lost control
    message followed by a duplicate is repaired by the answer alone, and
    the exploration finds a schedule that never comes to rest."""
    covered = Header(0, 0, 5)
    core = PairProtocol("B", PairState(log_received=5, confirm_received=5, peer_incarnation=INCARNATION["B"]))
    core.message_queued(0.0, "dup", covered, INCARNATION["B"])
    assert core.state.confirm_owed
    _without_the_answer_to_a_duplicate(monkeypatch)
    core = PairProtocol("B", PairState(log_received=5, confirm_received=5, peer_incarnation=INCARNATION["B"]))
    assert core.message_queued(0.0, "dup", covered, INCARNATION["B"]) == [DeleteInbound(("dup",), "duplicate")]
    assert not core.state.confirm_owed  # the mutation is in place

    assert explore(duplex(3, 3), [FAULTS] * 2).worst_rest <= bound(1)  # masked by the probes
    result = explore(duplex(3, 3, confirm_timeout=None), ANSWER, every_state=False)
    assert result.worst_rest == math.inf
    assert result.witness[-1].startswith("redeliver")


def test_the_last_applied_message_delivered_again_is_answered_once():
    """The redeliver fault is what the answer exploration relies on: a copy
    of an applied message arriving again makes its receiver confirm."""
    sim = duplex(1, 0, confirm_timeout=None)
    for name in "ABAB":
        sim.now += STEP
        sim.run(name)
    assert sim.at_rest() and not any(sim.flight.values())
    sim.flight["B"].append((0, sim.sites["B"].last_applied))
    sim.now += STEP
    [answer] = sim.run("B")
    assert answer.control is not None and answer.control.log_received == 1
    assert not answer.control.asks_confirmation


# --- what the exploration found -------------------------------------------------------

def test_with_commits_after_a_truncation_every_schedule_of_two_faults_reaches_rest():
    """Each site commits once more at its first run after it applied the
    peer's data, so a log is truncated over entries that held nothing for
    the peer (rule 8) before a later send.  The later commit adds its own
    round trip (send, apply, confirm: 3 runs) to the bound."""
    start = duplex(1, 1)
    start.sites["A"].later = start.sites["B"].later = 1
    result = explore(start, [FAULTS] * 2)
    assert result.errors == []
    assert result.worst_rest <= bound(1) + 3, result.witness


def test_a_resend_acted_on_in_the_receive_phase_reads_no_truncated_log():
    """Minimal reproduction.  A's log: 1 (for B), 2 (B's commit applied at A:
    nothing for B).  A sent (0, 1], B confirmed it, A read 2 for B (empty
    send) and truncated its log through 2 (rule 8: the horizon is
    read_through once B confirmed all that was sent).  A commits 3 and
    sends (1, 3] read from 2; it is lost.  B asks for a resend (1, lr=1).
    At A's next ``run --once`` the protocol is rebuilt (``_log_start`` = 0),
    the request arrives in the receive phase and, urgency 0, is acted on at
    once: SendData(1, 3, 1, read_from=None) reads (1, 3], but the entries
    up to 2 are gone.  The agent's read fails (``LogTruncated``: "... the
    peer needs a new extraction"), the run reports it, the send is aborted
    and the send phase's ``send_due(log_end, log_start)`` retries it
    correctly.  Suggested fix: give PairProtocol the truncation point when
    it is built (``PairProtocol(..., log_start=db.log_start())``) or have
    ``handle_timer``/``control_received`` leave the send to the next
    ``send_due``."""
    sim = duplex(1, 1)
    sim.sites["A"].later = 1
    for name in "ABAB":
        sim.now += STEP
        sim.run(name)
    assert sim.sites["A"].log_start == 2 and sim.sites["A"].state.horizon == 2
    sim.now += STEP
    sim.run("A")  # commits 3 and sends (1, 3]: lost
    sim.flight["B"] = [(hold, f) for hold, f in sim.flight["B"] if not f.is_data]
    for name in "BABAB":  # A probes, B asks for a resend after patience
        sim.now += STEP
        sim.run(name)
    assert sim.sites["B"].state.rereceive_count == 1
    sim.now += STEP
    sim.run("A")
    assert sim.errors == [], sim.errors
