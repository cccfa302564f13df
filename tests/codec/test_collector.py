"""The cyclic collector paused for the big passes (codec.collector): off
inside a pause, back on after the last one ends, whatever thread or
exception ends it, and left off when the process had switched it off."""

from __future__ import annotations

import gc
import threading

import pytest

from codec.collector import collector_paused


@pytest.fixture(autouse=True)
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_a_pause_switches_the_collector_off_for_its_block() -> None:
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_error_ends_the_pause_too() -> None:
    with pytest.raises(KeyError):
        with collector_paused():
            raise KeyError("x")
    assert gc.isenabled()


def test_pauses_nest_and_the_collector_resumes_after_the_last() -> None:
    with collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_pauses_from_two_threads_overlap() -> None:
    """The first pause ends while the other thread's goes on: the collector
    stays off until that one ends."""
    inside, first_done, seen = threading.Event(), threading.Event(), []

    def other() -> None:
        with collector_paused():
            inside.set()
            first_done.wait(10)
            seen.append(gc.isenabled())

    thread = threading.Thread(target=other)
    with collector_paused():
        thread.start()
        assert inside.wait(10)
    first_done.set()
    assert not gc.isenabled() or not thread.is_alive()
    thread.join(10)
    assert seen == [False]
    assert gc.isenabled()


def test_a_collector_the_process_switched_off_stays_off() -> None:
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_a_payload_read_into_operations_is_read_with_the_collector_paused_and_its_runs_are_not(monkeypatch) -> None:
    """codec.payloads.transactions_of: the runs a payload is read into are
    dropped as its operations are made, so the collector is paused; runs
    handed back live on, and it is not."""
    import codec.payloads as payloads
    from codec.header import Header
    from codec.message import serialize_transaction
    from codec.ops import Operation, Run, Transaction

    transaction = Transaction(5, "hq", (Operation.insert("t", (1,), {"id": 1, "v": "x"}),))
    payload = b"\x91" + serialize_transaction(transaction, 2)
    seen: list[bool] = []
    read = payloads._transactions_of

    def watched(*args):
        seen.append(gc.isenabled())
        return read(*args)

    monkeypatch.setattr(payloads, "_transactions_of", watched)
    as_operations = payloads.transactions_of(payload, Header(0, 0, 5, 0), "f", 2, runs=False)
    as_runs = payloads.transactions_of(payload, Header(0, 0, 5, 0), "f", 2, runs=True)
    assert seen == [False, True]
    assert gc.isenabled()
    assert as_operations[0].ops == transaction.ops
    assert type(as_runs[0].ops[0]) is Run
