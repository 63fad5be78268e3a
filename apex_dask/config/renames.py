"""Config keys and values that changed: old config files and checkpoints still load.

``RETIRED`` keys are accepted and ignored with one ``FutureWarning`` line naming what
replaced them; :func:`renamed` maps a renamed key (or env id) to its new form.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["RENAMED_ENV_IDS", "RETIRED", "renamed", "reward_stop", "set_reward_stop"]


RETIRED = {
    "workers.max_env_errors_per_min": (
        "workers.max_env_errors_per_min is no longer used and is ignored: a cap per minute "
        "ended runs of fast envs and let slow broken ones go on; env errors are now capped "
        "by workers.max_env_errors_per_1k_steps (default 10) and "
        "workers.max_consecutive_env_errors (default 5)"
    ),
}
"""Keys that are accepted (old config files and checkpoints still load) but ignored; each
gives one ``FutureWarning`` line naming what replaced it."""


RENAMED_ENV_IDS = {
    "apex_dask.algo.benchmark_envs:ApexSleepy-v0": "apex_dask.algo.envs.benchmark:ApexSleepy-v0",
}
"""Env ids that moved with their module: the old id still works, with one line naming the new."""


def renamed(key: Any, value: Any) -> tuple[Any, Any]:
    """Keys (and env ids) that were renamed, as their new key and value (old config files
    keep working)."""
    if key == "env.env_id" and isinstance(value, str) and value in RENAMED_ENV_IDS:
        new = RENAMED_ENV_IDS[value]
        warnings.warn(
            f"env.env_id {value} is now {new}; the old id still works", FutureWarning, stacklevel=3
        )
        return key, new
    if key == "replay.colocate_with_learner":
        if isinstance(value, str):
            value = value.strip().lower() in ("true", "yes", "on", "1")
        return "replay.placement", "learner_process" if value else "spread"
    return key, value


def reward_stop(value: Any, eval_on: bool) -> tuple[str, Any] | None:
    """``stop.reward`` (one key that meant two things) as the key it now means: the greedy
    evaluation's ``stop.eval_return`` when evaluation is on, else the training episodes'
    ``stop.train_return``; one ``FutureWarning`` line says which. None: unset (null)."""
    if value is None:
        return None
    if eval_on:
        key, what = "stop.eval_return", "the greedy evaluation's mean return, as eval.episodes > 0"
    else:
        key, what = "stop.train_return", "the training episodes' mean return, as evaluation is off"
    warnings.warn(
        f"stop.reward is deprecated and now means {key} ({what}); set {key} instead "
        "(stop.train_return: training episodes, stop.eval_return: greedy evaluation)",
        FutureWarning,
        stacklevel=4,
    )
    return key, value


def set_reward_stop(tree: dict[str, Any], value: Any, given: set[str], names: list[str]) -> None:
    """``stop.reward`` set in the nested ``tree`` as the key it now means
    (:func:`reward_stop`, read against the tree's ``eval.episodes``); refused beside
    that key."""
    from apex_dask.config.plumbing import ConfigError, coerce, set_dotted

    episodes = tree["eval"]["episodes"]
    if isinstance(episodes, str):
        episodes = coerce("eval.episodes", episodes, int)
    mapped = reward_stop(value, eval_on=isinstance(episodes, int | float) and episodes > 0)
    if mapped is None:
        return
    key, value = mapped
    if key in given:
        raise ConfigError(f"stop.reward and {key} are both given; give only {key}")
    set_dotted(tree, key, value, names)
