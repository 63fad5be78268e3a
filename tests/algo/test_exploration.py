import numpy as np
import pytest

from apex_dask.algo.rollout.exploration import (
    apex_epsilons,
    ladder_fill_order,
    lowest_epsilon_workers,
)


def test_epsilons_follow_apex_formula_hand_computed():
    eps = apex_epsilons(3)
    # i=0: 0.4^1, i=1: 0.4^(1+3.5), i=2: 0.4^8
    assert eps == pytest.approx([0.4, 0.4**4.5, 0.4**8])
    assert eps[2] == pytest.approx(0.00065536)


@pytest.mark.parametrize("n", [2, 5, 32])
def test_epsilons_span_base_to_base_power_one_plus_alpha(n):
    eps = apex_epsilons(n, base=0.5, alpha=3.0)
    assert len(eps) == n
    assert eps[0] == pytest.approx(0.5)
    assert eps[-1] == pytest.approx(0.5**4)
    assert np.all(np.diff(eps) < 0)
    expected = [0.5 ** (1 + 3.0 * i / (n - 1)) for i in range(n)]
    assert eps == pytest.approx(expected)


def test_single_worker_gets_base():
    assert apex_epsilons(1).tolist() == [0.4]


@pytest.mark.parametrize("n", [0, -1, 2.5, "3", True, None])
def test_bad_worker_count_raises(n):
    with pytest.raises(ValueError):
        apex_epsilons(n)


@pytest.mark.parametrize("kwargs", [{"base": 0.0}, {"base": 1.5}, {"alpha": -1.0}])
def test_bad_base_or_alpha_raises(kwargs):
    with pytest.raises(ValueError):
        apex_epsilons(4, **kwargs)


@pytest.mark.parametrize(
    "n,expected",
    [(1, [0]), (2, [1]), (3, [2]), (4, [2, 3]), (6, [4, 5]), (32, list(range(21, 32)))],
)
def test_lowest_epsilon_third_is_highest_indices(n, expected):
    assert lowest_epsilon_workers(n) == expected


@pytest.mark.parametrize("n", range(1, 70))
def test_lowest_epsilon_third_matches_rllib_slice(n):
    """RLlib reports from ``workers[-N // 3:]``: ceil(N / 3) workers, never N // 3."""
    assert lowest_epsilon_workers(n) == list(range(n))[-n // 3 :]


@pytest.mark.parametrize(
    "n,expected",
    [(1, [0]), (2, [0, 1]), (3, [0, 2, 1]), (4, [0, 3, 1, 2]), (5, [0, 4, 2, 1, 3])],
)
def test_ladder_fill_order_takes_the_ends_then_the_widest_gaps(n, expected):
    assert ladder_fill_order(n) == expected


@pytest.mark.parametrize("n", [2, 7, 32, 360])
def test_any_count_of_the_fill_order_spans_the_ladder(n):
    order = ladder_fill_order(n)
    assert sorted(order) == list(range(n))
    for k in range(2, n + 1):  # both ends, and no gap wider than twice the best possible
        taken = sorted(order[:k])
        assert taken[0] == 0 and taken[-1] == n - 1
        assert max(np.diff(taken)) <= 2 * -(-(n - 1) // (k - 1))
    eps = apex_epsilons(n)
    assert eps[sorted(order[:2])].tolist() == apex_epsilons(2).tolist()  # as 2 workers would
