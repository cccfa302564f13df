"""Rules 3, 5, 7 and 8 as they keep an idle pair quiet (docs/protocol.md,
"No message without news"): driven on the pure core, with the invariants
(I1, I2 and the truncation horizon) checked after every step."""

import random

from agent.protocol import PairProtocol, PairState, PurgeOutbound, SendData, Settings
from codec.message import ControlState

from .pairsim import INCARNATION_P, Pair

DAY = 86400.0


def test_a_range_with_nothing_for_the_peer_makes_no_message_and_moves_only_log_read():
    pair = Pair()
    pair.commit(2)
    for _ in range(3):
        pair.cycle(force_controls=False, heartbeat=DAY)
    files_before = pair.p.counters.controls_sent
    pair.commit(5, for_s=False)  # the log moves, with nothing for S
    pair.now += 60
    [send] = pair.p.send_due(pair.now, pair.log[-1])
    assert send == SendData(pair.log[1], pair.log[-1], 0)
    pair.p_run([send])
    assert pair.outbox_epochs == [] and pair.to_s == []
    state = pair.p.state
    assert (state.log_sent, state.log_read) == (pair.log[1], pair.log[-1])
    # S confirmed all that was sent, so nothing before log_read is needed: rule 8.
    assert state.horizon == pair.log[-1]
    assert pair.p.send_controls(pair.now, heartbeat=DAY) == [] and pair.p.counters.controls_sent == files_before
    # The next data for S chains from log_sent, read from log_read.
    pair.commit(1)
    [send] = pair.p.send_due(pair.now, pair.log[-1])
    assert send == SendData(pair.log[1], pair.log[-1], 0, read_from=pair.log[-2])
    pair.p_run([send])
    pair.flush_outbox()
    pair.deliver_to_s()
    assert pair.applied == pair.log_s and pair.s.state.log_received == pair.log[-1]


def test_confirmations_go_only_when_log_received_moved_or_the_heartbeat_is_due():
    core = PairProtocol("peer", PairState(log_received=10, confirm_received=10, control_sent_at=0.0))
    assert core.send_controls(100.0, heartbeat=DAY) == []
    [heartbeat] = core.send_controls(DAY, heartbeat=DAY)
    assert heartbeat.reason == "heartbeat" and core.state.control_sent_at == DAY
    assert core.send_controls(DAY + 1, heartbeat=DAY) == []
    core._state = PairState(log_received=20, confirm_received=10, control_sent_at=DAY)  # an apply moved it
    [confirmation] = core.send_controls(DAY + 2, heartbeat=DAY)
    assert confirmation.reason == "confirmation" and core.state.confirm_received == 20
    # Never sent one: the first send phase sends a heartbeat.
    assert PairProtocol("peer", PairState()).send_controls(0.0, heartbeat=DAY)[0].reason == "heartbeat"


def test_a_resend_keeps_log_read_when_the_peer_has_all_that_was_sent():
    core = PairProtocol("peer", PairState(log_send=90, log_sent=40, confirm_sent=40, log_read=90),
                        Settings(resend_urgency=0))
    actions = core.control_received(0, ControlState(40, 1, 0, 0), INCARNATION_P)
    assert core.state.log_read == 90 and core.state.log_sent == 40
    # Queued files of the old epoch go; nothing to send: what was read held nothing for the peer.
    assert actions == [PurgeOutbound(1)]


def test_a_resend_reads_again_from_confirm_sent_when_the_peer_lacks_data():
    core = PairProtocol("peer", PairState(log_send=90, log_sent=60, confirm_sent=40, log_read=90),
                        Settings(resend_urgency=0))
    actions = core.control_received(0, ControlState(40, 1, 0, 0), INCARNATION_P)
    assert actions[-1] == SendData(40, 90, 1)
    assert (core.state.log_sent, core.state.log_read, core.state.horizon) == (40, 40, 40)


def test_an_empty_send_of_a_replaced_epoch_moves_nothing():
    core = PairProtocol("peer", PairState(log_sent=5, confirm_sent=5))
    [send] = core.send_due(0, 20)
    core._state = PairState(log_send=20, log_sent=5, confirm_sent=5, resend_count=1)
    core.send_done(1, send.end, empty=True)
    assert core.state.log_read == 0 and core.state.read_through == 5


def test_an_idle_month_is_kept_alive_by_heartbeats_and_the_log_truncated():
    """Thirty days of runs every ten minutes, the log moving for other
    peers: S gets no file but the daily heartbeats; P's horizon follows
    its log, and a last data message lost in the middle is noticed at
    the next heartbeat and resent."""
    pair = Pair()
    pair.commit(3)
    rng = random.Random(5)
    for step in range(30 * 144):
        pair.now += 600 - 60  # cycle() adds 60 s
        pair.commit(rng.randint(0, 2), for_s=False)
        if step == 2000:
            pair.commit(1)  # one change for S, whose only message is lost
            _lose_data(pair)
        else:
            pair.cycle(force_controls=False, heartbeat=DAY)
        pair.check_invariants()
    # One heartbeat a day each way, plus the repair of the lost message.
    assert pair.p.counters.controls_sent <= 30 + 5, pair.p.counters
    assert pair.s.counters.controls_sent <= 30 + 5, pair.s.counters
    assert pair.applied == pair.log_s and pair.p.state.resend_count == 1
    assert pair.p.state.horizon >= pair.log[-1] - 200  # truncation keeps up with the log


def _lose_data(pair: Pair) -> None:
    pair.now += 60.0
    pair.p_run(pair.p.send_due(pair.now, pair.log[-1]))
    pair.flush_outbox()
    pair.to_s = [flight for flight in pair.to_s if flight.kind == "control"]  # the data message is lost
    pair.deliver_to_s()


def test_randomized_faults_without_forced_controls_reach_quiescence_with_heartbeats():
    for seed in range(120):
        rng = random.Random(seed)
        pair = Pair(per_message=rng.randint(1, 4), settings=Settings(patience=rng.randint(1, 3),
                                                                     resend_urgency=rng.choice([0.0, 90.0])))
        heartbeat = rng.choice([300.0, 1800.0])
        for _ in range(25):
            if rng.random() < 0.6:
                pair.commit(rng.randint(1, 3), for_s=rng.random() < 0.5)
            pair.now += 60
            pair.p_run(pair.p.handle_timer(pair.now))
            pair.p_run(pair.p.send_due(pair.now, pair.log[-1] if pair.log else 0))
            pair.p_run(pair.p.send_controls(pair.now, heartbeat=heartbeat))
            pair.flush_outbox()
            pair.to_s = [f for f in pair.to_s if rng.random() > 0.15]
            rng.shuffle(pair.to_s)
            pair.deliver_to_s()
            pair.s_run(pair.s.poll(pair.now))
            pair.s_run(pair.s.send_controls(pair.now, heartbeat=heartbeat))
            pair.to_p = [f for f in pair.to_p if rng.random() > 0.15]
            pair.deliver_to_p()
            pair.check_invariants()
        for _ in range(400):
            pair.cycle(force_controls=False, heartbeat=heartbeat)
            pair.check_invariants()
            if pair.quiescent() and not pair.to_s and not pair.to_p:
                break
        assert pair.quiescent(), (seed, pair.p.state, pair.s.state)
        assert pair.applied == pair.log_s, seed


def test_a_resend_after_truncation_reads_from_the_log_start():
    """The log was truncated over a range that held nothing for the peer
    (it had confirmed all that was sent); a later resend from before the
    truncation reads from the truncation point, never from deleted entries."""
    core = PairProtocol("peer", PairState(log_send=10, log_sent=6, confirm_sent=6, log_read=10),
                        Settings(resend_urgency=0))
    assert core.state.horizon == 10
    [send] = core.send_due(0, 15, log_start=10)
    assert send == SendData(6, 15, 0, read_from=10)
    core.send_done(1, 15)
    actions = core.control_received(2, ControlState(6, 1, 0, 0), INCARNATION_P)
    assert actions[-1] == SendData(6, 15, 1, read_from=10)


def test_the_heartbeats_of_a_fleet_confirmed_at_once_spread_out():
    """A thousand peers confirmed at the same moment, send phases every ten
    minutes for three days: no peer waits longer than the heartbeat, and the
    heartbeats of one period fall into many runs, none holding most."""
    peers = [PairProtocol(f"site{number:04d}", PairState(control_sent_at=0.0)) for number in range(1000)]
    runs: dict[float, int] = {}
    last = {core.peer: 0.0 for core in peers}
    for step in range(1, 3 * 144 + 1):
        now = step * 600.0
        for core in peers:
            if core.send_controls(now, heartbeat=DAY):
                assert now - last[core.peer] <= DAY
                last[core.peer] = now
                runs[now] = runs.get(now, 0) + 1
    assert all(DAY * 2 <= seen <= 3 * DAY for seen in last.values())  # each one beat every day
    first_day = {now: count for now, count in runs.items() if now <= DAY}
    assert len(first_day) >= 10 and max(first_day.values()) <= 200, first_day
