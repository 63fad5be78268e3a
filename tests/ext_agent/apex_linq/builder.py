"""The linq agent's builder: what apex_dask makes its parts with (``algo: linq``).

The package's entry point (``pyproject.toml``) names :data:`BUILDER`; nothing in
apex_dask names this agent.
"""

from __future__ import annotations

from typing import Any

from apex_dask.algo.agents.builder import AgentBuilder, check_q_spaces
from apex_dask.algo.agents.spec import AgentMetric
from apex_linq.config import LinQConfig

__all__ = ["BUILDER", "LinQBuilder"]


class LinQBuilder(AgentBuilder):
    """Linear n-step double Q-learning, epsilon-greedy env workers (vectors only)."""

    name = "linq"
    config = LinQConfig
    metrics = (
        AgentMetric("learner/weight_norm", "norm of the linear Q-function's weights", "|W|"),
    )

    def check_spaces(self, observation_space, action_space, config=None) -> str | None:
        problem = check_q_spaces(self.name, observation_space, action_space, None)
        if problem is None and len(observation_space.shape) != 1:
            return "the linq agent takes vector observations: wrap the env (FlattenObservation)"
        return problem

    def make_network(self, config: LinQConfig, observation_space, action_space) -> Any:
        from apex_linq.networks import linear_q

        return linear_q(observation_space, action_space, config.bias)

    def make_learner(self, spec, observation_space, action_space, seed: int):
        from apex_linq.learner import LinQLearner

        return LinQLearner(observation_space, action_space, spec.config, spec.learner, seed=seed)

    def make_worker(self, spec, env_factory, *, exploration: float, seed: int, where: str):
        from apex_linq.worker import LinQEnvWorker

        bias = spec.agent.config.bias
        return LinQEnvWorker(
            env_factory,
            epsilon=exploration,
            seed=seed,
            rollout=spec.rollout,
            bias=bias,
            where=where,
        )

    def make_policy(self, config: LinQConfig, observation_space, action_space, weights):
        from apex_linq.policy import LinQPolicy

        return LinQPolicy(observation_space, action_space, weights, config.bias)


BUILDER = LinQBuilder()
"""The builder the ``apex_dask.agents`` entry point names."""
