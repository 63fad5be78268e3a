import math
import time

import numpy as np
import pytest

from apex_dask.experiment.timers import Timer, WindowStat


def test_timer_measures_block_duration():
    t = Timer()
    with t:
        time.sleep(0.02)
    assert t.count == 1
    assert 0.015 <= t.mean < 0.5
    assert t.total_s == pytest.approx(t.mean)


def test_timer_window_keeps_only_last_durations():
    t = Timer(window=3)
    for s in [10.0, 1.0, 2.0, 3.0]:
        t.push(s)
    assert t.count == 4
    assert t.mean == pytest.approx(2.0)
    assert t.total_s == pytest.approx(16.0)


def test_timer_empty_reports_nan():
    t = Timer()
    assert math.isnan(t.mean)


def test_timer_records_even_when_block_raises():
    t = Timer()
    with pytest.raises(KeyError), t:
        raise KeyError("x")
    assert t.count == 1


def test_timer_rejects_bad_window():
    with pytest.raises(ValueError):
        Timer(window=0)


def test_window_stat_matches_numpy_over_last_n():
    rng = np.random.default_rng(0)
    xs = rng.normal(size=80)
    w = WindowStat("queue", n=50)
    for x in xs:
        w.push(x)
    s = w.stats()
    tail = xs[-50:]
    assert s["count"] == 80
    assert s["mean"] == pytest.approx(tail.mean())
    assert s["std"] == pytest.approx(tail.std())
    assert s["quantiles"] == pytest.approx(list(np.percentile(tail, [0, 10, 50, 90, 100])))


def test_window_stat_hand_computed_quantiles():
    w = WindowStat("q", n=5)
    for x in [4, 0, 2, 1, 3]:
        w.push(x)
    s = w.stats()
    assert s["quantiles"] == pytest.approx([0.0, 0.4, 2.0, 3.6, 4.0])
    assert s["mean"] == pytest.approx(2.0)


def test_window_stat_empty_is_nan_with_five_quantiles():
    s = WindowStat("q").stats()
    assert s["count"] == 0
    assert math.isnan(s["mean"]) and len(s["quantiles"]) == 5
