"""The Ape-X learner: one n-step double-DQN update per replayed batch.

Usage loop (a runner or actor owns the queueing around it)::

    learner = Learner(obs_space, act_space, lr=5e-4, target_update_freq=500_000)
    td_abs, metrics = learner.update(sample.data, sample.weights)
    shard.update_priorities(sample.indices, td_abs, sample.generations)  # new priorities
    version, weights = learner.get_weights()             # for env workers

Each update minimises the importance-weighted Huber loss of
:func:`apex_dask.algo.loss.dqn_loss` with Adam, clipping the global gradient
norm to ``grad_clip``. ``steps_trained`` counts *transitions* (batch rows);
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
with the previous update, :mod:`apex_dask.algo.device_batches`), queues the
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
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from apex_dask.algo.device_batches import (
    AMP_MODES,
    MEMORY_FORMATS,
    BatchStager,
    FinishedUpdate,
    ResultPipe,
    check_device_options,
    device_memory,
)
from apex_dask.algo.loss import dqn_loss
from apex_dask.algo.networks import build_q_network

__all__ = [
    "AMP_MODES",
    "MEMORY_FORMATS",
    "Learner",
    "NonFiniteLossError",
    "check_device_options",
    "resolve_device",
    "module_weights",
    "to_numpy_tree",
    "to_torch_tree",
]


class NonFiniteLossError(FloatingPointError):
    """A NaN or infinite loss or gradient norm; raised before the step, so the weights
    stay those of the last finite update. The message is one line naming the update."""


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when torch sees a GPU, else ``"cpu"``; others pass through."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    torch.device(device)  # raises on nonsense
    return device


def module_weights(module: torch.nn.Module) -> dict[str, np.ndarray]:
    """A plain dict of CPU numpy copies of ``module.state_dict()``."""
    return {k: v.detach().to("cpu", copy=True).numpy() for k, v in module.state_dict().items()}


def to_numpy_tree(obj: Any) -> Any:
    """Tensors -> CPU numpy arrays, recursively through dicts/lists/tuples (plain dicts out)."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True).numpy()
    if isinstance(obj, Mapping):
        return {k: to_numpy_tree(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_numpy_tree(v) for v in obj)
    return obj


def to_torch_tree(obj: Any) -> Any:
    """Numpy arrays -> CPU tensors, recursively (inverse of :func:`to_numpy_tree`)."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.array(obj, copy=True))
    if isinstance(obj, Mapping):
        return {k: to_torch_tree(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return type(obj)(to_torch_tree(v) for v in obj)
    return obj


class Learner:
    """Online + target Q-networks and Adam; see the module docstring for the maths.

    ``num_threads`` (if given) calls ``torch.set_num_threads`` for the whole
    process; ``seed`` fixes the initial weights without touching torch's
    global random state.
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        *,
        hiddens: Sequence[int] = (256,),
        dueling: bool = True,
        double_q: bool = True,
        lr: float = 5e-4,
        adam_eps: float = 1e-8,
        grad_clip: float = 40.0,
        target_update_freq: int = 500_000,
        device: str = "auto",
        num_threads: int | None = None,
        seed: int = 0,
        amp: str = "off",
        compile: bool = False,
        memory_format: str = "contiguous",
        pipeline: bool | None = None,
    ) -> None:
        if num_threads is not None:
            torch.set_num_threads(int(num_threads))
        if target_update_freq < 1:
            raise ValueError(f"target_update_freq must be >= 1, got {target_update_freq}")
        self.device = resolve_device(device)
        check_device_options(self.device, amp=amp, compile=compile, memory_format=memory_format)
        cuda = torch.device(self.device).type == "cuda"
        self.pipeline = cuda if pipeline is None else bool(pipeline)
        self.amp = amp
        self.memory_format = memory_format
        self.double_q = bool(double_q)
        self.grad_clip = float(grad_clip)
        self.target_update_freq = int(target_update_freq)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            online = build_q_network(observation_space, action_space, hiddens, dueling)
        self.online = online.to(self.device)
        if memory_format == "channels_last":
            self.online = self.online.to(memory_format=torch.channels_last)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        # the pipelined path skips a non-finite step on the device (fused Adam's found_inf)
        fused = {"fused": True} if self.pipeline else {}
        self.optimizer = torch.optim.Adam(self.online.parameters(), lr=lr, eps=adam_eps, **fused)
        self._nets = (self.online, self.target)
        if compile:
            self._nets = (torch.compile(self.online), torch.compile(self.target))
        self._stager: BatchStager | None = None
        self._results: ResultPipe | None = None
        if self.pipeline:
            self._stager = BatchStager(self.device)
            self._results = ResultPipe(self.device)
        self.steps_trained = 0
        self.num_updates = 0
        self.num_target_updates = 0
        self._last_target_update = 0
        self._version = 0
        self._weights_cache: tuple[int, dict[str, np.ndarray]] | None = None

    @property
    def version(self) -> int:
        """Weights version: the number of updates applied."""
        return self._version

    def _inputs(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        if self.memory_format == "channels_last":
            for key in ("obs", "next_obs"):
                if batch[key].dim() == 4:
                    batch[key] = batch[key].contiguous(memory_format=torch.channels_last)
        return batch

    def _loss(self, batch: Mapping[str, torch.Tensor], w: torch.Tensor) -> Any:
        online, target = self._nets
        if self.amp == "bf16":
            kind = torch.device(self.device).type
            with torch.autocast(kind, dtype=torch.bfloat16):
                return dqn_loss(online, target, batch, w, double_q=self.double_q)
        return dqn_loss(online, target, batch, w, double_q=self.double_q)

    def _count(self, n: int) -> None:
        self.steps_trained += n
        self.num_updates += 1
        self._version += 1
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
        """Queue one update (pipelined path); the results of the earlier updates still
        queued, oldest first, all but this one (see the module docstring).

        Raises :class:`NonFiniteLossError` when one of them was not finite (its
        step was skipped on the device).
        """
        if self._stager is None or self._results is None:
            raise RuntimeError("submit() needs the pipelined path (Learner(pipeline=True))")
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

    def get_weights(self) -> tuple[int, dict[str, np.ndarray]]:
        """``(version, {name: CPU numpy array})`` of the online net; one copy per version.
        Raises :class:`NonFiniteLossError` if a queued update was not finite."""
        self.check_finite()
        if self._weights_cache is None or self._weights_cache[0] != self._version:
            self._weights_cache = (self._version, module_weights(self.online))
        return self._weights_cache

    def counters(self) -> dict[str, int]:
        """``steps_trained``, ``num_updates``, ``num_target_updates``, ``version``."""
        return {
            "steps_trained": self.steps_trained,
            "num_updates": self.num_updates,
            "num_target_updates": self.num_target_updates,
            "last_target_update": self._last_target_update,
            "version": self._version,
        }

    def state_dict(self) -> dict[str, Any]:
        """Plain dict of CPU numpy arrays: ``online``, ``target``, ``optimizer``, ``counters``.
        Raises :class:`NonFiniteLossError` if a queued update was not finite."""
        self.check_finite()
        return {
            "online": module_weights(self.online),
            "target": module_weights(self.target),
            "optimizer": to_numpy_tree(self.optimizer.state_dict()),
            "counters": self.counters(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (nets, optimizer, counters)."""

        def tensors(d: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
            return {k: torch.as_tensor(np.asarray(v)) for k, v in d.items()}

        self.online.load_state_dict(tensors(state["online"]))
        self.target.load_state_dict(tensors(state["target"]))
        self.optimizer.load_state_dict(to_torch_tree(state["optimizer"]))
        for group in self.optimizer.param_groups:  # the saved groups carry the saver's choice
            group["fused"] = True if self.pipeline else None
            group["foreach"] = None
            for p in group["params"]:  # fused Adam keeps its step count on the device
                if "step" in (st := self.optimizer.state.get(p, {})):
                    where = p.device if self.pipeline else torch.device("cpu")
                    st["step"] = st["step"].to(where, torch.float32)
        c = state["counters"]
        self.steps_trained = int(c["steps_trained"])
        self.num_updates = int(c["num_updates"])
        self.num_target_updates = int(c["num_target_updates"])
        self._last_target_update = int(c["last_target_update"])
        self._version = int(c["version"])
        self._weights_cache = None
