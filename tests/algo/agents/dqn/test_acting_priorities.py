"""Initial priorities from the Q-values of acting equal a fresh recomputation.

An env worker keeps Q(s_t)[a_t] of each step and reads each bootstrap value
from the pass that acts on s_{t+k} (or an extra row for a time limit's final
observation, or the pass at the fragment's end). ``EnvWorker.td_errors`` makes
two new passes over the batch's ``obs`` and ``next_obs``: the two must agree,
on vector, image and stacked Atari observations, across terminations, life
losses, time limits, fragment cuts and weight syncs.
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from agent_parts import CPU

from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.learner import Learner
from apex_dask.algo.agents.dqn.worker import EnvWorker
from apex_dask.algo.envs.factory import make_env_factory
from apex_dask.algo.envs.probe import probe_spaces
from apex_dask.algo.replay.codec import decode_batch
from apex_dask.algo.rollout.spec import RolloutSpec

N_STEP, GAMMA = 3, 0.99


def _check_fragments(worker: EnvWorker, learner: Learner, fragments: int) -> dict[str, int]:
    """Sample; compare priorities with td_errors; sync new weights every other fragment.
    Counts of what the batches held."""
    seen = {"done": 0, "cut_short": 0, "bootstraps": 0, "episodes": 0}
    for i in range(fragments):
        if i % 2 == 1:  # weights change between fragments: the kept pass is dropped
            for p in learner.online.parameters():
                p.data.add_(0.01 * np.float32(i))
            worker.set_weights(i, {k: v.numpy() for k, v in learner.online.state_dict().items()})
        out = worker.sample()
        batch = out.batch
        if "frames" in batch:
            batch = decode_batch(batch)
        want = worker.td_errors(batch)
        assert out.priorities.dtype == np.float32 and out.priorities.shape == want.shape
        np.testing.assert_allclose(out.priorities, want, rtol=1e-4, atol=1e-5)
        done, disc = batch["done"], batch["discount"]
        seen["done"] += int(done.sum())
        # a time limit flushes k < n steps that still bootstrap: discount gamma^k > gamma^n
        seen["cut_short"] += int(((~done) & (disc > GAMMA**N_STEP * 1.0001)).sum())
        seen["bootstraps"] += int((~done).sum())
        seen["episodes"] += len(out.episode_returns)
    return seen


def _learner(factory, hiddens=(32,)):
    obs_space, act_space = probe_spaces(factory)
    return Learner(obs_space, act_space, DQNConfig(hiddens=hiddens), CPU, seed=3)


@pytest.mark.parametrize("double_q", [True, False])
def test_cartpole_priorities_equal_the_recomputation(double_q):
    factory = make_env_factory("CartPole-v1", {"max_episode_steps": 15})
    learner = _learner(factory)
    worker = EnvWorker(
        factory,
        epsilon=0.5,
        seed=1,
        rollout=RolloutSpec(fragment_length=20, num_envs=3, n_step=N_STEP, gamma=GAMMA),
        config=DQNConfig(hiddens=(32,), double_q=double_q),
    )
    seen = _check_fragments(worker, learner, 8)
    assert seen["done"] > 0 and seen["cut_short"] > 0 and seen["bootstraps"] > 0


@pytest.mark.skipif(importlib.util.find_spec("minatar") is None, reason="needs minatar")
def test_minatar_priorities_equal_the_recomputation():
    factory = make_env_factory("MinAtar/Breakout-v1", {"max_episode_steps": 8})
    learner = _learner(factory)
    worker = EnvWorker(
        factory,
        epsilon=0.5,
        seed=2,
        rollout=RolloutSpec(fragment_length=30, num_envs=4),
        config=DQNConfig(hiddens=(32,)),
    )
    seen = _check_fragments(worker, learner, 4)
    assert seen["cut_short"] > 0 and seen["bootstraps"] > 0 and seen["episodes"] > 0


@pytest.mark.skipif(
    importlib.util.find_spec("ale_py") is None or importlib.util.find_spec("cv2") is None,
    reason="needs ale_py and opencv",
)
def test_atari_priorities_equal_the_recomputation_with_life_losses_and_frame_stacks():
    factory = make_env_factory("ALE/Breakout-v5", {"max_episode_steps": 400})
    learner = _learner(factory)
    worker = EnvWorker(
        factory,
        epsilon=0.5,
        seed=3,
        rollout=RolloutSpec(fragment_length=40, num_envs=2, frame_stack=4),
        config=DQNConfig(hiddens=(32,)),
    )
    seen = _check_fragments(worker, learner, 6)
    # a time limit of 400 frames is 100 agent steps; Breakout's lost lives are training terminals long before a game ends
    assert seen["done"] > 0 and seen["cut_short"] > 0 and seen["bootstraps"] > 0
