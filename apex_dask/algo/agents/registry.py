"""The agents, by name: the one place that maps the config's ``algo`` string to an agent.

::

    agent("dqn")                        # its builder (AgentBuilder)
    learner = make_learner(spec, obs_space, act_space, seed=0)
    worker = make_env_worker(worker_spec, factory, epsilon=0.4, seed=1, where="env worker 0")

Adding an agent is its folder (``agents/<name>/``, the same role names as
``dqn/``: ``options``, ``networks``, ``loss``, ``learner``, ``worker``,
``policy``, ``builder``) and one line in :data:`AGENTS`. Importing this module
imports the builders only, which import their parts when they make them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from apex_dask.algo.agents.dpg.builder import BUILDER as DPG
from apex_dask.algo.agents.dqn.builder import BUILDER as DQN
from apex_dask.algo.agents.r2d2.builder import BUILDER as R2D2
from apex_dask.algo.agents.spec import AgentBuilder, AgentSpec, Policy, ScriptedPolicy, WorkerSpec

if TYPE_CHECKING:  # torch: imported when a part is made, not with the registry
    from apex_dask.algo.agents.base import LearnerProtocol
    from apex_dask.algo.rollout.worker import ActingWorker

__all__ = [
    "AGENTS",
    "UnknownAgentError",
    "agent",
    "make_env_worker",
    "make_learner",
    "make_policy",
    "scripted_policy",
]

AGENTS: dict[str, AgentBuilder] = {
    "dqn": DQN,  # n-step double dueling DQN, Discrete actions
    "dpg": DPG,  # DDPG with TD3's options, a bounded Box of actions
    "r2d2": R2D2,  # recurrent replay: an LSTM Q-network on stored sequences, Discrete actions
}
"""Every agent's builder, by the name ``algo`` takes."""


class UnknownAgentError(ValueError):
    """An ``algo`` no agent has; the message is one line listing the agents."""


def agent(name: str) -> AgentBuilder:
    """The builder of agent ``name`` (:class:`UnknownAgentError` if there is none)."""
    try:
        return AGENTS[name]
    except (KeyError, TypeError):
        raise UnknownAgentError(f"no agent {name!r}; the agents are {', '.join(AGENTS)}") from None


def make_learner(
    spec: AgentSpec, observation_space: Any, action_space: Any, *, seed: int
) -> LearnerProtocol:
    """The learner of ``spec``'s agent (the contract of :mod:`apex_dask.algo.agents.base`)."""
    return agent(spec.algo).make_learner(spec.options, observation_space, action_space, seed)


def make_env_worker(
    spec: WorkerSpec, env_factory: Callable[[], Any], *, epsilon: float, seed: int, where: str = ""
) -> ActingWorker:
    """An env worker of ``spec``'s agent (an :class:`~apex_dask.algo.rollout.worker.ActingWorker`)
    exploring with ``epsilon`` (the DPG agent: its noise scale)."""
    builder = agent(spec.agent.algo)
    return builder.make_worker(
        spec.agent.options, spec.rollout, env_factory, epsilon=epsilon, seed=seed, where=where
    )


def make_policy(
    spec: AgentSpec, observation_space: Any, action_space: Any, weights: Mapping[str, Any]
) -> Policy:
    """The greedy policy of trained weights (``WeightsMismatch`` if they do not fit)."""
    return agent(spec.algo).make_policy(spec.options, observation_space, action_space, weights)


def scripted_policy(
    spec: AgentSpec, observation_space: Any, action_space: Any, weights: Mapping[str, Any]
) -> ScriptedPolicy:
    """The greedy policy as a TorchScript program (``WeightsMismatch`` if they do not fit)."""
    builder = agent(spec.algo)
    return builder.scripted_policy(spec.options, observation_space, action_space, weights)
