"""What crosses from the config to an agent's parts: the specs, the policy contract, metrics.

The specs are plain data, made once per run from the config (the agent's own
section and the shared ``learner`` section, the same objects the config holds)
and sent to every actor as they are::

    spec = registry.agent(cfg.algo).agent_spec(cfg)   # AgentSpec("dqn", DQNConfig(...), ...)
    learner = registry.make_learner(spec, obs_space, act_space, seed=0)
    worker = registry.make_env_worker(WorkerSpec(spec, rollout), factory,
                                      exploration=0.4, seed=1, where="env worker 0")

An agent's builder (:class:`~apex_dask.algo.agents.builder.AgentBuilder`) makes the
parts; this module holds only what the rest of the package reads of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from apex_dask.algo.agents.config import AgentConfig, LearnerConfig
from apex_dask.algo.rollout.spec import RolloutSpec

__all__ = ["AgentMetric", "AgentSpec", "Policy", "ScriptedPolicy", "Weights", "WorkerSpec"]

Weights = Mapping[str, Any]
"""A network's weights as the learner publishes them: ``{name: array}``."""


@dataclass(frozen=True)
class AgentSpec:
    """Which agent (``algo``, a registry name) with its own config section and the shared
    ``learner`` section."""

    algo: str
    """The agent's registry name (``dqn``, ``dpg``, ``r2d2`` or a plugin's)."""
    config: AgentConfig
    """The agent's own config section."""
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    """The shared ``learner`` section."""


@dataclass(frozen=True)
class WorkerSpec:
    """What every env worker of a run is built with (each adds its exploration, seed and
    name)."""

    agent: AgentSpec
    """The agent the worker acts for."""
    rollout: RolloutSpec
    """The acting settings shared by every agent (envs, fragments, n-step)."""


@dataclass(frozen=True)
class AgentMetric:
    """A metric an agent adds to every agent's (its learner's :meth:`agent_stats` keys):
    listed by the ``/apex`` page, ``/apex/metrics.json`` and ``docs/metrics.md``."""

    name: str
    """The metric's name, e.g. ``learner/state_staleness``."""
    meaning: str
    """What it measures (the ``docs/metrics.md`` row)."""
    label: str
    """Its line's legend on the ``/apex`` page."""
    chart: str = "agent"
    """The ``/apex`` chart it is drawn in: ``sync`` (weight syncs and policy lag: units of
    learner updates), ``agent`` (a chart of the agents' own metrics) or empty (none: a
    metric per env worker)."""


@dataclass(frozen=True)
class ScriptedPolicy:
    """A greedy policy as a TorchScript program (``program``) and, for the other export
    formats, as a plain module (``module``), with what its JSON says
    about it: what runs ``inside`` the program, what it ``output`` s and, where it is
    not ``policy(obs)``, how to ``call`` it. A recurrent program takes its ``state``
    (the shapes of its tensors, zeros at each episode's start):
    ``action, *state = program(obs[None], *state)``."""

    program: Any
    """The TorchScript program (``torch.jit.load`` reads it back)."""
    inside: list[str]
    """The preprocessing the program does itself (e.g. input scaling)."""
    output: str
    """What the program returns (e.g. the greedy action's index)."""
    call: str | None = None
    """How to call it where it is not ``policy(obs)``."""
    state: tuple[tuple[int, ...], ...] = ()
    """A recurrent program's state tensors' shapes (zeros at each episode's start)."""
    module: Any = None
    """The same policy as a plain ``torch.nn.Module`` that takes a batch only
    (``forward(obs (B, ...), *state)``), for ``torch.export`` and ONNX (``.pt2``,
    ``.onnx``); None: the agent exports TorchScript only."""
    example: tuple[Any, ...] = ()
    """Example inputs of ``module`` (a batch of 2 observations, then the state)."""


class Policy(Protocol):
    """Actions from trained weights, one observation at a time (play and evaluation)."""

    def act(self, obs: Any, epsilon: float = 0.0, rng: np.random.Generator | None = None) -> Any:
        """The env's action; with probability ``epsilon`` (drawn from ``rng``) a uniform one."""
        ...

    def reset(self) -> None:
        """An episode begins (a recurrent policy's state goes back to zero)."""
        ...

    def program(self) -> ScriptedPolicy:
        """The same greedy policy as a TorchScript program (``--export``)."""
        ...
