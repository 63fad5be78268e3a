"""EnvWorker(frame_stack=k): rollouts carry each frame once and a shard returns the full stacks."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from agent_parts import dqn_worker
from gymnasium import spaces
from gymnasium.wrappers import FrameStackObservation

from apex_dask.algo.envs.factory import make_env_factory
from apex_dask.algo.replay.codec import decode_batch
from apex_dask.algo.replay.shard import ReplayShard


class BlinkEnv(gym.Env):
    """12x12 uint8 frames, random; episodes of 3-60 steps, a third of them truncated."""

    observation_space = spaces.Box(0, 255, (12, 12), np.uint8)
    action_space = spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.left = int(self.np_random.integers(3, 61))
        return self._frame(), {}

    def _frame(self):
        return self.np_random.integers(0, 256, (12, 12), dtype=np.uint8)

    def step(self, action):
        self.left -= 1
        end = self.left <= 0
        cut = end and self.np_random.random() < 0.33
        return self._frame(), float(action), end and not cut, cut, {}


def stacked_blink():
    return FrameStackObservation(BlinkEnv(), 4)


def worker(frame_stack, factory=stacked_blink, **kw):
    kw = {"epsilon": 1.0, "seed": 3, "hiddens": (16,), "fragment_length": 50, **kw}
    return dqn_worker(factory, frame_stack=frame_stack, **kw)


def test_compact_rollouts_decode_to_what_a_full_stack_worker_sends():
    full, compact = worker(None), worker(4)
    frames = transitions = 0
    for _ in range(8):
        a, b = full.sample(), compact.sample()
        assert set(b.batch) == {
            "frames",
            "obs_refs",
            "action",
            "reward",
            "next_obs_refs",
            "done",
            "discount",
        }
        decoded = decode_batch(b.batch)
        for key, value in a.batch.items():
            assert decoded[key].dtype == value.dtype
            np.testing.assert_array_equal(decoded[key], value, err_msg=key)
        np.testing.assert_array_equal(a.priorities, b.priorities)
        assert a.episode_returns == b.episode_returns
        frames += len(b.batch["frames"])
        transitions += len(b.batch["action"])
    # each frame once per fragment: ~(50 + n + k - 1) / 50 plus one per episode start
    assert frames / transitions <= 1.3


def test_frame_stack_must_match_the_observation_axis():
    with pytest.raises(ValueError, match=r"frame_stack=3 needs observations \[3"):
        worker(3)


def test_shard_returns_the_stacks_the_worker_saw():
    full, compact = worker(None, seed=5), worker(4, seed=5)
    shard = ReplayShard(400, seed=0, frame_stack=4)
    naive = {}
    for _ in range(12):
        a, b = full.sample(), compact.sample()
        slots = shard.add(b.batch, b.priorities)
        for j, slot in enumerate(slots):
            naive[int(slot)] = {key: value[j] for key, value in a.batch.items()}
    s = shard.sample(256, beta=0.4)
    for key in ("obs", "next_obs", "action", "reward", "done", "discount"):
        want = np.stack([naive[int(i)][key] for i in s.indices])
        np.testing.assert_array_equal(s.data[key], want, err_msg=key)


def test_real_ale_rollout_is_stored_and_sampled_exactly():
    pytest.importorskip("ale_py", reason="needs the atari extra: pip install 'apex_dask[atari]'")
    pytest.importorskip("cv2", reason="needs the atari extra: pip install 'apex_dask[atari]'")
    factory = make_env_factory("ALE/Pong-v5", {"repeat_action_probability": 0.0})
    full = worker(None, factory=factory, epsilon=1.0, seed=11)
    compact = worker(4, factory=factory, epsilon=1.0, seed=11)
    assert compact.observation_space.shape == (4, 84, 84)
    shard = ReplayShard(1000, seed=0, frame_stack=4)
    naive = {}
    frames = transitions = 0
    for _ in range(6):
        a, b = full.sample(), compact.sample()
        frames += len(b.batch["frames"])
        transitions += len(b.batch["action"])
        for j, slot in enumerate(shard.add(b.batch, b.priorities)):
            naive[int(slot)] = {key: value[j] for key, value in a.batch.items()}
    assert frames / transitions <= 1.3
    s = shard.sample(128, beta=0.4)
    assert s.data["obs"].shape == (128, 4, 84, 84) and s.data["obs"].dtype == np.uint8
    for key in ("obs", "next_obs"):
        want = np.stack([naive[int(i)][key] for i in s.indices])
        np.testing.assert_array_equal(s.data[key], want, err_msg=key)
