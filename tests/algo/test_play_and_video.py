"""Evaluation episodes: seeded per episode, whoever plays them; recorded videos decode
to the episode's frames (the reset frame and one per step)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from trained_runs import cartpole_weights, pendulum_model

from apex_dask.algo.agents.base import WeightsMismatch, module_weights
from apex_dask.algo.agents.dpg.config import DPGConfig
from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.networks import build_q_network
from apex_dask.algo.agents.dqn.policy import QPolicy
from apex_dask.algo.agents.registry import make_policy
from apex_dask.algo.agents.spec import AgentSpec
from apex_dask.algo.envs.factory import make_env_factory
from apex_dask.algo.play.episodes import play_episodes
from apex_dask.algo.play.video import rgb_frame, video_problem
from apex_dask.config import ApexConfig

HIDDENS = (128, 128)
DQN = AgentSpec("dqn", DQNConfig(hiddens=HIDDENS))


def test_episodes_do_not_depend_on_how_they_are_split():
    factory = make_env_factory("CartPole-v1")
    kw = {"base_seed": 11, "epsilon": 0.3}
    whole = play_episodes(factory, DQN, cartpole_weights(), range(6), **kw)
    parts = play_episodes(factory, DQN, cartpole_weights(), [4, 5], **kw)
    parts += play_episodes(factory, DQN, cartpole_weights(), [0, 1, 2, 3], **kw)
    key = sorted((r["index"], r["return"], r["length"]) for r in parts)
    assert key == [(r["index"], r["return"], r["length"]) for r in whole]
    assert len({r["length"] for r in whole}) > 1  # epsilon 0.3 makes episodes differ
    other = play_episodes(factory, DQN, cartpole_weights(), range(6), **{**kw, "base_seed": 12})
    assert [r["length"] for r in other] != [r["length"] for r in whole]


def test_greedy_controller_weights_balance_for_500_steps():
    rows = play_episodes(
        make_env_factory("CartPole-v1"), DQN, cartpole_weights(), range(3), base_seed=0
    )
    assert [r["return"] for r in rows] == [500.0] * 3


def test_weights_of_another_network_are_named():
    env = gym.make("CartPole-v1")
    with pytest.raises(WeightsMismatch, match=r"lack 'trunk\.2\.weight'"):
        QPolicy(env.observation_space, env.action_space, cartpole_weights((64,)), DQN.config)
    with pytest.raises(WeightsMismatch, match=r"'trunk\.0\.weight' has shape \[64, 4\]"):
        QPolicy(env.observation_space, env.action_space, cartpole_weights((64, 8)), DQN.config)


def _pendulum() -> tuple[gym.Env, dict, AgentSpec]:
    d = ApexConfig.preset("pendulum").agent
    options = DPGConfig(actor_hiddens=d.actor_hiddens, critic_hiddens=d.critic_hiddens)
    return gym.make("Pendulum-v1"), module_weights(pendulum_model()), AgentSpec("dpg", options)


def test_a_dpg_policy_plays_its_actor_and_explores_within_the_bounds():
    import torch

    env, weights, spec = _pendulum()
    policy = make_policy(spec, env.observation_space, env.action_space, weights)
    obs = np.random.default_rng(0).uniform(-1, 1, (200, 3)).astype(np.float32)
    with torch.no_grad():
        want = pendulum_model().actor(torch.as_tensor(obs)).numpy()
    got = np.stack([policy.act(o) for o in obs])
    assert got.shape == (200, 1) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert got.min() < -1.0 and got.max() > 1.0  # the actions span the range [-2, 2]
    rng = np.random.default_rng(1)
    explored = np.stack([policy.act(o, epsilon=1.0, rng=rng) for o in obs])
    assert np.all(np.abs(explored) <= 2.0) and not np.allclose(explored, got)
    assert abs(float(explored.mean())) < 0.3  # uniform over [-2, 2]
    with pytest.raises(WeightsMismatch, match=r"'actor\.net\.0\.weight' has shape"):
        other = AgentSpec("dpg", replace(spec.config, actor_hiddens=(32, 32)))
        make_policy(other, env.observation_space, env.action_space, weights)


def test_dpg_episodes_are_seeded_per_episode_and_greedy_ones_repeat():
    factory = make_env_factory("Pendulum-v1")
    _, weights, spec = _pendulum()
    kw = {"base_seed": 3}
    whole = play_episodes(factory, spec, weights, range(4), **kw)
    parts = play_episodes(factory, spec, weights, [2, 3], **kw) + play_episodes(
        factory, spec, weights, [0, 1], **kw
    )
    key = sorted((r["index"], r["return"], r["length"]) for r in parts)
    assert key == [(r["index"], r["return"], r["length"]) for r in whole]
    assert [r["length"] for r in whole] == [200] * 4  # Pendulum's time limit
    assert len({r["return"] for r in whole}) == 4  # each episode its own start
    noisy = play_episodes(factory, spec, weights, range(4), epsilon=0.5, **kw)
    assert [r["return"] for r in noisy] != [r["return"] for r in whole]


def test_frames_become_even_uint8_rgb_of_at_least_160_pixels():
    grid = np.random.default_rng(0).random((10, 10, 3))  # MinAtar: floats in [0, 1]
    out = rgb_frame(grid)
    assert out.shape == (160, 160, 3) and out.dtype == np.uint8
    assert out[0, 0].tolist() == (grid[0, 0] * 255).astype(np.uint8).tolist()
    assert rgb_frame(np.zeros((210, 160, 3), np.uint8)).shape == (210, 160, 3)
    assert rgb_frame(np.zeros((7, 9), np.uint8)).shape == (162, 208, 3)


def _decoded_frames(data: bytes, tmp_path: Path) -> tuple[int, tuple[int, int]]:
    import imageio.v2 as imageio

    path = tmp_path / "v.mp4"
    path.write_bytes(data)
    reader = imageio.get_reader(path)
    try:
        return sum(1 for _ in reader), reader.get_meta_data()["size"]
    finally:
        reader.close()


@pytest.mark.skipif(video_problem() is not None, reason="needs the video extra")
@pytest.mark.parametrize(
    ("env_id", "weights", "size"),
    [("CartPole-v1", cartpole_weights, (600, 400)), ("MinAtar/Breakout-v1", None, (160, 160))],
)
def test_recorded_video_decodes_to_the_episodes_frames(tmp_path, env_id, weights, size):
    factory = make_env_factory(env_id)
    render = replace(factory, env_kwargs={"render_mode": "rgb_array"})
    if weights is None:  # the network's initial weights
        env = factory()
        net = build_q_network(env.observation_space, env.action_space, (32,), True)
        w, hiddens = module_weights(net), (32,)
        env.close()
    else:
        w, hiddens = weights(), HIDDENS
    # epsilon 0.5 keeps CartPole episodes short (and different from 500)
    spec = AgentSpec("dqn", DQNConfig(hiddens=hiddens))
    kw = {"base_seed": 5, "epsilon": 0.5, "max_steps": 400}
    rows = play_episodes(factory, spec, w, [0, 1], record=[1], render_factory=render, **kw)
    assert "video" not in rows[0]
    frames, got_size = _decoded_frames(rows[1]["video"], tmp_path)
    assert frames == rows[1]["length"] + 1  # the reset frame, then one per step
    assert tuple(got_size) == size
    plain = play_episodes(factory, spec, w, [1], **kw)  # recording does not change the episode
    assert (plain[0]["return"], plain[0]["length"]) == (rows[1]["return"], rows[1]["length"])


def test_episode_frames_stay_few_small_and_evenly_spread():
    import io

    from PIL import Image

    from apex_dask.algo.play.video import EpisodeFrames, quiet_pygame

    quiet_pygame()
    env = gym.make("MountainCar-v0", render_mode="rgb_array")  # 200 steps, never earlier
    frames = EpisodeFrames(max_frames=10, max_side=64)
    env.reset(seed=0)
    rendered = []
    real_render = env.render
    env.render = lambda: rendered.append(1) or real_render()  # count the renders
    frames.offer(env, 0)
    for step in range(1, 201):
        env.step(1)
        frames.offer(env, step)
    env.close()
    assert frames.every == 16 and len(frames.frames) == 13  # steps 0, 16, ..., 192
    assert len(rendered) < 60  # rendering thins out as the episode goes on
    assert all(f.shape == (40, 60, 3) and f.dtype == np.uint8 for f in frames.frames)
    gif = Image.open(io.BytesIO(frames.gif(fps=50)))
    durations = []
    for i in range(gif.n_frames):  # Pillow merges a frame equal to the one before it
        gif.seek(i)
        durations.append(gif.info["duration"])
    assert gif.size == (60, 40) and gif.n_frames >= 2
    assert sum(durations) == 13 * 320  # 13 frames, each 16 steps at 50 steps/s


def test_a_render_that_raises_stops_the_frames_not_the_evaluation():
    from apex_dask.algo.agents.dqn.worker import EnvWorker
    from apex_dask.algo.play.video import EpisodeFrames

    class NoPygame(gym.Wrapper):
        def render(self):
            raise gym.error.DependencyNotInstalled("pygame is not installed")

    worker = EnvWorker(lambda: NoPygame(gym.make("CartPole-v1")), epsilon=0.0, seed=0)
    frames = EpisodeFrames()
    out = worker.evaluate(2, seed=3, frames=frames)
    worker.close()
    assert len(out["returns"]) == 2 and worker.env_errors == 0
    assert frames.frames == [] and "pygame is not installed" in frames.failed
