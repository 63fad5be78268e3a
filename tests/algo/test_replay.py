"""ReplayShard: the sampling law, weights, ring, priorities, checkpoints, bad input."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from scipy import stats

from apex_dask.algo.replay.sample import item_checksums
from apex_dask.algo.replay.shard import ReplayShard
from apex_dask.algo.replay.sumtree import HAVE_NUMBA

BACKENDS = ["numpy"] + (["numba"] if HAVE_NUMBA else [])


def transitions(n: int, start: int = 0, obs_dim: int = 3) -> dict[str, np.ndarray]:
    """n transitions whose every field encodes the item number start..start+n-1."""
    i = np.arange(start, start + n)
    return {
        "obs": np.repeat(i[:, None], obs_dim, axis=1).astype(np.float32),
        "action": i.astype(np.int64),
        "reward": i.astype(np.float32),
        "next_obs": np.repeat(i[:, None] + 1, obs_dim, axis=1).astype(np.float32),
        "done": i % 2 == 0,
    }


def probabilities(p: np.ndarray, alpha: float, eps: float) -> np.ndarray:
    mass = (p + eps) ** alpha
    return mass / mass.sum()


# ---------------------------------------------------------------- sampling law
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("alpha", "eps"), [(0.6, 1e-6), (1.0, 0.5), (0.0, 1e-6)])
def test_sampling_frequencies_match_priority_formula_chi_square(backend, alpha, eps):
    rng = np.random.default_rng(11)
    shard = ReplayShard(64, alpha=alpha, eps=eps, seed=5, backend=backend)
    p = rng.exponential(1.0, 40)
    p[:3] = 0.0
    shard.add(transitions(40), priorities=p)
    counts = np.zeros(40)
    for _ in range(40):
        counts += np.bincount(shard.sample(1000, beta=0.4).indices, minlength=40)
    expected = probabilities(p, alpha, eps) * counts.sum()
    assert stats.chisquare(counts, expected).pvalue > 1e-3
    if alpha != 1.0:  # the test has power: another exponent is rejected
        wrong = probabilities(p, 1.0, eps) * counts.sum()
        assert stats.chisquare(counts, wrong).pvalue < 1e-6


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("beta", [0.0, 0.4, 1.0])
def test_weights_match_brute_force_formula(backend, beta):
    rng = np.random.default_rng(12)
    shard = ReplayShard(32, alpha=0.6, eps=1e-6, seed=1, backend=backend)
    p = rng.exponential(2.0, 20)
    shard.add(transitions(20), priorities=p)
    s = shard.sample(256, beta=beta)
    prob = probabilities(p, 0.6, 1e-6)
    w_all = (len(shard) * prob) ** -beta
    expected = (len(shard) * prob[s.indices]) ** -beta / w_all.max()
    np.testing.assert_allclose(s.weights, expected, rtol=1e-5)
    assert s.weights.dtype == np.float32 and s.indices.dtype == np.int64
    assert s.weights.max() <= 1.0 + 1e-6


def test_sample_gathers_the_stored_items_at_the_indices():
    shard = ReplayShard(16, seed=2)
    shard.add(transitions(10, start=100))
    s = shard.sample(64, beta=0.4)
    assert np.array_equal(s.data["action"], 100 + s.indices)
    assert np.array_equal(s.data["obs"][:, 0], (100 + s.indices).astype(np.float32))
    assert s.data["obs"].shape == (64, 3) and s.data["done"].dtype == bool


def test_zero_priority_items_are_never_drawn_when_eps_is_zero():
    shard = ReplayShard(8, alpha=1.0, eps=0.0, seed=3)
    shard.add(transitions(4), priorities=np.array([0.0, 1.0, 0.0, 3.0]))
    s = shard.sample(2000, beta=0.5)
    assert set(np.unique(s.indices)) == {1, 3}
    shard.update_priorities(np.array([1, 3]), np.zeros(2))
    with pytest.raises(ValueError, match="mass 0"):
        shard.sample(4, beta=0.4)


# -------------------------------------------------------------------- priorities
def test_new_items_get_the_largest_priority_seen_so_far():
    shard = ReplayShard(16, alpha=1.0, eps=0.0)
    shard.add(transitions(2))
    assert shard.state_dict()["priority"].tolist() == [1.0, 1.0]
    shard.add(transitions(3, 2), priorities=np.array([0.5, 5.0, 2.0]))
    shard.add(transitions(1, 5))
    shard.update_priorities(np.array([0]), np.array([9.0]))
    shard.add(transitions(1, 6))
    assert shard.state_dict()["priority"].tolist() == [9.0, 1.0, 0.5, 5.0, 2.0, 5.0, 9.0]
    assert shard.max_priority == 9.0


def test_update_with_duplicate_indices_keeps_the_last_value():
    shard = ReplayShard(8, alpha=1.0, eps=0.0, seed=0)
    shard.add(transitions(4), priorities=np.ones(4))
    shard.update_priorities(np.array([2, 0, 2, 2]), np.array([7.0, 3.0, 8.0, 0.25]))
    state = shard.state_dict()
    assert state["priority"].tolist() == [3.0, 1.0, 0.25, 1.0]
    assert state["mass"].tolist() == [3.0, 1.0, 0.25, 1.0]
    assert shard.max_priority == 8.0  # every value was seen


def test_update_of_an_overwritten_slot_applies_to_the_item_there_now():
    shard = ReplayShard(4, alpha=1.0, eps=0.0, seed=0)
    shard.add(transitions(4), priorities=np.ones(4))
    shard.add(transitions(1, start=4), priorities=np.array([1.0]))  # item 4 replaces item 0
    shard.update_priorities(np.array([0]), np.array([6.0]))
    s = shard.sample(500, beta=0.0)
    assert np.array_equal(s.data["action"][s.indices == 0], np.full((s.indices == 0).sum(), 4))
    assert shard.state_dict()["priority"].tolist() == [6.0, 1.0, 1.0, 1.0]


def test_an_item_overwritten_since_its_sample_keeps_its_new_priority():
    shard = ReplayShard(4, alpha=1.0, eps=0.0, seed=0)
    shard.add(transitions(4), priorities=np.ones(4))
    s = shard.sample(64, beta=0.0)
    assert set(s.indices.tolist()) == {0, 1, 2, 3}
    shard.add(transitions(2, start=4), priorities=np.array([2.0, 3.0]))  # items 4, 5 -> 0, 1
    gone = np.isin(s.indices, [0, 1])
    stale = shard.update_priorities(s.indices, np.full(64, 7.0), s.generations)
    assert stale == gone.sum() and shard.stats()["stale_priority_updates"] == stale
    assert shard.stats()["updated"] == 64 - stale
    assert shard.state_dict()["priority"].tolist() == [2.0, 3.0, 7.0, 7.0]
    assert shard.max_priority == 7.0


def test_each_write_stamps_its_slot_with_a_new_generation():
    shard = ReplayShard(3, seed=0)
    t0 = shard.state_dict()["clock"]  # the clock starts at the wall clock (ns)
    shard.add(transitions(2))
    shard.add(transitions(5, start=2))  # wraps twice over the 3 slots: items 4, 5, 6 stay
    state = shard.state_dict()
    assert state["clock"] == t0 + 7
    # slot k holds the write numbered so
    assert (state["generation"] - t0).tolist() == [7, 5, 6]
    s = shard.sample(200, beta=0.4)
    np.testing.assert_array_equal(s.generations, state["generation"][s.indices])


def test_a_restored_shard_keeps_its_items_generations_and_never_reuses_one():
    a = ReplayShard(4, alpha=1.0, eps=0.0, seed=0)
    a.add(transitions(4))
    s = a.sample(32, beta=0.0)
    b = ReplayShard(4, alpha=1.0, eps=0.0, seed=0)
    b.load_state_dict(a.state_dict())
    a.add(transitions(1, start=4))  # the shard that was lost goes on to write slot 0 ...
    b.add(transitions(1, start=9))  # ... and so does the one restored from its checkpoint
    assert a.state_dict()["generation"][0] != b.state_dict()["generation"][0]
    assert b.update_priorities(s.indices, np.full(32, 5.0), s.generations) == (s.indices == 0).sum()
    assert b.state_dict()["priority"].tolist() == [1.0, 5.0, 5.0, 5.0]


def test_the_audit_finds_an_update_aimed_at_other_items():
    shard = ReplayShard(8, seed=0)
    shard.add(transitions(8))
    s = shard.sample(16, beta=0.4)
    assert shard.audit(s.indices, s.generations, item_checksums(s.data)) == (16, 0)
    other = (s.indices + 1) % 8  # what a reused buffer would send: other slots
    checked, differ = shard.audit(other, shard.items.generation[other], item_checksums(s.data))
    assert checked == 16 and differ == 16


def test_priorities_written_into_the_shard_move_its_tree_exactly():
    """20k random updates, then the incremental tree equals a rebuild from its leaves."""
    rng = np.random.default_rng(4)
    shard = ReplayShard(5000, seed=0)
    shard.add(transitions(5000), priorities=rng.exponential(1.0, 5000))
    for _ in range(40):
        shard.update_priorities(rng.integers(0, 5000, 500), rng.lognormal(0.0, 3.0, 500))
    tree = shard._priorities.tree
    tree.flush()
    sums, mins = tree.sum_tree.copy(), tree.min_tree.copy()
    tree.rebuild()
    assert np.array_equal(sums, tree.sum_tree) and np.array_equal(mins, tree.min_tree)


# --------------------------------------------------------------------------- ring
def test_ring_overwrites_the_oldest_items_and_counts_evictions():
    shard = ReplayShard(8, seed=0)
    assert shard.add(transitions(5)).tolist() == [0, 1, 2, 3, 4]
    slots = shard.add(transitions(5, start=5))
    assert slots.tolist() == [5, 6, 7, 0, 1] and slots.dtype == np.int64
    assert len(shard) == 8
    assert shard.state_dict()["data/action"].tolist() == [8, 9, 2, 3, 4, 5, 6, 7]
    st = shard.stats()
    assert (st["size"], st["added"], st["evicted"]) == (8, 10, 2)


def test_batch_that_wraps_the_ring_end_keeps_each_items_own_priority():
    shard = ReplayShard(8, alpha=1.0, eps=0.0, seed=0)
    shard.add(transitions(6), priorities=np.full(6, 0.5))
    shard.add(transitions(4, start=6), priorities=np.array([10.0, 20.0, 30.0, 40.0]))
    state = shard.state_dict()
    by_slot = dict(zip(state["data/action"].tolist(), state["priority"].tolist(), strict=True))
    assert by_slot == {8: 30.0, 9: 40.0, 2: 0.5, 3: 0.5, 4: 0.5, 5: 0.5, 6: 10.0, 7: 20.0}
    assert state["mass"].tolist() == state["priority"].tolist()  # alpha 1, eps 0
    counts = np.bincount(shard.sample(20_000, beta=0.4).data["action"], minlength=10)
    np.testing.assert_allclose(counts[8] / counts[6], 3.0, rtol=0.15)


def test_batch_larger_than_capacity_keeps_its_last_items():
    shard = ReplayShard(4, alpha=1.0, eps=0.0, seed=0)
    shard.add(transitions(1))
    slots = shard.add(transitions(6, start=1), priorities=np.arange(1.0, 7.0))
    assert slots.tolist() == [1, 2, 3, 0, 1, 2]
    state = shard.state_dict()
    assert state["data/action"].tolist() == [4, 5, 6, 3]
    assert state["priority"].tolist() == [4.0, 5.0, 6.0, 3.0]
    assert shard.stats()["evicted"] == 3


def test_extra_keys_are_stored_and_sampled():
    shard = ReplayShard(8, seed=0)
    batch = transitions(3)
    batch["discount"] = np.array([0.99, 0.98, 0.97], np.float32)
    shard.add(batch)
    s = shard.sample(16, beta=0.4)
    np.testing.assert_allclose(s.data["discount"], batch["discount"][s.indices])


# --------------------------------------------------------------------- checkpoint
@pytest.mark.parametrize("backend", BACKENDS)
def test_state_dict_round_trips_through_npz_and_continues_identically(backend, tmp_path):
    rng = np.random.default_rng(6)
    a = ReplayShard(50, seed=9, backend=backend)
    for k in range(4):
        a.add(transitions(17, start=17 * k), priorities=rng.exponential(1.0, 17))
        s = a.sample(32, beta=0.4)
        a.update_priorities(s.indices, rng.exponential(1.0, 32))
    np.savez(tmp_path / "shard.npz", **a.state_dict())
    with np.load(tmp_path / "shard.npz") as f:
        state = dict(f)
    b = ReplayShard(50, seed=123, backend=backend)
    b.load_state_dict(state)
    assert b.stats() == a.stats()
    assert np.array_equal(a._priorities.tree.sum_tree, b._priorities.tree.sum_tree)
    assert np.array_equal(a._priorities.tree.min_tree, b._priorities.tree.min_tree)
    for _ in range(3):
        sa, sb = a.sample(64, beta=0.4), b.sample(64, beta=0.4)
        assert np.array_equal(sa.indices, sb.indices)
        assert np.array_equal(sa.weights, sb.weights)
        for key in sa.data:
            assert np.array_equal(sa.data[key], sb.data[key])
        assert np.array_equal(a.add(transitions(5)), b.add(transitions(5)))
    assert a.state_dict()["priority"].tolist() == b.state_dict()["priority"].tolist()


def test_a_pickled_shard_continues_identically_and_still_stores_into_its_records():
    rng = np.random.default_rng(8)
    a = ReplayShard(20, seed=4)
    a.add(transitions(25), priorities=rng.exponential(1.0, 25))
    b = pickle.loads(pickle.dumps(a))
    for shard in (a, b):
        shard.add(transitions(3, start=500))
    sa, sb = a.sample(40, beta=0.4), b.sample(40, beta=0.4)
    assert np.array_equal(sa.indices, sb.indices)
    assert np.array_equal(sa.data["action"], sb.data["action"])
    assert {500, 501, 502} <= set(b.state_dict()["data/action"].tolist())


def test_state_of_an_empty_shard_loads():
    b = ReplayShard(10, seed=0)
    b.load_state_dict(ReplayShard(10).state_dict())
    assert len(b) == 0
    b.add(transitions(2))
    assert len(b) == 2


def test_load_state_dict_rejects_another_capacity_or_alpha():
    state = ReplayShard(10).state_dict()
    with pytest.raises(ValueError, match="capacity"):
        ReplayShard(11).load_state_dict(state)
    with pytest.raises(ValueError, match="alpha"):
        ReplayShard(10, alpha=0.5).load_state_dict(state)


# ------------------------------------------------------------------------ stats
def test_stats_count_items_and_accumulate_time():
    shard = ReplayShard(8, seed=0)
    shard.add(transitions(6))
    s = shard.sample(5, beta=0.4)
    shard.update_priorities(s.indices, np.ones(5))
    st = shard.stats()
    assert {k: st[k] for k in ("size", "capacity", "added", "sampled", "evicted", "updated")} == {
        "size": 6,
        "capacity": 8,
        "added": 6,
        "sampled": 5,
        "evicted": 0,
        "updated": 5,
    }
    assert all(st[k] > 0.0 for k in ("add_s", "sample_s", "update_s"))


# -------------------------------------------------------------------- bad input
@pytest.fixture
def shard() -> ReplayShard:
    s = ReplayShard(8, seed=0)
    s.add(transitions(4))
    return s


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("obs", np.zeros((2, 3), np.float64)),  # dtype
        ("next_obs", np.zeros((2, 4), np.float32)),  # shape
        ("done", np.zeros(2, np.int8)),  # dtype
    ],
)
def test_schema_mismatch_raises_naming_the_key(shard, key, value):
    batch = transitions(2)
    batch[key] = value
    with pytest.raises(ValueError, match=key):
        shard.add(batch)
    assert len(shard) == 4


def test_missing_or_extra_key_after_the_first_add_raises_naming_it(shard):
    batch = transitions(2)
    del batch["reward"]
    with pytest.raises(ValueError, match="reward"):
        shard.add(batch)
    batch = transitions(2)
    batch["discount"] = np.ones(2, np.float32)
    with pytest.raises(ValueError, match="discount"):
        shard.add(batch)


def test_first_batch_without_a_required_key_raises_and_fixes_no_schema():
    s = ReplayShard(8)
    batch = transitions(2)
    del batch["done"]
    with pytest.raises(ValueError, match="done"):
        s.add(batch)
    batch = transitions(2)
    batch["reward"] = batch["reward"][:1]
    with pytest.raises(ValueError, match="reward"):
        s.add(batch)
    s.add(transitions(2))  # a good batch still sets the schema
    assert len(s) == 2


def test_unequal_first_dimensions_raise_naming_the_key(shard):
    batch = transitions(3)
    batch["action"] = batch["action"][:2]
    with pytest.raises(ValueError, match="action"):
        shard.add(batch)


def test_sampling_an_empty_shard_raises():
    with pytest.raises(ValueError, match="empty"):
        ReplayShard(8).sample(4, beta=0.4)


@pytest.mark.parametrize("bad", [-1.0, np.nan, np.inf, -np.inf])
def test_negative_or_non_finite_priorities_raise(shard, bad):
    with pytest.raises(ValueError, match="finite and >= 0"):
        shard.update_priorities(np.array([0, 1]), np.array([1.0, bad]))
    with pytest.raises(ValueError, match="finite and >= 0"):
        shard.add(transitions(2), priorities=np.array([bad, 1.0]))
    assert len(shard) == 4
    assert shard.state_dict()["priority"].tolist() == [1.0] * 4


@pytest.mark.parametrize(
    ("indices", "priorities"),
    [
        (np.array([0, 4]), np.ones(2)),  # slot 4 holds nothing yet
        (np.array([-1]), np.ones(1)),
        (np.array([0, 1]), np.ones(3)),  # length mismatch
        (np.array([0.0, 1.0]), np.ones(2)),  # not integers
        (np.array([[0, 1]]), np.ones((1, 2))),  # not 1-d
    ],
)
def test_bad_indices_raise(shard, indices, priorities):
    with pytest.raises(ValueError):
        shard.update_priorities(indices, priorities)


def test_bad_arguments_raise():
    with pytest.raises(ValueError):
        ReplayShard(0)
    with pytest.raises(ValueError):
        ReplayShard(8, alpha=-1.0)
    with pytest.raises(ValueError):
        ReplayShard(8, eps=-1e-6)
    s = ReplayShard(8)
    s.add(transitions(2))
    with pytest.raises(ValueError):
        s.sample(0, beta=0.4)
    with pytest.raises(ValueError):
        s.sample(4, beta=-0.1)
    with pytest.raises(ValueError):
        s.add(transitions(2), priorities=np.ones(3))


# ----------------------------------------------------------------- the sample type
def test_a_sample_carries_the_items_ever_added_not_the_size():
    shard = ReplayShard(8, seed=0)
    shard.add(transitions(12))
    s = shard.sample(4, beta=0.4)
    assert len(shard) == 8 and s.added == shard.added == shard.stats()["added"] == 12
    assert s.shard_id == 0
    t = s.with_shard_id(3)
    assert (t.shard_id, t.added) == (3, 12) and t.indices is s.indices and t.data is s.data


def test_a_hook_batch_replaces_only_what_the_hook_returned():
    shard = ReplayShard(8, seed=0)
    shard.add(transitions(5))
    s = shard.sample(4, beta=0.4).with_shard_id(2)
    assert s.as_hook_batch() == {"indices": s.indices, "weights": s.weights, "data": s.data}
    weights = np.full(4, 0.5, np.float32)
    t = s.with_hook_batch({"weights": weights})
    assert t.weights is weights and t.indices is s.indices and t.data is s.data
    assert (t.shard_id, t.added) == (2, 5)
