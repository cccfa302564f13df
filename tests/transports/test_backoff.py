"""transports.backoff: the one exponential backoff (pure values)."""

import pytest

from transports.backoff import MAX_RETRY_DELAY, Backoff
from transports.errors import BadTransportOptions


def test_the_delays_double_up_to_the_cap_and_stop_after_the_retries():
    assert list(Backoff(6, 2.0).delays()) == [2.0, 4.0, 8.0, 16.0, MAX_RETRY_DELAY, MAX_RETRY_DELAY]
    assert list(Backoff(0, 2.0).delays()) == []
    assert list(Backoff(3, 0).delays()) == [0.0, 0.0, 0.0]


def test_an_endless_backoff_has_a_delay_for_every_failure_however_many():
    endless = Backoff(None, 5.0, 300.0)
    assert [endless.delay(failures) for failures in (1, 2, 3, 7, 8)] == [5.0, 10.0, 20.0, 300.0, 300.0]
    assert endless.delay(1_000_000) == 300.0  # no float overflow after days of failures
    with pytest.raises(AssertionError):
        list(endless.delays())


@pytest.mark.parametrize("retries, first_delay, max_delay", [(-1, 1.0, 30.0), (101, 1.0, 30.0), (True, 1.0, 30.0),
                                                             (3, 31.0, 30.0), (3, -1.0, 30.0), (3, True, 30.0)])
def test_out_of_range_values_are_refused(retries, first_delay, max_delay):
    with pytest.raises(BadTransportOptions):
        Backoff(retries, first_delay, max_delay)
