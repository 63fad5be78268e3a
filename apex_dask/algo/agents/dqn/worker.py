"""An epsilon-greedy env worker: rollouts with n-step transitions and initial priorities.

Usage loop (a runner or actor drives it)::

    worker = EnvWorker(make_env_factory("CartPole-v1"), epsilon=0.4, seed=1,
                       rollout=RolloutSpec(fragment_length=50), config=DQNConfig())
    worker.set_weights(*learner.get_weights())
    rollout = worker.sample()         # fragment_length env steps: a Rollout
    shard.add(rollout.batch, rollout.priorities)

Batched acting: a worker steps ``num_envs`` envs of its own together
(``workers.envs_per_worker``; RLlib's tuned Atari Ape-X ran 8): gymnasium envs
in turn (``vector_mode="sync"``, :mod:`apex_dask.algo.envs.sync`) or, for ALE
games with ``vector_mode="native"``, ale-py's C++ vector env
(:mod:`apex_dask.algo.envs.native`). It makes **one forward pass per step** over
all of them, the exploring ones too. For each env, with probability
``epsilon`` a uniform random action (drawn from the worker's own seeded
``numpy.random.Generator``), else ``argmax_a Q(s, a)`` under the last synced
weights. Vector observations use a numpy forward pass
(:class:`~apex_dask.algo.agents.dqn.networks.NumpyMLPQ`), images go through torch. The
caller should run ``torch.set_num_threads(1)`` in the worker's process:
small-batch forwards are slower with more threads.

Steps go through a :class:`~apex_dask.algo.rollout.vector_nstep.VectorNStepAdder`
(n-step transitions over the env and time axes, worked out once per
fragment) whose pending steps carry over
between fragments, so a fragment holds the transitions *completed* during
its steps (about ``fragment_length`` per env, not exactly).

Initial priorities come from the Q-values of acting, as the Ape-X paper's
actors do: each step keeps ``Q(s_t)[a_t]`` with its transition, and a
transition's bootstrap value ``max_b Q(s_{t+k}, b)`` is read from the
forward pass that acts on ``s_{t+k}`` (the step after it completes). A time
limit's final observation is never acted on: those states ride along as
extra rows of the next forward. The transitions that bootstrap from the
fragment's last observations get them from one batched pass at the end of
the fragment, whose Q-values also choose the next fragment's first actions
(unless :meth:`set_weights` came in between). So a pass costs nothing
extra per fragment, every transition ships in the fragment that completed
it, and all of a fragment's priorities come from the weights it acted
with. The priorities equal ``td_errors(batch)``: |td| with the double-DQN
target, online = target = the synced weights,
``|R + discount * Q(s', argmax_b Q(s', b)) - Q(s, a)|`` (HL-Gauss: on the expected
values). For C51 each step keeps the log-probabilities of every action's atoms instead,
and a transition's priority is the learner's cross-entropy with online = target
(:func:`~apex_dask.algo.agents.dqn.heads.c51_priorities_numpy`). Actions are the argmax
of the expected value.

Noisy nets: noise from the worker's own seeded generator. With
``acting_noise="fragment"`` (the default) one sample serves a whole rollout fragment:
it is drawn just before the pass at the end of the previous fragment (whose values
choose the fragment's first actions), and the noisy weights are formed once for it, so
an acting pass costs what a noise-free one does. With ``acting_noise="pass"`` each
acting pass (the one per vector step and the one at the fragment's end) draws its own.
The priorities come from those passes' values either way. Greedy evaluation uses the
mean weights.

Frame stacks: with ``frame_stack=k`` (observations ``[k, *frame_shape]``, as
gymnasium's ``FrameStackObservation`` makes them) the rollout's batch is sent
in the compact form of :mod:`apex_dask.algo.replay.codec` (each frame once),
which a shard built with the same ``frame_stack`` stores as it is.

Envs that misbehave (:mod:`apex_dask.algo.envs.guard`): making an env is
bounded by ``make_timeout_s``, a ``step``/``reset`` by ``step_timeout_s``;
an exception, a late call or a non-finite reward or float observation is an
env error. With ``restart_failed_envs`` it is counted (``env_errors``), the
env is closed (a hung one is abandoned with its thread) and made again, its
partial episode is dropped from the episode stats and its pending n-step
steps are dropped; transitions already complete are kept. More than
``max_env_errors_per_1k_steps`` errors within the worker's last 1,000 env
steps, ``max_consecutive_env_errors`` errors of one env in a row without a
completed step, or any error with restarts off, raise
:class:`~apex_dask.algo.envs.guard.EnvFailed` (one line naming the env, the
error and the step); so does an env that fails to be made again
:data:`REMAKE_TRIES` times in a row. Errors making or resetting the first
envs always raise it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import gymnasium as gym
import numpy as np
import torch

from apex_dask.algo.agents.base import module_weights
from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.heads import c51_priorities_numpy, log_softmax_numpy, support
from apex_dask.algo.agents.dqn.loss import td_errors_numpy
from apex_dask.algo.agents.dqn.networks import NumpyMLPQ, q_network
from apex_dask.algo.agents.noisy import noise_numpy, noisy_layers
from apex_dask.algo.rollout.spec import RolloutSpec
from apex_dask.algo.rollout.vector_nstep import VectorNStepAdder
from apex_dask.algo.rollout.worker import ActingWorker

__all__ = ["EnvWorker"]


class EnvWorker(ActingWorker):
    """Envs plus an epsilon-greedy policy; see the module docstring.

    Before the first :meth:`set_weights` the worker acts with its own random
    initial weights and ``weights_version == -1``.
    """

    def __init__(
        self,
        env_factory: Callable[[], gym.Env],
        *,
        epsilon: float,
        seed: int,
        rollout: RolloutSpec | None = None,
        config: DQNConfig | None = None,
        where: str = "",
    ) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon!r}")
        r = rollout if rollout is not None else RolloutSpec()
        o = config if config is not None else DQNConfig()
        super().__init__(env_factory, r, seed=seed, where=where)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self._net = q_network(self.observation_space, self.action_space, o)
        self._net.eval()
        self.config = o
        self._numpy_net: NumpyMLPQ | None = None
        if len(self.observation_space.shape) == 1:
            self._numpy_net = NumpyMLPQ(module_weights(self._net), o)
        self._noisy = noisy_layers(self._net)
        self._noise_rng = np.random.default_rng([seed, 2]) if self._noisy else None
        self._noise_per_pass = o.acting_noise == "pass"
        # acting_noise="fragment": the fragment's noise and the numpy net under it
        self._fragment_noise: list[tuple[np.ndarray, np.ndarray]] | None = None
        self._noised_numpy: NumpyMLPQ | None = None
        self._support = support(o)
        self._c51 = o.head == "c51"
        self.exploration = self.epsilon = float(epsilon)
        self.double_q = bool(o.double_q)
        self.num_actions = int(self.action_space.n)
        self._action_offset = int(self.action_space.start)
        stack = r.frame_stack
        if stack is not None and self._obs_shape[:1] != (stack,):
            raise ValueError(
                f"frame_stack={stack} needs observations [{stack}, ...] "
                f"(first axis the stack), the env gives {list(self._obs_shape)}"
            )
        self.frame_stack = stack
        self.adder = VectorNStepAdder(
            self.num_envs,
            r.n_step,
            r.gamma,
            self._obs_shape,
            self._obs_dtype,
            self.fragment_length,
            num_actions=self.num_actions,
            value_shape=(o.num_atoms,) if self._c51 else (),
            priority=self._c51_priorities if self._c51 else None,
        )
        # (Q, values kept for the priorities) of self._obs under the current weights
        self._q_next: tuple[np.ndarray, np.ndarray] | None = None
        self._requote = False
        self._draws: tuple[np.ndarray, np.ndarray] | None = None
        self._explore_at: list[bool] = []

    # -- policy ---------------------------------------------------------
    def values(self, obs: np.ndarray, noise: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """``(Q (B, A), kept values)`` float32 of a batch under the synced weights: the kept
        values are the Q-values, or C51's log-probabilities (B, A, atoms). ``noise``: draw
        new noise for the noisy layers (acting); else their mean weights."""
        noisy = noise and self._noise_rng is not None
        if self._numpy_net is not None:
            if not noisy:
                q, logp = self._numpy_net.values(obs)
            elif self._noise_per_pass:
                q, logp = self._numpy_net.values(obs, self._draw_noise())
            else:
                q, logp = self._numpy_noised().values(obs)
            return q, (logp if self._c51 else q)
        if self._noisy:  # noise in train mode, the mean weights in eval mode
            if noisy and (self._noise_per_pass or self._fragment_noise is None):
                draws = self._draw_noise()
                for layer, (f_in, f_out) in zip(self._noisy, draws, strict=True):
                    layer.set_noise(torch.from_numpy(f_in), torch.from_numpy(f_out))
            if self._net.training != noisy:
                self._net.train(noisy)
        with torch.inference_mode():
            x = torch.as_tensor(obs)
            if self._support is None:
                q = self._net(x).numpy()
                return q, q
            logp = log_softmax_numpy(self._net.logits(x).float().numpy())
        q = (np.exp(logp) * self._support).sum(axis=-1, dtype=np.float32)
        return q, (logp if self._c51 else q)

    def _draw_noise(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """New noise for the noisy layers; with ``acting_noise="fragment"`` it is the
        fragment's until :meth:`_end_fragment` drops it."""
        draws = noise_numpy(self._noise_rng, [(m.in_features, m.out_features) for m in self._noisy])
        if not self._noise_per_pass:
            self._fragment_noise = draws
            self._noised_numpy = None
        return draws

    def _numpy_noised(self) -> NumpyMLPQ:
        """The numpy net with the fragment's noise in its weights (formed once)."""
        if self._fragment_noise is None:
            self._draw_noise()
        if self._noised_numpy is None:
            self._noised_numpy = self._numpy_net.noised(self._fragment_noise)
        return self._noised_numpy

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values (B, A) float32 of a batch of observations under the synced (mean) weights."""
        return self.values(obs)[0]

    def _greedy(self, obs: np.ndarray) -> int:
        return int(np.argmax(self.q_values(obs[None])[0]))

    def _c51_priorities(
        self, taken: np.ndarray, rows_next: np.ndarray, reward: np.ndarray, discount: np.ndarray
    ) -> np.ndarray:
        return c51_priorities_numpy(taken, rows_next, reward, discount, self._support)

    def _explore(self) -> tuple[np.ndarray, np.ndarray] | None:
        """A fragment's exploration draws: (explore?, random action) per step and env."""
        if self.epsilon == 0.0:
            return None
        shape = (self.fragment_length, self.num_envs)
        return self.rng.random(shape) < self.epsilon, self.rng.integers(
            self.num_actions, size=shape
        )

    def set_weights(self, version: int, weights: Mapping[str, np.ndarray]) -> None:
        """Act with these weights (a learner's ``get_weights()``) from now on."""
        if self._numpy_net is not None:
            self._numpy_net = NumpyMLPQ(weights, self.config)
            self._noised_numpy = None  # formed again from the new weights, same noise
        else:
            self._net.load_state_dict({k: torch.as_tensor(v) for k, v in weights.items()})
        self.weights_version = int(version)
        self._q_next = None  # acted on with the old weights: computed again
        self._requote = True  # as are the pending steps' Q(s_t)[a_t]

    # -- rollouts (the loop: ActingWorker.sample) --------------------------
    def _begin_fragment(self) -> None:
        self._draws = draws = self._explore()
        n = self.fragment_length
        self._explore_at = [False] * n if draws is None else draws[0].any(1).tolist()

    def _actions(self, t: int) -> np.ndarray:
        """Epsilon-greedy with the fragment's draws, from one forward pass."""
        actions = self._forward()[0].argmax(axis=1)
        if self._explore_at[t]:
            draws = self._draws
            actions = np.where(draws[0][t], draws[1][t], actions)
        return actions

    def _end_fragment(self) -> None:
        if self._noisy and not self._noise_per_pass:
            self._fragment_noise = None  # the next fragment's noise, drawn for this pass
            self._noised_numpy = None
        self._forward(keep=True)

    def _forward(self, keep: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Q-values and kept values of the envs' observations (one pass, with the last
        step's time-limit final observations and, after new weights, the pending steps as
        extra rows); the kept values go to the adder. ``keep``: the pass at a fragment's
        end, kept for the next fragment's first step."""
        n, adder = self.num_envs, self.adder
        cached, self._q_next = self._q_next, None
        finals = len(adder.finals())
        if cached is not None and not finals:
            adder.set_q(cached[1])
            return cached
        parts = [self._obs, adder.final_obs()] if finals else [self._obs]
        pending = 0
        if self._requote:  # new weights: the pending steps' Q(s_t)[a_t] too, same pass
            self._requote = False
            obs, actions = adder.pending_obs()
            pending = len(actions)
            if pending:
                parts.append(obs)
        q, kept = self.values(np.concatenate(parts) if len(parts) > 1 else parts[0], noise=True)
        if pending:
            adder.set_pending_q(kept[len(kept) - pending :])
        out = (q[:n], kept[:n])
        adder.set_q(out[1], kept[n : n + finals] if finals else None)
        if keep:
            self._q_next = out
        return out

    def td_errors(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """float32 priorities of a batch under the synced weights (online = target; noisy
        layers at their mean weights), from two new passes: what :meth:`sample`'s
        priorities equal (without noise), made from its acting passes. |td| for scalar and
        HL-Gauss heads, the cross-entropy for C51."""
        n = len(batch["action"])
        if n == 0:
            return np.zeros(0, np.float32)
        q_all, kept = self.values(np.concatenate([batch["obs"], batch["next_obs"]]))
        b = batch
        if self._c51:
            taken = kept[np.arange(n), b["action"]]
            return c51_priorities_numpy(taken, kept[n:], b["reward"], b["discount"], self._support)
        q, q_next = q_all[:n], q_all[n:]
        return td_errors_numpy(
            q, q_next, q_next, b["action"], b["reward"], b["discount"], self.double_q
        )
