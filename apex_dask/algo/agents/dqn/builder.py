"""The DQN agent's builder: n-step double dueling DQN with per-worker epsilons (``algo: dqn``).

It reads the ``learner`` section's network, value-head and optimizer keys and the
``workers`` section's epsilon ladder (all zeros with noisy nets, unless
``workers.epsilon_with_noisy``); see
:class:`~apex_dask.algo.agents.spec.AgentBuilder` for what each method makes.
Heavy modules (torch, the networks) are imported when a part is made, so
reading the registry stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from apex_dask.algo.agents.dqn.options import LOSSES, DQNOptions
from apex_dask.algo.agents.spec import AgentSpec, ScriptedPolicy
from apex_dask.algo.agents.torso_size import ENCODERS, conv_size, image_chw, linear_params, mlp_size
from apex_dask.algo.rollout.spec import RolloutSpec

if TYPE_CHECKING:  # torch: imported when a part is made
    from apex_dask.algo.agents.base import LearnerProtocol
    from apex_dask.algo.rollout.worker import ActingWorker

__all__ = ["BUILDER", "DQNBuilder"]


class DQNBuilder:
    """Makes the DQN agent's parts (see the module docstring)."""

    name = "dqn"

    def check_config(self, cfg: Any) -> tuple[str, Any, str] | None:
        """The value-head and encoder keys, alone and together (one problem at a time)."""
        lc = cfg.learner
        if lc.loss not in LOSSES:
            return "learner.loss", lc.loss, f"must be one of {', '.join(LOSSES)}"
        if lc.num_atoms < 1:
            return "learner.num_atoms", lc.num_atoms, "must be >= 1 (1: a scalar Q head; C51: 51)"
        if lc.num_atoms > 1 and lc.loss == "hl_gauss":
            return (
                "learner.loss",
                lc.loss,
                f"cannot be combined with learner.num_atoms={lc.num_atoms} (C51 has its own "
                "cross-entropy loss): set learner.num_atoms=1 for HL-Gauss, or "
                "learner.loss=huber for C51",
            )
        if (lc.num_atoms > 1 or lc.loss == "hl_gauss") and not lc.v_min < lc.v_max:
            return "learner.v_max", lc.v_max, f"must be > learner.v_min ({lc.v_min})"
        if lc.loss == "hl_gauss" and lc.num_bins < 2:
            return "learner.num_bins", lc.num_bins, "must be >= 2 with learner.loss=hl_gauss"
        if lc.loss == "hl_gauss" and not lc.hl_gauss_sigma_ratio > 0:
            return "learner.hl_gauss_sigma_ratio", lc.hl_gauss_sigma_ratio, "must be > 0"
        if lc.noisy and not lc.sigma0 > 0:
            return "learner.sigma0", lc.sigma0, "must be > 0 with learner.noisy=true"
        if lc.encoder not in ENCODERS:
            return "learner.encoder", lc.encoder, f"must be one of {', '.join(ENCODERS)}"
        if lc.impala_scale < 1:
            return "learner.impala_scale", lc.impala_scale, "must be >= 1"
        return None

    def check_spaces(
        self, observation_space: Any, action_space: Any, options: DQNOptions | None = None
    ) -> str | None:
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
        if options is not None and options.encoder == "impala" and len(obs.shape) == 1:
            return (
                "learner.encoder=impala is an image encoder and these observations are "
                "vectors: set learner.encoder=auto (the MLP)"
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
            num_atoms=lc.num_atoms,
            v_min=lc.v_min,
            v_max=lc.v_max,
            noisy=lc.noisy,
            sigma0=lc.sigma0,
            loss=lc.loss,
            num_bins=lc.num_bins,
            hl_gauss_sigma_ratio=lc.hl_gauss_sigma_ratio,
            layer_norm=lc.layer_norm,
            encoder=lc.encoder,
            impala_scale=lc.impala_scale,
        )
        return AgentSpec(self.name, options)

    def exploration_ladder(self, cfg: Any, num_workers: int) -> np.ndarray:
        """Ape-X's epsilons; with noisy nets 0 for every worker (the noise explores, as in
        NoisyNet and Rainbow) unless ``workers.epsilon_with_noisy``."""
        from apex_dask.algo.rollout.exploration import apex_epsilons

        w = cfg.workers
        if cfg.learner.noisy and not w.epsilon_with_noisy:
            return np.zeros(num_workers)
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
        from apex_dask.algo.agents.dqn.networks import q_network

        return q_network(observation_space, action_space, options)

    def network_size(
        self, options: DQNOptions, observation_space: Any, action_space: Any
    ) -> tuple[int, int]:
        """By arithmetic, as :func:`~apex_dask.algo.agents.dqn.networks.q_network` builds it
        (no torch import: the pre-start memory check stays quick)."""
        o = options
        shape = tuple(int(d) for d in observation_space.shape)
        params = acts = 0
        if len(shape) == 1:
            features = shape[0]
        else:
            chw = image_chw(shape)[0]
            params, acts, features = conv_size(
                chw, encoder=o.encoder, layer_norm=o.layer_norm, impala_scale=o.impala_scale
            )
        p, a, features = mlp_size(features, o.hiddens, layer_norm=o.layer_norm, noisy=o.noisy)
        k, n = o.num_outputs, int(action_space.n)
        streams = [k, n * k] if o.dueling else [n * k]
        params += p + sum(linear_params(features, out, o.noisy) for out in streams)
        return params, acts + a + sum(streams)

    def item_bytes(self, cfg: Any, observation_space: Any) -> int | None:
        """None: its replay items are transitions."""
        return None

    def network_keys(self, cfg: Any) -> str:
        lc, d = cfg.learner, DQNOptions()
        keys = [f"learner.hiddens={list(lc.hiddens)}", f"learner.dueling={lc.dueling}"]
        shaping = {  # the other keys that shape the network, named where not the default
            "num_atoms": (lc.num_atoms, d.num_atoms),
            "noisy": (lc.noisy, d.noisy),
            "loss": (lc.loss, d.loss),
            "num_bins": (lc.num_bins if lc.loss == "hl_gauss" else d.num_bins, d.num_bins),
            "layer_norm": (lc.layer_norm, d.layer_norm),
            "encoder": (lc.encoder, d.encoder),
            "impala_scale": (lc.impala_scale, d.impala_scale),
        }
        keys += [f"learner.{k}={v}" for k, (v, default) in shaping.items() if v != default]
        return ", ".join(keys)

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
