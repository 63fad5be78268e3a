"""The Ape-X learner: one n-step double-DQN update per replayed batch.

Usage loop (a runner or actor owns the queueing around it)::

    learner = Learner(obs_space, act_space, DQNConfig(lr=5e-4, target_update_freq=500_000))
    td_abs, metrics = learner.update(sample.data, sample.weights)
    shard.update_priorities(sample.indices, td_abs, sample.generations)  # new priorities
    version, weights = learner.get_weights()             # for env workers

Each update minimises the importance-weighted loss of the value head
(:mod:`apex_dask.algo.agents.dqn.loss`: the Huber TD loss of a scalar head, C51's or
HL-Gauss's cross-entropy) with Adam, clipping the global gradient norm to ``grad_clip``.
With noisy layers, new noise is drawn before each update for the online net at s, for
the online net's argmax at s' (a twin sharing its parameters,
:func:`~apex_dask.algo.agents.noisy.noise_twin`) and for the target net: three
independent samples, as in NoisyNet's double-DQN loss; all from the learner's own generator (on its device; saved in its state, so a
restored learner makes the same next update). ``steps_trained`` counts *transitions* (batch rows);
the target net becomes a copy of the online net whenever
``steps_trained - steps_trained_at_last_copy >= target_update_freq``
(RLlib's ``UpdateTargetNetwork(by_steps_trained=True)``). ``version`` grows by
one per update, so a weights version is the number of updates behind it.

**The pipelined path** (``pipeline``, default on a CUDA device)::

    for batch in batches:                               # the learner thread
        for done in learner.submit(batch.data, batch.weights, tag=batch):
            send(done.tag, done.td_abs)                 # update k-1's priorities
    for done in learner.drain(): ...                    # before stopping

``submit`` stages the batch through reused pinned buffers (copy overlapped
with the previous update, :mod:`apex_dask.algo.agents.device_batches`), queues the
update on the device and returns the results of the updates before it, read
one update later: no blocking sync per update. ``update`` still works (submit,
then wait for that update).

**A non-finite loss on the pipelined path.** The finite flag of each update
(loss and gradient norm) is computed on the device and gates the optimizer
step there (fused Adam's ``found_inf``): a non-finite update's step is skipped,
so NaN never reaches the weights, and no host sync is needed for it. The flag
is read with the update's results one update later; a false flag raises
:class:`NonFiniteLossError`, which stops the learner (and the run).
Weights leave the learner only through :meth:`Learner.get_weights` and
:meth:`Learner.state_dict` (published, synced to env workers, saved), and
both first wait for every queued update and raise if any was non-finite: what
is published or saved has passed the check of every update up to it.

Options (off by default; checked when the learner is made, on its device):
``amp="bf16"`` (autocast of the forward passes to bfloat16), ``compile=True``
(``torch.compile`` of both networks), ``memory_format="channels_last"`` (the
CNN's weights and image inputs in channels-last layout).
"""

from __future__ import annotations

import copy
import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from apex_dask.algo.agents.base import (
    LearnerBase,
    NonFiniteLossError,
    load_weights,
    module_weights,
    to_numpy_tree,
    to_torch_tree,
)
from apex_dask.algo.agents.config import LearnerConfig
from apex_dask.algo.agents.device_batches import (
    AMP_MODES,
    MEMORY_FORMATS,
    BatchStager,
    FinishedUpdate,
    ResultPipe,
    check_device_options,
    device_memory,
)
from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.heads import bin_edges, support
from apex_dask.algo.agents.dqn.loss import c51_loss, dqn_loss, hl_gauss_loss
from apex_dask.algo.agents.dqn.networks import q_network
from apex_dask.algo.agents.noisy import draw_noise, noise_twin

__all__ = ["AMP_MODES", "MEMORY_FORMATS", "Learner", "NonFiniteLossError", "check_device_options"]


class Learner(LearnerBase):
    """Online + target Q-networks and Adam; see the module docstring for the maths.

    ``config.num_threads`` (if given) calls ``torch.set_num_threads`` for the
    whole process; ``seed`` fixes the initial weights without touching torch's
    global random state; ``config.pipeline`` (None: on a CUDA device) picks the
    pipelined path.
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        config: DQNConfig | None = None,
        learner: LearnerConfig | None = None,
        *,
        seed: int = 0,
    ) -> None:
        o = config if config is not None else DQNConfig()
        lc = self._init_shared(learner)
        check_device_options(
            self.device, amp=o.amp, compile=o.compile, memory_format=o.memory_format, section="dqn"
        )
        cuda = torch.device(self.device).type == "cuda"
        self.pipeline = cuda if o.pipeline is None else bool(o.pipeline)
        self.amp = o.amp
        self.memory_format = o.memory_format
        self.double_q = bool(o.double_q)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            online = q_network(observation_space, action_space, o)
        self.online = online.to(self.device)
        if o.memory_format == "channels_last":
            self.online = self.online.to(memory_format=torch.channels_last)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.head = o.head
        values = support(o)
        self._support = None if values is None else torch.from_numpy(values).to(self.device)
        self._edges = torch.from_numpy(bin_edges(o)).to(self.device)
        self._sigma = float(o.hl_gauss_sigma_ratio) * (o.v_max - o.v_min) / o.num_bins
        ends = bin_edges(o) if values is None or o.head == "hl_gauss" else values
        self._bounds = (float(ends[0]), float(ends[-1]))  # as float32 numbers, read on the host
        self.noisy = bool(o.noisy)
        self._noise: torch.Generator | None = None
        # noisy: the online net under noise of its own, for the argmax at s'
        self.online_next: torch.nn.Module | None = None
        if self.noisy:
            self._noise = torch.Generator(device=self.device)
            self._noise.manual_seed(int(seed) + 1)
            self.online_next = noise_twin(self.online)
        # the pipelined path skips a non-finite step on the device (fused Adam's found_inf)
        fused = {"fused": True} if self.pipeline else {}
        self.optimizer = torch.optim.Adam(
            self.online.parameters(), lr=o.lr, eps=lc.adam_eps, **fused
        )
        # what the loss calls: Q-values (scalar head) or logits (C51, HL-Gauss)
        scalar = self.head == "scalar"
        self._nets = (
            (self.online, self.target) if scalar else (self.online.logits, self.target.logits)
        )
        chooser = self.online_next
        if chooser is not None and not scalar:
            chooser = chooser.logits
        if o.compile:
            self._nets = (torch.compile(self._nets[0]), torch.compile(self._nets[1]))
            chooser = None if chooser is None else torch.compile(chooser)
        self._chooser = chooser
        self._stager: BatchStager | None = None
        self._results: ResultPipe | None = None
        if self.pipeline:
            self._stager = BatchStager(self.device)
            self._results = ResultPipe(self.device)

    def _inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.memory_format == "channels_last":
            for key in ("obs", "next_obs"):
                if batch[key].dim() == 4:
                    batch[key] = batch[key].contiguous(memory_format=torch.channels_last)
        return batch

    def _loss(self, batch: Mapping[str, torch.Tensor], w: torch.Tensor) -> Any:
        if self._noise is not None:  # new noise for this update: online, its argmax, target
            draw_noise(self.online, self._noise)
            draw_noise(self.online_next, self._noise)
            draw_noise(self.target, self._noise)
        if self.amp == "bf16":
            kind = torch.device(self.device).type
            with torch.autocast(kind, dtype=torch.bfloat16):
                return self._head_loss(batch, w)
        return self._head_loss(batch, w)

    def _head_loss(self, batch: Mapping[str, torch.Tensor], w: torch.Tensor) -> Any:
        online, target = self._nets
        chooser = self._chooser
        if self.head == "c51":
            return c51_loss(
                online,
                target,
                batch,
                w,
                self._support,
                double_q=self.double_q,
                bounds=self._bounds,
                online_next=chooser,
            )
        if self.head == "hl_gauss":
            return hl_gauss_loss(
                online,
                target,
                batch,
                w,
                self._support,
                self._edges,
                self._sigma,
                double_q=self.double_q,
                bounds=self._bounds,
                online_next=chooser,
            )
        return dqn_loss(online, target, batch, w, double_q=self.double_q, online_next=chooser)

    def _count(self, n: int) -> None:
        super()._count(n)
        if self.steps_trained - self._last_target_update >= self.target_update_freq:
            self.update_target()

    def _tensor(self, arr: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
        t = torch.as_tensor(np.asarray(arr))
        return t.to(self.device, dtype=dtype, non_blocking=True)

    def update(
        self, data: Mapping[str, np.ndarray], weights: np.ndarray
    ) -> tuple[np.ndarray, dict[str, float]]:
        """One gradient step on a replayed batch.

        ``data`` holds ``obs, action, reward, next_obs, discount`` arrays (extra keys
        are ignored); ``weights`` the importance weights. Returns float32 |td| per
        item (computed before the step, the new priorities) and
        ``{"loss", "mean_q", "grad_norm"}`` (norm before clipping). A non-finite loss or
        gradient norm raises :class:`NonFiniteLossError` before the optimizer step.
        On the pipelined path this is :meth:`submit` followed by :meth:`drain`.
        """
        if self.pipeline:
            done = self.submit(data, weights)
            done += self.drain()
            return done[-1].td_abs, done[-1].metrics()
        batch = {
            "obs": self._tensor(data["obs"]),
            "action": self._tensor(data["action"], torch.int64),
            "reward": self._tensor(data["reward"], torch.float32),
            "next_obs": self._tensor(data["next_obs"]),
            "discount": self._tensor(data["discount"], torch.float32),
        }
        w = self._tensor(weights, torch.float32)
        out = self._loss(self._inputs(batch), w)
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.online.parameters(), self.grad_clip)
        scalars = torch.stack([out.loss.detach(), out.mean_q, grad_norm.detach()]).cpu()
        loss, mean_q, norm = (float(x) for x in scalars.tolist())
        if not (math.isfinite(loss) and math.isfinite(norm)):
            # before the step: the weights stay those of the last finite update
            raise NonFiniteLossError(
                f"non-finite loss ({loss}) or gradient norm ({norm}) at update "
                f"{self.num_updates + 1} (after {self.steps_trained} transitions trained); "
                f"the weights of update {self.num_updates} are kept"
            )
        self.optimizer.step()
        self._count(int(batch["action"].shape[0]))
        td_abs = out.td_abs.to("cpu").float().numpy()
        return td_abs, {"loss": loss, "mean_q": mean_q, "grad_norm": norm}

    def submit(
        self, data: Mapping[str, np.ndarray], weights: np.ndarray, tag: Any = None
    ) -> list[FinishedUpdate]:
        """Queue one update; the results of the earlier updates still queued, oldest
        first, all but this one (see the module docstring). Off the pipelined path:
        :meth:`update`, its results at once.

        Raises :class:`NonFiniteLossError` when one of them was not finite (its
        step was skipped on the device).
        """
        if self._stager is None or self._results is None:
            return super().submit(data, weights, tag)
        cuda = self._stager.cuda
        t0 = time.perf_counter()
        staged = self._stager.stage(data, weights)
        stage_s = time.perf_counter() - t0
        staged.wait()
        batch = self._inputs(dict(staged.tensors))
        w = batch.pop("weights")
        compute = None
        if cuda:
            compute = (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            compute[0].record()
        out = self._loss(batch, w)
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.online.parameters(), self.grad_clip)
        loss = out.loss.detach().float()
        finite = torch.isfinite(loss) & torch.isfinite(norm.detach())
        self.optimizer.found_inf = (~finite).float()  # fused Adam skips the step on the device
        try:
            self.optimizer.step()
        finally:
            del self.optimizer.found_inf
        if compute is not None:
            compute[1].record()
        scalars = torch.stack([loss, out.mean_q.float(), norm.detach().float(), finite.float()])
        self._count(int(w.shape[0]))
        self._results.push(
            tag, self.num_updates, scalars, out.td_abs.float(), compute, staged.h2d_events, stage_s
        )
        done = []
        while len(self._results) > 1:
            done.append(self._finished(self._results.pop()))
        return done

    def drain(self) -> list[FinishedUpdate]:
        """Wait for every queued update; their results, oldest first (pipelined path)."""
        done: list[FinishedUpdate] = []
        while self._results is not None and len(self._results):
            done.append(self._finished(self._results.pop()))
        return done

    def _finished(self, done: FinishedUpdate) -> FinishedUpdate:
        if not done.finite:
            self._raise_non_finite(done.number, f"loss {done.loss}, gradient norm {done.grad_norm}")
        return done

    def _raise_non_finite(self, number: int, what: str) -> None:
        raise NonFiniteLossError(
            f"non-finite {what} at update {number}; its optimizer step was skipped on the "
            f"device, so the weights hold no NaN; weights are published and saved only "
            f"after every update's check"
        )

    def check_finite(self) -> None:
        """Wait for the queued updates; raise :class:`NonFiniteLossError` if one was not
        finite (they stay queued for :meth:`submit` / :meth:`drain`). A no-op off the
        pipelined path, whose check comes before each step."""
        if self._results is not None and len(self._results):
            bad = self._results.check()
            if bad is not None:
                self._raise_non_finite(bad, "loss or gradient norm")

    def device_stats(self) -> dict[str, float]:
        """``learner/device_busy``, ``learner/h2d_s``, ``learner/device_mem_bytes``,
        ``learner/device_mem_peak_bytes`` on a CUDA device (pipelined); ``{}`` on CPU."""
        out = self._results.device_stats() if self._results is not None else {}
        return {**out, **device_memory(self.device)}

    def update_target(self) -> None:
        """Copy the online weights into the target net now."""
        self.target.load_state_dict(self.online.state_dict())
        self.num_target_updates += 1
        self._last_target_update = self.steps_trained

    def state_dict(self) -> dict[str, Any]:
        """Plain dict of CPU numpy arrays: ``online``, ``target``, ``optimizer``, ``counters``
        (and ``noise_rng``, the noise generator's state, with noisy layers).
        Raises :class:`NonFiniteLossError` if a queued update was not finite."""
        self.check_finite()
        state = {
            "online": module_weights(self.online),
            "target": module_weights(self.target),
            "optimizer": to_numpy_tree(self.optimizer.state_dict()),
            "counters": self.counters(),
        }
        if self._noise is not None:
            state["noise_rng"] = self._noise.get_state().numpy().copy()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (nets, optimizer, counters)."""

        load_weights(self.online, state["online"])
        load_weights(self.target, state["target"])
        self.optimizer.load_state_dict(to_torch_tree(state["optimizer"]))
        for group in self.optimizer.param_groups:  # the saved groups carry the saver's choice
            group["fused"] = True if self.pipeline else None
            group["foreach"] = None
            for p in group["params"]:  # fused Adam keeps its step count on the device
                if "step" in (st := self.optimizer.state.get(p, {})):
                    where = p.device if self.pipeline else torch.device("cpu")
                    st["step"] = st["step"].to(where, torch.float32)
        self._load_counters(state["counters"])
        if self._noise is not None:
            saved = state.get("noise_rng")
            try:
                self._noise.set_state(torch.as_tensor(np.asarray(saved, np.uint8)))
            except (RuntimeError, TypeError, ValueError):  # none saved, or another device's
                self._noise.manual_seed(1 + int(self.num_updates))
