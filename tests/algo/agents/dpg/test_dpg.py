"""The DPG agent: losses against hand computation, TD3's options, priorities, noise, checkpoints."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from agent_parts import configs
from gymnasium import spaces

from apex_dask.algo.agents.dpg.config import DPGConfig
from apex_dask.algo.agents.dpg.learner import DPGLearner
from apex_dask.algo.agents.dpg.loss import actor_loss, critic_loss, dpg_targets, target_actions
from apex_dask.algo.agents.dpg.noise import ActionNoise, noise_ladder
from apex_dask.algo.agents.dpg.worker import DPGEnvWorker
from apex_dask.algo.envs.factory import make_env_factory
from apex_dask.algo.rollout.spec import RolloutSpec
from apex_dask.experiment.checkpoints.store import load_checkpoint, save_checkpoint

OBS1 = spaces.Box(-10.0, 10.0, (1,), np.float32)
ACT1 = spaces.Box(-2.0, 2.0, (1,), np.float32)  # center 0, half range 2


def _linear_learner(twin_q: bool = True, **kw) -> DPGLearner:
    """No hidden layers: mu(s) = 2 tanh(0.5 s), Q1 = s + 2a + 0.5, Q2 = 2s + a."""
    keys = {"actor_hiddens": (), "critic_hiddens": (), "twin_q": twin_q, **kw}
    learner = DPGLearner(OBS1, ACT1, *configs("dpg", **keys))
    with torch.no_grad():
        for model in (learner.online, learner.target):
            model.actor.net[0].weight.fill_(0.5)
            model.actor.net[0].bias.zero_()
            model.critic.q1[0].weight.copy_(torch.tensor([[1.0, 2.0]]))
            model.critic.q1[0].bias.fill_(0.5)
            if twin_q:
                model.critic.q2[0].weight.copy_(torch.tensor([[2.0, 1.0]]))
                model.critic.q2[0].bias.zero_()
    return learner


def _one(**values: float) -> dict[str, torch.Tensor]:
    return {
        k: torch.tensor([[v]] if k in ("obs", "action", "next_obs") else [v])
        for k, v in values.items()
    }


BATCH = {"obs": 1.0, "action": 0.5, "reward": 1.0, "next_obs": 2.0, "discount": 0.9}


@pytest.mark.parametrize("twin_q", [True, False])
def test_critic_loss_target_and_priority_match_hand_computation(twin_q):
    learner = _linear_learner(twin_q, smooth_target_policy=False)
    batch, w = _one(**BATCH), torch.tensor([2.0])
    y = dpg_targets(learner.target, batch, smooth=False, noise=0.0, noise_clip=0.0)
    a_next = 2 * math.tanh(0.5 * 2.0)  # mu'(s') = 1.5232
    q1_next, q2_next = 2.0 + 2 * a_next + 0.5, 2 * 2.0 + a_next
    y_hand = 1.0 + 0.9 * (min(q1_next, q2_next) if twin_q else q1_next)  # the twin minimum
    assert float(y) == pytest.approx(y_hand, rel=1e-6)
    out = critic_loss(learner.online, y, batch, w)
    td1 = (1.0 + 2 * 0.5 + 0.5) - y_hand  # Q1(s, a) = 2.5
    td2 = (2 * 1.0 + 0.5) - y_hand  # Q2(s, a) = 2.5
    loss_hand = 2.0 * 0.5 * td1**2 + (2.0 * 0.5 * td2**2 if twin_q else 0.0)
    assert float(out.loss.detach()) == pytest.approx(loss_hand, rel=1e-6)
    assert float(out.td_abs[0]) == pytest.approx(abs(td1), rel=1e-6)
    td_abs, metrics = learner.update({k: v.numpy() for k, v in batch.items()}, np.array([2.0]))
    assert td_abs[0] == pytest.approx(abs(td1), rel=1e-6)  # priorities: before the step
    assert metrics["loss"] == pytest.approx(loss_hand, rel=1e-6)
    assert metrics["mean_q"] == pytest.approx(2.5)


def test_actor_loss_matches_hand_computation_and_moves_only_the_actor():
    kw = {"smooth_target_policy": False, "tau": 1.0, "target_update_freq": 10**9}
    learner = _linear_learner(policy_delay=1, **kw)
    obs = torch.tensor([[1.0]])
    expected = -(1.0 + 2 * (2 * math.tanh(0.5)) + 0.5)
    assert float(actor_loss(learner.online, obs).detach()) == pytest.approx(expected, rel=1e-6)
    critic_before = {k: v.clone() for k, v in learner.online.critic.state_dict().items()}
    data = {k: v.numpy() for k, v in _one(**BATCH).items()}
    _, metrics = learner.update(data, np.ones(1, np.float32))
    # dL/d(actor weight) < 0: Q grows with a, so the actor's weight rises
    assert float(learner.online.actor.net[0].weight.detach()) > 0.5
    # the critic moved by its own step only (the actor's loss left no gradient on it)
    fresh = _linear_learner(policy_delay=10**6, **kw)
    fresh.update(data, np.ones(1, np.float32))
    # the actor's step follows the critic's: its loss is the stepped critic's value
    after = float(actor_loss(fresh.online, obs).detach())
    assert metrics["actor_loss"] == pytest.approx(after, rel=1e-6) and after != expected
    for k, v in learner.online.critic.state_dict().items():
        torch.testing.assert_close(v, fresh.online.critic.state_dict()[k])
        assert not torch.equal(v, critic_before[k])


def test_target_smoothing_is_clipped_noise_within_the_action_bounds():
    learner = _linear_learner()
    next_obs = torch.tensor([[2.0]] * 20_000)
    gen = torch.Generator().manual_seed(0)
    plain = target_actions(learner.target, next_obs, smooth=False, noise=0.2, noise_clip=0.5)
    smooth = target_actions(
        learner.target, next_obs, smooth=True, noise=0.2, noise_clip=0.1, generator=gen
    )
    offset = (smooth - plain).numpy().ravel()
    assert np.all(np.abs(offset) <= 0.1 * 2.0 + 1e-6)  # clip 0.1 half ranges, half = 2
    assert np.mean(np.isclose(np.abs(offset), 0.2, atol=1e-6)) > 0.4  # N(0, 0.4) clipped
    assert abs(offset.mean()) < 0.01
    wide = target_actions(
        learner.target, next_obs, smooth=True, noise=5.0, noise_clip=5.0, generator=gen
    )
    assert float(wide.max()) == pytest.approx(2.0) and float(wide.min()) == pytest.approx(-2.0)
    off = target_actions(learner.target, next_obs, smooth=True, noise=0.0, noise_clip=0.5)
    torch.testing.assert_close(off, plain)


def test_policy_delay_and_soft_or_periodic_target_updates():
    rng = np.random.default_rng(0)
    data = {
        "obs": rng.normal(size=(8, 1)).astype(np.float32),
        "action": rng.uniform(-2, 2, size=(8, 1)).astype(np.float32),
        "reward": rng.normal(size=8).astype(np.float32),
        "next_obs": rng.normal(size=(8, 1)).astype(np.float32),
        "discount": np.full(8, 0.9, np.float32),
    }
    w = np.ones(8, np.float32)
    soft = _linear_learner(policy_delay=2, tau=0.5)
    actor0 = soft.online.actor.net[0].weight.clone()
    soft.update(data, w)
    assert torch.equal(soft.online.actor.net[0].weight, actor0) and soft.num_target_updates == 0
    soft.update(data, w)  # second update: the actor steps, the targets move halfway
    assert soft.num_target_updates == 1
    on, tgt = soft.online.actor.net[0].weight, soft.target.actor.net[0].weight
    torch.testing.assert_close(tgt, 0.5 * actor0 + 0.5 * on)
    hard = _linear_learner(policy_delay=1, tau=1.0, target_update_freq=24)
    for k in range(1, 7):
        hard.update(data, w)
        assert hard.num_target_updates == (k * 8) // 24
    torch.testing.assert_close(hard.target.critic.q1[0].weight, hard.online.critic.q1[0].weight)
    assert hard.counters()["steps_trained"] == 48 and hard.version == 6


def test_checkpoint_round_trip_restores_nets_optimizers_counters_and_noise(tmp_path):
    rng = np.random.default_rng(1)
    obs, act = spaces.Box(-1, 1, (3,), np.float32), spaces.Box(-1, 1, (2,), np.float32)

    def batch():
        return {
            "obs": rng.normal(size=(16, 3)).astype(np.float32),
            "action": rng.uniform(-1, 1, size=(16, 2)).astype(np.float32),
            "reward": rng.normal(size=16).astype(np.float32),
            "next_obs": rng.normal(size=(16, 3)).astype(np.float32),
            "discount": np.full(16, 0.99, np.float32),
        }

    options = configs("dpg", actor_hiddens=(16,), critic_hiddens=(16,))
    a = DPGLearner(obs, act, *options, seed=4)
    w = np.ones(16, np.float32)
    for _ in range(5):
        a.update(batch(), w)
    save_checkpoint(tmp_path / "ckpt", {"learner": a.state_dict()})
    parts, _ = load_checkpoint(tmp_path / "ckpt")
    b = DPGLearner(obs, act, *options, seed=99)
    b.load_state_dict(parts["learner"])
    assert b.counters() == a.counters()
    nxt = batch()
    td_a, m_a = a.update(nxt, w)
    td_b, m_b = b.update(nxt, w)
    np.testing.assert_array_equal(td_a, td_b)
    assert m_a == m_b
    for k, v in a.get_weights()[1].items():
        np.testing.assert_array_equal(v, b.get_weights()[1][k])


def test_noise_ladder_is_geometric_and_each_noise_has_its_scale():
    sig = noise_ladder(5, 0.4, 7.0)
    assert sig[0] == pytest.approx(0.4) and sig[-1] == pytest.approx(0.4**8)
    np.testing.assert_allclose(sig[1:] / sig[:-1], (0.4**7) ** 0.25)
    assert noise_ladder(1, 0.3, 2.0).tolist() == [0.3]
    g = ActionNoise("gaussian", 0.3, (20_000, 2), np.random.default_rng(0))
    assert np.std(g.sample()) == pytest.approx(0.3, rel=0.02)
    ou = ActionNoise("ou", 0.5, (4_000, 1), np.random.default_rng(1), theta=0.15)
    xs = np.stack([ou.sample()[:, 0] for _ in range(60)])
    assert np.std(xs[-1]) == pytest.approx(0.5, rel=0.06)  # stationary std = sigma
    corr = np.corrcoef(xs[-2], xs[-1])[0, 1]
    assert corr == pytest.approx(0.85, abs=0.03)  # 1 - theta
    ou.reset(np.arange(4_000) < 10)
    assert not ou.state[:10].any() and ou.state[10:].any()
    with pytest.raises(ValueError, match="noise must be one of"):
        ActionNoise("uniform", 0.1, (1, 1), np.random.default_rng(0))


@pytest.fixture(scope="module")
def pendulum():
    return make_env_factory("Pendulum-v1")


@pytest.mark.parametrize("noise", ["gaussian", "ou"])
def test_worker_priorities_are_the_learners_td_errors_from_the_acting_passes(pendulum, noise):
    worker = DPGEnvWorker(
        pendulum,
        noise_scale=0.5,
        seed=3,
        rollout=RolloutSpec(num_envs=3, fragment_length=90),
        config=DPGConfig(noise=noise),
    )
    learner = DPGLearner(
        worker.observation_space,
        worker.action_space,
        *configs("dpg", smooth_target_policy=False),
    )
    worker.set_weights(*learner.get_weights())
    for k in range(4):  # 270 steps: time limits at 200 (final observations), carried steps
        out = worker.sample()
        batch = out.batch
        np.testing.assert_allclose(out.priorities, worker.td_errors(batch), rtol=1e-4, atol=1e-4)
        if k == 1:  # online = target (no update yet), no smoothing: the same |td|
            td, _ = learner.update(batch, np.ones(len(batch["action"]), np.float32))
            np.testing.assert_allclose(out.priorities, td, rtol=1e-4, atol=1e-4)
        if k == 2:  # new weights mid-run: pending steps get values from them
            worker.set_weights(*learner.get_weights())
    assert worker.episodes == 3  # each env's first 200-step episode ended


def test_worker_actions_are_clipped_to_the_bounds_and_greedy_has_no_noise(pendulum):
    worker = DPGEnvWorker(
        pendulum, noise_scale=1.0, seed=0, rollout=RolloutSpec(num_envs=2, fragment_length=100)
    )
    batch = worker.sample().batch
    assert batch["action"].dtype == np.float32 and batch["action"].shape[1:] == (1,)
    assert np.all(np.abs(batch["action"]) <= 2.0)
    assert np.mean(np.abs(batch["action"]) == 2.0) > 0.1  # sigma 1 half range: often clipped
    obs = batch["obs"][:5]
    np.testing.assert_array_equal(worker.mu(obs), worker.mu(obs))
    out = worker.evaluate(1, seed=0)
    assert out["lengths"] == [200] and math.isfinite(out["return_mean"])


def test_halfcheetah_rollouts_train_the_learner():
    pytest.importorskip("mujoco", reason="HalfCheetah-v5 needs apex_dask[mujoco]")
    worker = DPGEnvWorker(
        make_env_factory("HalfCheetah-v5"), noise_scale=0.3, seed=0, rollout=RolloutSpec(num_envs=2)
    )
    learner = DPGLearner(worker.observation_space, worker.action_space, *configs("dpg"))
    worker.set_weights(*learner.get_weights())
    out = worker.sample()
    batch = out.batch
    assert batch["action"].shape[1:] == (6,) and np.all(np.abs(batch["action"]) <= 1.0)
    np.testing.assert_allclose(out.priorities, worker.td_errors(batch), rtol=1e-4, atol=1e-3)
    n = len(batch["action"])
    td, metrics = learner.update(batch, np.ones(n, np.float32))
    assert td.shape == (n,) and math.isfinite(metrics["loss"])
