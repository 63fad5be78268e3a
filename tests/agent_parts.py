"""Agents' parts for tests, made from flat keyword arguments: the rollout keys go to a
:class:`RolloutSpec`, the rest to the agent's options."""

from __future__ import annotations

import dataclasses
from typing import Any

from apex_dask.algo.agents.dpg.options import DPGOptions
from apex_dask.algo.agents.dpg.worker import DPGEnvWorker
from apex_dask.algo.agents.dqn.options import DQNOptions
from apex_dask.algo.agents.dqn.worker import EnvWorker
from apex_dask.algo.rollout.spec import RolloutSpec

ROLLOUT_KEYS = {f.name for f in dataclasses.fields(RolloutSpec)}


def split(keys: dict[str, Any], options_cls: type) -> tuple[RolloutSpec, Any]:
    """``(RolloutSpec(...), options_cls(...))`` from one dict of keys (unknown keys raise)."""
    rollout = {k: v for k, v in keys.items() if k in ROLLOUT_KEYS}
    options = {k: v for k, v in keys.items() if k not in ROLLOUT_KEYS}
    return RolloutSpec(**rollout), options_cls(**options)


def dqn_worker(factory: Any, *, epsilon: float, seed: int, where: str = "", **keys: Any):
    rollout, options = split(keys, DQNOptions)
    return EnvWorker(
        factory, epsilon=epsilon, seed=seed, rollout=rollout, options=options, where=where
    )


def dpg_worker(factory: Any, *, sigma: float, seed: int, where: str = "", **keys: Any):
    rollout, options = split(keys, DPGOptions)
    return DPGEnvWorker(
        factory, sigma=sigma, seed=seed, rollout=rollout, options=options, where=where
    )
