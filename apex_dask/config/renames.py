"""Config keys and values that changed: old config files and checkpoints still load.

``RETIRED`` keys are accepted and ignored with one ``FutureWarning`` line naming what
replaced them; :func:`renamed` maps a renamed key (or env id) to its new form;
:func:`reward_stop` maps ``stop.reward`` to the key it now means;
:func:`route` sends every key to its section, agent keys that moved out of
``learner`` to the agent's own (one ``FutureWarning`` line for all of them), and
refuses a key of another agent's section in one line naming that agent.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import fields
from typing import Any

from apex_dask.algo.agents.registry import agent, agents, is_agent

__all__ = [
    "MOVED_TO_AGENT",
    "RENAMED_ENV_IDS",
    "RETIRED",
    "renamed",
    "reward_stop",
    "route",
    "set_reward_stop",
]

_SHARED = {"env", "replay", "learner", "workers", "eval", "report", "topology", "stop"}
_SHARED |= {"checkpoint", "simulate", "algo", "seed", "agent", "preset"}
"""Top-level names that are not an agent's section (no agent may take one)."""


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


MOVED_TO_AGENT: dict[str, Any] = {
    "learner.lr": 5e-4,
    "learner.hiddens": [256],
    "learner.dueling": True,
    "learner.double_q": True,
    "learner.num_atoms": 1,
    "learner.v_min": -10.0,
    "learner.v_max": 10.0,
    "learner.noisy": False,
    "learner.sigma0": 0.5,
    "learner.loss": "huber",
    "learner.num_bins": 51,
    "learner.hl_gauss_sigma_ratio": 0.75,
    "learner.layer_norm": False,
    "learner.encoder": "auto",
    "learner.impala_scale": 1,
    "learner.amp": "off",
    "learner.compile": False,
    "learner.memory_format": "contiguous",
}
"""Keys of the ``learner`` section that moved to the agents' own sections
(``learner.lr`` -> ``dqn.lr`` / ``r2d2.lr``), with the value they had by default.
The old key still works this release, with one ``FutureWarning`` line."""


def renamed(key: Any, value: Any) -> tuple[Any, Any]:
    """Keys (and env ids) that were renamed, as their new key and value (old config files
    keep working)."""
    if key == "env.env_id" and isinstance(value, str) and value in RENAMED_ENV_IDS:
        new = RENAMED_ENV_IDS[value]
        warnings.warn(
            f"env.env_id {value} is now {new}; the old id still works", FutureWarning, stacklevel=4
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


def set_reward_stop(
    tree: dict[str, Any], value: Any, given: set[str], names: Iterable[str]
) -> None:
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


def route(
    flat: Mapping[str, Any], algo: str, *, saved: bool, stacklevel: int = 3
) -> Iterator[tuple[str, Any]]:
    """``(key, value)`` of every override but ``algo``, each key where it now lives.

    A key of another agent's section, or a moved ``learner`` key the run's agent has
    no field for, raises one :class:`ConfigError` naming the agent(s) it belongs to;
    in a ``saved`` dict (a config file or checkpoint written by an older apex_dask,
    which held every agent's section) those keys were never read and are dropped.
    """
    from apex_dask.config.plumbing import ConfigError

    own = {f.name for f in fields(agent(algo).config)} if is_agent(algo) else set()
    moved: list[str] = []
    ignored: list[str] = []
    for key, value in flat.items():
        if key == "algo":
            continue
        if key in RETIRED:  # accepted and ignored, with one line saying what replaced it
            warnings.warn(RETIRED[key], FutureWarning, stacklevel=stacklevel)
            continue
        key, value = renamed(key, value)
        if not isinstance(key, str):
            yield key, value  # set_dotted names it
            continue
        section, _, name = key.partition(".")
        if key in MOVED_TO_AGENT:
            if name in own:
                moved.append(key)
                yield f"{algo}.{name}", value
                continue
            if saved:
                if value != MOVED_TO_AGENT[key]:
                    ignored.append(key)
                continue
            owners = [n for n, b in agents().items() if name in {f.name for f in fields(b.config)}]
            raise ConfigError(
                f"{key} is now a key of the {' and '.join(owners)} agent "
                f"({', '.join(f'{o}.{name}' for o in owners)}); the {algo} agent has none "
                f"(algo={algo})"
            )
        if section != algo and name and section not in _SHARED and is_agent(section):
            if saved:
                continue  # another agent's section of an old file: it was never read
            raise ConfigError(
                f"{key} is a key of the {section} agent, and this config's algo is {algo}: "
                f"set algo={section} to use it, or drop it"
            )
        yield key, value
    if moved or ignored:
        line = ""
        if moved:
            line = (
                f"{', '.join(moved)} moved to the {algo} agent's own section "
                f"({', '.join(algo + '.' + k.partition('.')[2] for k in moved)}); "
                "the old keys still work this release"
            )
        if ignored:
            line += "; " if line else ""
            line += f"ignored (the {algo} agent never read them): {', '.join(ignored)}"
        warnings.warn(line, FutureWarning, stacklevel=stacklevel)
