"""What every agent's learner shares: the contract, the counters, weights as numpy.

The learner actor and the in-process runner hold a learner only through
:class:`LearnerProtocol`. One loop drives every agent's learner::

    for batch in batches:
        for done in learner.submit(batch.data, batch.weights, tag=batch):
            send(done.tag.priority_update(done.td_abs))   # to the batch's source shard
    for done in learner.drain(): ...              # before stopping or reading weights
    version, weights = learner.get_weights()      # {name: CPU array}, one copy per version

``submit`` returns the finished updates: the batch's own at once on a plain
learner (``pipeline`` False), the one before it on a pipelined learner (a CUDA
device: results are read one update later, with no blocking sync).

:class:`LearnerBase` gives a learner the counters (``steps_trained`` counts
transitions; ``version`` grows by one per update), the weights snapshot per
version, and the plain ``submit``/``drain`` made from ``update``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import numpy as np
import torch

from apex_dask.algo.agents.config import LearnerConfig
from apex_dask.algo.agents.device_batches import FinishedUpdate

__all__ = [
    "LearnerBase",
    "LearnerProtocol",
    "NonFiniteLossError",
    "WeightsMismatch",
    "check_weights",
    "load_weights",
    "module_weights",
    "resolve_device",
    "to_numpy_tree",
    "to_torch_tree",
]


class NonFiniteLossError(FloatingPointError):
    """A NaN or infinite loss or gradient norm; raised before the step, so the weights
    stay those of the last finite update. The message is one line naming the update."""


class WeightsMismatch(ValueError):
    """Weights that do not fit the network a config builds; the message is one line."""


def resolve_device(device: str) -> str:
    """``"auto"`` -> ``"cuda"`` when torch sees a GPU, else ``"cpu"``; others pass through."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    torch.device(device)  # raises on nonsense
    return device


def module_weights(module: torch.nn.Module) -> dict[str, np.ndarray]:
    """A plain dict of CPU numpy copies of ``module.state_dict()``."""
    return {k: v.detach().to("cpu", copy=True).numpy() for k, v in module.state_dict().items()}


def load_weights(module: torch.nn.Module, weights: Mapping[str, Any]) -> None:
    """``module.load_state_dict`` from a dict of arrays (as :func:`module_weights` gives)."""
    module.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in weights.items()})


def check_weights(net: torch.nn.Module, weights: Mapping[str, Any]) -> None:
    """Raise :class:`WeightsMismatch` unless ``weights`` has exactly ``net``'s tensors,
    each of the same shape and finite (the first difference is named)."""
    want = {k: tuple(v.shape) for k, v in net.state_dict().items()}
    missing = [k for k in want if k not in weights]
    if missing:
        raise WeightsMismatch(f"the weights lack {missing[0]!r} ({len(missing)} tensor(s) missing)")
    extra = [k for k in weights if k not in want]
    if extra:
        raise WeightsMismatch(f"the weights hold {extra[0]!r}, which the network does not have")
    for k, shape in want.items():
        got = tuple(np.shape(weights[k]))
        if got != shape:
            raise WeightsMismatch(f"{k!r} has shape {list(got)}, the network wants {list(shape)}")
        if not np.all(np.isfinite(np.asarray(weights[k], dtype=np.float64))):
            raise WeightsMismatch(f"{k!r} holds NaN or inf")


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


class LearnerProtocol(Protocol):
    """The contract of every agent's learner (see the module docstring)."""

    device: str
    pipeline: bool
    steps_trained: int
    num_updates: int
    num_target_updates: int

    @property
    def version(self) -> int:
        """Weights version: the number of updates applied."""
        ...

    def update(
        self, data: Mapping[str, np.ndarray], weights: np.ndarray
    ) -> tuple[np.ndarray, dict[str, float]]:
        """One gradient update on a batch (``data``, importance ``weights``): the batch's
        new ``|td|`` priorities and the update's metrics (``loss``, ``mean_q``,
        ``grad_norm``)."""
        ...

    def submit(
        self, data: Mapping[str, np.ndarray], weights: np.ndarray, tag: Any = None
    ) -> list[FinishedUpdate]:
        """Start an update on a batch (``tag`` comes back with its results); the updates
        that finished, this one's at once on a plain learner."""
        ...

    def drain(self) -> list[FinishedUpdate]:
        """The updates still in flight, finished (before stopping or reading weights)."""
        ...

    def get_weights(self) -> tuple[int, dict[str, np.ndarray]]:
        """``(version, {name: CPU array})`` of the acting network, one copy per version."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Everything a checkpoint keeps: networks, optimizer and counters."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back what :meth:`state_dict` gave (a checkpoint's learner part)."""
        ...

    def counters(self) -> dict[str, int]:
        """The cumulative counters: transitions trained on, updates, target updates."""
        ...

    def device_stats(self) -> dict[str, float]:
        """The device's timings and memory (CUDA learners; empty on a CPU)."""
        ...

    def agent_stats(self) -> dict[str, float]:
        """The metrics this agent declares (its builder's ``metrics``), by name."""
        ...


class LearnerBase:
    """Counters, the weights snapshot and the plain ``submit``/``drain`` of a learner.

    A subclass calls :meth:`_init_shared` with the shared ``learner`` section (the
    process's torch threads, the device, the clip and the target period), sets
    ``online`` (the module whose weights env workers act with), implements
    ``update``, and calls :meth:`_count` once per update. A pipelined subclass
    overrides ``submit``, ``drain``, ``check_finite`` and ``device_stats``; one whose
    agent declares metrics (its builder's ``metrics``) returns them from
    :meth:`agent_stats`.
    """

    online: torch.nn.Module
    device: str = "cpu"
    pipeline: bool = False

    def _init_shared(self, learner: LearnerConfig | None) -> LearnerConfig:
        """What every learner reads of the shared section: ``num_threads`` (for the whole
        process: ``torch.set_num_threads``), ``device``, ``grad_clip`` and
        ``target_update_freq``; the counters start. Returns the section (default if None)."""
        lc = learner if learner is not None else LearnerConfig()
        if lc.num_threads is not None:
            torch.set_num_threads(int(lc.num_threads))
        if lc.target_update_freq < 1:
            raise ValueError(f"target_update_freq must be >= 1, got {lc.target_update_freq}")
        self.device = resolve_device(lc.device)
        self.grad_clip = float(lc.grad_clip)
        self.target_update_freq = int(lc.target_update_freq)
        self._init_counters()
        return lc

    def _init_counters(self) -> None:
        self.steps_trained = 0
        self.num_updates = 0
        self.num_target_updates = 0
        self._last_target_update = 0
        self._version = 0
        self._weights_cache: tuple[int, dict[str, np.ndarray]] | None = None

    def _count(self, n: int) -> None:
        """One update of ``n`` transitions is done."""
        self.steps_trained += n
        self.num_updates += 1
        self._version += 1

    @property
    def version(self) -> int:
        """Weights version: the number of updates applied."""
        return self._version

    def update(
        self, data: Mapping[str, np.ndarray], weights: np.ndarray
    ) -> tuple[np.ndarray, dict[str, float]]:
        """One gradient update: the batch's new ``|td|`` and the metrics (subclasses)."""
        raise NotImplementedError

    def submit(
        self, data: Mapping[str, np.ndarray], weights: np.ndarray, tag: Any = None
    ) -> list[FinishedUpdate]:
        """One update; its results at once (a plain learner is never behind)."""
        td_abs, m = self.update(data, weights)
        n = self.num_updates
        return [FinishedUpdate(tag, n, td_abs, m["loss"], m["mean_q"], m["grad_norm"], True)]

    def drain(self) -> list[FinishedUpdate]:
        """The updates still queued (a plain learner has none)."""
        return []

    def check_finite(self) -> None:
        """Raise :class:`NonFiniteLossError` if a queued update was not finite (a plain
        learner checks each update before its step: nothing to wait for)."""

    def device_stats(self) -> dict[str, float]:
        """Device metrics (CUDA only); ``{}`` here."""
        return {}

    def agent_stats(self) -> dict[str, float]:
        """The metrics its agent declares (its builder's ``metrics``); ``{}`` here."""
        return {}

    def get_weights(self) -> tuple[int, dict[str, np.ndarray]]:
        """``(version, {name: CPU numpy array})`` of the online net; one copy per version.
        Raises :class:`NonFiniteLossError` if a queued update was not finite."""
        self.check_finite()
        if self._weights_cache is None or self._weights_cache[0] != self._version:
            self._weights_cache = (self._version, module_weights(self.online))
        return self._weights_cache

    def counters(self) -> dict[str, int]:
        """``steps_trained``, ``num_updates``, ``num_target_updates``,
        ``last_target_update``, ``version``."""
        return {
            "steps_trained": self.steps_trained,
            "num_updates": self.num_updates,
            "num_target_updates": self.num_target_updates,
            "last_target_update": self._last_target_update,
            "version": self._version,
        }

    def _load_counters(self, counters: Mapping[str, Any]) -> None:
        c = {k: int(v) for k, v in counters.items()}
        self.steps_trained, self.num_updates = c["steps_trained"], c["num_updates"]
        self.num_target_updates, self._version = c["num_target_updates"], c["version"]
        self._last_target_update = c["last_target_update"]
        self._weights_cache = None
