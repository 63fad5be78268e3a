"""Env workers with several envs (``num_envs``) and bounded evaluation."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from apex_dask.algo.agents.base import module_weights
from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.worker import EnvWorker
from apex_dask.algo.envs.factory import make_env_factory
from apex_dask.algo.replay.codec import decode_batch
from apex_dask.algo.rollout.spec import RolloutSpec

CARTPOLE = make_env_factory("CartPole-v1")


class CountingEnv(gym.Env):
    """obs = [env id, step]; reward = 1; episodes of ``length`` steps (terminated)."""

    observation_space = spaces.Box(-1e6, 1e6, (2,), np.float32)
    action_space = spaces.Discrete(2)
    made = 0

    def __init__(self, length: int = 7) -> None:
        self.length = length
        self.env_id = CountingEnv.made
        CountingEnv.made += 1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([self.env_id, 0], np.float32), {}

    def step(self, action):
        self.t += 1
        obs = np.array([self.env_id, self.t], np.float32)
        return obs, 1.0, self.t >= self.length, False, {}


class EndlessEnv(CountingEnv):
    """Never ends: a policy that never loses."""

    def step(self, action):
        return np.array([0, 0], np.float32), 0.0, False, False, {}


class SlowEndlessEnv(EndlessEnv):
    def step(self, action):
        time.sleep(0.002)
        return super().step(action)


def test_each_env_keeps_its_own_nstep_state_and_episode_stats():
    CountingEnv.made = 0
    worker = EnvWorker(
        CountingEnv,
        epsilon=0.5,
        seed=0,
        rollout=RolloutSpec(n_step=3, gamma=0.5, fragment_length=10, num_envs=4),
    )
    assert len(worker.envs) == 1  # an evaluator never makes the others
    out = worker.sample()
    envs = {int(e.env_id) for e in worker.envs}
    assert len(worker.envs) == 4 and len(envs) == 4
    assert out.steps == 40
    b = out.batch
    # no transition mixes envs: obs and next_obs come from the same env
    np.testing.assert_array_equal(b["obs"][:, 0], b["next_obs"][:, 0])
    # 10 steps of 7-step episodes per env: one episode each, 10 - 2 pending transitions
    assert sorted(out.episode_returns) == [7.0] * 4
    assert out.episode_lengths == [7] * 4
    assert len(b["action"]) == 4 * (10 - 2) and worker.num_pending == 4 * 2
    for env_id in envs:
        mine = b["obs"][:, 0] == env_id
        steps = b["obs"][mine, 1]
        assert list(steps) == [0, 1, 2, 3, 4, 5, 6, 0]  # one env's steps, in order
        # n-step returns within each env's own episode: 1 + 0.5 + 0.25, then flushed at its end
        np.testing.assert_allclose(b["reward"][mine][:5], [1.75] * 5)
        assert list(b["done"][mine]) == [False] * 4 + [True] * 3 + [False]


def test_one_forward_per_step_for_all_envs():
    worker = EnvWorker(
        CARTPOLE, epsilon=0.0, seed=0, rollout=RolloutSpec(fragment_length=5, num_envs=8)
    )
    calls = []
    inner = worker.values  # acting's one forward pass (Q-values and the kept values)
    worker.values = lambda obs, noise=False: calls.append(len(obs)) or inner(obs, noise)
    worker.sample()
    assert calls == [8] * 6  # 5 steps, then the last observations' pass
    calls.clear()
    worker.sample()
    assert calls == [8] * 5  # that pass chose the next fragment's first actions
    worker.set_weights(1, module_weights(worker._net))
    calls.clear()
    pending = worker.num_pending
    worker.sample()
    # new weights: the first step's pass is made again, with the pending steps' states
    # (their kept Q(s_t)[a_t] came from the old weights)
    assert pending > 0 and calls == [8 + pending] + [8] * 5


def test_all_envs_use_the_worker_epsilon():
    worker = EnvWorker(
        CARTPOLE, epsilon=1.0, seed=0, rollout=RolloutSpec(fragment_length=50, num_envs=4)
    )
    forwards = []

    def values(obs, noise=False):
        forwards.append(len(obs))
        q = np.zeros((len(obs), 2), np.float32)
        return q, q

    worker.values = values
    actions = []
    worker._envs.reset()  # makes the other envs
    for env in worker.envs:
        orig = env.step
        env.step = lambda a, orig=orig: actions.append(a) or orig(a)
    worker.sample()
    # one pass per step for every env, exploring ones too (their Q-values give the
    # priorities), and one at the fragment's end for the last bootstraps
    assert forwards == [4] * 51
    assert len(actions) == 200 and 0.4 < np.mean(actions) < 0.6


def test_one_env_draws_as_before():
    a = EnvWorker(CARTPOLE, epsilon=0.3, seed=5, rollout=RolloutSpec(fragment_length=40))
    b = EnvWorker(
        CARTPOLE, epsilon=0.3, seed=5, rollout=RolloutSpec(fragment_length=40, num_envs=1)
    )
    for x, y in zip(a.sample().batch.values(), b.sample().batch.values(), strict=True):
        np.testing.assert_array_equal(x, y)


def test_frame_stack_rollouts_of_several_envs_decode_to_the_full_stacks():
    factory = make_env_factory("CartPole-v1", {"render_mode": None})

    def stacked():
        return gym.wrappers.FrameStackObservation(factory(), 4)

    full = EnvWorker(
        stacked,
        epsilon=0.5,
        seed=2,
        rollout=RolloutSpec(fragment_length=30, num_envs=3),
        config=DQNConfig(hiddens=(8,)),
    )
    compact = EnvWorker(
        stacked,
        epsilon=0.5,
        seed=2,
        rollout=RolloutSpec(fragment_length=30, num_envs=3, frame_stack=4),
        config=DQNConfig(hiddens=(8,)),
    )
    for _ in range(2):
        want, got = full.sample(), compact.sample()
        assert "frames" in got.batch
        decoded = decode_batch(got.batch)
        for key, value in want.batch.items():
            np.testing.assert_array_equal(decoded[key], value)
        np.testing.assert_array_equal(got.priorities, want.priorities)


def test_evaluation_caps_each_episode_at_max_steps():
    worker = EnvWorker(EndlessEnv, epsilon=0.1, seed=0, config=DQNConfig(hiddens=(8,)))
    out = worker.evaluate(2, seed=0, max_steps=300)
    assert out["lengths"] == [300, 300] and out["timed_out"] is False


def test_evaluation_stops_at_its_timeout_and_says_so():
    worker = EnvWorker(SlowEndlessEnv, epsilon=0.1, seed=0, config=DQNConfig(hiddens=(8,)))
    t0 = time.monotonic()
    out = worker.evaluate(3, seed=0, timeout_s=0.3)
    took = time.monotonic() - t0
    assert out["timed_out"] is True and out["returns"] == []
    assert np.isnan(out["return_mean"])
    assert took < 0.3 + 5.0  # ends within about one env step of the deadline
