"""The DQN agent's builder: n-step double dueling DQN with per-worker epsilons (``algo: dqn``).

It reads the ``learner`` section's network and optimizer keys and the
``workers`` section's epsilon ladder; see
:class:`~apex_dask.algo.agents.spec.AgentBuilder` for what each method makes.
Heavy modules (torch, the networks) are imported when a part is made, so
reading the registry stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from apex_dask.algo.agents.dqn.options import DQNOptions
from apex_dask.algo.agents.spec import AgentSpec, ScriptedPolicy
from apex_dask.algo.rollout.spec import RolloutSpec

if TYPE_CHECKING:  # torch: imported when a part is made
    from apex_dask.algo.agents.base import LearnerProtocol
    from apex_dask.algo.rollout.worker import ActingWorker

__all__ = ["BUILDER", "DQNBuilder"]


class DQNBuilder:
    """Makes the DQN agent's parts (see the module docstring)."""

    name = "dqn"

    def check_config(self, cfg: Any) -> tuple[str, Any, str] | None:
        return None  # every section's own checks cover it

    def check_spaces(self, observation_space: Any, action_space: Any) -> str | None:
        from gymnasium import spaces

        if isinstance(action_space, spaces.Box):
            return (
                "the dqn agent needs a Discrete action space; for a continuous Box use the "
                "dpg agent (--set algo=dpg, or --preset pendulum)"
            )
        if not isinstance(action_space, spaces.Discrete):
            return (
                "Ape-X (DQN) needs a Discrete action space (e.g. CartPole-v1, MountainCar-v0, "
                "ALE/Pong-v5), or the dpg agent a bounded Box"
            )
        obs = observation_space
        if not isinstance(obs, spaces.Box) or len(obs.shape) not in (1, 2, 3):
            return (
                "the Q-networks take an observation Box of rank 1 (vector) or 2-3 (image): "
                "wrap the env (e.g. FlattenObservation)"
            )
        return None

    def agent_spec(self, cfg: Any) -> AgentSpec:
        lc = cfg.learner
        options = DQNOptions(
            hiddens=tuple(lc.hiddens),
            dueling=lc.dueling,
            double_q=lc.double_q,
            lr=lc.lr,
            adam_eps=lc.adam_eps,
            grad_clip=lc.grad_clip,
            target_update_freq=lc.target_update_freq,
            device=lc.device,
            num_threads=lc.num_threads,
            amp=lc.amp,
            compile=lc.compile,
            memory_format=lc.memory_format,
        )
        return AgentSpec(self.name, options)

    def exploration_ladder(self, cfg: Any, num_workers: int) -> np.ndarray:
        from apex_dask.algo.rollout.exploration import apex_epsilons

        w = cfg.workers
        return apex_epsilons(num_workers, w.epsilon_base, w.epsilon_alpha)

    def make_learner(
        self, options: DQNOptions, observation_space: Any, action_space: Any, seed: int
    ) -> LearnerProtocol:
        from apex_dask.algo.agents.dqn.learner import Learner

        return Learner(observation_space, action_space, options, seed=seed)

    def make_worker(
        self,
        options: DQNOptions,
        rollout: RolloutSpec,
        env_factory: Callable[[], Any],
        *,
        epsilon: float,
        seed: int,
        where: str,
    ) -> ActingWorker:
        from apex_dask.algo.agents.dqn.worker import EnvWorker

        return EnvWorker(
            env_factory, epsilon=epsilon, seed=seed, rollout=rollout, options=options, where=where
        )

    def make_network(self, options: DQNOptions, observation_space: Any, action_space: Any) -> Any:
        from apex_dask.algo.agents.dqn.networks import build_q_network

        return build_q_network(observation_space, action_space, options.hiddens, options.dueling)

    def network_size(
        self, options: DQNOptions, observation_space: Any, action_space: Any
    ) -> tuple[int, int]:
        """By arithmetic, as :func:`~apex_dask.algo.agents.dqn.networks.build_q_network`
        builds it (no torch import: the pre-start memory check stays quick)."""
        params = acts = 0
        shape = tuple(int(d) for d in observation_space.shape)
        if len(shape) == 1:
            features = shape[0]
        else:
            if len(shape) == 2:
                c, h, w = 1, *shape
            elif shape[2] <= min(shape[0], shape[1]):  # HWC, as the network guesses
                h, w, c = shape
            else:
                c, h, w = shape
            convs = [(32, 8, 4), (64, 4, 2), (64, 3, 1)] if min(h, w) >= 36 else [(16, 3, 1)]
            for out, k, stride in convs:
                params += out * (c * k * k + 1)
                c, h, w = out, (h - k) // stride + 1, (w - k) // stride + 1
                acts += c * h * w
            features = c * h * w
        for width in options.hiddens:
            params += (features + 1) * width
            acts += width
            features = width
        heads = int(action_space.n) + (1 if options.dueling else 0)
        return params + (features + 1) * heads, acts + heads

    def network_keys(self, cfg: Any) -> str:
        lc = cfg.learner
        return f"learner.hiddens={list(lc.hiddens)}, learner.dueling={lc.dueling}"

    def make_policy(
        self,
        options: DQNOptions,
        observation_space: Any,
        action_space: Any,
        weights: Mapping[str, Any],
    ) -> Any:
        from apex_dask.algo.agents.dqn.policy import QPolicy

        return QPolicy(observation_space, action_space, weights, options)

    def scripted_policy(
        self,
        options: DQNOptions,
        observation_space: Any,
        action_space: Any,
        weights: Mapping[str, Any],
    ) -> ScriptedPolicy:
        from apex_dask.algo.agents.dqn.policy import scripted_policy

        return scripted_policy(observation_space, action_space, weights, options)


BUILDER = DQNBuilder()
"""The builder the registry holds."""
