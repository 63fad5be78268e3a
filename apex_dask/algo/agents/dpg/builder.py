"""The DPG agent's builder: Ape-X DPG, DDPG with TD3's options (``algo: dpg``).

It reads its own section (:class:`~apex_dask.algo.agents.dpg.config.DPGConfig`) and
the shared ``learner`` section; see :class:`~apex_dask.algo.agents.builder.AgentBuilder`
for what each method makes. Each env worker explores with a noise scale (in half
ranges of the action space): ``env/noise_scale/<i>``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from apex_dask.algo.agents.builder import AgentBuilder
from apex_dask.algo.agents.config import Problem
from apex_dask.algo.agents.dpg.config import DPGConfig
from apex_dask.algo.agents.spec import AgentSpec, Weights, WorkerSpec

if TYPE_CHECKING:  # torch: imported when a part is made
    from apex_dask.algo.agents.base import LearnerProtocol
    from apex_dask.algo.agents.dpg.policy import DPGPolicy
    from apex_dask.algo.rollout.worker import ActingWorker

__all__ = ["BUILDER", "DPGBuilder"]


class DPGBuilder(AgentBuilder):
    """Makes the DPG agent's parts (see the module docstring)."""

    name = "dpg"
    config = DPGConfig
    exploration = "noise_scale"
    exploration_meaning = (
        "noise scale sigma_i of env worker `i`, in half ranges of the action space "
        "(`dpg.noise_base`, `dpg.noise_alpha`)"
    )

    def check_config(self, cfg: Any) -> Problem | None:
        if cfg.replay.frame_stack is not None:
            return (
                "replay.frame_stack",
                cfg.replay.frame_stack,
                "must be null with algo=dpg (its networks take vector observations)",
            )
        return None

    def check_spaces(
        self, observation_space: Any, action_space: Any, config: DPGConfig | None = None
    ) -> str | None:
        from gymnasium import spaces

        act = action_space
        if isinstance(act, spaces.Discrete):
            return "the dpg agent needs a bounded Box action space; for Discrete use --set algo=dqn"
        if not isinstance(act, spaces.Box) or len(act.shape) != 1:
            return (
                "the dpg agent needs a bounded Box action space of rank 1 (the dqn agent: "
                "Discrete); wrap the env (e.g. FlattenAction)"
            )
        if not (np.all(np.isfinite(act.low)) and np.all(np.isfinite(act.high))):
            return (
                "the dpg agent needs finite action bounds: wrap the env in a gymnasium "
                "ActionWrapper whose action_space is a bounded Box, or discretise it for the "
                "dqn agent"
            )
        obs = observation_space
        if not (isinstance(obs, spaces.Box) and len(obs.shape) == 1):
            return (
                "the dpg agent's networks take an observation Box of rank 1 (a vector): "
                "wrap the env (e.g. FlattenObservation)"
            )
        return None

    def exploration_ladder(self, cfg: Any, num_workers: int) -> np.ndarray:
        """Each worker's noise scale: ``dpg.noise_base ** (1 + dpg.noise_alpha * i / (N - 1))``."""
        from apex_dask.algo.agents.dpg.noise import noise_ladder

        return noise_ladder(num_workers, cfg.agent.noise_base, cfg.agent.noise_alpha)

    def make_network(self, config: DPGConfig, observation_space: Any, action_space: Any) -> Any:
        from apex_dask.algo.agents.dpg.networks import build_dpg_model

        c = config
        return build_dpg_model(
            observation_space, action_space, c.actor_hiddens, c.critic_hiddens, c.twin_q
        )

    def sample_forward(
        self,
        network: Any,
        config: DPGConfig,
        observation_space: Any,
        action_space: Any,
        device: str,
    ) -> None:
        """The actor on one observation, and the critic(s) on it and the actor's action."""
        import torch

        obs = torch.zeros((1, *observation_space.shape), device=device)
        network.critic(obs, network.actor(obs))

    def make_learner(
        self, spec: AgentSpec, observation_space: Any, action_space: Any, seed: int
    ) -> LearnerProtocol:
        from apex_dask.algo.agents.dpg.learner import DPGLearner

        return DPGLearner(observation_space, action_space, spec.config, spec.learner, seed=seed)

    def make_worker(
        self, spec: WorkerSpec, env_factory: Any, *, exploration: float, seed: int, where: str
    ) -> ActingWorker:
        from apex_dask.algo.agents.dpg.worker import DPGEnvWorker

        kw = {"rollout": spec.rollout, "config": spec.agent.config, "where": where}
        return DPGEnvWorker(env_factory, noise_scale=exploration, seed=seed, **kw)

    def make_policy(
        self, config: DPGConfig, observation_space: Any, action_space: Any, weights: Weights
    ) -> DPGPolicy:
        from apex_dask.algo.agents.dpg.policy import DPGPolicy

        return DPGPolicy(observation_space, action_space, weights, config)


BUILDER = DPGBuilder()
"""The builder the registry holds."""
