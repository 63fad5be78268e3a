"""Any agent's parts for tests, through the registry, from flat keyword arguments: the
rollout keys go to a :class:`RolloutSpec`, the shared learner keys to a
:class:`LearnerConfig` (on the CPU unless given), the rest to the agent's own config."""

from __future__ import annotations

import dataclasses
from typing import Any

from apex_dask.algo.agents.config import LearnerConfig
from apex_dask.algo.agents.registry import agent, make_env_worker, make_learner
from apex_dask.algo.agents.spec import AgentSpec, WorkerSpec
from apex_dask.algo.rollout.spec import RolloutSpec

ROLLOUT_KEYS = {f.name for f in dataclasses.fields(RolloutSpec)}
LEARNER_KEYS = {f.name for f in dataclasses.fields(LearnerConfig)}
CPU = LearnerConfig(device="cpu")
"""The shared learner section of a test's learner: the CPU, one torch thread."""


def agent_spec(algo: str, **keys: Any) -> AgentSpec:
    """``AgentSpec(algo, <its config>(...), LearnerConfig(device="cpu", ...))`` (unknown
    keys raise); rollout keys are not taken here."""
    shared = {k: v for k, v in keys.items() if k in LEARNER_KEYS}
    own = {k: v for k, v in keys.items() if k not in LEARNER_KEYS}
    return AgentSpec(algo, agent(algo).config(**own), dataclasses.replace(CPU, **shared))


def worker_spec(algo: str, **keys: Any) -> WorkerSpec:
    """A :class:`WorkerSpec` from one dict of keys: rollout keys, then the agent's."""
    rollout = {k: v for k, v in keys.items() if k in ROLLOUT_KEYS}
    rest = {k: v for k, v in keys.items() if k not in ROLLOUT_KEYS}
    return WorkerSpec(agent_spec(algo, **rest), RolloutSpec(**rollout))


def worker(algo: str, factory: Any, *, exploration: float, seed: int, where: str = "", **keys):
    """An env worker of agent ``algo`` (``keys``: rollout and agent keys)."""
    spec = worker_spec(algo, **keys)
    return make_env_worker(spec, factory, exploration=exploration, seed=seed, where=where)


def dqn_worker(factory: Any, *, epsilon: float, seed: int, where: str = "", **keys: Any):
    """A DQN env worker exploring with ``epsilon``."""
    return worker("dqn", factory, exploration=epsilon, seed=seed, where=where, **keys)


def learner(algo: str, observation_space: Any, action_space: Any, *, seed: int = 0, **keys):
    """A learner of agent ``algo`` on the CPU (``keys``: its own and shared learner keys)."""
    return make_learner(agent_spec(algo, **keys), observation_space, action_space, seed=seed)


def configs(algo: str, **keys: Any) -> tuple[Any, LearnerConfig]:
    """``(its own config, the shared learner section)`` of agent ``algo`` from one dict
    of keys, the learner on the CPU unless ``device`` is given: a learner's two
    config arguments (``Learner(obs_space, act_space, *configs("dqn", ...))``)."""
    spec = agent_spec(algo, **keys)
    return spec.config, spec.learner


def observations(space: Any, n: int, seed: int, std: float = 1.0) -> Any:
    """``n`` observations of a Box ``space`` to compare policies on: bool grids, uint8
    frames of varied density, or normal floats (``std``)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if space.dtype == bool:
        return rng.random((n, *space.shape)) < 0.2
    if space.dtype == np.uint8:  # frames of varied density
        on = rng.random((n, *space.shape)) < rng.random((n,) + (1,) * len(space.shape))
        return np.where(on, rng.integers(0, 256, (n, *space.shape)), 0).astype(np.uint8)
    return rng.normal(0, std, (n, *space.shape)).astype(space.dtype)
