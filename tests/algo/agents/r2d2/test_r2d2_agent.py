"""The R2D2 agent's parts on a real partially observable CartPole: worker priorities
equal the learner's, stored states are the ones acted from, a checkpoint round trip
gives a bit-identical next update, greedy play and export carry the state."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import torch

from apex_dask.algo.agents.base import module_weights
from apex_dask.algo.agents.config import LearnerConfig
from apex_dask.algo.agents.r2d2.config import R2D2Config
from apex_dask.algo.agents.r2d2.learner import R2D2Learner
from apex_dask.algo.agents.r2d2.worker import R2D2EnvWorker
from apex_dask.algo.agents.registry import make_policy
from apex_dask.algo.agents.spec import AgentSpec
from apex_dask.algo.envs.factory import make_env_factory
from apex_dask.algo.envs.pomdp import POMDP_CARTPOLE_ID
from apex_dask.algo.play.episodes import play_episode
from apex_dask.algo.play.export import export_policy
from apex_dask.algo.replay.shard import ReplayShard
from apex_dask.algo.rollout.spec import RolloutSpec
from apex_dask.experiment.checkpoints.store import load_checkpoint, save_checkpoint

OPTIONS = R2D2Config(
    hiddens=(16,), lstm_size=8, burn_in=4, trace_length=6, period=3, initial_priority="worker"
)
LEARNER = LearnerConfig(device="cpu", n_step=3)


def make_worker(epsilon=0.5, seed=3, num_envs=2, config=OPTIONS):
    rollout = RolloutSpec(n_step=3, fragment_length=17, num_envs=num_envs)  # no multiple
    return R2D2EnvWorker(
        make_env_factory(POMDP_CARTPOLE_ID),
        epsilon=epsilon,
        seed=seed,
        rollout=rollout,
        config=config,
    )


def test_the_env_hides_the_velocities():
    env = gym.make(POMDP_CARTPOLE_ID)
    full = gym.make("CartPole-v1")
    obs, _ = env.reset(seed=4)
    want, _ = full.reset(seed=4)
    assert env.observation_space.shape == (2,)
    np.testing.assert_array_equal(obs, want[[0, 2]])
    for _ in range(5):
        obs, *_ = env.step(1)
        want, *_ = full.step(1)
    np.testing.assert_array_equal(obs, want[[0, 2]])
    assert env.spec.max_episode_steps == 500


def trained_pair():
    """A worker and a learner that has trained a few updates on the worker's items."""
    torch.manual_seed(0)
    worker = make_worker()
    learner = R2D2Learner(worker.observation_space, worker.action_space, OPTIONS, LEARNER, seed=1)
    worker.set_weights(*learner.get_weights())
    shard = ReplayShard(500, alpha=0.9, seed=0)
    for _ in range(4):
        r = worker.sample()
        shard.add(r.batch, r.priorities)
    for _ in range(3):
        s = shard.sample(8, 0.6)
        learner.update(s.data, s.weights)
    return worker, learner, shard


def test_worker_priorities_equal_the_learners_on_the_same_data():
    worker, learner, _ = trained_pair()
    learner.update_target()  # online = target, as on the worker
    worker.set_weights(*learner.get_weights())
    rollout = worker.sample()
    assert len(rollout) > 0
    got = learner.loss(rollout.batch, np.ones(len(rollout), np.float32)).priorities.numpy()
    np.testing.assert_allclose(rollout.priorities, got, rtol=1e-5, atol=1e-6)
    # the priorities depend on the weights: a learner with other weights disagrees
    other = R2D2Learner(worker.observation_space, worker.action_space, OPTIONS, LEARNER, seed=9)
    far = other.loss(rollout.batch, np.ones(len(rollout), np.float32)).priorities.numpy()
    assert not np.allclose(rollout.priorities, far, rtol=1e-3)


def test_stored_states_are_the_ones_the_worker_acted_from():
    """Each item's stored state, unrolled over its steps up to the next item's start,
    gives the next item's stored state: the states chain as the worker carried them
    (over fragments too: 17-step fragments, period 3)."""
    worker = make_worker(epsilon=0.3, num_envs=1)
    items = []
    while len(items) < 40:
        batch = worker.sample().batch
        items += [{k: v[j] for k, v in batch.items()} for j in range(len(batch["action"]))]
    b_in, period = OPTIONS.burn_in, OPTIONS.period
    checked = nonzero = 0
    start = 0
    for prev, item in zip(items[:-1], items[1:], strict=True):
        start = 0 if int(item["first"].argmax()) == b_in else start + period
        if start == 0:
            continue  # a new episode: its first item starts from the zero state
        p0 = int(prev["first"].argmax())
        p1 = max(start - b_in, 0) - (start - period - b_in)  # item's first step, in prev
        if p1 == p0:  # both begin at the episode's first step
            np.testing.assert_array_equal(prev["state"], item["state"])
            continue
        obs = torch.as_tensor(prev["obs"][None, p0:p1])
        state = tuple(torch.as_tensor(prev["state"][None, k]) for k in range(2))
        with torch.no_grad():
            _, (h, c) = worker.net.unroll(obs, state)
        torch.testing.assert_close(h[0], torch.as_tensor(item["state"][0]))
        torch.testing.assert_close(c[0], torch.as_tensor(item["state"][1]))
        checked += 1
        nonzero += int(np.abs(item["state"]).sum() > 0)
    assert checked > 10 and nonzero == checked


def test_checkpoint_round_trip_gives_a_bit_identical_next_update(tmp_path):
    _, learner, shard = trained_pair()
    path = save_checkpoint(tmp_path / "ckpt", {"learner": learner.state_dict()}, metadata={})
    parts, _ = load_checkpoint(path)
    restored = R2D2Learner(
        gym.make(POMDP_CARTPOLE_ID).observation_space,
        gym.spaces.Discrete(2),
        OPTIONS,
        LEARNER,
        seed=77,
    )
    restored.load_state_dict(parts["learner"])
    assert restored.version == learner.version
    s = shard.sample(8, 0.6)
    p_a, m_a = learner.update(s.data, s.weights)
    p_b, m_b = restored.update(s.data, s.weights)
    np.testing.assert_array_equal(p_a, p_b)
    assert m_a == m_b
    for k, v in module_weights(learner.online).items():
        np.testing.assert_array_equal(v, module_weights(restored.online)[k])


def test_target_copies_follow_steps_trained():
    _, learner, shard = trained_pair()
    learner.target_update_freq = 1
    before = learner.num_target_updates
    s = shard.sample(4, 0.6)
    learner.update(s.data, s.weights)
    assert learner.num_target_updates == before + 1
    assert learner.agent_stats()["learner/state_staleness"] >= 0.0


def test_greedy_play_evaluation_and_export_agree_over_whole_episodes(tmp_path):
    worker, learner, _ = trained_pair()
    version, weights = learner.get_weights()
    worker.set_weights(version, weights)
    env = gym.make(POMDP_CARTPOLE_ID)
    spec = AgentSpec("r2d2", OPTIONS, LEARNER)
    policy = make_policy(spec, env.observation_space, env.action_space, weights)
    pt, meta = export_policy(
        tmp_path / "r2d2.pt",
        spec,
        env.observation_space,
        env.action_space,
        weights,
        about={"env_id": POMDP_CARTPOLE_ID},
    )
    doc = json.loads(meta.read_text())
    assert "h, c" in doc["load"] and "(action, h, c)" in doc["output"]
    program = torch.jit.load(str(pt))
    for seed in (0, 1):
        ret, length = play_episode(env, policy, seed=seed)
        evaluated = worker.evaluate(1, seed=seed)
        assert evaluated["returns"] == [ret] and evaluated["lengths"] == [length]
        # the exported program over the same whole episode, its state passed back
        obs, _ = env.reset(seed=seed)
        policy.reset()
        h = c = torch.zeros(1, OPTIONS.lstm_size)
        done, steps = False, 0
        while not done:
            action, h, c = program(torch.as_tensor(obs)[None], h, c)
            assert int(action[0]) == policy.act(obs)
            obs, _, terminated, truncated, _ = env.step(int(action[0]))
            done, steps = terminated or truncated, steps + 1
        assert steps == length


def test_a_batch_of_three_through_the_program_matches_one_at_a_time(tmp_path):
    env = gym.make(POMDP_CARTPOLE_ID)
    _, learner, _ = trained_pair()
    spec = AgentSpec("r2d2", OPTIONS, LEARNER)
    pt, _ = export_policy(
        tmp_path / "p.pt",
        spec,
        env.observation_space,
        env.action_space,
        learner.get_weights()[1],
    )
    program = torch.jit.load(str(pt))
    obs = torch.randn(3, 2)
    h, c = torch.randn(3, 8), torch.randn(3, 8)
    a, h3, _ = program(obs, h, c)
    for i in range(3):
        ai, hi, _ = program(obs[i : i + 1], h[i : i + 1], c[i : i + 1])
        assert int(ai[0]) == int(a[i])
        torch.testing.assert_close(hi[0], h3[i])


@pytest.mark.parametrize("epsilon", [0.0, 1.0])
def test_epsilon_sets_how_often_the_worker_explores(epsilon):
    worker = make_worker(epsilon=epsilon, num_envs=1)
    greedy_run = worker.sample()
    assert greedy_run.exploration == epsilon and greedy_run.steps == 17


def test_image_sequences_on_minatar_train_and_agree_with_the_worker():
    """The conv torso path: MinAtar frames (10 x 10 x C) through the LSTM agent."""
    pytest.importorskip("minatar")
    options = R2D2Config(
        hiddens=(16,), lstm_size=8, burn_in=2, trace_length=4, period=2, initial_priority="worker"
    )
    worker = R2D2EnvWorker(
        make_env_factory("MinAtar/Breakout-v1"),
        epsilon=0.5,
        seed=0,
        rollout=RolloutSpec(fragment_length=12),
        config=options,
    )
    learner = R2D2Learner(worker.observation_space, worker.action_space, options, LEARNER, seed=0)
    worker.set_weights(*learner.get_weights())
    rollout = worker.sample()
    assert len(rollout) > 0 and rollout.batch["obs"].shape[1:] == (6, 10, 10, 4)
    weights = np.ones(len(rollout), np.float32)
    want = learner.loss(rollout.batch, weights).priorities.numpy()
    np.testing.assert_allclose(rollout.priorities, want, rtol=1e-5, atol=1e-6)
    priorities, metrics = learner.update(rollout.batch, weights)
    assert np.all(np.isfinite(priorities)) and np.isfinite(metrics["loss"])


@pytest.mark.parametrize("preset", ["cartpole_pomdp", "minatar_r2d2"])
def test_the_memory_estimate_matches_a_shard_of_sequence_items(preset):
    """Each r2d2 preset's parts, built as a run builds them (vectors and MinAtar images):
    the shard of their sequence items is as big as the estimate said."""
    from types import SimpleNamespace

    from apex_dask.algo.agents.registry import make_env_worker
    from apex_dask.cli.memory import replay_bytes
    from apex_dask.config import ApexConfig
    from apex_dask.experiment.builder import env_factory, worker_spec

    if preset == "minatar_r2d2":
        pytest.importorskip("minatar")
    cfg = ApexConfig.preset(preset).override(
        {"replay.capacity": 400, "replay.learning_starts": 100}
    )
    worker = make_env_worker(worker_spec(cfg), env_factory(cfg), exploration=0.5, seed=3)
    spaces_ = SimpleNamespace(
        observation_space=worker.observation_space, action_space=worker.action_space
    )
    total, per_item = replay_bytes(cfg, spaces_)
    shard = ReplayShard(cfg.replay.capacity, alpha=0.9, seed=0)
    rollout = worker.sample()
    assert (
        len(rollout) > 0
        and rollout.batch["obs"].shape[1] == cfg.agent.burn_in + cfg.agent.trace_length
    )
    shard.add(rollout.batch, rollout.priorities)  # allocates the whole ring
    measured = shard.stats()["bytes"]
    assert 0.85 < total / measured < 1.15, (total, measured)
    # a transition estimate (2 observations an item) would be 10x too small here
    assert per_item > 10 * 2 * 4 * 2
