"""agent.controls: which control message a peer is owed, and with which
timers (pure: no files, no asyncio)."""

from agent.controls import control_timers


def test_a_peers_own_timers_come_first_then_the_runs_and_the_confirm_timeout_is_capped_at_the_heartbeat():
    run = {"run_heartbeat": 86400.0, "run_confirm_timeout": 3600.0}
    assert control_timers(None, None, **run) == (86400.0, 3600.0)
    assert control_timers(600, None, **run) == (600, 600)  # the run's confirm timeout, capped at the peer's heartbeat
    assert control_timers(None, 60, **run) == (86400.0, 60)
    assert control_timers(600, 7200, **run) == (600, 600)
    assert control_timers(7200, 600, **run) == (7200, 600)
