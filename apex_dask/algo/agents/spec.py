"""What an agent is to the rest of the package: its builder's contract and the specs it makes.

An agent is a folder (``agents/dqn/``, ``agents/dpg/``) with the same role
names in each: ``options`` (one typed object its parts share), ``networks``,
``loss``, ``learner``, ``worker``, ``policy`` and ``builder``. The builder
(an :class:`AgentBuilder`) is the only way in: it reads the run's config,
checks it, and makes every part. :mod:`apex_dask.algo.agents.registry` maps
the config's ``algo`` string to a builder, once; nothing else branches on it.

The specs are plain data, made once per run from the config and sent to
every actor as they are::

    agent = registry.agent(cfg.algo)
    spec = agent.agent_spec(cfg)                     # AgentSpec("dqn", DQNOptions(...))
    learner = registry.make_learner(spec, obs_space, act_space, seed=0)
    worker = registry.make_env_worker(WorkerSpec(spec, rollout), factory,
                                      epsilon=0.4, seed=1, where="env worker 0")
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from apex_dask.algo.rollout.spec import RolloutSpec

if TYPE_CHECKING:  # the config tree is read, never imported, by the algorithm layer
    from gymnasium import spaces

    from apex_dask.algo.agents.base import LearnerProtocol
    from apex_dask.algo.rollout.worker import ActingWorker

__all__ = ["AgentBuilder", "AgentSpec", "Policy", "ScriptedPolicy", "WorkerSpec"]


@dataclass(frozen=True)
class AgentSpec:
    """Which agent (``algo``, a registry name) with which options (its own frozen
    dataclass, e.g. :class:`~apex_dask.algo.agents.dqn.options.DQNOptions`)."""

    algo: str
    options: Any


@dataclass(frozen=True)
class WorkerSpec:
    """What every env worker of a run is built with (each adds its epsilon, seed and name)."""

    agent: AgentSpec
    rollout: RolloutSpec


class Policy(Protocol):
    """Actions from trained weights, one observation at a time (play and evaluation)."""

    def act(self, obs: Any, epsilon: float = 0.0, rng: np.random.Generator | None = None) -> Any:
        """The env's action; with probability ``epsilon`` (drawn from ``rng``) a uniform one."""
        ...

    def reset(self) -> None:
        """An episode begins (a recurrent policy's state goes back to zero)."""
        ...


@dataclass(frozen=True)
class ScriptedPolicy:
    """A greedy policy as a TorchScript program (``program``), with what its JSON says
    about it: what runs ``inside`` the program, what it ``output`` s and, where it is
    not ``policy(obs)``, how to ``call`` it (a recurrent program takes its state)."""

    program: Any
    inside: list[str]
    output: str
    call: str | None = None


class AgentBuilder(Protocol):
    """What an agent's builder makes (see the module docstring). ``cfg`` is the run's
    :class:`~apex_dask.config.ApexConfig`, read by attribute."""

    name: str
    """The registry name (``algo`` in the config)."""

    def check_config(self, cfg: Any) -> tuple[str, Any, str] | None:
        """A setting this agent cannot run with, as ``(key, value, why)``; None if none."""
        ...

    def check_spaces(
        self, observation_space: spaces.Space, action_space: spaces.Space, options: Any = None
    ) -> str | None:
        """Why this agent cannot act in an env with these spaces (naming the agent, the
        wrapper or the setting that can), with ``options`` (its :meth:`agent_spec`'s; None:
        the spaces alone), or None."""
        ...

    def agent_spec(self, cfg: Any) -> AgentSpec:
        """This agent's options from the config."""
        ...

    def exploration_ladder(self, cfg: Any, num_workers: int) -> np.ndarray:
        """Each env worker's exploration (epsilon, or noise scale), worker 0 the most."""
        ...

    def make_learner(
        self, options: Any, observation_space: spaces.Space, action_space: spaces.Space, seed: int
    ) -> LearnerProtocol:
        """The learner."""
        ...

    def make_worker(
        self,
        options: Any,
        rollout: RolloutSpec,
        env_factory: Callable[[], Any],
        *,
        epsilon: float,
        seed: int,
        where: str,
    ) -> ActingWorker:
        """An env worker acting with exploration ``epsilon``."""
        ...

    def make_network(
        self, options: Any, observation_space: spaces.Space, action_space: spaces.Space
    ) -> Any:
        """The network whose weights the learner publishes (a ``torch.nn.Module``)."""
        ...

    def network_size(
        self, options: Any, observation_space: spaces.Space, action_space: spaces.Space
    ) -> tuple[int, int]:
        """``(parameters, activations per sample)`` of :meth:`make_network`'s network, without
        building it (the pre-start memory check runs before torch is imported)."""
        ...

    def item_bytes(self, cfg: Any, observation_space: spaces.Space) -> int | None:
        """Bytes of one stored replay item when it is not a transition (None: a transition,
        ``obs`` and ``next_obs``, the estimate of :func:`apex_dask.cli.checks.replay_bytes`)."""
        ...

    def network_keys(self, cfg: Any) -> str:
        """The config keys (with their values) that shape the network: what a user
        compares when saved weights do not fit."""
        ...

    def make_policy(
        self,
        options: Any,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        weights: Mapping[str, Any],
    ) -> Policy:
        """The greedy policy of trained weights (``WeightsMismatch`` if they do not fit)."""
        ...

    def scripted_policy(
        self,
        options: Any,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        weights: Mapping[str, Any],
    ) -> ScriptedPolicy:
        """The greedy policy as a TorchScript program, for ``--export``."""
        ...
