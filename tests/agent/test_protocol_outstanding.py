"""Rule 3, "never silent while something is outstanding" (docs/protocol.md):
the bounds on repairing a lost confirmation or a lost last data message,
the probe backoff, and the quiet of an idle pair.  Driven on the two-way
pure simulation (tests/agent/duplexsim.py): two sites that both publish,
each run a whole ``agent run --once``, alternately, one run every
``RUN`` seconds of virtual time (so each site runs every ``2 * RUN``).
The heartbeat is a day and the confirm timeout an hour, so a heartbeat
is never what repairs a loss here.  The invariants (I1, I2, I3 and rule
8, per direction) are checked after every run."""

import math

import pytest

from agent.controls import heartbeat_period
from agent.protocol import Settings

from .duplexsim import OTHER, Duplex

HOUR = 3600.0
DAY = 86400.0
RUN = 300.0  # a run every five minutes, A and B in turn
EVERY = 2 * RUN  # each site runs every ten minutes


def duplex(commits_a: int, commits_b: int, **options) -> Duplex:
    return Duplex(commits_a, commits_b, heartbeat=DAY, confirm_timeout=HOUR, **options)


def run(sim: Duplex, name: str):
    sim.now += RUN
    files = sim.run(name)
    sim.check_invariants()
    return files


def run_until(sim: Duplex, first: str, done, *, limit: int = 400) -> dict[str, int]:
    """Run the sites in turn, from ``first``, until ``done()``; return the
    runs each site made."""
    runs, name = {"A": 0, "B": 0}, first
    while not done():
        assert runs["A"] + runs["B"] < limit, "not done"
        run(sim, name)
        runs[name] += 1
        name = OTHER[name]
    return runs


def controls_since(sim: Duplex, moment: float) -> list[tuple[float, str, str]]:
    return [sent for sent in sim.sent if sent[0] > moment and sent[2] != "data"]


def silent_until_the_heartbeat(sim: Duplex) -> list[tuple[float, str, str]]:
    """Run until just before either site's next heartbeat falls due (its
    period after its last control message); return what was sent."""
    due = min(site.state.control_sent_at + heartbeat_period(OTHER[name], DAY) for name, site in sim.sites.items())
    before = len(sim.sent)
    run_until(sim, "A", lambda: sim.now + RUN >= due, limit=1000)
    return sim.sent[before:]


def data_of(files) -> list:
    """The data files of ``files`` (a site's first send phase also sends a
    heartbeat: a peer never sent a control message gets one, rule 3)."""
    return [f for f in files if f.is_data]


def rested(commits_a: int, commits_b: int, **options) -> Duplex:
    """A pair past its first contact (whose heartbeats carry log_sent and
    would tell of a loss at once), at rest, nothing in flight."""
    sim = duplex(commits_a, commits_b, **options)
    run_until(sim, "A", lambda: sim.at_rest() and not any(sim.flight.values()))
    return sim


def send_two(sim: Duplex) -> list:
    """A commits twice and sends them, one message each, and nothing else."""
    sim.commit("A", 2)
    files = run(sim, "A")
    assert [f.header.last for f in files if f.is_data] == sim.sites["A"].for_peer()[-2:] and len(files) == 2
    return files


def lose_the_confirmation(sim: Duplex) -> float:
    """A sends two commits; B applies them and confirms; that confirmation,
    the only file in flight, is lost.  Returns when A's data went."""
    send_two(sim)
    sent_at = sim.now
    run(sim, "B")
    [(_, confirmation)] = sim.flight["A"]
    assert confirmation.control.log_received == sim.sites["A"].state.log_sent == sim.sites["A"].for_peer()[-1]
    sim.flight["A"] = []  # exactly the last confirmation is lost
    assert sim.sites["A"].state.unconfirmed
    return sent_at


def test_a_lost_confirmation_is_repaired_by_the_next_data_flowing_back():
    """Rule 3, a confirmation with data: B's next data message carries the
    confirmation that was lost; A's stream is confirmed in the run in
    which it applies that data, and B's by B's next run."""
    sim = rested(1, 0)
    start = sim.now
    lose_the_confirmation(sim)
    run(sim, "A")
    assert sim.sites["A"].state.unconfirmed  # nothing told A (no probe yet: ten minutes)
    sim.commit("B")
    files = run(sim, "B")
    assert [f.is_data for f in files] == [True, False]  # the data and its confirmation
    assert files[1].control.log_received == sim.sites["A"].state.log_sent
    run(sim, "A")
    assert sim.sites["A"].applied == sim.sites["B"].for_peer() and sim.confirmed("A")
    run(sim, "B")
    assert sim.confirmed("B") and sim.at_rest()
    assert sim.now - start < HOUR and not [s for s in sim.sent if s[2] == "probe"]


def test_a_lost_confirmation_with_nothing_flowing_back_is_repaired_within_one_confirm_timeout():
    """A's probe goes at A's first run a confirm timeout after its data; B
    answers at its next run; A has the answer at its next one: one
    confirm timeout plus two runs of each side."""
    sim = rested(1, 0)
    sent_at = lose_the_confirmation(sim)
    lost_at = sim.now
    runs = run_until(sim, "A", lambda: sim.confirmed("A"))
    elapsed = sim.now - lost_at
    assert elapsed <= HOUR + 2 * EVERY, elapsed
    assert runs["A"] <= HOUR / EVERY + 2 and runs["B"] <= HOUR / EVERY + 2, runs
    # Nothing else repaired it: one probe, a confirm timeout after the data, and its answer.
    (probe_at, _, probe), (answer_at, _, answer) = controls_since(sim, lost_at)
    assert (probe, answer) == ("probe", "confirmation")
    assert HOUR <= probe_at - sent_at < HOUR + EVERY and answer_at == probe_at + RUN
    assert sim.sites["A"].state.probes == 0  # the answer reset the backoff
    assert silent_until_the_heartbeat(sim) == [] and sim.at_rest()


@pytest.mark.parametrize("patience, urgency", [(1, 0.0), (2, 0.0), (1, 900.0)],
                         ids=["batch", "patience-2", "continuous-urgency-15min"])
@pytest.mark.parametrize("flowing_back", [False, True], ids=["quiet-peer", "data-flowing-back"])
def test_a_lost_last_data_message_is_applied_within_the_bound(patience, urgency, flowing_back):
    """Rule 3's probe carries log_sent, so the receiver notices the gap
    (rule 4) and, ``patience`` polls later, asks for the resend; the
    publisher resends after the urgency; the receiver applies it.  Bound:
    one confirm timeout plus ``patience`` polls, the resend urgency and
    two runs of each side.  With data flowing back, A's confirmation of it
    carries log_sent, and the gap is noticed before any timeout.  A resend
    urgency is a continuous agent's (a batch run acts on a request at once
    and keeps no timer), so that case keeps the protocols between runs."""
    sim = rested(1, 0, settings=Settings(patience=patience, resend_urgency=urgency), restart=urgency == 0)
    [_, last] = send_two(sim)
    sim.flight["B"].remove((0, last))  # exactly the last data message is lost
    lost_at = sim.now
    if flowing_back:
        sim.commit("B")
    runs = run_until(sim, "B", lambda: sim.sites["B"].applied == sim.sites["A"].for_peer())
    elapsed = sim.now - lost_at
    extra = math.ceil(urgency / EVERY)  # the runs of A that wait for the urgency
    if flowing_back:
        assert elapsed < HOUR
    else:
        # The timeout runs out at A's run at lost_at + HOUR; then A probes,
        # B polls `patience` times with the gap (the first in the run that
        # receives the probe) and asks in the next, A resends (after the
        # urgency), B applies: patience + 2 runs of B after the timeout,
        # and as many of A (the sites run in turn).
        assert runs["A"] <= HOUR / EVERY + patience + 2 + extra, runs
        assert runs["B"] <= HOUR / EVERY + patience + 2 + extra, runs
        assert elapsed >= HOUR  # nothing but the probe told B of the loss
    assert elapsed <= HOUR + urgency + (patience + 2) * EVERY, elapsed
    assert sim.sites["A"].state.resend_count == 1
    run_until(sim, "A", sim.at_rest)


def test_an_idle_pair_with_everything_confirmed_sends_nothing_but_heartbeats():
    """Both streams confirmed, three idle days: a heartbeat a day each way
    (its period, less the peer's share), no probe, no confirmation."""
    sim = rested(2, 2)
    rested_at = sim.now
    run_until(sim, "A", lambda: sim.now > rested_at + 3 * DAY, limit=3 * 24 * 12 + 10)
    after = [sent for sent in sim.sent if sent[0] > rested_at]
    assert {reason for _, _, reason in after} == {"heartbeat"}
    for name in "AB":
        beats = [moment for moment, sender, _ in after if sender == name]
        assert len(beats) == 3, beats
        gaps = [later - earlier for earlier, later in zip(beats, beats[1:])]
        period = heartbeat_period(OTHER[name], DAY)
        assert all(period <= gap < period + EVERY for gap in gaps), gaps


def test_the_probe_backoff_doubles_while_nothing_changes_and_never_exceeds_the_heartbeat():
    """B is gone: nothing A sends arrives.  A probes a confirm timeout after
    its data, then after 2, 4, 8, 16 hours, then at every heartbeat
    period (the heartbeat less B's share), never later; no separate
    heartbeat goes, a probe is one."""
    sim = duplex(1, 0)
    run(sim, "A")  # the data, and a first heartbeat
    sent_at = sim.now
    while sim.now < sent_at + 4 * DAY:
        sim.flight["B"] = []  # lost
        run(sim, "A")
        sim.now += RUN  # B does not run
    controls = [(moment, reason) for moment, sender, reason in controls_since(sim, sent_at) if sender == "A"]
    assert {reason for _, reason in controls} == {"probe"}
    probes = [moment for moment, _ in controls]
    waits = [later - earlier for earlier, later in zip([sent_at] + probes, probes)]
    period = heartbeat_period("B", DAY)
    expected = [min(HOUR * 2 ** number, period) for number in range(len(waits))]
    assert expected[:6] == [HOUR, 2 * HOUR, 4 * HOUR, 8 * HOUR, 16 * HOUR, period] and len(waits) >= 7
    assert all(wait <= gap < wait + EVERY for wait, gap in zip(expected, waits)), (waits, expected)
    assert max(waits) <= DAY
    assert sim.sites["A"].state.probes == len(probes)


def test_a_duplicate_of_an_applied_message_is_answered_by_one_confirmation():
    sim = duplex(1, 0)
    [data] = data_of(run(sim, "A"))
    run_until(sim, "B", lambda: sim.at_rest() and not any(sim.flight.values()))
    rested_at = sim.now
    run(sim, "B")
    run(sim, "A")
    assert controls_since(sim, rested_at) == []
    sim.flight["B"].append((0, data))  # the same file, delivered again
    [answer] = run(sim, "B")
    assert answer.control.log_received == 1 and not answer.control.asks_confirmation
    assert run(sim, "A") == [] and run(sim, "B") == []
    assert sim.sites["B"].applied == [1] and sim.at_rest()
    assert silent_until_the_heartbeat(sim) == []  # no further exchange: zero until the heartbeat


def test_two_crossing_probes_do_not_start_an_endless_exchange():
    """Both streams unconfirmed (both confirmations lost), and the probes
    cross: each site sends its probe before the other's arrives.  Each
    probe confirms the other stream and is answered once, and then nothing
    goes until the heartbeat: an answer never asks for another."""
    sim = duplex(1, 1)
    run(sim, "A")
    run(sim, "B")  # B applies A's data, sends its own and a confirmation
    sim.flight["A"] = [(hold, f) for hold, f in sim.flight["A"] if f.is_data]  # B's confirmation is lost
    run(sim, "A")  # A applies B's data and confirms it
    [(_, lost)] = sim.flight["B"]
    sim.flight["B"] = []  # A's confirmation is lost
    assert lost.control.asks_confirmation
    assert sim.sites["A"].state.unconfirmed and sim.sites["B"].state.unconfirmed
    lost_at = sim.now
    run_until(sim, "B", lambda: any(reason == "probe" for _, _, reason in controls_since(sim, lost_at)))
    name = sim.sent[-1][1]
    sim.flight[OTHER[name]] = [(hold + 1, f) for hold, f in sim.flight[OTHER[name]]]  # delayed: they cross
    run_until(sim, OTHER[name], lambda: sum(reason == "probe" for _, _, reason in controls_since(sim, lost_at)) == 2)
    run_until(sim, name, lambda: sim.at_rest() and not any(sim.flight.values()))
    # The second prober had not seen the first probe: else it would have owed
    # an answer, and a confirmation (which comes first) would have gone.
    exchange = controls_since(sim, lost_at)
    assert [reason for _, _, reason in exchange] == ["probe", "probe", "confirmation", "confirmation"], exchange
    quiet_from = sim.now
    assert silent_until_the_heartbeat(sim) == []
    run_until(sim, "A", lambda: sim.now > quiet_from + 2 * DAY, limit=1000)
    assert {reason for _, _, reason in controls_since(sim, quiet_from)} == {"heartbeat"}


def test_a_message_queued_earlier_did_not_arrive_now():
    """At a run's start the core is told what is queued from earlier runs
    (``queued_earlier``): that is no news from the peer, so neither heard_at nor
    the probe backoff moves, and a covered message asks for no answer."""
    from agent.protocol import PairProtocol, PairState
    from codec.header import Header

    incarnation = b"B" * 16
    state = PairState(log_received=5, confirm_received=5, peer_incarnation=incarnation, heard_at=1.0,
                      log_sent=9, log_send=9, probes=3)
    core = PairProtocol("B", state)
    core.message_queued(100.0, "covered", Header(0, 2, 5), incarnation, queued_earlier=True)
    core.message_queued(100.0, "waiting", Header(0, 7, 8), incarnation, queued_earlier=True)
    assert (core.state.heard_at, core.state.probes, core.state.confirm_owed) == (1.0, 3, False)
    core.message_queued(200.0, "again", Header(0, 2, 5), incarnation)  # arrives now: a duplicate
    assert (core.state.heard_at, core.state.probes, core.state.confirm_owed) == (200.0, 0, True)


def test_a_probe_that_still_announces_a_gap_sets_the_request_patience_back():
    """Rule 4: after a lost resend request the next one waits twice the
    patience; a probe of the publisher (a confirm timeout after its last
    message) that still announces more than arrived shows the request or
    its resend lost, so the next request goes after --patience polls."""
    from agent.protocol import PairProtocol, PairState
    from codec.message import ControlState

    incarnation = b"A" * 16
    state = PairState(log_received=5, confirm_received=5, peer_log_sent=9, rereceive_count=1, request_patience=8,
                      peer_incarnation=incarnation)
    core = PairProtocol("A", state)
    core.control_received(10.0, ControlState(0, 0, 9, 1), incarnation)  # no probe: the wait stays doubled
    assert core.state.request_patience == 8
    core.control_received(20.0, ControlState(0, 0, 9, 1, asks_confirmation=True), incarnation)
    assert core.state.request_patience == 0 and not core.state.confirm_owed  # rule 4 answers, not a confirmation
    polls = [core.poll(30.0 + n) for n in range(2)]
    assert [action.reason for actions in polls for action in actions] == ["resend request"]
