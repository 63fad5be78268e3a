"""The DQN Atari preprocessing of ``ALE/`` ids, on real ALE games (ale-py is in the test extra)."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("ale_py")

from apex_dask.algo.agents.dqn.worker import EnvWorker  # noqa: E402
from apex_dask.algo.envs.atari import NOOP_MAX, wrap_atari  # noqa: E402
from apex_dask.algo.envs.factory import check_env_id, make_env_factory  # noqa: E402
from apex_dask.algo.rollout.spec import RolloutSpec

DEADLINE_S = 120.0


class RecordActions(gym.Wrapper):
    """Records every action the emulator receives (below the preprocessing: one per frame)."""

    def __init__(self, env):
        super().__init__(env)
        self.actions: list[int] = []

    def reset(self, **kwargs):
        self.actions = []
        return self.env.reset(**kwargs)

    def step(self, action):
        self.actions.append(int(action))
        return self.env.step(action)


def _recorded(game: str, **kwargs):
    check_env_id(f"ALE/{game}-v5")  # registers the ALE ids
    inner = RecordActions(gym.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=0.0))
    return wrap_atari(inner, **kwargs), inner


def test_factory_makes_stacked_grayscale_frames_without_sticky_actions_unless_asked():
    env = make_env_factory("ALE/Breakout-v5")()
    assert env.observation_space.shape == (4, 84, 84)
    assert env.observation_space.dtype == np.uint8
    obs, _ = env.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8
    ale = env.unwrapped.ale
    assert ale.getFloat("repeat_action_probability") == 0.0
    assert ale.getInt("frame_skip") == 1  # the skip is done (with max-pooling) by the wrapper
    sticky = make_env_factory("ALE/Breakout-v5", repeat_action_probability=0.25)()
    assert sticky.unwrapped.ale.getFloat("repeat_action_probability") == 0.25
    env.close()
    sticky.close()


def test_noop_starts_are_between_1_and_30_frames():
    env, inner = _recorded("Freeway")  # no FIRE: the reset makes only no-ops
    counts = []
    env.reset(seed=0)  # seeding reloads the ROM (slow); later resets draw from its generator
    for _ in range(60):
        env.reset()
        assert set(inner.actions) <= {0}
        counts.append(len(inner.actions))
    assert 1 <= min(counts) and max(counts) <= NOOP_MAX
    assert min(counts) <= 5 and max(counts) >= 25  # spread over the range, not a constant
    env.close()


def test_fire_is_pressed_on_reset_for_games_that_need_it():
    env, inner = _recorded("Breakout")
    env.reset(seed=0)
    for _ in range(5):
        env.reset()
        noops = len(inner.actions) - 8
        # no-op frames, then FIRE for one agent step (4 frames), then action 2
        assert 1 <= noops <= NOOP_MAX
        assert inner.actions == [0] * noops + [1] * 4 + [2] * 4
    env.close()


def _sample_until(worker: EnvWorker, stop) -> list[dict]:
    outs = []
    deadline = time.monotonic() + DEADLINE_S
    while not stop(outs):
        assert time.monotonic() < deadline, "no such event within the deadline"
        outs.append(worker.sample())
    return outs


def test_life_loss_is_a_training_terminal_but_not_an_episode_end():
    worker = EnvWorker(
        make_env_factory("ALE/Breakout-v5"),
        epsilon=1.0,
        seed=3,
        rollout=RolloutSpec(n_step=3, fragment_length=50),
    )
    lives0 = worker.env.unwrapped.ale.lives()
    outs = _sample_until(worker, lambda outs: any(o.batch["done"].any() for o in outs))
    assert worker.env.unwrapped.ale.lives() < lives0  # a life was lost...
    assert all(o.episode_returns == [] for o in outs)  # ...and the game goes on
    assert worker.episodes == 0
    done = np.concatenate([o.batch["done"] for o in outs])
    discount = np.concatenate([o.batch["discount"] for o in outs])
    assert (discount[done] == 0.0).all()  # no bootstrapping across the lost life
    worker.close()


def test_training_rewards_are_clipped_while_episode_returns_are_raw_scores():
    worker = EnvWorker(
        make_env_factory("ALE/SpaceInvaders-v5"),
        epsilon=1.0,
        seed=1,
        rollout=RolloutSpec(n_step=1, fragment_length=100),
    )
    outs = _sample_until(worker, lambda outs: any(o.episode_returns for o in outs))
    rewards = np.concatenate([o.batch["reward"] for o in outs])
    done = np.concatenate([o.batch["done"] for o in outs])
    returns = [r for o in outs for r in o.episode_returns]
    lengths = [n for o in outs for n in o.episode_lengths]
    assert set(np.unique(rewards)) <= {0.0, 1.0} and rewards.max() == 1.0
    game = slice(0, lengths[0])  # n_step=1: one transition per step, in order
    clipped = float(rewards[game].sum())
    assert returns[0] > clipped > 0  # invaders are worth 5 to 30 points each
    assert returns[0] % 5 == 0
    # the whole game is one episode: a training terminal per life (3), one game end
    assert int(done[game].sum()) == 3 and worker.episodes == 1
    worker.close()


def test_clip_rewards_can_be_turned_off():
    env = make_env_factory("ALE/SpaceInvaders-v5", clip_rewards=False)()
    env.reset(seed=1)
    deadline = time.monotonic() + DEADLINE_S
    while True:
        assert time.monotonic() < deadline
        _, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert info["train_reward"] == reward
        if reward > 1 or terminated or truncated:
            break
    assert reward > 1
    env.close()
