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

from apex_dask.algo.env_worker import EnvWorker, probe_spaces
from apex_dask.algo.envs import make_env_factory
from apex_dask.algo.frame_codec import decode_batch
from apex_dask.algo.learner import Learner

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
        batch = out["batch"]
        if "frames" in batch:
            batch = decode_batch(batch)
        want = worker.td_errors(batch)
        assert out["priorities"].dtype == np.float32 and out["priorities"].shape == want.shape
        np.testing.assert_allclose(out["priorities"], want, rtol=1e-4, atol=1e-5)
        done, disc = batch["done"], batch["discount"]
        seen["done"] += int(done.sum())
        # a time limit flushes k < n steps that still bootstrap: discount gamma^k > gamma^n
        seen["cut_short"] += int(((~done) & (disc > GAMMA**N_STEP * 1.0001)).sum())
        seen["bootstraps"] += int((~done).sum())
        seen["episodes"] += len(out["episode_returns"])
    return seen


def _learner(factory, hiddens=(32,)):
    obs_space, act_space = probe_spaces(factory)
    return Learner(obs_space, act_space, hiddens=hiddens, device="cpu", seed=3)


@pytest.mark.parametrize("double_q", [True, False])
def test_cartpole_priorities_equal_the_recomputation(double_q):
    factory = make_env_factory("CartPole-v1", {"max_episode_steps": 15})
    learner = _learner(factory)
    worker = EnvWorker(
        factory,
        epsilon=0.5,
        seed=1,
        hiddens=(32,),
        fragment_length=20,
        num_envs=3,
        n_step=N_STEP,
        gamma=GAMMA,
        double_q=double_q,
    )
    seen = _check_fragments(worker, learner, 8)
    assert seen["done"] > 0 and seen["cut_short"] > 0 and seen["bootstraps"] > 0


@pytest.mark.skipif(importlib.util.find_spec("minatar") is None, reason="needs minatar")
def test_minatar_priorities_equal_the_recomputation():
    factory = make_env_factory("MinAtar/Breakout-v1", {"max_episode_steps": 8})
    learner = _learner(factory)
    worker = EnvWorker(factory, epsilon=0.5, seed=2, hiddens=(32,), fragment_length=30, num_envs=4)
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
        hiddens=(32,),
        fragment_length=40,
        num_envs=2,
        frame_stack=4,
    )
    seen = _check_fragments(worker, learner, 6)
    # a time limit of 400 frames is 100 agent steps; Breakout's lost lives are training terminals long before a game ends
    assert seen["done"] > 0 and seen["cut_short"] > 0 and seen["bootstraps"] > 0


@pytest.mark.skipif(importlib.util.find_spec("ale_py") is None, reason="needs ale_py")
def test_double_buffered_native_envs_give_the_same_transitions_and_exact_priorities():
    """Two lanes (envs 0-1 and 2, each its own vector env, one stepping while the other
    acts) emit what one vector env of the same three games emits, given the same actions
    (epsilon 1: the draws), and their priorities still equal the recomputation."""
    factory = make_env_factory("ALE/Breakout-v5", {"max_episode_steps": 240})
    learner = _learner(factory)
    kwargs = dict(epsilon=1.0, seed=3, hiddens=(32,), fragment_length=30, num_envs=3)
    kwargs.update(frame_stack=4, vector_mode="native")
    lanes = EnvWorker(factory, double_buffer=True, **kwargs)
    plain = EnvWorker(factory, double_buffer=False, **kwargs)
    assert lanes.double_buffer and not plain.double_buffer
    assert [e.num_envs for e in lanes.envs] == [1]  # an evaluator never makes the others
    seen = {"done": 0, "cut_short": 0, "episodes": 0}
    for i in range(3):
        if i % 2 == 1:  # new weights between fragments, for both
            for p in learner.online.parameters():
                p.data.add_(0.01 * np.float32(i))
            weights = {k: v.numpy() for k, v in learner.online.state_dict().items()}
            lanes.set_weights(i, weights)
            plain.set_weights(i, weights)
        got, want = lanes.sample(), plain.sample()
        assert [e.num_envs for e in lanes.envs] == [2, 1]
        assert got["steps"] == want["steps"] == 90
        assert got["episode_returns"] == want["episode_returns"]
        assert got["episode_lengths"] == want["episode_lengths"]
        batch, ref = decode_batch(got["batch"]), decode_batch(want["batch"])
        assert batch.keys() == ref.keys()
        for key in batch:
            np.testing.assert_array_equal(batch[key], ref[key], err_msg=key)
        np.testing.assert_allclose(got["priorities"], lanes.td_errors(batch), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got["priorities"], want["priorities"], rtol=1e-4, atol=1e-5)
        seen["done"] += int(batch["done"].sum())
        seen["cut_short"] += int(((~batch["done"]) & (batch["discount"] > GAMMA**3 * 1.0001)).sum())
        seen["episodes"] += len(got["episode_returns"])
    # life losses are training terminals; 240 frames (60 steps) cut each game by time
    assert seen["done"] > 0 and seen["cut_short"] > 0 and seen["episodes"] >= 3
    lanes.close()
    plain.close()
