"""An agent's builder: the few factories an agent writes, and what every agent shares.

An agent is a folder (``agents/<name>/``) with the same role names in each:
``config`` (its typed section of the run's config), ``networks``, ``loss``,
``learner``, ``worker``, ``policy`` and ``builder``. Its builder derives
:class:`AgentBuilder`, names its config class, and writes four factories::

    class MyBuilder(AgentBuilder):
        name = "mine"                      # algo: mine; its section: mine.<key>
        config = MyConfig                  # a frozen dataclass deriving AgentConfig

        def make_network(self, config, observation_space, action_space): ...
        def make_learner(self, spec, observation_space, action_space, seed): ...
        def make_worker(self, spec, env_factory, *, exploration, seed, where): ...
        def make_policy(self, config, observation_space, action_space, weights): ...
        def check_spaces(self, observation_space, action_space, config=None): ...

Everything else has a default here: the spec a run sends to every actor
(:meth:`AgentBuilder.agent_spec`), the exploration ladder (Ape-X's epsilons from
the ``workers`` section), the network's size for the pre-start memory check
(the network itself, built on torch's ``meta`` device: no memory, no second
description to keep equal), the keys named when saved weights do not fit, the
exported program (the policy's own). An agent overrides what differs (DPG's
noise ladder, R2D2's sequence items) and declares what it adds: the metrics
its learner reports (:attr:`AgentBuilder.metrics`) and what its exploration
parameter is (:attr:`AgentBuilder.exploration`: ``env/<exploration>/<i>``).

Heavy modules (torch, the networks) are imported when a part is made, so
reading the registry stays cheap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from apex_dask.algo.agents.config import AgentConfig, Problem
from apex_dask.algo.agents.spec import (
    AgentMetric,
    AgentSpec,
    Policy,
    ScriptedPolicy,
    Weights,
    WorkerSpec,
)

if TYPE_CHECKING:  # torch and gymnasium: imported when a part is made
    from gymnasium import spaces

    from apex_dask.algo.agents.base import LearnerProtocol
    from apex_dask.algo.rollout.worker import ActingWorker

__all__ = ["AgentBuilder", "check_q_spaces"]


class AgentBuilder:
    """Makes one agent's parts (see the module docstring). ``cfg`` arguments are the
    run's :class:`~apex_dask.config.ApexConfig`, read by attribute; ``config`` ones the
    agent's own section (``cfg.agent``)."""

    name: ClassVar[str]
    """The registry name (``algo`` in the config, and the name of its config section)."""
    config: ClassVar[type[AgentConfig]]
    """Its config section's class."""
    exploration: ClassVar[str] = "epsilon"
    """What each env worker's exploration parameter is, as its metric names it
    (``env/<exploration>/<i>``): ``epsilon``, or DPG's ``noise_scale``."""
    exploration_meaning: ClassVar[str] = "epsilon of env worker `i`"
    """What ``env/<exploration>/<i>`` measures (its ``docs/metrics.md`` row)."""
    metrics: ClassVar[tuple[AgentMetric, ...]] = ()
    """The metrics its learner adds (:meth:`LearnerProtocol.agent_stats`)."""

    # -- the factories an agent writes -----------------------------------------
    def make_network(
        self, config: Any, observation_space: spaces.Space, action_space: spaces.Space
    ) -> Any:
        """The network whose weights the learner publishes (a ``torch.nn.Module``)."""
        raise NotImplementedError

    def make_learner(
        self,
        spec: AgentSpec,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        seed: int,
    ) -> LearnerProtocol:
        """The learner (the contract of :mod:`apex_dask.algo.agents.base`)."""
        raise NotImplementedError

    def make_worker(
        self, spec: WorkerSpec, env_factory: Any, *, exploration: float, seed: int, where: str
    ) -> ActingWorker:
        """An env worker exploring with ``exploration`` (see :attr:`exploration`)."""
        raise NotImplementedError

    def make_policy(
        self,
        config: Any,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        weights: Weights,
    ) -> Policy:
        """The greedy policy of trained weights (``WeightsMismatch`` if they do not fit)."""
        raise NotImplementedError

    def check_spaces(
        self, observation_space: spaces.Space, action_space: spaces.Space, config: Any = None
    ) -> str | None:
        """Why this agent cannot act in an env with these spaces (naming the agent, the
        wrapper or the setting that can), with ``config`` (its section; None: the spaces
        alone), or None."""
        raise NotImplementedError

    # -- what an agent may override --------------------------------------------
    def check_config(self, cfg: Any) -> Problem | None:
        """A shared section's setting this agent cannot run with, as ``(dotted key, value,
        why)`` (its own section checks itself: :meth:`AgentConfig.check`); None if none."""
        return None

    def exploration_ladder(self, cfg: Any, num_workers: int) -> np.ndarray:
        """Each env worker's exploration, worker 0 the most: Ape-X's epsilons
        ``workers.epsilon_base ** (1 + workers.epsilon_alpha * i / (N - 1))``."""
        from apex_dask.algo.rollout.exploration import apex_epsilons

        w = cfg.workers
        return apex_epsilons(num_workers, w.epsilon_base, w.epsilon_alpha)

    def item_bytes(self, cfg: Any, observation_space: spaces.Space) -> int | None:
        """Bytes of one stored replay item when it is not a transition (None: a transition,
        ``obs`` and ``next_obs``, the estimate of :func:`apex_dask.cli.memory.replay_bytes`)."""
        return None

    def sample_forward(
        self,
        network: Any,
        config: Any,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        device: str,
    ) -> None:
        """Run ``network`` on one sample of inputs made on ``device`` (what
        :meth:`network_size` counts the activations of): here ``network(obs[None])``."""
        import torch

        network(torch.zeros((1, *observation_space.shape), device=device))

    # -- what every agent shares -----------------------------------------------
    def declared_metrics(self) -> tuple[AgentMetric, ...]:
        """Every metric this agent adds to the shared ones: its exploration parameter's
        (and, for another name than ``epsilon``, that old name, written this release
        too) and its learner's own."""
        name = f"env/{self.exploration}/<i>"
        out = [AgentMetric(name, self.exploration_meaning, self.exploration, chart="")]
        if self.exploration != "epsilon":
            old = f"the old name of `{name}`, written beside it until the next release"
            out.append(AgentMetric("env/epsilon/<i>", old, "epsilon", chart=""))
        return (*out, *self.metrics)

    def agent_spec(self, cfg: Any) -> AgentSpec:
        """What the learner, the env workers, evaluation and export are built with: the
        config's own section objects, sent as they are."""
        return AgentSpec(self.name, cfg.agent, cfg.learner)

    def network_size(
        self, config: Any, observation_space: spaces.Space, action_space: spaces.Space
    ) -> tuple[int, int]:
        """``(parameters, activations per sample)`` of :meth:`make_network`'s network, built
        on torch's ``meta`` device (shapes only, no memory): the activations are the
        outputs of every layer that has weights, in :meth:`sample_forward`'s pass. That
        pass runs on an uninitialised CPU copy (its values do not matter; torch's meta
        kernels for it would cost the CLI a second of imports), on ``meta`` for a
        network of more than ``2**28`` parameters."""
        import torch

        with torch.device("meta"):
            net = self.make_network(config, observation_space, action_space)
        net = net.to("meta")
        params = sum(p.numel() for p in net.parameters())
        device = "cpu" if params <= 2**28 else "meta"
        if device == "cpu":
            from apex_dask.algo.agents.torsos import net_on_cpu

            net = net_on_cpu(net)
        outputs = [0]

        def count(_module: Any, _args: Any, out: Any) -> None:
            outputs[0] += _numel(out)

        hooks = [
            m.register_forward_hook(count)
            for m in net.modules()
            if next(m.parameters(recurse=False), None) is not None
        ]
        try:
            with torch.no_grad():
                self.sample_forward(net, config, observation_space, action_space, device)
        finally:
            for hook in hooks:
                hook.remove()
        return int(params), int(outputs[0])

    def network_keys(self, cfg: Any) -> str:
        """The config keys (with their values) that shape the network: what a user
        compares when saved weights do not fit."""
        shaping = cfg.agent.shaping()
        return ", ".join(f"{self.name}.{k}={_plain(v)}" for k, v in shaping.items())

    def scripted_policy(
        self,
        config: Any,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        weights: Mapping[str, Any],
    ) -> ScriptedPolicy:
        """The greedy policy as a TorchScript program, for ``--export``."""
        return self.make_policy(config, observation_space, action_space, weights).program()


def check_q_spaces(
    name: str, observation_space: Any, action_space: Any, encoder: str | None
) -> str | None:
    """The spaces a Q-network agent takes: Discrete actions, a Box of rank 1 (an MLP) or
    2-3 (images; ``encoder`` ``impala`` only these)."""
    from gymnasium import spaces

    if not isinstance(action_space, spaces.Discrete):
        return (
            f"the {name} agent needs a Discrete action space; for a continuous Box use the "
            "dpg agent (--set algo=dpg, or --preset pendulum)"
        )
    obs = observation_space
    if not isinstance(obs, spaces.Box) or len(obs.shape) not in (1, 2, 3):
        return (
            f"the {name} agent's networks take an observation Box of rank 1 (vector) or 2-3 "
            "(image): wrap the env (e.g. FlattenObservation)"
        )
    if encoder == "impala" and len(obs.shape) == 1:
        return (
            f"{name}.encoder=impala is an image encoder and these observations are "
            f"vectors: set {name}.encoder=auto (the MLP)"
        )
    return None


def _numel(out: Any) -> int:
    if hasattr(out, "numel"):  # a batch of one sample
        return int(out.numel())
    if isinstance(out, tuple | list):
        return sum(_numel(o) for o in out)
    return 0


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value
