"""The DQN agent's builder: n-step double dueling DQN with per-worker epsilons (``algo: dqn``).

It reads its own section (:class:`~apex_dask.algo.agents.dqn.config.DQNConfig`),
the shared ``learner`` section and the ``workers`` section's epsilon ladder (all
zeros with noisy nets, unless ``workers.epsilon_with_noisy``); see
:class:`~apex_dask.algo.agents.builder.AgentBuilder` for what each method makes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from apex_dask.algo.agents.builder import AgentBuilder, check_q_spaces
from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.spec import AgentSpec, Weights, WorkerSpec

if TYPE_CHECKING:  # torch: imported when a part is made
    from apex_dask.algo.agents.base import LearnerProtocol
    from apex_dask.algo.agents.dqn.policy import QPolicy
    from apex_dask.algo.rollout.worker import ActingWorker

__all__ = ["BUILDER", "DQNBuilder"]


class DQNBuilder(AgentBuilder):
    """Makes the DQN agent's parts (see the module docstring)."""

    name = "dqn"
    config = DQNConfig
    exploration_meaning = (
        "epsilon of env worker `i` (0 for every worker with `dqn.noisy` unless "
        "`workers.epsilon_with_noisy`)"
    )

    def check_spaces(
        self, observation_space: Any, action_space: Any, config: DQNConfig | None = None
    ) -> str | None:
        encoder = None if config is None else config.encoder
        return check_q_spaces(self.name, observation_space, action_space, encoder)

    def exploration_ladder(self, cfg: Any, num_workers: int) -> np.ndarray:
        """Ape-X's epsilons; with noisy nets 0 for every worker (the noise explores, as in
        NoisyNet and Rainbow) unless ``workers.epsilon_with_noisy``."""
        if cfg.agent.noisy and not cfg.workers.epsilon_with_noisy:
            return np.zeros(num_workers)
        return super().exploration_ladder(cfg, num_workers)

    def make_network(self, config: DQNConfig, observation_space: Any, action_space: Any) -> Any:
        from apex_dask.algo.agents.dqn.networks import q_network

        return q_network(observation_space, action_space, config)

    def make_learner(
        self, spec: AgentSpec, observation_space: Any, action_space: Any, seed: int
    ) -> LearnerProtocol:
        from apex_dask.algo.agents.dqn.learner import Learner

        return Learner(observation_space, action_space, spec.config, spec.learner, seed=seed)

    def make_worker(
        self, spec: WorkerSpec, env_factory: Any, *, exploration: float, seed: int, where: str
    ) -> ActingWorker:
        from apex_dask.algo.agents.dqn.worker import EnvWorker

        kw = {"rollout": spec.rollout, "config": spec.agent.config, "where": where}
        return EnvWorker(env_factory, epsilon=exploration, seed=seed, **kw)

    def make_policy(
        self, config: DQNConfig, observation_space: Any, action_space: Any, weights: Weights
    ) -> QPolicy:
        from apex_dask.algo.agents.dqn.policy import QPolicy

        return QPolicy(observation_space, action_space, weights, config)


BUILDER = DQNBuilder()
"""The builder the registry holds."""
