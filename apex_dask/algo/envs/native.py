"""ALE games stepped by ale-py's native vector env, behind :class:`GuardedEnvs`' interface.

``workers.vector_mode = "native"``: an env worker whose env is an ``ALE/``
game with the DQN preprocessing (:mod:`apex_dask.algo.envs.atari`) steps all its
envs through one ``ale_py.vector_env.AtariVectorEnv``: C++, with the
preprocessing built in (frame skip 4 with a max over the last two frames,
84x84 grayscale ``uint8``, a stack of 4 frames, 1-30 no-op frames and FIRE
on reset, no sticky actions unless asked for), one call per vector step::

    envs = NativeAtariEnvs(factory, num_envs=8, seed=0, guard=guard, policy=policy)
    obs = envs.reset()                  # (8, 4, 84, 84) uint8
    step = envs.step(actions)           # a VectorStep, as GuardedEnvs gives

The training-only signals stay those of :class:`~apex_dask.algo.envs.atari.TrainingSignals`:
the env runs with ``episodic_life=False`` and ``reward_clipping=False``, so
``terminated`` is the game's end and ``reward`` the raw score; a step in
which ``info["lives"]`` drops is a training terminal (``train_terminated``)
and ``train_reward = sign(reward)`` when ``clip_rewards``. Episodes end and
reset in the same step (``autoreset_mode="SameStep"``; ``next_obs`` is then
``info["final_obs"]``). What differs from the gymnasium pipeline is listed
in ``docs/algorithm.md``.

Env errors: the vector env is one C++ object, so a step that raises or hangs
(``env.step_timeout_s``) is counted like one env error, every env's step is
left out (``active`` all False), and the whole vector env is closed and made
again (:data:`~apex_dask.algo.envs.sync.REMAKE_TRIES` attempts). Rewards are
integers and frames ``uint8``: nothing can be non-finite.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from gymnasium import spaces

from apex_dask.algo.envs.atari import NOOP_MAX
from apex_dask.algo.envs.factory import EnvFactory
from apex_dask.algo.envs.guard import EnvErrorPolicy, EnvFailed, EnvFault, EnvGuard
from apex_dask.algo.envs.sync import REMAKE_TRIES, VectorStep

__all__ = ["NATIVE_KWARGS", "NativeAtariEnvs", "native_game", "native_kwargs"]

NATIVE_KWARGS = {
    "max_episode_steps": "max_num_frames_per_episode",  # frames: the emulator runs frameskip=1
    "max_num_frames_per_episode": "max_num_frames_per_episode",
    "repeat_action_probability": "repeat_action_probability",
    "full_action_space": "full_action_space",
}
"""``env.env_kwargs`` keys the native vector env takes, and its argument for each."""

_ALE_ID = re.compile(r"^ALE/([A-Za-z0-9]+)-v5$")


def native_game(factory: EnvFactory) -> str | None:
    """The ALE ROM name (``"ALE/MsPacman-v5"`` -> ``"ms_pacman"``) if ``factory`` makes an
    ALE game with the DQN preprocessing, else None (no native vector env for it)."""
    if not isinstance(factory, EnvFactory) or factory.atari_wrappers is False:
        return None
    match = _ALE_ID.match(factory.env_id)
    if match is None:
        return None
    return re.sub(r"(?<!^)(?=[A-Z])", "_", match.group(1)).lower()


def native_kwargs(env_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``AtariVectorEnv`` arguments for ``env.env_kwargs``; ValueError (one line) naming a
    key it cannot take."""
    out: dict[str, Any] = {}
    for key, value in env_kwargs.items():
        if key not in NATIVE_KWARGS:
            raise ValueError(
                f"env.env_kwargs key {key!r} is not supported by workers.vector_mode=native "
                f"(supported: {', '.join(sorted(NATIVE_KWARGS))}); "
                "set workers.vector_mode=sync to use it"
            )
        out[NATIVE_KWARGS[key]] = value
    return out


class NativeAtariEnvs:
    """``num_envs`` ALE games in one ``AtariVectorEnv``; see the module docstring.

    Env j resets first with ``seed + j``. Construction makes a one-game vector env
    for the spaces; :meth:`reset` makes the one of all ``num_envs`` games.
    """

    def __init__(
        self,
        factory: EnvFactory,
        *,
        num_envs: int,
        seed: int,
        guard: EnvGuard,
        policy: EnvErrorPolicy,
        rng: np.random.Generator,
        where: str = "",
        noop_max: int = NOOP_MAX,
    ) -> None:
        game = native_game(factory)
        if game is None:
            raise ValueError(f"no native vector env for {factory.env_id!r}")
        kwargs = {"repeat_action_probability": float(factory.repeat_action_probability)}
        kwargs.update(native_kwargs(factory.env_kwargs))
        clip = factory.clip_rewards
        self.clip_rewards = True if clip is None else bool(clip)
        self.num_envs, self.seed, self.env_id = int(num_envs), int(seed), guard.env_id
        self.guard, self.policy, self.rng, self.where = guard, policy, rng, where
        self._args = {
            "game": game,
            "num_envs": self.num_envs,
            "num_threads": 1,  # one core per env worker
            "autoreset_mode": "SameStep",
            "episodic_life": False,
            "life_loss_info": False,
            "reward_clipping": False,
            "noop_max": int(noop_max),
            **kwargs,
        }
        self._t = 0  # vector steps made
        self.vec = self._make(1)  # one game, for the spaces (an evaluator needs no more)
        self.envs = [self.vec]
        self.observation_space = self.vec.single_observation_space
        self.action_space = spaces.Discrete(int(self.vec.single_action_space.n))
        self._lives = np.zeros(self.num_envs, np.int64)
        self._obs: np.ndarray | None = None

    def _at(self) -> str:
        return f" ({self.where})" if self.where else ""

    def _new_vec(self, num_envs: int | None = None) -> Any:
        from ale_py.vector_env import AtariVectorEnv  # extra: atari

        return AtariVectorEnv(**{**self._args, "num_envs": num_envs or self.num_envs})

    def _make(self, num_envs: int | None = None) -> Any:
        try:
            return self.guard.make(lambda: self._new_vec(num_envs))
        except EnvFault as fault:
            raise EnvFailed(f"{fault}{self._at()}") from None

    def _reset(self, seed: int) -> np.ndarray:
        vec = self.vec
        obs, info = self.guard.call("reset", lambda: vec.reset(seed=seed), self._t)
        self._lives = np.asarray(info["lives"], np.int64)
        return obs

    def reset(self) -> np.ndarray:
        """The observations every env acts on next (N, 4, 84, 84): the vector env of all
        ``num_envs`` games is made and reset the first time."""
        if self._obs is None:
            self.guard.discard(self.vec)
            self.vec = self._make()
            self.envs = [self.vec]
            try:
                self._obs = self._reset(self.seed)
            except EnvFault as fault:
                raise EnvFailed(f"{fault}{self._at()}") from None
        return self._obs

    def step(self, actions: np.ndarray) -> VectorStep:
        """Step every env once (see the module docstring)."""
        self._t += 1
        vec = self.vec
        act = np.asarray(actions, np.int64)
        try:
            obs, reward, term, trunc, info = self.guard.call("step", lambda: vec.step(act), self._t)
        except EnvFault as fault:
            return self._replace(fault)
        ended = term | trunc
        any_end = bool(ended.any())
        next_obs = np.where(ended[:, None, None, None], info["final_obs"], obs) if any_end else obs
        reward = reward.astype(np.float64)
        lives = np.asarray(info["lives"], np.int64)
        train_term = term | ((lives < self._lives) & ~ended)  # a lost life: training only
        self._lives = lives
        train_reward = np.sign(reward) if self.clip_rewards else reward
        self._obs = obs
        self.policy.completed(self.num_envs)
        active = np.ones(self.num_envs, bool)
        return VectorStep(
            obs, next_obs, reward, train_reward, term, trunc, train_term, active, any_end, True
        )

    def _replace(self, fault: EnvFault) -> VectorStep:
        """Count ``fault`` (EnvFailed if the run must end); the vector env made again."""
        self.policy.record(fault, self.where)
        self.guard.discard(self.vec)
        for attempt in range(1, REMAKE_TRIES + 1):
            vec = None
            try:
                vec = self.vec = self.guard.make(self._new_vec)
                self.envs = [vec]
                self._obs = self._reset(int(self.rng.integers(2**31 - self.num_envs)))
                break
            except EnvFault as again:
                if vec is not None:
                    self.guard.discard(vec)
                if attempt == REMAKE_TRIES:
                    raise EnvFailed(
                        f"{again}{self._at()}; it failed to be made again {attempt} times "
                        "in a row after an env error"
                    ) from None
                self.policy.record(again, self.where)
        no, zero = np.zeros(self.num_envs, bool), np.zeros(self.num_envs)
        return VectorStep(self._obs, self._obs, zero, zero, no, no, no, no.copy(), False, False)

    def close(self) -> None:
        """Close the vector env (a hung one once its call returns)."""
        self.guard.discard(self.vec)
