import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch
from agent_parts import CPU, dqn_worker
from gymnasium import spaces

from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.learner import Learner
from apex_dask.algo.agents.dqn.loss import dqn_loss
from apex_dask.algo.agents.dqn.worker import EnvWorker
from apex_dask.algo.envs.factory import UnknownEnvError, check_env_id, make_env_factory
from apex_dask.algo.envs.probe import probe_spaces
from apex_dask.algo.rollout.spec import Rollout, RolloutSpec

CARTPOLE = make_env_factory("CartPole-v1")


class TinyGridEnv(gym.Env):
    """uint8 image observations and actions {-1, 0, 1}; reward = action; 7-step episodes."""

    observation_space = spaces.Box(0, 255, (10, 10, 2), np.uint8)
    action_space = spaces.Discrete(3, start=-1)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.integers(0, 256, (10, 10, 2), dtype=np.uint8), {}

    def step(self, action):
        assert action in (-1, 0, 1)
        self.t += 1
        obs = self.np_random.integers(0, 256, (10, 10, 2), dtype=np.uint8)
        return obs, float(action), self.t >= 7, False, {}


def _worker(**kw):
    kw = {"epsilon": 0.3, "seed": 0, "hiddens": (32,), "fragment_length": 50, **kw}
    return dqn_worker(kw.pop("factory", CARTPOLE), **kw)


# -- envs ---------------------------------------------------------------


def test_factory_pickles_and_makes_the_env():
    factory = pickle.loads(pickle.dumps(make_env_factory("CartPole-v1", {"max_episode_steps": 20})))
    env = factory()
    assert env.spec.id == "CartPole-v1" and env.spec.max_episode_steps == 20
    obs_space, act_space = probe_spaces(factory)
    assert obs_space.shape == (4,) and act_space.n == 2


def test_unknown_env_id_raises_one_clear_line():
    with pytest.raises(UnknownEnvError) as info:
        make_env_factory("CartPol-v1")
    msg = str(info.value)
    assert "\n" not in msg
    assert "'CartPol-v1'" in msg and "CartPole-v1" in msg
    assert "gymnasium.pprint_registry()" in msg
    assert isinstance(info.value, ValueError)


def test_env_id_with_missing_module_raises_unknown_env():
    with pytest.raises(UnknownEnvError, match="no_such_module_xyz"):
        check_env_id("no_such_module_xyz:Foo-v0")


def test_known_ids_pass_check():
    check_env_id("CartPole-v1")
    check_env_id("gymnasium.envs.classic_control:MountainCar-v0")


def test_sleepy_benchmark_env_sleeps_each_step_and_truncates_after_max_steps():
    import time

    from apex_dask.algo.envs.benchmark import SLEEPY_ID

    factory = make_env_factory(SLEEPY_ID, {"step_s": 0.02, "max_steps": 5})
    env, twin = factory(), factory()
    obs, _ = env.reset(seed=4)
    assert env.observation_space.contains(obs) and env.action_space.n == 2
    np.testing.assert_array_equal(twin.reset(seed=4)[0], obs)  # seeded
    t0 = time.monotonic()
    steps = [env.step(0) for _ in range(5)]
    assert time.monotonic() - t0 >= 5 * 0.02  # each step sleeps step_s at least
    assert [s[1] for s in steps] == [1.0] * 5
    assert [s[3] for s in steps] == [False] * 4 + [True]  # truncated, never terminated
    assert not any(s[2] for s in steps)
    out = _worker(factory=factory, fragment_length=12).sample()
    assert out.steps == 12 and out.episode_lengths == [5, 5]


# -- rollouts -------------------------------------------------------------


def test_sample_returns_fragment_with_consistent_batch():
    worker = _worker(fragment_length=64)
    out = worker.sample()
    assert isinstance(out, Rollout) and out.exploration == 0.3 and out.weights_version == -1
    b = out.batch
    n = len(b["action"])
    assert out.steps == 64 and n == 64 - worker.adder.num_pending
    assert b["obs"].shape == (n, 4) and b["obs"].dtype == np.float32
    assert b["next_obs"].shape == (n, 4)
    assert out.priorities.shape == (n,) and out.priorities.dtype == np.float32
    assert np.all(out.priorities >= 0)
    assert out.weights_version == -1 and out.exploration == 0.3
    # done transitions never bootstrap
    assert np.all(b["discount"][b["done"]] == 0.0)
    assert np.allclose(
        b["discount"][~b["done"]], 0.99**3
    )  # CartPole episodes here end by termination


def test_every_env_step_becomes_one_transition_across_fragments():
    worker = _worker(epsilon=1.0, fragment_length=7)
    total, lengths = 0, []
    for _ in range(40):
        out = worker.sample()
        total += len(out.batch["action"])
        lengths += out.episode_lengths
    assert total == 280 - worker.adder.num_pending
    assert len(lengths) == worker.episodes and sum(lengths) <= 280


def test_short_fragment_carries_pending_steps_over():
    worker = _worker(fragment_length=2, n_step=3)
    first = worker.sample()  # CartPole cannot end in 2 steps
    assert len(first.batch["action"]) == 0 and first.priorities.shape == (0,)
    assert first.batch["obs"].shape == (0, 4)
    second = worker.sample()
    assert len(second.batch["action"]) == 2  # steps 0 and 1 complete at steps 2 and 3
    assert second.batch["discount"] == pytest.approx([0.99**3] * 2)


def test_same_seed_same_rollouts_and_evaluation_does_not_disturb_them():
    a, b, c = _worker(seed=3), _worker(seed=3), _worker(seed=4)
    ra = a.sample()
    b.sample()
    b.evaluate(2)
    rb = b.sample()
    ra = a.sample()
    np.testing.assert_array_equal(ra.batch["obs"], rb.batch["obs"])
    np.testing.assert_array_equal(ra.batch["action"], rb.batch["action"])
    rc = c.sample()
    assert not np.array_equal(rc.batch["obs"], ra.batch["obs"])


def _prefer_action(learner, action):
    """Weights whose Q strongly prefers ``action`` everywhere."""
    _, weights = learner.get_weights()
    weights = {k: v.copy() for k, v in weights.items()}
    weights["head.advantage.bias"][:] = 0.0
    weights["head.advantage.bias"][action] = 100.0
    return weights


def test_greedy_worker_follows_weights_and_epsilon_one_is_uniform():
    learner = Learner(
        CARTPOLE().observation_space, spaces.Discrete(2), DQNConfig(hiddens=(32,)), CPU
    )
    greedy = _worker(epsilon=0.0)
    greedy.set_weights(7, _prefer_action(learner, 1))
    assert greedy.weights_version == 7
    out = greedy.sample()
    assert np.all(out.batch["action"] == 1) and out.weights_version == 7
    explorer = _worker(epsilon=1.0)
    explorer.set_weights(7, _prefer_action(learner, 1))
    actions = np.concatenate([explorer.sample().batch["action"] for _ in range(20)])
    assert 0.4 < actions.mean() < 0.6


def test_priorities_equal_learner_td_errors_under_the_same_weights():
    obs_space, act_space = probe_spaces(CARTPOLE)
    learner = Learner(obs_space, act_space, DQNConfig(hiddens=(32,)), CPU, seed=11)
    worker = _worker(epsilon=0.5)
    worker.set_weights(*learner.get_weights())
    out = worker.sample()
    batch = {k: torch.as_tensor(v) for k, v in out.batch.items()}
    n = len(out.priorities)
    expected = dqn_loss(learner.online, learner.target, batch, torch.ones(n), double_q=True)
    np.testing.assert_allclose(out.priorities, expected.td_abs.numpy(), rtol=1e-4, atol=1e-5)


def test_evaluate_is_greedy_and_reproducible_with_seed():
    worker = _worker(epsilon=1.0)
    r1 = worker.evaluate(3, seed=10)
    r2 = worker.evaluate(3, seed=10)
    assert r1 == r2
    assert set(r1) == {"return_mean", "return_std", "returns", "lengths", "timed_out"}
    assert r1["timed_out"] is False
    assert r1["return_mean"] == pytest.approx(np.mean(r1["returns"]))
    assert r1["returns"] == [float(n) for n in r1["lengths"]]  # CartPole: +1 per step
    assert worker.evaluate(2, max_steps=5)["lengths"] == [5, 5]


def test_image_env_acts_through_torch_and_maps_action_offset():
    obs_space, act_space = probe_spaces(TinyGridEnv)
    learner = Learner(obs_space, act_space, DQNConfig(hiddens=(32,)), CPU, seed=0)
    worker = _worker(factory=TinyGridEnv, epsilon=0.0, fragment_length=14, n_step=2)
    weights = _prefer_action(learner, 2)
    worker.set_weights(1, weights)
    out = worker.sample()
    b = out.batch
    assert b["obs"].dtype == np.uint8 and b["obs"].shape == (14, 10, 10, 2)
    assert np.all(b["action"] == 2)  # index 2 -> env action +1, reward +1 per step
    assert out.episode_returns == [7.0, 7.0]
    assert b["reward"][0] == pytest.approx(1.0 + 0.99)


def test_bad_epsilon_raises():
    with pytest.raises(ValueError):
        _worker(epsilon=1.5)


def test_atari_ids_get_dqn_preprocessing():
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    factory = make_env_factory("ALE/Pong-v5")
    obs_space, act_space = probe_spaces(factory)
    assert obs_space.shape == (4, 84, 84) and obs_space.dtype == np.uint8
    worker = EnvWorker(
        factory,
        epsilon=1.0,
        seed=0,
        rollout=RolloutSpec(fragment_length=8, n_step=3),
        config=DQNConfig(hiddens=(32,)),
    )
    out = worker.sample()
    assert out.batch["obs"].shape == (6, 4, 84, 84)  # 8 steps, n - 1 = 2 pending
    assert out.batch["obs"].dtype == np.uint8


def test_minatar_ids_register_on_demand_or_say_what_to_install():
    import importlib.util

    from apex_dask.algo.envs.factory import UnknownEnvError, check_env_id, make_env_factory

    if importlib.util.find_spec("minatar") is None:
        with pytest.raises(UnknownEnvError, match="minatar") as info:
            check_env_id("MinAtar/Breakout-v1")
        assert "\n" not in str(info.value)
        return
    obs_space, act_space = probe_spaces(make_env_factory("MinAtar/Breakout-v1"))
    assert obs_space.shape == (10, 10, 4) and act_space.n == 3
