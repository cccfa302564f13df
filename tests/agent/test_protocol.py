"""The protocol core, driven without I/O (see pairsim.py).  Every test
checks the invariants I1 and I2 after each step."""

import random
from dataclasses import replace

import hypothesis
import pytest
from hypothesis import strategies as st

from agent.protocol import (Apply, DeleteInbound, LocalProtocolError, PairProtocol, PairState, PurgeOutbound,
                            Quarantine, SendControl, SendData, Settings, StreamStopped)
from codec.header import Header
from codec.message import ControlState

from .pairsim import INCARNATION_P, Pair


def run_until_quiet(pair: Pair, cycles: int = 30) -> int:
    for number in range(cycles):
        pair.cycle()
        pair.check_invariants()
        if pair.quiescent() and not pair.to_s and not pair.to_p:
            return number + 1
    raise AssertionError(f"no quiescence: P={pair.p.state} S={pair.s.state}")


def test_normal_replication_confirms_everything():
    pair = Pair()
    pair.commit(10)
    run_until_quiet(pair)
    assert pair.applied == pair.log
    assert pair.p.counters.resends_done == 0 and pair.s.counters.resend_requests_sent == 0


def test_multi_part_groups_apply_once_atomically():
    pair = Pair()
    pair.commit(4)
    pair.big = frozenset({pair.log[1], pair.log[3]})
    run_until_quiet(pair)
    assert pair.applied == pair.log


def test_lost_message_is_resent_in_a_new_epoch_and_old_copies_are_stale():
    pair = Pair(per_message=1)
    pair.commit(4)
    pair.now += 60
    pair.p_run(pair.p.send_due(pair.now, pair.log[-1]))
    pair.flush_outbox()
    lost = pair.to_s.pop(1)  # the second message never arrives
    pair.deliver_to_s()
    assert pair.applied == pair.log[:1]
    run_until_quiet(pair)
    assert pair.p.state.resend_count == 1 and pair.s.state.rereceive_count == 1
    # The old-epoch copy turns up late: it is deleted as stale, never applied.
    pair.to_s.append(lost)
    pair.deliver_to_s()
    assert lost.message_id not in pair.inbox and pair.s.counters.stale_deleted >= 1
    pair.check_invariants()


def test_lost_last_message_is_detected_from_the_publishers_control():
    pair = Pair()
    pair.commit(3)
    pair.now += 60
    pair.p_run(pair.p.send_due(pair.now, pair.log[-1]))
    pair.p_run(pair.p.send_controls(pair.now, force=True))
    pair.flush_outbox()
    pair.to_s = [f for f in pair.to_s if f.kind == "control"]  # the only data message is lost
    pair.deliver_to_s()
    assert pair.s.state.peer_log_sent == pair.log[-1] and pair.s.state.log_received == 0
    run_until_quiet(pair)
    assert pair.applied == pair.log and pair.p.state.resend_count == 1


def test_lost_confirmation_is_repaired_by_the_next_one():
    pair = Pair()
    pair.commit(3)
    pair.now += 60
    pair.p_run(pair.p.send_due(pair.now, pair.log[-1]))
    pair.flush_outbox()
    pair.deliver_to_s()
    pair.s_run(pair.s.send_controls(pair.now))
    pair.to_p.clear()  # the confirmation is lost
    assert pair.p.state.confirm_sent == 0
    run_until_quiet(pair)
    assert pair.p.state.confirm_sent == pair.log[-1] and pair.p.state.resend_count == 0


def test_duplicated_and_reordered_messages_apply_once_in_order():
    pair = Pair(per_message=1)
    pair.commit(6)
    pair.now += 60
    pair.p_run(pair.p.send_due(pair.now, pair.log[-1]))
    pair.flush_outbox()
    pair.to_s = list(reversed(pair.to_s + pair.to_s[:3]))
    pair.deliver_to_s()
    assert pair.applied == pair.log
    run_until_quiet(pair)
    assert pair.p.state.resend_count == 0


def test_corrupt_message_counts_as_missing_and_is_resent():
    pair = Pair(per_message=2)
    pair.commit(4)
    pair.now += 60
    pair.p_run(pair.p.send_due(pair.now, pair.log[-1]))
    pair.flush_outbox()
    pair.to_s[0].corrupt = True
    pair.deliver_to_s()
    assert pair.s.counters.rejected == 1 and pair.quarantined
    run_until_quiet(pair)
    assert pair.applied == pair.log


def test_regenerated_messages_after_a_publisher_crash_overlap_and_are_skipped():
    pair = Pair(per_message=2)
    pair.commit(3)
    saved = pair.p.state
    pair.now += 60
    # P packs and queues (0, end] but crashes before send_done records log_sent.
    pair._pack(SendData(saved.log_sent, pair.log[-1], saved.resend_count))
    pair.flush_outbox()
    first_version = list(pair.to_s)
    pair.p = PairProtocol("S", saved, pair.settings)  # restart from the persisted state
    pair.commit(3)
    pair.per_message = 4  # cut differently this time
    pair.to_s = first_version[:1]
    pair.deliver_to_s()
    assert pair.s.state.log_received == first_version[0].header.last
    run_until_quiet(pair)
    assert pair.applied == pair.log and pair.p.state.resend_count == 0


def test_randomized_faults_keep_the_invariants():
    for seed in range(150):
        rng = random.Random(seed)
        pair = Pair(per_message=rng.randint(1, 4), settings=Settings(patience=rng.randint(1, 3),
                                                                     resend_urgency=rng.choice([0.0, 90.0])))
        for step in range(25):
            if rng.random() < 0.6:
                pair.commit(rng.randint(1, 4))
                pair.big = frozenset(c for c in pair.log if rng.random() < 0.15) | pair.big
            pair.now += 60
            pair.p_run(pair.p.handle_timer(pair.now))
            pair.p_run(pair.p.send_due(pair.now, pair.log[-1] if pair.log else 0))
            pair.p_run(pair.p.send_controls(pair.now, force=rng.random() < 0.5))
            pair.flush_outbox()
            survivors = []
            for flight in pair.to_s:
                roll = rng.random()
                if roll < 0.1:
                    continue  # lost
                if roll < 0.15:
                    flight.corrupt = True
                survivors.append(flight)
                if rng.random() < 0.1:
                    survivors.append(flight)  # duplicated
            rng.shuffle(survivors)
            held = [f for f in survivors if rng.random() < 0.1]
            pair.to_s = [f for f in survivors if f not in held]
            pair.deliver_to_s()
            pair.to_s = held
            pair.s_run(pair.s.poll(pair.now))
            pair.s_run(pair.s.send_controls(pair.now, force=rng.random() < 0.5))
            pair.to_p = [f for f in pair.to_p if rng.random() > 0.1]
            rng.shuffle(pair.to_p)
            pair.deliver_to_p()
            pair.check_invariants()
            for flight in pair.to_s:
                flight.corrupt = False
        run_until_quiet(pair, cycles=80)
        assert pair.applied == pair.log, seed


# --- targeted rules ---------------------------------------------------------------------

def protocol(**state) -> PairProtocol:
    return PairProtocol("peer", PairState(**state), Settings(patience=1, resend_urgency=10.0))


def test_state_validation():
    with pytest.raises(LocalProtocolError):
        PairState(log_sent=1, confirm_sent=2)
    for name in ("log_send", "log_sent", "confirm_sent", "resend_count", "log_received", "confirm_received",
                 "rereceive_count", "peer_log_sent", "gap_polls", "request_patience", "log_read", "peer_confirmed",
                 "probes"):
        lowest = {"confirm_sent": -1} if name == "log_sent" else {}  # confirm_sent <= log_sent holds
        with pytest.raises(LocalProtocolError, match=f"^{name} must be >= 0"):
            PairState(**{name: -1, **lowest})
    with pytest.raises(LocalProtocolError):
        Settings(patience=0)
    with pytest.raises(LocalProtocolError):
        Settings(resend_urgency=-1)


def test_applicable_rule_and_skip_through():
    core = protocol(log_received=50)
    # prev 40 <= 50 < 70: applicable, skipping commits <= 50.
    actions = core.message_queued(0, "m", Header(0, 40, 70), INCARNATION_P)
    assert actions == [Apply(("m",), 50, 70)]
    # While applying, nothing else starts; a second message waits.
    assert core.message_queued(0, "n", Header(0, 70, 90), INCARNATION_P) == []
    actions = core.apply_done(1, 70)
    assert actions == [DeleteInbound(("m",), "applied"), Apply(("n",), 70, 90)]
    assert core.state.log_received == 70


def test_duplicates_and_stale_messages_are_deleted():
    core = protocol(log_received=50, rereceive_count=2)
    assert core.message_queued(0, "old", Header(1, 50, 60), INCARNATION_P) == [DeleteInbound(("old",), "stale")]
    assert core.message_queued(0, "dup", Header(2, 30, 50), INCARNATION_P) == [DeleteInbound(("dup",), "duplicate")]
    # A non-final part whose prev equals log_received waits for its siblings ...
    assert core.message_queued(0, "p0", Header(2, 50, 50, 0), INCARNATION_P) == []
    # ... one whose prev is behind log_received is a duplicate.
    assert core.message_queued(0, "q0", Header(2, 40, 40, 0), INCARNATION_P) == [DeleteInbound(("q0",), "duplicate")]
    assert core.message_queued(0, "p0", Header(2, 50, 50, 0), INCARNATION_P) == []  # same id again: ignored
    assert core.pending_ids == ("p0",)
    assert core.counters.stale_deleted == 1 and core.counters.duplicates_deleted == 2


def test_incomplete_or_inconsistent_groups_are_not_applied():
    core = protocol(log_received=10)
    core.message_queued(0, "a0", Header(0, 10, 10, 0), INCARNATION_P)
    assert core.message_queued(0, "a2", Header(0, 10, 30, 2), INCARNATION_P) == []  # part 1 missing
    actions = core.message_queued(0, "a1", Header(0, 10, 10, 1), INCARNATION_P)
    assert actions == [Apply(("a0", "a1", "a2"), 10, 30)]


def test_newest_epoch_wins_among_applicable_messages():
    core = protocol(log_received=10)
    core.message_queued(0, "x", Header(0, 10, 10, 0), INCARNATION_P)  # an incomplete group of epoch 0
    core._applying = Apply(("z",), 0, 1)  # hold applies while both arrive
    core.message_queued(0, "e0", Header(0, 10, 20), INCARNATION_P)
    core.message_queued(0, "e1", Header(1, 10, 20), INCARNATION_P)
    core._applying = None
    assert core._applicable() == Apply(("e1",), 10, 20)
    core._applying = Apply(("z",), 0, 1)
    core.message_queued(0, "e1-early", Header(1, 5, 20), INCARNATION_P)
    core.message_queued(0, "e0-late", Header(0, 10, 25), INCARNATION_P)
    core._applying = None
    # Equal epochs: the first in stream order; never the older epoch's message.
    assert core._applicable() == Apply(("e1-early",), 10, 20)
    core2 = protocol(log_received=10)
    core2._applying = Apply(("z",), 0, 1)
    core2.message_queued(0, "g1", Header(1, 10, 10, 0), INCARNATION_P)
    core2.message_queued(0, "g1b", Header(1, 10, 20, 1), INCARNATION_P)
    core2.message_queued(0, "w0", Header(0, 10, 20), INCARNATION_P)
    core2._applying = None
    assert core2._applicable() == Apply(("g1", "g1b"), 10, 20)
    core3 = protocol(log_received=10)
    core3._applying = Apply(("z",), 0, 1)
    core3.message_queued(0, "g0", Header(0, 10, 10, 0), INCARNATION_P)
    core3.message_queued(0, "g0b", Header(0, 10, 20, 1), INCARNATION_P)
    core3.message_queued(0, "w1", Header(1, 10, 20), INCARNATION_P)
    core3._applying = None
    assert core3._applicable() == Apply(("w1",), 10, 20)


def test_gap_waits_for_patience_then_requests_once_with_backoff():
    core = PairProtocol("peer", PairState(), Settings(patience=2, resend_urgency=0))
    core.message_queued(0, "later", Header(0, 20, 30), INCARNATION_P)
    assert core.poll(1) == [] and core.poll(2) == []  # seen, then patience polls
    actions = core.poll(3)
    assert actions == [DeleteInbound(("later",), "stale"),
                       SendControl(ControlState(0, 1, 0, 0), "resend request")]
    assert core.state.request_patience == 4
    core.control_received(4, ControlState(0, 0, 30, 0), INCARNATION_P)  # the peer sent up to 30
    for now in range(5, 9):
        assert core.poll(now) == []  # backoff: the gap must last 4 more polls
    assert core.state.rereceive_count == 1
    assert isinstance(core.poll(9)[-1], SendControl) and core.state.rereceive_count == 2
    assert core.state.request_patience == 8
    # Progress resets the patience.
    core.message_queued(10, "resent", Header(2, 0, 30), INCARNATION_P)
    core.apply_done(10, 30)
    assert core.state.request_patience == 0 and core.state.gap_polls == 0


def test_no_gap_resets_the_poll_count():
    core = protocol()
    core.message_queued(0, "later", Header(0, 20, 30), INCARNATION_P)
    core.poll(1)
    assert core.state.gap_polls == 1
    core._forget("later")
    assert core.poll(2) == [] and core.state.gap_polls == 0
    assert core.poll(3) == [] and core.state.gap_polls == 0


def test_poll_does_nothing_more_while_applying():
    core = protocol()
    actions = core.message_queued(0, "m", Header(0, 0, 10), INCARNATION_P)
    assert actions == [Apply(("m",), 0, 10)]
    assert core.poll(1) == []


def test_apply_aborted_retries_or_quarantines():
    core = protocol()
    core.message_queued(0, "m", Header(0, 0, 10), INCARNATION_P)
    assert core.apply_aborted(1) == []
    assert core.poll(2) == [Apply(("m",), 0, 10)]
    assert core.apply_aborted(3, quarantine="malformed payload") == [Quarantine("m", "malformed payload")]
    assert core.counters.rejected == 1 and core.pending_ids == ()
    with pytest.raises(LocalProtocolError):
        core.apply_aborted(4)
    with pytest.raises(LocalProtocolError):
        core.apply_done(4, 10)


def test_confirmation_rules():
    core = protocol(log_send=100, log_sent=100, confirm_sent=10)
    core.control_received(0, ControlState(log_received=60, rereceive_count=0, log_sent=0, resend_count=0),
                          INCARNATION_P)
    assert core.state.confirm_sent == 60
    core.control_received(0, ControlState(40, 0, 0, 0), INCARNATION_P)  # older confirmation: merged by max
    assert core.state.confirm_sent == 60
    core.control_received(0, ControlState(500, 0, 0, 0), INCARNATION_P)  # never beyond log_sent (I1)
    assert core.state.confirm_sent == 100


def test_the_peers_schema_version_is_merged_by_max_and_a_control_without_it_leaves_it():
    core = protocol(log_send=100, log_sent=100, confirm_sent=100)
    core.control_received(0, ControlState(60, 0, 0, 0), INCARNATION_P)  # an older release's: says nothing
    assert core.state.peer_schema_version is None
    core.control_received(1, ControlState(60, 0, 0, 0, schema_version=0), INCARNATION_P)
    assert core.state.peer_schema_version == 0
    core.control_received(2, ControlState(60, 0, 0, 0, schema_version=923_400), INCARNATION_P)
    assert core.state.peer_schema_version == 923_400
    core.control_received(3, ControlState(60, 0, 0, 0, schema_version=500), INCARNATION_P)  # late mail
    core.control_received(4, ControlState(60, 0, 0, 0), INCARNATION_P)
    assert core.state.peer_schema_version == 923_400
    state = core.state
    core.control_received(5, ControlState(60, 0, 0, 0, schema_version=923_400), INCARNATION_P)
    assert replace(core.state, heard_at=state.heard_at) == state  # the same value: nothing to save but heard_at


def test_resend_request_waits_for_urgency_and_coalesces():
    core = protocol(log_send=100, log_sent=100, confirm_sent=20, resend_count=0)
    assert core.control_received(0, ControlState(30, 1, 0, 0), INCARNATION_P) == []
    assert core.get_timer() == 10.0
    assert core.control_received(5, ControlState(35, 2, 0, 0), INCARNATION_P) == []
    assert core.handle_timer(9) == []
    actions = core.handle_timer(10)
    assert actions == [PurgeOutbound(2), SendData(35, 100, 2)]
    assert (core.state.resend_count, core.state.confirm_sent, core.state.log_sent) == (2, 35, 35)
    assert core.get_timer() is None and core.handle_timer(11) == []
    # A duplicate request (k <= resend_count) is ignored.
    core.send_done(12, 100)
    assert core.control_received(13, ControlState(35, 2, 0, 0), INCARNATION_P) == []
    assert core.get_timer() is None


def test_resend_request_is_deferred_while_a_send_is_in_flight():
    core = PairProtocol("peer", PairState(log_sent=10, confirm_sent=10), Settings(resend_urgency=0))
    assert core.send_due(0, 50) == [SendData(10, 50, 0)]
    assert core.control_received(1, ControlState(10, 1, 0, 0), INCARNATION_P) == []
    actions = core.send_done(2, 50)
    assert actions == [PurgeOutbound(1), SendData(10, 50, 1)]


def test_a_send_phase_whose_schedule_is_not_due_sends_only_a_resend_asked_for():
    """The core decides, given the schedule: not due, nothing new is due
    (log_send stays); a resend asked for whose urgency passed goes all the
    same, and the log start it is told holds for it (rule 8)."""
    core = protocol(log_send=100, log_sent=100, confirm_sent=20, resend_count=0)
    assert core.send_due(0, 150, 0, scheduled=False) == [] and core.state.log_send == 100
    core.control_received(1, ControlState(30, 1, 0, 0), INCARNATION_P)
    assert core.send_due(5, 150, 0, scheduled=False) == []  # its urgency has not passed
    assert core.send_due(11, 150, 40, scheduled=False) == [PurgeOutbound(1), SendData(30, 100, 1, read_from=40)]
    assert core.state.log_send == 100
    core.send_done(12, 100)
    assert core.send_due(13, 150, 40) == [SendData(100, 150, 1)]  # due: everything up to the log end


def test_request_already_superseded_when_timer_fires():
    core = protocol(log_send=10, log_sent=10)
    core.control_received(0, ControlState(0, 1, 0, 0), INCARNATION_P)
    core._state = PairState(log_send=10, log_sent=10, resend_count=3)
    assert core.handle_timer(100) == []


def test_send_flow_and_misuse():
    core = protocol(log_sent=5, confirm_sent=5)
    assert core.send_due(0, 5) == []  # nothing new
    assert core.send_due(0, 20) == [SendData(5, 20, 0)]
    assert core.send_due(0, 30) == []  # one send at a time
    assert core.send_done(1, 20) == [SendData(20, 30, 0)]
    with pytest.raises(LocalProtocolError):
        core.send_done(2, 99)
    assert core.send_aborted(2) == []
    assert core.state.log_sent == 20
    with pytest.raises(LocalProtocolError):
        core.send_aborted(3)
    assert core.send_due(4, 30) == [SendData(20, 30, 0)]


def test_send_done_of_a_superseded_epoch_does_not_move_log_sent():
    core = protocol(log_sent=5, confirm_sent=5)
    core.send_due(0, 20)
    core._state = PairState(log_send=20, log_sent=5, confirm_sent=5, resend_count=1)
    core.send_done(1, 20)
    assert core.state.log_sent == 5


def test_controls_carry_the_pair_view_and_confirm_received():
    core = protocol(log_received=40, confirm_received=40, rereceive_count=1, log_sent=7, confirm_sent=7,
                    resend_count=2)
    assert core.send_controls(0) == []  # nothing moved since the last confirmation: no news
    [control] = core.send_controls(0, force=True)
    assert control.state == ControlState(40, 1, 7, 2) and core.state.confirm_received == 40
    core.message_queued(0, "m", Header(1, 40, 50), INCARNATION_P)
    core.apply_done(1, 50)
    [control] = core.send_controls(2)
    assert control.state.log_received == 50 and control.reason == "confirmation"


def test_incarnation_change_stops_the_stream():
    core = protocol()
    core.message_queued(0, "a", Header(0, 0, 10), INCARNATION_P)
    core.apply_done(0, 10)
    other = b"X" * 16
    actions = core.message_queued(1, "b", Header(0, 10, 20), other)
    assert actions[0] == StreamStopped(INCARNATION_P, other)
    assert isinstance(actions[1], Quarantine) and core.stopped is not None
    # Old-incarnation messages are kept but nothing is applied while stopped.
    assert core.message_queued(2, "c", Header(0, 10, 20), INCARNATION_P) == []
    assert core.poll(3) == []
    assert core.control_received(4, ControlState(99, 5, 99, 0), other) == []
    assert core.state.peer_log_sent == 0
    # The stop is reported once.
    assert core.message_queued(5, "d", Header(0, 20, 30), other) == [Quarantine("d", actions[1].reason)]


def test_first_contact_adopts_the_peer_incarnation():
    core = protocol()
    core.control_received(0, ControlState(0, 0, 0, 0), INCARNATION_P)
    assert core.state.peer_incarnation == INCARNATION_P


def test_unsafe_switches_turn_the_rules_off_for_the_fault_suite():
    stale_off = PairProtocol("peer", PairState(rereceive_count=2), Settings(unsafe_without_stale_rule=True))
    assert stale_off.message_queued(0, "old", Header(1, 0, 10), INCARNATION_P) == [Apply(("old",), 0, 10)]
    assert stale_off._delete_stale() == []
    dup_off = PairProtocol("peer", PairState(log_received=50), Settings(unsafe_without_duplicate_rule=True))
    assert dup_off.message_queued(0, "dup", Header(0, 10, 40), INCARNATION_P) == []
    assert dup_off.pending_ids == ("dup",)  # a duplicate is kept ...
    # ... and an overlapping message is applied from its prev, without skipping.
    assert dup_off.message_queued(0, "overlap", Header(0, 30, 70), INCARNATION_P) == [Apply(("overlap",), 30, 70)]


def test_without_the_duplicate_rule_the_simulation_double_applies():
    """The pure simulation notices when the rule is gone (the harness can fail):
    messages regenerated after a publisher crash overlap what was applied."""
    pair = Pair(per_message=1, settings=Settings(unsafe_without_duplicate_rule=True))
    pair.commit(6)
    saved = pair.p.state
    pair._pack(SendData(saved.log_sent, pair.log[-1], saved.resend_count))  # crash before send_done
    pair.flush_outbox()
    first_version = list(pair.to_s)
    pair.p = PairProtocol("S", saved, pair.settings)
    pair.per_message = 3
    pair.to_s = first_version[:1]
    pair.deliver_to_s()
    with pytest.raises(AssertionError, match="double apply"):
        pair.cycle()


def test_files_from_a_superseded_copy_are_set_aside_quietly():
    old = b"O" * 16
    core = PairProtocol("peer", PairState(peer_incarnation=INCARNATION_P), Settings(), superseded=frozenset({old}))
    assert core.message_queued(0, "late", Header(0, 0, 10), old) == [DeleteInbound(("late",), "stale")]
    assert core.control_received(0, ControlState(5, 9, 5, 0), old) == []
    assert core.stopped is None and core.state.rereceive_count == 0


def test_a_file_that_fails_its_checks_counts_as_missing_unless_it_names_a_superseded_copy():
    """The judgement of a rejected file sits by that of a verified one: a
    file naming a copy extracted again since is late mail, set aside with
    that said and not counted; any other counts as missing."""
    old = b"O" * 16
    core = PairProtocol("peer", PairState(peer_incarnation=INCARNATION_P), Settings(), superseded=frozenset({old}))
    reason = core.message_rejected(0, "late", "bad signature", claimed_incarnation=old)
    assert reason.startswith("bad signature: it names peer's incarnation 4f4f4f4f, a copy that was extracted again")
    assert core.counters.rejected == 0
    assert core.message_rejected(0, "forged", "bad signature", claimed_incarnation=b"N" * 16) == "bad signature"
    assert core.message_rejected(0, "torn", "truncated") == "truncated"
    assert core.counters.rejected == 2 and core.state == PairState(peer_incarnation=INCARNATION_P)


def test_a_superseded_copy_is_judged_by_rule_1_and_without_it_is_applied():
    """Extraction starts a new epoch both ways, so each file of the copy it
    replaced is of an older epoch: rule 1 is what sets it aside.  With the
    rule off (the fault suite's switch) it is applied as if it were the new
    copy's, though its offsets count another log."""
    old = b"O" * 16
    state = PairState(peer_incarnation=INCARNATION_P, rereceive_count=2)
    core = PairProtocol("peer", state, Settings(), superseded=frozenset({old}))
    assert core.message_queued(0, "late", Header(1, 0, 10), old) == [DeleteInbound(("late",), "stale")]
    stale_off = PairProtocol("peer", state, Settings(unsafe_without_stale_rule=True), superseded=frozenset({old}))
    assert stale_off.message_queued(0, "late", Header(1, 0, 10), old) == [Apply(("late",), 0, 10)]
    assert stale_off.stopped is None
    # A file of that copy in a newer epoch (a lost device that heard the new
    # copy's resend requests) is set aside whatever the switch says.
    assert stale_off.message_queued(0, "newer", Header(2, 10, 20), old) == [DeleteInbound(("newer",), "stale")]


def test_a_confirmation_from_before_the_epoch_of_the_stream_is_ignored():
    """A remote extracted again starts its stream in the epoch the
    consolidated asks for from then on.  A control message the consolidated
    sent to the old copy (one that still opens: the device kept its keys,
    or sealing is off) confirms offsets of the old copy's log; taken as a
    confirmation it would let the new copy skip what was never received."""
    core = PairProtocol("hq", PairState(log_send=40, log_sent=40, resend_count=3, rereceive_count=3,
                                        peer_incarnation=INCARNATION_P), Settings())
    core.control_received(0, ControlState(log_received=30, rereceive_count=2, log_sent=7, resend_count=2),
                          INCARNATION_P)
    assert core.state.confirm_sent == 0
    assert core.state.peer_log_sent == 7  # the consolidated's own log: the same offsets for both copies
    core.control_received(0, ControlState(log_received=10, rereceive_count=3, log_sent=7, resend_count=3),
                          INCARNATION_P)
    assert core.state.confirm_sent == 10


def test_already_taken_is_what_queueing_would_add_nothing_for():
    """``agent run --keep`` skips a file read again when ``already_taken``
    says so; that must be exactly when queueing it would change nothing
    (no new pending message, nothing but deletions)."""
    old = b"O" * 16

    @hypothesis.settings(max_examples=400, deadline=None)
    @hypothesis.given(
        log_received=st.integers(0, 30), rereceive_count=st.integers(0, 3),
        pending=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(1, 6)), max_size=4),
        probe=st.tuples(st.integers(0, 3), st.integers(0, 40), st.integers(0, 6), st.integers(0, 3)),
        incarnation=st.sampled_from([INCARNATION_P, old, b"N" * 16]),
        unsafe=st.sampled_from(["", "stale", "duplicate"]), again=st.booleans())
    def check(log_received, rereceive_count, pending, probe, incarnation, unsafe, again):
        core = PairProtocol("peer", PairState(peer_incarnation=INCARNATION_P, log_received=log_received,
                                              rereceive_count=rereceive_count),
                            Settings(unsafe_without_stale_rule=unsafe == "stale",
                                     unsafe_without_duplicate_rule=unsafe == "duplicate"),
                            superseded=frozenset({old}))
        for number, (epoch, prev, length) in enumerate(pending):
            core.message_queued(0, f"p{number}", Header(epoch, prev, prev + length), INCARNATION_P)
        epoch, prev, length, seq = probe
        header = Header(epoch, prev, prev + length, seq if length == 0 else 0)
        message_id = core.pending_ids[0] if again and core.pending_ids else "probe"
        before = core.pending_ids
        taken = core.already_taken(message_id, header, incarnation)
        actions = core.message_queued(0, message_id, header, incarnation)
        added = (message_id in core.pending_ids and message_id not in before) or any(
            not isinstance(action, DeleteInbound) for action in actions)
        assert taken == (not added), (message_id, header, incarnation, before, actions)

    check()


def test_evolve_is_replace_checked_alike():
    state = PairState(log_send=9, log_sent=5, confirm_sent=3, heard_at=1.5, peer_incarnation=b"\x01" * 16)
    changes = {"log_send": 12, "log_read": 7, "heard_at": None, "confirm_owed": True, "peer_schema_version": 4}
    assert state.evolve(**changes) == replace(state, **changes)
    assert state.evolve() == state
    with pytest.raises(LocalProtocolError, match="confirm_sent 6 is after log_sent 5"):
        state.evolve(confirm_sent=6)
    with pytest.raises(LocalProtocolError, match="^probes must be >= 0"):
        state.evolve(probes=-1)
