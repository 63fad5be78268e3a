"""SumMinTree: exact internal nodes, correct descent, both backends alike."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from apex_dask.algo.replay.sumtree import HAVE_NUMBA, SumMinTree

BACKENDS = ["numpy"] + (["numba"] if HAVE_NUMBA else [])
needs_numba = pytest.mark.skipif(not HAVE_NUMBA, reason="numba not importable")


def random_writes(tree: SumMinTree, rng: np.random.Generator, n_writes: int) -> None:
    """Scattered sets (with repeats and zeros), ranges and fills, n_writes slots in all."""
    cap = tree.capacity
    done = 0
    while done < n_writes:
        kind = rng.integers(3)
        if kind == 0:
            n = int(rng.integers(1, 64))
            slots = rng.integers(0, cap, n)
            masses = rng.lognormal(0.0, 4.0, n) * (rng.random(n) < 0.9)
            tree.set(slots, masses)
        else:
            start = int(rng.integers(0, cap))
            n = int(rng.integers(0, min(64, cap - start) + 1))
            if kind == 1:
                tree.set_range(start, rng.lognormal(0.0, 4.0, n))
            else:
                tree.fill_range(start, n, float(rng.lognormal()))
        done += max(n, 1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("capacity", [1, 7, 8, 9, 1000, 4096])
def test_incremental_updates_equal_a_full_rebuild_bit_for_bit(backend, capacity):
    rng = np.random.default_rng(capacity)
    tree = SumMinTree(capacity, backend=backend)
    random_writes(tree, rng, 20_000 if capacity >= 1000 else 2_000)
    tree.flush()
    sums, mins = tree.sum_tree.copy(), tree.min_tree.copy()
    tree.rebuild()
    assert np.array_equal(sums, tree.sum_tree)
    assert np.array_equal(mins, tree.min_tree)
    leaves = tree.masses()
    assert tree.total == pytest.approx(leaves.sum(), rel=1e-12)
    assert tree.min == leaves.min()


@needs_numba
@pytest.mark.parametrize("capacity", [9, 1000, 5000])
def test_numba_and_numpy_backends_build_the_same_tree_and_draw_the_same_slots(capacity):
    trees = {}
    for backend in ("numba", "numpy"):
        tree = SumMinTree(capacity, backend=backend)
        random_writes(tree, np.random.default_rng(7), 5_000)
        tree.flush()
        trees[backend] = tree
    assert np.array_equal(trees["numba"].sum_tree, trees["numpy"].sum_tree)
    assert np.array_equal(trees["numba"].min_tree, trees["numpy"].min_tree)
    u = np.random.default_rng(8).random(20_000)
    slots_nb, w_nb = trees["numba"].sample(u, 0.4)
    slots_np, w_np = trees["numpy"].sample(u, 0.4)
    assert np.array_equal(slots_nb, slots_np)
    np.testing.assert_allclose(w_nb, w_np, rtol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_descent_returns_the_slot_whose_mass_interval_holds_u_times_total(backend):
    rng = np.random.default_rng(3)
    tree = SumMinTree(300, backend=backend)
    masses = rng.integers(1, 5, 300).astype(np.float64)  # integers: exact prefix sums
    masses[::7] = 0.0
    tree.set(np.arange(300), masses)
    u = rng.random(5_000)
    slots, _ = tree.sample(u, 0.0)
    expected = np.searchsorted(np.cumsum(masses), u * masses.sum(), side="right")
    assert np.array_equal(slots, expected)
    assert np.all(masses[slots] > 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_uniform_at_the_top_edge_never_lands_on_an_empty_slot(backend):
    tree = SumMinTree(64, backend=backend)
    tree.set(np.arange(10), np.full(10, 0.1))
    # u = 1 puts the target mass exactly at the end of the filled slots, where
    # rounding of u * total can also put it; slots 10.. are empty.
    slots, weights = tree.sample(np.array([1.0, np.nextafter(1.0, 0.0), 0.0]), 1.0)
    assert slots.tolist() == [9, 9, 0]
    np.testing.assert_allclose(weights, 1.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_weights_are_mass_over_min_mass_to_the_minus_beta(backend):
    tree = SumMinTree(5, backend=backend)
    masses = np.array([1.0, 2.0, 4.0, 0.5, 3.0])
    tree.set(np.arange(5), masses)
    u = np.linspace(0, 1, 50, endpoint=False)
    slots, weights = tree.sample(u, 0.7)
    np.testing.assert_allclose(weights, (masses[slots] / 0.5) ** -0.7, rtol=1e-6)
    assert weights.dtype == np.float32 and slots.dtype == np.int64


def test_min_and_total_cover_only_filled_slots():
    tree = SumMinTree(100)
    assert tree.total == 0.0 and tree.min == np.inf
    tree.fill_range(10, 5, 2.0)
    tree.set(np.array([50]), np.array([0.25]))
    assert tree.total == 10.25
    assert tree.min == 0.25


def test_load_masses_replaces_every_leaf():
    tree = SumMinTree(20)
    tree.fill_range(0, 20, 1.0)
    tree.load_masses(np.array([3.0, 1.0]))
    assert tree.total == 4.0 and tree.min == 1.0
    assert np.array_equal(tree.masses()[:3], [3.0, 1.0, 0.0])


def test_bad_construction_and_ranges_raise():
    with pytest.raises(ValueError):
        SumMinTree(0)
    with pytest.raises(ValueError):
        SumMinTree(8, backend="cuda")
    tree = SumMinTree(8)
    with pytest.raises(ValueError):
        tree.fill_range(6, 3, 1.0)
    with pytest.raises(ValueError):
        tree.set_range(-1, np.ones(2))


def test_a_pickled_tree_keeps_working_on_its_own_arrays():
    tree = SumMinTree(100)
    tree.fill_range(0, 10, 1.0)
    copy = pickle.loads(pickle.dumps(tree))
    copy.fill_range(10, 10, 3.0)
    assert copy.total == 40.0 and tree.total == 10.0
    copy.flush()
    sums = copy.sum_tree.copy()
    copy.rebuild()
    assert np.array_equal(sums, copy.sum_tree)
