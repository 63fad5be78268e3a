"""The R2D2 agent's builder: recurrent replay on the Ape-X plan (``algo: r2d2``).

It reads its own section (:class:`~apex_dask.algo.agents.r2d2.config.R2D2Config`:
the torso, the LSTM, the sequences, eta, h's epsilon), the shared ``learner``
section and the ``workers`` section's epsilon ladder; see
:class:`~apex_dask.algo.agents.builder.AgentBuilder` for what each method makes.
Replay items are sequences (:mod:`apex_dask.algo.agents.r2d2.sequences`), so
``replay.capacity``, ``replay.learning_starts`` and ``learner.batch_size`` count
sequences with this agent. Its learner adds ``learner/state_staleness``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from apex_dask.algo.agents.builder import AgentBuilder, check_q_spaces
from apex_dask.algo.agents.config import Problem
from apex_dask.algo.agents.r2d2.config import R2D2Config
from apex_dask.algo.agents.spec import AgentMetric, AgentSpec, Weights, WorkerSpec

if TYPE_CHECKING:  # torch: imported when a part is made
    from apex_dask.algo.agents.base import LearnerProtocol
    from apex_dask.algo.agents.r2d2.policy import R2D2Policy
    from apex_dask.algo.rollout.worker import ActingWorker

__all__ = ["BUILDER", "R2D2Builder"]

STATE_STALENESS = AgentMetric(
    "learner/state_staleness",
    "the mean age, in learner updates, of the stored recurrent states being replayed "
    "(the learner's version at the update minus the weights version that computed each "
    "item's stored state), over the last 20 batches; it grows with the replay's age and "
    "with the time between weight syncs; the burn-in is there to make up for it",
    "stored-state age (r2d2)",
    chart="sync",
)


class R2D2Builder(AgentBuilder):
    """Makes the R2D2 agent's parts (see the module docstring)."""

    name = "r2d2"
    config = R2D2Config
    metrics = (STATE_STALENESS,)

    def check_config(self, cfg: Any) -> Problem | None:
        if cfg.replay.frame_stack is not None:
            return (
                "replay.frame_stack",
                cfg.replay.frame_stack,
                "is not supported with algo=r2d2 (the LSTM sees one frame a step: set it to null)",
            )
        return None

    def check_spaces(
        self, observation_space: Any, action_space: Any, config: R2D2Config | None = None
    ) -> str | None:
        encoder = None if config is None else config.encoder
        return check_q_spaces(self.name, observation_space, action_space, encoder)

    def make_network(self, config: R2D2Config, observation_space: Any, action_space: Any) -> Any:
        from apex_dask.algo.agents.r2d2.networks import RecurrentQNetwork

        return RecurrentQNetwork(observation_space, action_space, config)

    def sample_forward(
        self,
        network: Any,
        config: R2D2Config,
        observation_space: Any,
        action_space: Any,
        device: str,
    ) -> None:
        """One stored sequence: its ``burn_in + trace_length + 1`` steps unrolled."""
        import torch

        steps = config.sequence_length + 1
        obs = torch.zeros((1, steps, *observation_space.shape), device=device)
        network.unroll(obs, network.initial_state(1, device=device))

    def item_bytes(self, cfg: Any, observation_space: Any) -> int | None:
        """Bytes of one stored sequence item: ``T + 1`` observations, the per-step keys
        and the stored state."""
        r = cfg.agent
        t = r.sequence_length
        obs = int(np.prod(observation_space.shape)) * np.dtype(observation_space.dtype).itemsize
        return (t + 1) * obs + t * (8 + 4 * 4) + 2 * 4 * r.lstm_size + 8 + 48

    def make_learner(
        self, spec: AgentSpec, observation_space: Any, action_space: Any, seed: int
    ) -> LearnerProtocol:
        from apex_dask.algo.agents.r2d2.learner import R2D2Learner

        return R2D2Learner(observation_space, action_space, spec.config, spec.learner, seed=seed)

    def make_worker(
        self, spec: WorkerSpec, env_factory: Any, *, exploration: float, seed: int, where: str
    ) -> ActingWorker:
        from apex_dask.algo.agents.r2d2.worker import R2D2EnvWorker

        kw = {"rollout": spec.rollout, "config": spec.agent.config, "where": where}
        return R2D2EnvWorker(env_factory, epsilon=exploration, seed=seed, **kw)

    def make_policy(
        self, config: R2D2Config, observation_space: Any, action_space: Any, weights: Weights
    ) -> R2D2Policy:
        from apex_dask.algo.agents.r2d2.policy import R2D2Policy

        return R2D2Policy(observation_space, action_space, weights, config)


BUILDER = R2D2Builder()
"""The builder the registry holds."""
