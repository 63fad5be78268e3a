"""The progress line: fraction of the stop condition, ETA from the recent rate, TTY or plain."""

from __future__ import annotations

import io

import pytest

from apex_dask.cli.output import format_progress
from apex_dask.cli.progress import ProgressPrinter, StopProgress, format_eta
from apex_dask.config import StopConfig


def result(it: int, t: float, steps: float) -> dict[str, float]:
    return {"iteration": it, "time_s": t, "timesteps_total": steps}


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "?"), (float("inf"), "?"), (0.4, "0s"), (14.2, "14s"), (125, "2m05s"), (3720, "1h02m")],
)
def test_eta_format(seconds, text):
    assert format_eta(seconds) == text


def test_fraction_is_the_condition_closest_to_its_target_and_eta_the_soonest():
    # 1000 steps/s; 10k steps target is 40% done at t=4 (eta 6 s); 100 s target is 4% done.
    p = StopProgress(StopConfig(timesteps=10_000, time_s=100.0))
    fraction, eta = p.observe(result(1, 4.0, 4000))
    assert fraction == pytest.approx(0.4)
    assert eta == pytest.approx(6.0)
    # time runs out first: 10 s left at 90 s, while steps need (10000-9000)/100 = 10 s.
    p = StopProgress(StopConfig(timesteps=10_000, time_s=100.0))
    fraction, eta = p.observe(result(1, 90.0, 9000))
    assert fraction == pytest.approx(0.9)
    assert eta == pytest.approx(10.0)


def test_eta_follows_the_recent_rate_not_the_average_since_the_start():
    p = StopProgress(StopConfig(timesteps=200_000), window_s=30.0)
    for t in range(10, 100, 10):  # 1000 steps/s up to t=50, then 3000 steps/s
        steps = 1000 * min(t, 50) + 3000 * max(t - 50, 0)
        fraction, eta = p.observe(result(t // 10, float(t), steps))
    assert fraction == pytest.approx(170_000 / 200_000)
    assert eta == pytest.approx(30_000 / 3000)  # rate over t=60..90 only, not 170k/90 s
    fraction, eta = p.observe(result(10, 100.0, 230_000))
    assert (fraction, eta) == (1.0, 0.0)  # past the target: capped, due now


def test_iterations_target_uses_the_iteration_rate():
    p = StopProgress(StopConfig(iterations=10))
    fraction, eta = p.observe(result(2, 5.0, 123))
    assert fraction == pytest.approx(0.2)
    assert eta == pytest.approx(8 / (2 / 5.0))


def test_no_fraction_without_a_stop_condition_or_with_a_reward_target_only():
    for stop in (StopConfig(), StopConfig(eval_return=475.0)):
        p = StopProgress(stop)
        assert not p.active
        assert p.observe(result(1, 1.0, 100)) == (None, None)


def test_plain_line_when_not_a_tty_carries_fraction_and_eta():
    out = io.StringIO()
    printer = ProgressPrinter(StopConfig(timesteps=4000), stream=out)
    first = result(1, 2.0, 1000)
    printer.update(first)
    printer.update(result(2, 4.0, 2000))
    printer.close()
    lines = out.getvalue().splitlines()
    assert lines == [
        format_progress(first) + " | 25% | eta 6s",
        format_progress(result(2, 4.0, 2000)) + " | 50% | eta 4s",
    ]
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()


def test_plain_line_is_todays_line_without_a_stop_condition():
    out = io.StringIO()
    ProgressPrinter(StopConfig(), stream=out, tty=True).update(result(1, 2.0, 1000))
    assert out.getvalue() == format_progress(result(1, 2.0, 1000)) + "\n"


def test_terminal_redraws_one_line_with_a_bar_and_ends_it_on_close():
    out = io.StringIO()
    printer = ProgressPrinter(StopConfig(iterations=4), stream=out, tty=True)
    printer.update(result(1, 1.0, 100))
    printer.update(result(2, 2.0, 200))
    assert "\n" not in out.getvalue()
    assert out.getvalue().count("\r\x1b[2K") == 2
    assert "[##########----------]  50% eta 2s | it 2 |" in out.getvalue()
    printer.close()
    assert out.getvalue().endswith("\n")


def test_quiet_prints_nothing():
    out = io.StringIO()
    printer = ProgressPrinter(StopConfig(timesteps=10), quiet=True, stream=out, tty=True)
    printer.update(result(1, 1.0, 5))
    printer.close()
    assert out.getvalue() == ""
