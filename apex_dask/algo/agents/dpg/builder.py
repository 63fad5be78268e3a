"""The DPG agent's builder: Ape-X DPG, DDPG with TD3's options (``algo: dpg``).

It reads the ``dpg`` section and the learner's shared keys (``adam_eps``,
``grad_clip``, ``target_update_freq``, ``device``, ``num_threads``); see
:class:`~apex_dask.algo.agents.spec.AgentBuilder` for what each method makes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from apex_dask.algo.agents.dpg.options import DPGOptions
from apex_dask.algo.agents.spec import AgentSpec, ScriptedPolicy
from apex_dask.algo.rollout.spec import RolloutSpec

if TYPE_CHECKING:  # torch: imported when a part is made
    from apex_dask.algo.agents.base import LearnerProtocol
    from apex_dask.algo.rollout.worker import ActingWorker

__all__ = ["BUILDER", "DPGBuilder"]


class DPGBuilder:
    """Makes the DPG agent's parts (see the module docstring)."""

    name = "dpg"

    def check_config(self, cfg: Any) -> tuple[str, Any, str] | None:
        if cfg.replay.frame_stack is not None:
            return (
                "replay.frame_stack",
                cfg.replay.frame_stack,
                "must be null with algo=dpg (its networks take vector observations)",
            )
        return None

    def check_spaces(
        self, observation_space: Any, action_space: Any, options: Any = None
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

    def agent_spec(self, cfg: Any) -> AgentSpec:
        d, lc = cfg.dpg, cfg.learner
        options = DPGOptions(
            actor_hiddens=tuple(d.actor_hiddens),
            critic_hiddens=tuple(d.critic_hiddens),
            twin_q=d.twin_q,
            actor_lr=d.actor_lr,
            critic_lr=d.critic_lr,
            adam_eps=lc.adam_eps,
            grad_clip=lc.grad_clip,
            policy_delay=d.policy_delay,
            smooth_target_policy=d.smooth_target_policy,
            target_noise=d.target_noise,
            target_noise_clip=d.target_noise_clip,
            tau=d.tau,
            target_update_freq=lc.target_update_freq,
            use_huber=d.use_huber,
            device=lc.device,
            num_threads=lc.num_threads,
            noise=d.noise,
            ou_theta=d.ou_theta,
        )
        return AgentSpec(self.name, options)

    def exploration_ladder(self, cfg: Any, num_workers: int) -> np.ndarray:
        from apex_dask.algo.agents.dpg.noise import noise_ladder

        return noise_ladder(num_workers, cfg.dpg.noise_base, cfg.dpg.noise_alpha)

    def make_learner(
        self, options: DPGOptions, observation_space: Any, action_space: Any, seed: int
    ) -> LearnerProtocol:
        from apex_dask.algo.agents.dpg.learner import DPGLearner

        return DPGLearner(observation_space, action_space, options, seed=seed)

    def make_worker(
        self,
        options: DPGOptions,
        rollout: RolloutSpec,
        env_factory: Callable[[], Any],
        *,
        epsilon: float,
        seed: int,
        where: str,
    ) -> ActingWorker:
        from apex_dask.algo.agents.dpg.worker import DPGEnvWorker

        return DPGEnvWorker(
            env_factory, sigma=epsilon, seed=seed, rollout=rollout, options=options, where=where
        )

    def make_network(self, options: DPGOptions, observation_space: Any, action_space: Any) -> Any:
        from apex_dask.algo.agents.dpg.networks import build_dpg_model

        o = options
        return build_dpg_model(
            observation_space, action_space, o.actor_hiddens, o.critic_hiddens, o.twin_q
        )

    def network_size(
        self, options: DPGOptions, observation_space: Any, action_space: Any
    ) -> tuple[int, int]:
        """By arithmetic: the actor and the critic(s) are MLPs (no torch import)."""
        obs_dim = int(np.prod(observation_space.shape))
        act_dim = int(np.prod(action_space.shape))
        params = acts = 0
        critics = 2 if options.twin_q else 1
        for sizes, copies in (
            ([obs_dim, *options.actor_hiddens, act_dim], 1),
            ([obs_dim + act_dim, *options.critic_hiddens, 1], critics),
        ):
            for a, b in zip(sizes[:-1], sizes[1:], strict=True):
                params += copies * (a + 1) * b
                acts += copies * b
        return params, acts

    def item_bytes(self, cfg: Any, observation_space: Any) -> int | None:
        """None: its replay items are transitions."""
        return None

    def network_keys(self, cfg: Any) -> str:
        d = cfg.dpg
        return (
            f"dpg.actor_hiddens={list(d.actor_hiddens)}, "
            f"dpg.critic_hiddens={list(d.critic_hiddens)}, dpg.twin_q={d.twin_q}"
        )

    def make_policy(
        self,
        options: DPGOptions,
        observation_space: Any,
        action_space: Any,
        weights: Mapping[str, Any],
    ) -> Any:
        from apex_dask.algo.agents.dpg.policy import DPGPolicy

        return DPGPolicy(observation_space, action_space, weights, options)

    def scripted_policy(
        self,
        options: DPGOptions,
        observation_space: Any,
        action_space: Any,
        weights: Mapping[str, Any],
    ) -> ScriptedPolicy:
        from apex_dask.algo.agents.dpg.policy import scripted_policy

        return scripted_policy(observation_space, action_space, weights, options)


BUILDER = DPGBuilder()
"""The builder the registry holds."""
