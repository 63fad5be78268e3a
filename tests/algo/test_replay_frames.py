"""ReplayShard(frame_stack=k): every sampled item equals what a naive store of whole stacks holds."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from frame_rollouts import StackedEpisodes, naive_sample_check

from apex_dask.algo.replay.codec import encode_batch
from apex_dask.algo.replay.frames import FRAMES_PER_ITEM
from apex_dask.algo.replay.shard import ReplayShard


def add_both(shard, naive: dict, batch: dict, k: int, compact: bool, priorities=None):
    """Add to the shard (full stacks or compact) and to the naive store, slot by slot."""
    slots = shard.add(encode_batch(batch, k) if compact else batch, priorities)
    assert len(slots) == len(batch["obs"])
    for j, slot in enumerate(slots):
        if slot >= 0:
            naive[int(slot)] = {key: v[j] for key, v in batch.items()}
    return slots


@pytest.mark.parametrize("compact", [False, True])
@pytest.mark.parametrize(
    ("k", "n_step", "lengths", "padding"),
    [
        (4, 3, (1, 12), "reset"),  # episodes shorter than k and n
        (4, 3, (20, 200), "zero"),
        (4, 1, (1, 60), "reset"),
        (3, 5, (1, 30), "reset"),
    ],
)
def test_interleaved_producers_wrapping_ring_match_naive_store(
    compact, k, n_step, lengths, padding
):
    rng = np.random.default_rng(hash((compact, k, n_step, padding)) % 2**32)
    capacity = 97
    shard = ReplayShard(capacity, seed=1, frame_stack=k)
    producers = [
        StackedEpisodes(rng, k=k, n_step=n_step, lengths=lengths, padding=padding) for _ in range(3)
    ]
    naive: dict[int, dict] = {}
    checked = 0
    for _ in range(150):  # ~20 wraps of the item ring
        batch = producers[rng.integers(3)].fragment(int(rng.integers(1, 60)))
        prios = rng.exponential(size=len(batch["obs"])) if rng.random() < 0.5 else None
        add_both(shard, naive, batch, k, compact, prios)
        if len(shard):
            checked += naive_sample_check(shard, naive, 64)
            s = shard.sample(16, beta=0.4)
            shard.update_priorities(s.indices, rng.exponential(size=16))
    assert shard.stats()["added"] > 10 * capacity
    assert checked > 5000
    # every stored item, not only sampled ones: slots of the newest len(shard) items
    live = shard.stored_slots()
    assert len(live) == len(set(live.tolist())) == len(shard)
    data = shard.items_at(live)
    for j, slot in enumerate(live):
        for key in ("obs", "next_obs"):
            np.testing.assert_array_equal(data[key][j], naive[int(slot)][key])


def test_state_dict_round_trip_keeps_frames_once_and_continues_exactly(tmp_path):
    rng = np.random.default_rng(7)
    env = StackedEpisodes(rng, lengths=(1, 40), frame_shape=(12, 12))
    a = ReplayShard(200, seed=3, frame_stack=4)
    naive: dict[int, dict] = {}
    for _ in range(30):
        add_both(a, naive, env.fragment(50), 4, compact=True)
    state = a.state_dict()
    assert "data/obs" not in state and "data/obs_refs" in state
    frames_saved = state["frames/data"]
    assert frames_saved.shape[1:] == (12, 12)
    assert len(frames_saved) <= FRAMES_PER_ITEM * 200  # each frame once, not 2k per item
    np.savez(tmp_path / "shard.npz", **state)
    with np.load(tmp_path / "shard.npz", allow_pickle=False) as loaded:
        b = ReplayShard(200, seed=99, frame_stack=4)
        b.load_state_dict(dict(loaded))
    c = pickle.loads(pickle.dumps(a))
    for other in (b, c):
        assert len(other) == len(a) and other.stats()["bytes"] == a.stats()["bytes"]
    batch = env.fragment(50)
    for shard in (a, b, c):
        add_both(shard, naive, batch, 4, compact=False)
    sa, sb, sc = (s.sample(64, beta=0.5) for s in (a, b, c))
    for other in (sb, sc):
        np.testing.assert_array_equal(sa.indices, other.indices)
        np.testing.assert_array_equal(sa.weights, other.weights)
        for key in sa.data:
            np.testing.assert_array_equal(sa.data[key], other.data[key])
    for shard in (a, b, c):
        naive_sample_check(shard, naive, 300)


def test_stacks_that_do_not_overlap_are_stored_whole_and_evict_early():
    # 2k distinct frames per item: twice what the frame ring budgets for
    rng = np.random.default_rng(5)
    shard = ReplayShard(100, seed=0, frame_stack=4)
    naive: dict[int, dict] = {}
    for _ in range(40):
        n = int(rng.integers(1, 30))
        batch = {
            "obs": rng.integers(0, 256, (n, 4, 3, 3), dtype=np.uint8),
            "action": rng.integers(0, 4, n),
            "reward": rng.standard_normal(n).astype(np.float32),
            "next_obs": rng.integers(0, 256, (n, 4, 3, 3), dtype=np.uint8),
            "done": rng.random(n) < 0.1,
        }
        add_both(shard, naive, batch, 4, compact=False)
        naive_sample_check(shard, naive, 50)
    stats = shard.stats()
    assert 100 * FRAMES_PER_ITEM / 8 * 0.5 <= len(shard) < 100  # fewer items held...
    assert stats["evicted"] == stats["added"] - len(shard)  # ...and counted as evicted
    # an evicted slot is never sampled again, even after a priority update for it
    dead = np.setdiff1d(np.arange(100), shard.stored_slots())
    assert len(dead) > 0
    shard.update_priorities(dead, np.full(len(dead), 1e6))
    drawn = np.concatenate([shard.sample(500, beta=0.4).indices for _ in range(10)])
    assert not np.isin(drawn, dead).any()


def test_batch_larger_than_the_shard_keeps_its_newest_items():
    rng = np.random.default_rng(6)
    batch = StackedEpisodes(rng, lengths=(5, 50)).fragment(300)
    n = len(batch["obs"])
    shard = ReplayShard(40, seed=0, frame_stack=4)
    naive: dict[int, dict] = {}
    slots = add_both(shard, naive, batch, 4, compact=True, priorities=np.ones(n))
    assert (slots[: n - 40] == -1).all() and sorted(slots[n - 40 :]) == list(range(40))
    assert len(shard) == 40
    naive_sample_check(shard, naive, 200)
    # frames for more items than the frame ring holds: leading items are dropped
    wide = {key: np.concatenate([v, v[::-1]]) for key, v in batch.items()}
    wide["obs"] = rng.integers(0, 256, wide["obs"].shape, dtype=np.uint8)
    small = ReplayShard(40, seed=0, frame_stack=4)
    slots = add_both(small, naive := {}, wide, 4, compact=False)
    assert 0 < len(small) < 40 and (slots[: len(slots) - len(small)] == -1).all()
    naive_sample_check(small, naive, 200)


def test_vector_shard_takes_a_compact_batch_as_full_stacks():
    rng = np.random.default_rng(8)
    batch = StackedEpisodes(rng).fragment(30)
    shard = ReplayShard(64, seed=0)
    naive: dict[int, dict] = {}
    add_both(shard, naive, batch, 4, compact=True)
    assert shard.schema["obs"][1] == (4, 6, 5)
    naive_sample_check(shard, naive, 100)


def test_stats_bytes_count_every_array_the_shard_holds():
    rng = np.random.default_rng(9)
    batch = StackedEpisodes(rng, frame_shape=(84, 84)).fragment(50)
    for frame_stack, stack_bytes in ((4, 84 * 84), (None, 2 * 4 * 84 * 84)):
        shard = ReplayShard(1000, frame_stack=frame_stack)
        empty = shard.stats()["bytes"]
        assert empty >= 1000 * (8 + 16)  # priorities + sum/min leaves
        shard.add(batch)
        full = shard.stats()["bytes"]
        per_item = (full - empty) / 1000
        if frame_stack:
            assert FRAMES_PER_ITEM * stack_bytes <= per_item <= FRAMES_PER_ITEM * stack_bytes + 64
        else:
            assert stack_bytes <= per_item <= stack_bytes + 64


def test_bad_stacked_batches_raise_and_fix_no_schema():
    rng = np.random.default_rng(10)
    batch = StackedEpisodes(rng).fragment(20)
    shard = ReplayShard(50, frame_stack=4)
    with pytest.raises(ValueError, match=r"frame_stack=4 needs obs and next_obs items \[4"):
        shard.add({**batch, "obs": batch["obs"][:, :3], "next_obs": batch["next_obs"][:, :3]})
    with pytest.raises(ValueError, match="must have obs/next_obs or"):
        shard.add({**encode_batch(batch, 4), "obs": batch["obs"]})
    with pytest.raises(ValueError, match="reward"):
        shard.add({k: v for k, v in batch.items() if k != "reward"})
    with pytest.raises(ValueError, match=f"expected {len(batch['obs'])} priorities"):
        shard.add(batch, priorities=np.ones(3))
    assert shard.schema == {} and len(shard) == 0
    shard.add(batch)
    other = StackedEpisodes(rng, frame_shape=(6, 6)).fragment(20)
    with pytest.raises(ValueError, match="the schema says"):
        shard.add(encode_batch(other, 4))
    with pytest.raises(ValueError, match="discount"):
        shard.add({k: v for k, v in batch.items() if k != "discount"})
    with pytest.raises(ValueError, match="frame_stack=None, this shard has frame_stack=4"):
        shard.load_state_dict(ReplayShard(50).state_dict())
    with pytest.raises(ValueError, match="frame_stack must be >= 1"):
        ReplayShard(10, frame_stack=0)
