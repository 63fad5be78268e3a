"""The stop's clock: one grace from the first signal, shared by the halt, the checkpoint
and the exit; a SIGTERM passed on twice is one stop; a watchdog ends a stop that
outlasts its grace."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from apex_dask.cli.stopclock import TERM_GRACE_ENV, StopClock, grace_for


def test_each_step_gets_its_share_and_all_of_them_end_inside_the_grace():
    clock = StopClock(120.0, start=time.monotonic())
    assert clock.halt_s(cap=1e9) == pytest.approx(24.0)  # 20%
    assert clock.halt_s(cap=5.0) == 5.0  # and at most the call timeout
    assert clock.weights_s(cap=1e9) == pytest.approx(12.0)  # 10%
    assert clock.exit_reserve == 10.0  # 15%, at most 10 s
    # the checkpoint: everything before the exit's share, less 5% for a weights fetch
    assert clock.checkpoint_s() == pytest.approx(120.0 - 10.0 - 6.0, abs=0.05)
    assert clock.exit_s() <= clock.left() <= 120.0
    small = StopClock(4.0)
    assert small.exit_reserve == pytest.approx(0.6)
    halt = small.halt_s(60.0)
    after_halt = StopClock(4.0, start=time.monotonic() - halt)  # the halt took all of it
    assert halt + after_halt.checkpoint_s() + after_halt.exit_reserve <= 4.0


def test_later_steps_get_what_is_left_never_past_the_grace():
    clock = StopClock(10.0, start=time.monotonic() - 9.0)  # 9 of 10 s already spent
    assert clock.checkpoint_s() == 0.1  # the least a step gets
    assert clock.left() == pytest.approx(1.0, abs=0.05)
    assert clock.exit_s() < clock.left()


@pytest.mark.parametrize(
    ("signame", "env", "want"),
    [
        ("SIGTERM", {TERM_GRACE_ENV: "8"}, 8.0),
        ("SIGTERM", {TERM_GRACE_ENV: "300"}, 120.0),  # a cap, never more
        ("SIGUSR1", {TERM_GRACE_ENV: "8"}, 120.0),  # only SIGTERM is followed by SIGKILL
        ("SIGINT", {TERM_GRACE_ENV: "8"}, 120.0),
        ("SIGTERM", {TERM_GRACE_ENV: "soon"}, 120.0),
        ("SIGTERM", {TERM_GRACE_ENV: "-1"}, 120.0),
        ("SIGTERM", {}, 120.0),
    ],
)
def test_a_sigterm_grace_is_capped_by_the_batch_systems_kill_delay(signame, env, want):
    assert grace_for(signame, 120.0, env) == want


RUNNER = textwrap.dedent(
    """
    import os, signal, sys, time
    from apex_dask.cli.signals import StopSignals
    stops = StopSignals.install(grace_s=float(sys.argv[1]))
    stops.phase = "running"
    print("ready", flush=True)
    os.kill(os.getpid(), signal.SIGTERM)   # the batch system's
    os.kill(os.getpid(), signal.SIGTERM)   # and the job script's, passed on
    time.sleep(0.2)
    print("requested", stops.requested, flush=True)
    time.sleep(float(sys.argv[2]))         # a stop that takes too long
    print("still running", flush=True)
    """
)


def test_a_sigterm_passed_on_twice_is_one_stop_and_the_watchdog_ends_a_late_one():
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, "3", "60"], capture_output=True, text=True, timeout=60
    )
    took = time.monotonic() - started
    assert proc.returncode == 143, proc.stderr  # no checkpoint was written
    assert "requested SIGTERM" in proc.stdout and "still running" not in proc.stdout
    assert "SIGTERM again" not in proc.stderr  # not taken as a second signal
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines[0] == (
        "apex-dask-submit: SIGTERM: stopping, saving a checkpoint and the weights within 3 s "
        "(Ctrl-C again to exit at once)"
    )
    assert lines[-1] == (
        "apex-dask-submit: the stop outlasted its grace (3 s, checkpoint.grace_s): exiting now "
        "with what was saved (exit 143)"
    )
    assert took < 30  # the watchdog, not the 60 s sleep


def test_a_second_sigterm_later_still_exits_at_once():
    code = RUNNER.replace(
        'print("still running", flush=True)',
        'os.kill(os.getpid(), signal.SIGTERM); time.sleep(30); print("still running")',
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, "60", "2.5"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 143, proc.stderr
    assert "SIGTERM again: exiting now, without saving more (exit 143)" in proc.stderr
    assert "still running" not in proc.stdout


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_the_longest_grace_is_one_the_watchdog_timer_holds():
    """``checkpoint.grace_s`` past :data:`GRACE_MAX_S` is refused in one line; at the bound
    the watchdog's timer runs (1e10 s overflows the timer's wait: no watchdog at all)."""
    from apex_dask.config import ApexConfig, ConfigError
    from apex_dask.config.sections import GRACE_MAX_S

    with pytest.raises(
        ConfigError, match=r"checkpoint.grace_s=10000000000.0 is invalid: must be at most 604,800 s"
    ):
        ApexConfig().override({"checkpoint.grace_s": 1e10})
    assert ApexConfig().override({"checkpoint.grace_s": GRACE_MAX_S}).checkpoint.grace_s == (
        GRACE_MAX_S
    )
    for grace, holds in ((GRACE_MAX_S, True), (1e10, False)):
        clock = StopClock(grace)
        clock.start_watchdog(lambda: None)
        timer = clock._watchdog
        timer.join(1.0)  # a timer that cannot hold its wait dies at once
        assert timer.is_alive() is holds, grace
        timer.cancel()
