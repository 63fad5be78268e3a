"""The R2D2 agent's builder: recurrent replay on the Ape-X plan (``algo: r2d2``).

It reads the ``r2d2`` section (the LSTM, the sequences, eta, h's epsilon) and the
learner's shared keys (``hiddens``, ``dueling``, ``encoder``, ``impala_scale``,
``lr``, ``adam_eps``, ``grad_clip``, ``gamma``, ``n_step``, ``target_update_freq``,
``device``, ``num_threads``) and the ``workers`` section's epsilon ladder; see
:class:`~apex_dask.algo.agents.spec.AgentBuilder` for what each method makes.
Replay items are sequences (:mod:`apex_dask.algo.agents.r2d2.sequences`), so
``replay.capacity``, ``replay.learning_starts`` and ``learner.batch_size`` count
sequences with this agent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from apex_dask.algo.agents.r2d2.options import R2D2Options
from apex_dask.algo.agents.spec import AgentSpec, ScriptedPolicy
from apex_dask.algo.agents.torso_size import ENCODERS, conv_size, image_chw, mlp_size
from apex_dask.algo.rollout.spec import RolloutSpec

if TYPE_CHECKING:  # torch: imported when a part is made
    from apex_dask.algo.agents.base import LearnerProtocol
    from apex_dask.algo.rollout.worker import ActingWorker

__all__ = ["BUILDER", "R2D2Builder"]

UNSUPPORTED = (  # (key, the value r2d2 runs with, what to do instead)
    ("replay.frame_stack", None, "the LSTM sees one frame a step: set it to null"),
    ("learner.noisy", False, "noisy nets are not built for the r2d2 agent yet"),
    ("learner.num_atoms", 1, "distributional heads are not built for the r2d2 agent yet"),
    ("learner.loss", "huber", "r2d2 trains h-rescaled values with a squared loss"),
    ("learner.amp", "off", "bf16 autocast is not built for the r2d2 agent yet"),
    ("learner.compile", False, "torch.compile is not built for the r2d2 agent yet"),
    ("learner.memory_format", "contiguous", "channels_last is not built for r2d2 yet"),
    ("learner.layer_norm", False, "LayerNorm torsos are not built for the r2d2 agent yet"),
)


class R2D2Builder:
    """Makes the R2D2 agent's parts (see the module docstring)."""

    name = "r2d2"

    def check_config(self, cfg: Any) -> tuple[str, Any, str] | None:
        for key, fine, why in UNSUPPORTED:
            section, name = key.split(".")
            value = getattr(getattr(cfg, section), name)
            if value != fine:
                return key, value, f"is not supported with algo=r2d2 ({why})"
        if cfg.learner.encoder not in ENCODERS:
            return "learner.encoder", cfg.learner.encoder, f"must be one of {', '.join(ENCODERS)}"
        r = cfg.r2d2
        if r.period > r.trace_length:
            return (
                "r2d2.period",
                r.period,
                f"must be <= r2d2.trace_length ({r.trace_length}), or steps between traces "
                "are never trained",
            )
        return None

    def check_spaces(
        self, observation_space: Any, action_space: Any, options: Any = None
    ) -> str | None:
        from gymnasium import spaces

        if not isinstance(action_space, spaces.Discrete):
            return (
                "the r2d2 agent needs a Discrete action space; for a continuous Box use the "
                "dpg agent (--set algo=dpg)"
            )
        obs = observation_space
        if not isinstance(obs, spaces.Box) or len(obs.shape) not in (1, 2, 3):
            return (
                "the r2d2 agent's networks take an observation Box of rank 1 (vector) or 2-3 "
                "(image): wrap the env (e.g. FlattenObservation)"
            )
        if options is not None and options.encoder == "impala" and len(obs.shape) == 1:
            return "learner.encoder=impala is an image encoder: set learner.encoder=auto"
        return None

    def agent_spec(self, cfg: Any) -> AgentSpec:
        lc, r = cfg.learner, cfg.r2d2
        options = R2D2Options(
            hiddens=tuple(lc.hiddens),
            lstm_size=r.lstm_size,
            dueling=lc.dueling,
            encoder=lc.encoder,
            impala_scale=lc.impala_scale,
            burn_in=r.burn_in,
            trace_length=r.trace_length,
            period=r.period,
            n_step=lc.n_step,
            gamma=lc.gamma,
            eta=r.eta,
            rescale_eps=r.rescale_eps,
            lr=lc.lr,
            adam_eps=lc.adam_eps,
            grad_clip=lc.grad_clip,
            target_update_freq=lc.target_update_freq,
            device=lc.device,
            num_threads=lc.num_threads,
        )
        return AgentSpec(self.name, options)

    def exploration_ladder(self, cfg: Any, num_workers: int) -> np.ndarray:
        from apex_dask.algo.rollout.exploration import apex_epsilons

        w = cfg.workers
        return apex_epsilons(num_workers, w.epsilon_base, w.epsilon_alpha)

    def make_learner(
        self, options: R2D2Options, observation_space: Any, action_space: Any, seed: int
    ) -> LearnerProtocol:
        from apex_dask.algo.agents.r2d2.learner import R2D2Learner

        return R2D2Learner(observation_space, action_space, options, seed=seed)

    def make_worker(
        self,
        options: R2D2Options,
        rollout: RolloutSpec,
        env_factory: Callable[[], Any],
        *,
        epsilon: float,
        seed: int,
        where: str,
    ) -> ActingWorker:
        from apex_dask.algo.agents.r2d2.worker import R2D2EnvWorker

        return R2D2EnvWorker(
            env_factory, epsilon=epsilon, seed=seed, rollout=rollout, options=options, where=where
        )

    def make_network(self, options: R2D2Options, observation_space: Any, action_space: Any) -> Any:
        from apex_dask.algo.agents.r2d2.networks import RecurrentQNetwork

        return RecurrentQNetwork(observation_space, action_space, options)

    def network_size(
        self, options: R2D2Options, observation_space: Any, action_space: Any
    ) -> tuple[int, int]:
        """By arithmetic (no torch import); activations are per sequence item (its
        ``T + 1`` steps)."""
        o = options
        shape = tuple(int(d) for d in observation_space.shape)
        params = acts = 0
        if len(shape) == 1:
            features = shape[0]
        else:
            chw = image_chw(shape)[0]
            params, acts, features = conv_size(
                chw, encoder=o.encoder, layer_norm=False, impala_scale=o.impala_scale
            )
        p, a, features = mlp_size(features, o.hiddens, layer_norm=False, noisy=False)
        h, n = o.lstm_size, int(action_space.n)
        lstm = 4 * h * (features + h + 2)
        head = (h + 1) * (n + 1) if o.dueling else (h + 1) * n
        steps = o.sequence_length + 1
        return params + p + lstm + head, steps * (acts + a + 6 * h + n + 1)

    def network_keys(self, cfg: Any) -> str:
        lc, r = cfg.learner, cfg.r2d2
        return (
            f"learner.hiddens={list(lc.hiddens)}, learner.dueling={lc.dueling}, "
            f"learner.encoder={lc.encoder}, r2d2.lstm_size={r.lstm_size}"
        )

    def item_bytes(self, cfg: Any, observation_space: Any) -> int | None:
        """Bytes of one stored sequence item: ``T + 1`` observations, the per-step keys
        and the stored state."""
        r = cfg.r2d2
        t = r.burn_in + r.trace_length
        obs = int(np.prod(observation_space.shape)) * np.dtype(observation_space.dtype).itemsize
        return (t + 1) * obs + t * (8 + 4 * 4) + 2 * 4 * r.lstm_size + 8 + 48

    def make_policy(
        self,
        options: R2D2Options,
        observation_space: Any,
        action_space: Any,
        weights: Mapping[str, Any],
    ) -> Any:
        from apex_dask.algo.agents.r2d2.policy import R2D2Policy

        return R2D2Policy(observation_space, action_space, weights, options)

    def scripted_policy(
        self,
        options: R2D2Options,
        observation_space: Any,
        action_space: Any,
        weights: Mapping[str, Any],
    ) -> ScriptedPolicy:
        from apex_dask.algo.agents.r2d2.policy import scripted_policy

        return scripted_policy(observation_space, action_space, weights, options)


BUILDER = R2D2Builder()
"""The builder the registry holds."""
