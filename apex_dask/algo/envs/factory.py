"""Picklable environment factories and env-id validation.

Env workers run in other processes, so they receive a *factory* (a small
picklable object) rather than a live env::

    factory = make_env_factory("CartPole-v1")
    env = factory()            # gymnasium.make("CartPole-v1")

Ids may name the module that registers them, as gymnasium allows
(``"my_pkg.envs:MyEnv-v0"``). For the ``ALE/`` and ``MinAtar/`` namespaces the
registering module (``ale_py``, ``minatar``) is imported on demand. ``ALE/``
envs get the standard DQN preprocessing of :mod:`apex_dask.algo.envs.atari` unless
``atari_wrappers=False``: ``frameskip=1`` and ``repeat_action_probability=0.0``
(no sticky actions; set 0.25 for ALE v5's default) in the emulator, then
no-op starts (1 to 30 frames), frame skip 4 with max-pooling, FIRE on reset
where the game needs it, a life loss as a *training* terminal only, rewards
clipped to their sign *for training only* (``clip_rewards``), 84x84
grayscale ``uint8`` frames, and a stack of the last 4 frames -> observations
of shape (4, 84, 84).
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

from apex_dask.algo.envs.atari import TrainingSignals, wrap_atari

__all__ = ["EnvFactory", "UnknownEnvError", "check_env_id", "make_env_factory"]

LIST_IDS_HINT = 'list valid ids with: python -c "import gymnasium; gymnasium.pprint_registry()"'

_NAMESPACE_MODULES = {"ALE": "ale_py", "MinAtar": "minatar.gym"}
_INSTALL_HINTS = {
    "ale_py": "pip install 'apex_dask[atari]'",
    "minatar.gym": "pip install 'apex_dask[minatar]'",
}


class UnknownEnvError(ValueError):
    """An environment id gymnasium does not know; the message is one line."""


def _split_module(env_id: str) -> tuple[str | None, str]:
    if ":" in env_id:
        module, _, name = env_id.partition(":")
        return module, name
    return None, env_id


def _import_registering_module(env_id: str) -> None:
    module, name = _split_module(env_id)
    if module is None and "/" in name:
        module = _NAMESPACE_MODULES.get(name.split("/", 1)[0])
        if module is not None and name in gym.registry:
            return
    if module is None:
        return
    try:
        mod = importlib.import_module(module)
    except ImportError as exc:
        how = _INSTALL_HINTS.get(module, "install it")
        raise UnknownEnvError(
            f"environment id {env_id!r} needs module {module!r}, which cannot be imported "
            f"({exc.__class__.__name__}: {exc}); {how}, or {LIST_IDS_HINT}"
        ) from None
    if module == "ale_py" and hasattr(gym, "register_envs"):
        gym.register_envs(mod)
    elif module == "minatar.gym" and name not in gym.registry:
        mod.register_envs()  # MinAtar registers its ids only when asked


def check_env_id(env_id: str) -> None:
    """Raise :class:`UnknownEnvError` (one line: the id, a close match, how to list ids)
    unless gymnasium can make ``env_id``."""
    if not isinstance(env_id, str) or not env_id:
        raise UnknownEnvError(f"environment id must be a non-empty string, got {env_id!r}")
    _import_registering_module(env_id)
    _, name = _split_module(env_id)
    if name in gym.registry:
        return
    close = difflib.get_close_matches(name, list(gym.registry), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise UnknownEnvError(f"unknown environment id {env_id!r}; {hint}{LIST_IDS_HINT}")


def _wants_atari_wrappers(env_id: str, flag: bool | None) -> bool:
    if flag is not None:
        return flag
    return _split_module(env_id)[1].startswith("ALE/")


@dataclass(frozen=True)
class EnvFactory:
    """``factory()`` -> a new ``gymnasium.Env``; picklable, so it can cross processes."""

    env_id: str
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    atari_wrappers: bool | None = None
    """Apply the DQN Atari preprocessing; None: only for ``ALE/`` ids."""
    clip_rewards: bool | None = None
    """Train on sign(reward) (``info["train_reward"]``; metrics keep the raw score).
    None: only with the Atari preprocessing."""
    repeat_action_probability: float = 0.0
    """Sticky actions of the ALE emulator (Atari preprocessing only; ``env_kwargs`` wins)."""

    def __call__(self) -> gym.Env:
        _import_registering_module(self.env_id)
        kwargs = dict(self.env_kwargs)
        atari = _wants_atari_wrappers(self.env_id, self.atari_wrappers)
        clip = atari if self.clip_rewards is None else bool(self.clip_rewards)
        if not atari:
            env = gym.make(self.env_id, **kwargs)
            if clip:
                env = TrainingSignals(env, clip_rewards=True, life_loss_terminal=False)
            return env
        kwargs.setdefault("frameskip", 1)
        kwargs.setdefault("repeat_action_probability", float(self.repeat_action_probability))
        return wrap_atari(gym.make(self.env_id, **kwargs), clip_rewards=clip)


def make_env_factory(
    env_id: str,
    env_kwargs: dict[str, Any] | None = None,
    *,
    atari_wrappers: bool | None = None,
    clip_rewards: bool | None = None,
    repeat_action_probability: float = 0.0,
) -> EnvFactory:
    """A checked, picklable factory for ``gymnasium.make(env_id, **env_kwargs)``.

    Raises :class:`UnknownEnvError` for an id gymnasium does not know.
    """
    check_env_id(env_id)
    return EnvFactory(
        env_id,
        dict(env_kwargs or {}),
        atari_wrappers,
        clip_rewards=clip_rewards,
        repeat_action_probability=float(repeat_action_probability),
    )
