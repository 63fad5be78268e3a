"""Env workers' initial priorities equal the learner's on the same data, for every head.

The worker takes them from its acting passes (C51: the log-probabilities each pass
kept; HL-Gauss: the expected values); the learner computes them in its update, before
the step, with online = target = the weights the worker acted with. Across time limits,
terminations, fragment cuts and a weight sync before every fragment, on vectors (the
numpy forward) and MinAtar frames (torch). Noisy layers are checked with their noise
scales zeroed (the same weights then act with or without noise): their noisy forward
passes are compared with torch's in ``test_noisy_and_torsos.py``.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import torch
from agent_parts import CPU

from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.learner import Learner
from apex_dask.algo.agents.dqn.worker import EnvWorker
from apex_dask.algo.agents.noisy import noisy_layers
from apex_dask.algo.envs.factory import make_env_factory
from apex_dask.algo.envs.probe import probe_spaces
from apex_dask.algo.replay.codec import decode_batch
from apex_dask.algo.rollout.spec import RolloutSpec

HEADS = {
    "scalar": {},
    "c51": {"num_atoms": 51, "v_min": -5.0, "v_max": 5.0},
    "hl_gauss": {"loss": "hl_gauss", "num_bins": 41, "v_min": -5.0, "v_max": 5.0},
    "layer_norm": {"layer_norm": True},
    "c51_noisy_ln": {"num_atoms": 21, "noisy": True, "layer_norm": True, "dueling": False},
    "hl_gauss_single_q": {"loss": "hl_gauss", "double_q": False},
}


def _check(factory, options: DQNConfig, rollout: RolloutSpec, fragments: int) -> list[int]:
    obs_space, act_space = probe_spaces(factory)
    learner = Learner(obs_space, act_space, options, CPU, seed=3)
    worker = EnvWorker(factory, epsilon=0.5, seed=1, rollout=rollout, config=options)
    seen = [0, 0]
    for _ in range(fragments):
        with torch.no_grad():  # noise scales to 0 (updates move them)
            for layer in noisy_layers(learner.online):
                layer.weight_sigma.zero_()
                layer.bias_sigma.zero_()
        learner.update_target()  # online = target = what the worker acts with
        worker.set_weights(*learner.get_weights())
        out = worker.sample()
        data = decode_batch(out.batch) if "frames" in out.batch else out.batch
        assert out.priorities.dtype == np.float32 and len(out.priorities)
        td, _ = learner.update(data, np.ones(len(out.priorities), np.float32))
        np.testing.assert_allclose(out.priorities, td, rtol=2e-4, atol=2e-5)
        done, discount = data["done"], data["discount"]
        seen[0] += int((~done & (discount > 0.99**3 * 1.0001)).sum())  # cut by a time limit
        seen[1] += int(done.sum())  # terminals
    return seen


@pytest.mark.parametrize("head", list(HEADS))
def test_cartpole_worker_priorities_equal_the_learners(head):
    factory = make_env_factory("CartPole-v1", {"max_episode_steps": 15})
    options = DQNConfig(hiddens=(32,), **HEADS[head])
    rollout = RolloutSpec(fragment_length=20, num_envs=3, n_step=3, gamma=0.99)
    assert min(_check(factory, options, rollout, 5)) > 0


@pytest.mark.skipif(importlib.util.find_spec("minatar") is None, reason="needs minatar")
@pytest.mark.parametrize("head", ["c51", "hl_gauss", "c51_noisy_ln"])
def test_minatar_worker_priorities_equal_the_learners(head):
    factory = make_env_factory("MinAtar/Breakout-v1", {"max_episode_steps": 5})
    options = DQNConfig(hiddens=(32,), **HEADS[head])
    rollout = RolloutSpec(fragment_length=16, num_envs=2, n_step=3, gamma=0.99)
    assert _check(factory, options, rollout, 3)[0] > 0  # (terminals: the CartPole test)


@pytest.mark.skipif(
    importlib.util.find_spec("ale_py") is None or importlib.util.find_spec("cv2") is None,
    reason="needs ale_py and opencv",
)
def test_atari_frame_stacks_with_c51_and_noisy_layers():
    """Frame dedup (rollouts sent in the compact form) with a C51 noisy head."""
    factory = make_env_factory("ALE/Breakout-v5", {"max_episode_steps": 200})
    options = DQNConfig(hiddens=(32,), **HEADS["c51_noisy_ln"])
    rollout = RolloutSpec(fragment_length=30, num_envs=2, frame_stack=4)
    assert sum(_check(factory, options, rollout, 2)) > 0


@pytest.mark.parametrize("acting_noise", ["pass", "fragment"])
def test_noisy_workers_draw_new_noise_and_evaluate_on_the_mean(acting_noise):
    factory = make_env_factory("CartPole-v1")
    options = DQNConfig(hiddens=(16,), noisy=True, sigma0=2.0, acting_noise=acting_noise)
    worker = EnvWorker(factory, epsilon=0.0, seed=4, config=options)
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    a, b = worker.values(obs, noise=True)[0], worker.values(obs, noise=True)[0]
    if acting_noise == "pass":
        assert not np.allclose(a, b)  # a new draw for each acting pass
    else:
        np.testing.assert_array_equal(a, b)  # one draw for the fragment
        worker.sample()
        assert not np.allclose(worker.values(obs, noise=True)[0], a)  # the next fragment's
    mean = worker.q_values(obs)
    np.testing.assert_array_equal(mean, worker.q_values(obs))  # the mean weights, no noise
    again = EnvWorker(factory, epsilon=0.0, seed=4, config=options)
    np.testing.assert_array_equal(again.values(obs, noise=True)[0], a)  # seeded per worker
