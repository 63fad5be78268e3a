"""The agents, by name: the one place that maps the config's ``algo`` string to an agent.

::

    agent("dqn")                        # its builder (an AgentBuilder)
    learner = make_learner(spec, obs_space, act_space, seed=0)
    worker = make_env_worker(worker_spec, factory, exploration=0.4, seed=1, where="env worker 0")

Adding an agent is its folder (``agents/<name>/``, the same role names as
``dqn/``: ``config``, ``networks``, ``loss``, ``learner``, ``worker``,
``policy``, ``builder``) and one line in :data:`AGENTS`. An agent from another
package needs no line here: it names its builder in the entry point group
``apex_dask.agents`` of its own ``pyproject.toml``::

    [project.entry-points."apex_dask.agents"]
    mine = "my_package.builder:BUILDER"

and ``algo: mine`` finds it (docs/architecture.md, "Writing an agent").
Importing this module imports the built-in builders only, which import their
parts when they make them; entry points are read once, the first time a name
is not a built-in one or every agent is listed.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from apex_dask.algo.agents.builder import AgentBuilder
from apex_dask.algo.agents.dpg.builder import BUILDER as DPG
from apex_dask.algo.agents.dqn.builder import BUILDER as DQN
from apex_dask.algo.agents.r2d2.builder import BUILDER as R2D2
from apex_dask.algo.agents.spec import AgentMetric, AgentSpec, Policy, ScriptedPolicy, WorkerSpec

if TYPE_CHECKING:  # torch: imported when a part is made, not with the registry
    from apex_dask.algo.agents.base import LearnerProtocol
    from apex_dask.algo.rollout.worker import ActingWorker

__all__ = [
    "AGENTS",
    "ENTRY_POINTS",
    "UnknownAgentError",
    "agent",
    "agents",
    "declared_metrics",
    "is_agent",
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
"""The built-in agents' builders, by the name ``algo`` takes."""

ENTRY_POINTS = "apex_dask.agents"
"""The entry point group other packages register their agents' builders in."""

_plugins: dict[str, AgentBuilder] | None = None
_broken: dict[str, str] = {}  # an entry point that is not an agent: name -> why, one line


class UnknownAgentError(ValueError):
    """An ``algo`` no agent has, or an entry point that is not an agent's builder; the
    message is one line."""


def _load_plugins() -> dict[str, AgentBuilder]:
    """The agents of the entry point group, each loaded and checked once. One that cannot
    be loaded, or is not an :class:`AgentBuilder` of its name, is left out (with one
    ``RuntimeWarning`` line): a run that names it is refused, the others run."""
    global _plugins
    if _plugins is None:
        from importlib import metadata  # read when first needed: it costs the CLI ~40 ms

        found: dict[str, AgentBuilder] = {}
        for ep in metadata.entry_points(group=ENTRY_POINTS):
            if ep.name in AGENTS or ep.name in found:
                continue  # a built-in name is never replaced
            try:
                builder = ep.load()
            except Exception as exc:  # noqa: BLE001 - a broken plugin is named, not raised
                why = f"cannot be loaded: {type(exc).__name__}: {' '.join(str(exc).split())}"
            else:
                if isinstance(builder, AgentBuilder) and builder.name == ep.name:
                    found[ep.name] = builder
                    continue
                why = f"names {builder!r}, not an AgentBuilder whose name is {ep.name!r}"
            _broken[ep.name] = (
                f"the agent {ep.name!r} ({ENTRY_POINTS} entry point {ep.value!r}) {why}"
            )
            warnings.warn(_broken[ep.name], RuntimeWarning, stacklevel=3)
        _plugins = found
    return _plugins


def agents() -> dict[str, AgentBuilder]:
    """Every agent: the built-in ones, then those of installed packages' entry points."""
    return {**AGENTS, **_load_plugins()}


def is_agent(name: str) -> bool:
    """Whether ``name`` is an agent's (the entry points are read only for another name
    than a built-in agent's)."""
    return name in AGENTS or name in agents()


def declared_metrics() -> dict[str, list[tuple[str, AgentMetric]]]:
    """``{metric name: [(agent, its declaration), ...]}`` of every metric an agent adds
    (:meth:`AgentBuilder.declared_metrics`): what the ``/apex`` page,
    ``/apex/metrics.json`` and ``docs/metrics.md`` list."""
    out: dict[str, list[tuple[str, AgentMetric]]] = {}
    for name, builder in agents().items():
        for metric in builder.declared_metrics():
            out.setdefault(metric.name, []).append((name, metric))
    return out


def agent(name: str) -> AgentBuilder:
    """The builder of agent ``name`` (:class:`UnknownAgentError` if there is none)."""
    if isinstance(name, str) and name in AGENTS:
        return AGENTS[name]
    found = agents()
    if isinstance(name, str) and name in found:
        return found[name]
    if isinstance(name, str) and name in _broken:
        raise UnknownAgentError(_broken[name])
    raise UnknownAgentError(f"no agent {name!r}; the agents are {', '.join(found)}")


def make_learner(
    spec: AgentSpec, observation_space: Any, action_space: Any, *, seed: int
) -> LearnerProtocol:
    """The learner of ``spec``'s agent (the contract of :mod:`apex_dask.algo.agents.base`)."""
    return agent(spec.algo).make_learner(spec, observation_space, action_space, seed)


def make_env_worker(
    spec: WorkerSpec,
    env_factory: Callable[[], Any],
    *,
    exploration: float,
    seed: int,
    where: str = "",
) -> ActingWorker:
    """An env worker of ``spec``'s agent (an :class:`~apex_dask.algo.rollout.worker.ActingWorker`)
    exploring with ``exploration`` (its agent's :attr:`~AgentBuilder.exploration`: an
    epsilon, or DPG's noise scale)."""
    builder = agent(spec.agent.algo)
    return builder.make_worker(spec, env_factory, exploration=exploration, seed=seed, where=where)


def make_policy(
    spec: AgentSpec, observation_space: Any, action_space: Any, weights: Mapping[str, Any]
) -> Policy:
    """The greedy policy of trained weights (``WeightsMismatch`` if they do not fit)."""
    return agent(spec.algo).make_policy(spec.config, observation_space, action_space, weights)


def scripted_policy(
    spec: AgentSpec, observation_space: Any, action_space: Any, weights: Mapping[str, Any]
) -> ScriptedPolicy:
    """The greedy policy as a TorchScript program (``WeightsMismatch`` if they do not fit)."""
    builder = agent(spec.algo)
    return builder.scripted_policy(spec.config, observation_space, action_space, weights)
