"""Replay shard checkpoints written by older code still load, and continue as that code did.

The fixtures in ``data/replay_checkpoints/`` were written by commit 29928ec
(``data/make_replay_checkpoints.py``), before the item storage and the frame
store owned their checkpoint state: a vector shard with an extra key and a
frame-stacked shard that evicted items early. Each comes with what that
code's shard did next (its stats, a sample, an add, another sample); a shard
restored by today's code must do exactly the same.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from apex_dask.algo.replay.shard import ReplayShard
from apex_dask.experiment.checkpoints.store import load_checkpoint

FIXTURES = Path(__file__).parent / "data" / "replay_checkpoints"
SHARDS = {
    "vector": dict(capacity=32, alpha=0.6),
    "stacked": dict(capacity=24, alpha=0.7, frame_stack=4),
}
COMMON_KEYS = {
    "capacity", "alpha", "eps", "size", "pos", "max_priority", "added", "sampled", "updated",
    "add_s", "sample_s", "update_s", "priority", "mass", "rng_state",
    "data/action", "data/reward", "data/done",
}  # fmt: skip
OWN_KEYS = {
    "vector": {"data/obs", "data/next_obs", "data/discount"},
    "stacked": {"filled", "frame_stack", "frame_capacity", "frames/written", "frames/data",
                "frames/log_items", "frames/log_first", "data/obs_refs", "data/next_obs_refs"},
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(SHARDS))
def test_an_old_checkpoint_loads_and_continues_as_the_old_code_did(case):
    parts, meta = load_checkpoint(FIXTURES / case)
    state = parts["shard_0"]
    assert meta["case"] == case and set(state) == COMMON_KEYS | OWN_KEYS[case]
    shard = ReplayShard(**SHARDS[case], seed=999)  # the rng state comes from the checkpoint
    shard.load_state_dict(state)
    with np.load(FIXTURES / f"{case}_expected.npz") as f:
        want = dict(f)
    stats = {k.removeprefix("stats/"): v.item() for k, v in want.items() if k.startswith("stats/")}
    assert shard.stats() == {**stats, "stale_priority_updates": 0}  # a counter added since
    if case == "stacked":
        assert len(shard) < state["filled"]  # items evicted early stay out
    batch = {k.removeprefix("add/batch/"): v for k, v in want.items() if k.startswith("add/batch/")}
    for j, beta in ((0, 0.4), (1, 0.6)):
        if j == 1:
            slots = shard.add(batch, want["add/priorities"])
            np.testing.assert_array_equal(slots, want["add/slots"])
        s = shard.sample(16, beta=beta)
        np.testing.assert_array_equal(s.indices, want[f"s{j}/indices"])
        np.testing.assert_array_equal(s.weights, want[f"s{j}/weights"])
        assert sorted(s.data) == sorted(k.split("/")[-1] for k in want if f"s{j}/data/" in k)
        for key, v in s.data.items():
            np.testing.assert_array_equal(v, want[f"s{j}/data/{key}"])


NEW_KEYS = {"clock", "generation", "stale_priority_updates"}  # added since the fixtures


@pytest.mark.parametrize("case", sorted(SHARDS))
def test_todays_state_has_the_old_keys(case):
    parts, _ = load_checkpoint(FIXTURES / case)
    shard = ReplayShard(**SHARDS[case], seed=0)
    shard.load_state_dict(parts["shard_0"])
    assert set(shard.state_dict()) == set(parts["shard_0"]) | NEW_KEYS


@pytest.mark.parametrize("case", sorted(SHARDS))
def test_an_old_checkpoint_gives_its_items_a_generation_new_items_never_reuse(case):
    parts, _ = load_checkpoint(FIXTURES / case)
    shard = ReplayShard(**SHARDS[case], seed=0)
    shard.load_state_dict(parts["shard_0"])
    old = shard.sample(16, beta=0.4)
    assert (old.generations == 0).all()  # no stamps in the old format: all 0
    with np.load(FIXTURES / f"{case}_expected.npz") as f:
        batch = {k.removeprefix("add/batch/"): v for k, v in f.items() if "add/batch/" in k}
    one = {k: v[:1] for k, v in batch.items()}
    rewritten = np.zeros(16, bool)
    while not rewritten.any():  # write one item at a time until a sampled slot was rewritten
        rewritten |= np.isin(old.indices, shard.add(one))
    assert not rewritten.all()
    gone = rewritten | ~shard.items.stored(old.indices)
    assert (shard.sample(64, beta=0.4).generations > 0).any()  # new items are stamped
    assert shard.update_priorities(old.indices, np.full(16, 5.0), old.generations) == gone.sum()
