"""Rule 2's consecutive messages in one apply (docs/protocol.md): which
pending messages go together, the bounds, and what an apply of several
that does not commit leads to."""

from __future__ import annotations

import pytest

from agent import protocol as protocol_module
from agent.protocol import Apply, DeleteInbound, PairProtocol, PairState, Quarantine, SendControl, Settings
from codec.header import Header

from .pairsim import INCARNATION_P


def core(**state) -> PairProtocol:
    return PairProtocol("peer", PairState(**state), Settings(patience=1, resend_urgency=0))


def queue(protocol: PairProtocol, *messages: tuple, size: int = 1000) -> list:
    """Queue ``(id, resend_count, prev, last[, seq])`` messages without applying; then what is applicable."""
    for message_id, *header in messages:
        assert protocol.message_queued(0, message_id, Header(*header), INCARNATION_P, size=size, apply=False) == []
    return protocol.take_applicable(1)


def test_consecutive_messages_queued_together_are_applied_together() -> None:
    protocol = core(log_received=5)
    actions = queue(protocol, ("m3", 0, 20, 30), ("m1", 0, 0, 10), ("m2", 0, 10, 20))
    assert actions == [Apply(("m1", "m2", "m3"), 5, 30)]  # skips what log_received covers, sets the last one's
    assert protocol.apply_done(2, 30) == [DeleteInbound(("m1", "m2", "m3"), "applied")]
    assert protocol.state.log_received == 30 and protocol.pending_ids == ()


def test_a_message_queued_to_apply_at_once_still_starts_alone() -> None:
    protocol = core()
    assert protocol.message_queued(0, "m1", Header(0, 0, 10), INCARNATION_P) == [Apply(("m1",), 0, 10)]
    assert protocol.message_queued(0, "m2", Header(0, 10, 20), INCARNATION_P) == []
    assert protocol.message_queued(0, "m3", Header(0, 20, 30), INCARNATION_P) == []
    # Once the first is applied, the two that wait go together.
    assert protocol.apply_done(1, 10) == [DeleteInbound(("m1",), "applied"), Apply(("m2", "m3"), 10, 30)]


def test_a_poll_applies_what_waits() -> None:
    protocol = core()
    assert protocol.message_queued(0, "m1", Header(0, 0, 10), INCARNATION_P, apply=False) == []
    assert protocol.message_queued(0, "m2", Header(0, 10, 20), INCARNATION_P, apply=False) == []
    assert protocol.poll(1) == [Apply(("m1", "m2"), 0, 20)]


@pytest.mark.parametrize("messages, applied", [
    # a gap: 20..30 is missing
    ([("m1", 0, 0, 10), ("m2", 0, 10, 20), ("m4", 0, 30, 40)], Apply(("m1", "m2"), 0, 20)),
    # the next one rule 2 picks (the newer epoch) starts before the last: it goes alone, with its skip
    ([("m1", 0, 0, 10), ("n", 1, 5, 20), ("m2", 0, 10, 20)], Apply(("m1",), 0, 10)),
    # a group of parts after a message: applied as a group, on its own
    ([("m1", 0, 0, 10), ("p0", 0, 10, 10, 0), ("p1", 0, 10, 20, 1)], Apply(("m1",), 0, 10)),
    # a group first: on its own
    ([("p0", 0, 0, 0, 0), ("p1", 0, 0, 10, 1), ("m2", 0, 10, 20)], Apply(("p0", "p1"), 0, 10)),
])
def test_what_ends_a_run_of_consecutive_messages(messages: list, applied: Apply) -> None:
    assert queue(core(), *messages) == [applied]


def test_at_most_chain_messages_and_chain_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    messages = [(f"m{i}", 0, 10 * i, 10 * i + 10) for i in range(5)]
    monkeypatch.setattr(protocol_module, "CHAIN_MESSAGES", 3)
    assert queue(core(), *messages) == [Apply(("m0", "m1", "m2"), 0, 30)]
    monkeypatch.setattr(protocol_module, "CHAIN_MESSAGES", 64)
    bytes_ = protocol_module.CHAIN_BYTES
    assert queue(core(), *messages, size=bytes_ // 2) == [Apply(("m0", "m1"), 0, 20)]  # two fill the bytes
    assert queue(core(), *messages, size=bytes_ + 1) == [Apply(("m0",), 0, 10)]  # the first whatever its size
    assert queue(core(), *messages, size=0) == [Apply(tuple(m[0] for m in messages), 0, 50)]  # sizes not told


def test_an_apply_of_several_that_did_not_commit_is_tried_one_message_at_a_time() -> None:
    protocol = core()
    assert queue(protocol, ("m1", 0, 0, 10), ("m2", 0, 10, 20), ("m3", 0, 20, 30)) == [Apply(("m1", "m2", "m3"), 0,
                                                                                               30)]
    assert protocol.apply_aborted(2) == []  # the database refused it: all stay queued
    assert protocol.poll(3) == [Apply(("m1",), 0, 10)]
    assert protocol.apply_done(4, 10)[-1] == Apply(("m2",), 10, 20)
    assert protocol.apply_done(5, 20)[-1] == Apply(("m3",), 20, 30)
    protocol.apply_done(6, 30)
    # As many single applies as the aborted one held; then they go together again.
    assert queue(protocol, ("m4", 0, 30, 40), ("m5", 0, 40, 50)) == [Apply(("m4", "m5"), 30, 50)]


def test_a_message_of_several_that_cannot_be_decoded_is_set_aside_alone() -> None:
    protocol = core()
    queue(protocol, ("m1", 0, 0, 10), ("m2", 0, 10, 20), ("m3", 0, 20, 30))
    # Set aside, and the one before it applied at once.
    assert protocol.apply_aborted(2, quarantine="bad payload", culprit="m2") == [Quarantine("m2", "bad payload"),
                                                                                 Apply(("m1",), 0, 10)]
    assert protocol.pending_ids == ("m1", "m3") and protocol.counters.rejected == 1
    assert protocol.apply_done(4, 10) == [DeleteInbound(("m1",), "applied")]  # the one after it waits
    assert protocol.state.log_received == 10
    assert protocol.poll(5) == []
    assert isinstance(protocol.poll(6)[-1], SendControl)  # and its gap is asked for (rule 4)


def test_a_group_that_cannot_be_decoded_is_set_aside_whole() -> None:
    protocol = core()
    queue(protocol, ("p0", 0, 0, 0, 0), ("p1", 0, 0, 10, 1))
    assert protocol.apply_aborted(2, quarantine="bad part", culprit="p1") == [Quarantine("p0", "bad part"),
                                                                               Quarantine("p1", "bad part")]
