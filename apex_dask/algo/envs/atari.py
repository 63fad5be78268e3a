"""The DQN / Ape-X Atari preprocessing, and the training-only signals of an env.

:func:`wrap_atari` turns an ALE env made with ``frameskip=1`` into the setup
the DQN and Ape-X results are quoted for (Mnih et al. 2015; Machado et al.
2018 for what differs from ALE v5's defaults)::

    ALE env (frameskip=1, repeat_action_probability=0.0 unless asked for)
    -> gymnasium AtariPreprocessing: 1..30 no-op frames on reset, frame skip 4
       with a max over the last two frames, 84x84 grayscale uint8
    -> FireOnReset: FIRE (then action 2) after every reset, for games whose
       second action is FIRE (Breakout, Pong, SpaceInvaders, ...)
    -> TrainingSignals: life loss -> a *training* terminal; sign-clipped reward
    -> gymnasium FrameStackObservation(4): observations (4, 84, 84), first axis
       the stack (what ``replay.frame_stack = 4`` stores once per frame)

**Training-only signals.** A lost life ends nothing: the game goes on and
``terminated`` stays False until the game is over, so episode returns and
evaluation count whole games. :class:`TrainingSignals` instead puts what the
learner should see into ``info``:

    info["train_terminated"] = terminated or (a life was lost in this step)
    info["train_reward"]     = sign(reward)   (clip_rewards=True; else reward)

:class:`~apex_dask.algo.rollout.worker.ActingWorker` feeds these to its n-step adder
(a life loss cuts the n-step return with discount 0, as DeepMind's
``EpisodicLifeEnv`` did) and keeps the raw reward and the true
``terminated``/``truncated`` for its episode statistics. Envs without
these keys train on their own reward and ``terminated``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["FireOnReset", "TrainingSignals", "wrap_atari", "NOOP_MAX", "FRAME_SKIP"]

NOOP_MAX = 30
"""At most this many no-op frames after a reset (at least one)."""
FRAME_SKIP = 4
"""Frames per agent step (the last two max-pooled)."""
SCREEN_SIZE = 84
STACK = 4


class FireOnReset(gym.Wrapper):
    """After a reset, press FIRE and then action 2, for games that wait for FIRE.

    Applies when the game's action 1 is ``FIRE`` and it has at least 3 actions
    (as the DQN baselines' ``FireResetEnv``); otherwise a pass-through. Should
    one of the two steps end the game, the env is reset again.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        meanings = env.unwrapped.get_action_meanings()
        self.active = len(meanings) >= 3 and meanings[1] == "FIRE"

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        if not self.active:
            return obs, info
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class TrainingSignals(gym.Wrapper):
    """Adds ``train_terminated`` and ``train_reward`` to every step's ``info``.

    ``life_loss_terminal``: a step in which the ALE's life counter drops is a
    training terminal (the env's own ``terminated`` is untouched).
    ``clip_rewards``: the training reward is ``sign(reward)`` in {-1, 0, 1};
    the reward returned by ``step`` stays the raw game score.
    """

    def __init__(self, env: gym.Env, *, clip_rewards: bool, life_loss_terminal: bool) -> None:
        super().__init__(env)
        self.clip_rewards = bool(clip_rewards)
        self.life_loss_terminal = bool(life_loss_terminal)
        self._lives = 0

    def _read_lives(self) -> int:
        ale = getattr(self.env.unwrapped, "ale", None)
        return int(ale.lives()) if ale is not None else 0

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        self._lives = self._read_lives()
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        info = dict(info)
        train_terminated = bool(terminated)
        if self.life_loss_terminal:
            lives = self._read_lives()
            train_terminated = train_terminated or lives < self._lives
            self._lives = lives
        info["train_terminated"] = train_terminated
        info["train_reward"] = float(np.sign(reward)) if self.clip_rewards else float(reward)
        return obs, reward, terminated, truncated, info


def wrap_atari(
    env: gym.Env,
    *,
    clip_rewards: bool = True,
    life_loss_terminal: bool = True,
    noop_max: int = NOOP_MAX,
) -> gym.Env:
    """The preprocessing of the module docstring around an ALE env made with ``frameskip=1``."""
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    env = AtariPreprocessing(
        env,
        noop_max=noop_max,
        frame_skip=FRAME_SKIP,
        screen_size=SCREEN_SIZE,
        terminal_on_life_loss=False,
        grayscale_obs=True,
        scale_obs=False,
    )
    env = FireOnReset(env)
    env = TrainingSignals(env, clip_rewards=clip_rewards, life_loss_terminal=life_loss_terminal)
    return FrameStackObservation(env, STACK)
