"""What a frame-stacked shard allocates, measured with tracemalloc (numpy reports to it)."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
from frame_rollouts import StackedEpisodes

from apex_dask.algo.replay.codec import encode_batch
from apex_dask.algo.replay.shard import ReplayShard

FRAME = (84, 84)
FRAME_BYTES = 84 * 84


def fill_traced(capacity: int, frame_stack: int | None, compact: bool) -> tuple[ReplayShard, int]:
    """Fill a shard twice over with n-step 3, k = 4 fragments of 50 transitions.

    Returns the shard and the bytes still traced after everything else was freed.
    """
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        shard = ReplayShard(capacity, seed=0, frame_stack=frame_stack)
        env = StackedEpisodes(
            np.random.default_rng(0), n_step=3, frame_shape=FRAME, lengths=(30, 600)
        )
        while shard.stats()["added"] < 2 * capacity:
            batch = env.fragment(50)
            shard.add(encode_batch(batch, 4) if compact else batch)
            shard.update_priorities(shard.sample(64, 0.4).indices, np.ones(64))
        del env, batch
        gc.collect()
        return shard, tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()


def test_frame_stacked_shard_allocates_at_most_1_25_frames_plus_64_bytes_per_item():
    capacity = 2048
    for compact in (False, True):
        shard, traced = fill_traced(capacity, 4, compact)
        assert len(shard) == capacity  # real episodes fit: nothing evicted early
        assert traced <= capacity * (1.25 * FRAME_BYTES + 64), traced / capacity
        assert shard.stats()["bytes"] <= traced <= 1.02 * shard.stats()["bytes"]


def test_full_stack_shard_allocates_both_stacks_per_item():
    # the same measurement without frame_stack, so the bound above can fail
    capacity = 512
    shard, traced = fill_traced(capacity, None, compact=False)
    assert traced >= capacity * 2 * 4 * FRAME_BYTES
    assert shard.stats()["bytes"] <= traced <= 1.02 * shard.stats()["bytes"]
