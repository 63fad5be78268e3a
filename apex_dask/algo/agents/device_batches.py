"""Replayed batches to the learner's device, results back, with no blocking sync per update.

The learner's pipelined path (:meth:`apex_dask.algo.agents.dqn.learner.Learner.submit`)::

    stager = BatchStager("cuda")              # two reused pinned host slots, a copy stream
    staged = stager.stage(data, weights)      # numpy -> slot k % 2 -> device, on the copy stream
    staged.wait()                             # the compute stream waits for that copy only
    ... loss, backward, step of batch k, queued on the compute stream ...
    results.push(tag, scalars, td_abs, compute_events, staged.h2d_events)
    done = results.pop()                      # update k-1's, read one update later

**Staging (host to device).** On CUDA each slot holds page-locked (pinned)
host tensors, one per key, reused while the batch's keys, shapes and dtypes
stay the same (reallocated when they change). A slot is rewritten only once
the copy that last read it has finished (its event), so with two slots the
copy of batch k+1 (on the copy stream) runs while batch k computes (on the
compute stream). Arrays cross the bus in their stored dtype: ``uint8``
frames stay ``uint8`` (a quarter of the bytes of ``float32``) and the
network scales them on the device; ``action`` becomes int64 and ``reward``,
``discount`` and the importance weights float32 on the device. Each device
tensor is marked as used by the compute stream (``record_stream``) so the
caching allocator never hands its memory out while the update still reads it.

**Results (device to host).** An update's loss scalars, its finite flag and
its |TD| (the new priorities) are copied into pinned host memory on the
compute stream without blocking, behind an event; :meth:`ResultPipe.pop`
reads them one update later, when the copy is (nearly always) done.

**Timing.** CUDA events around each copy and each update's compute give
``learner/h2d_s`` and ``learner/device_busy`` (compute time / wall time over
the updates read in a window); both exist only on a CUDA device.

On CPU the same classes run without pinning, streams or events (the tests
use them so); the learner's CPU path does not stage at all (a host-to-host
copy is pure cost there).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from apex_dask.algo.agents.config import AMP_MODES, MEMORY_FORMATS

__all__ = [
    "AMP_MODES",
    "MEMORY_FORMATS",
    "DEVICE_METRICS",
    "BatchStager",
    "FinishedUpdate",
    "ResultPipe",
    "StagedBatch",
    "check_device_options",
    "device_memory",
]


def check_device_options(
    device: str, *, amp: str, compile: bool, memory_format: str, section: str
) -> None:
    """Raise ``ValueError`` (one line naming the option, as ``<section>.<key>``, and the
    fix) when ``device`` cannot run the options: bf16 autocast needs a CUDA device with
    bfloat16 or a CPU; ``compile`` needs triton on CUDA and a C compiler on CPU."""
    s = section
    if amp not in AMP_MODES:
        raise ValueError(f"{s}.amp must be one of {AMP_MODES}, got {amp!r}")
    if memory_format not in MEMORY_FORMATS:
        raise ValueError(
            f"{s}.memory_format must be one of {MEMORY_FORMATS}, got {memory_format!r}"
        )
    cuda = torch.device(device).type == "cuda"
    if amp == "bf16" and cuda and not torch.cuda.is_bf16_supported():
        name = torch.cuda.get_device_name(torch.device(device))
        raise ValueError(
            f"{s}.amp: bf16 needs bfloat16 support, which {name} lacks; set {s}.amp: off"
        )
    if compile:
        import importlib.util
        import shutil

        if cuda and importlib.util.find_spec("triton") is None:
            raise ValueError(
                f"{s}.compile: true needs triton on a CUDA device (pip install triton); set {s}.compile: false"
            )
        if not cuda and not any(shutil.which(c) for c in ("cc", "gcc", "clang", "g++")):
            raise ValueError(
                f"{s}.compile: true needs a C compiler on a CPU learner; set {s}.compile: false"
            )


DEVICE_METRICS = (
    "learner/device_busy",
    "learner/h2d_s",
    "learner/device_mem_bytes",
    "learner/device_mem_peak_bytes",
    "learner/stage_s",
    "learner/d2h_wait_s",
)
"""The learner's device metrics: present on a CUDA learner only (absent, not zero, on CPU)."""

# cast on the device after the copy; other keys keep their stored dtype
_DEVICE_DTYPES = {
    "action": torch.int64,
    "reward": torch.float32,
    "discount": torch.float32,
    "weights": torch.float32,
}


def _is_cuda(device: str | torch.device) -> bool:
    return torch.device(device).type == "cuda"


@dataclass
class StagedBatch:
    """A batch on the device: ``tensors`` (``data`` keys and ``weights``), ready once
    :meth:`wait` has made the current stream wait for its copy."""

    tensors: dict[str, torch.Tensor]
    ready: Any = None  # torch.cuda.Event on CUDA
    h2d_events: tuple[Any, Any] | None = None

    def wait(self) -> None:
        """Make the current (compute) stream wait for this batch's copy; no host sync."""
        if self.ready is None:
            return
        stream = torch.cuda.current_stream()
        stream.wait_event(self.ready)
        for t in self.tensors.values():
            t.record_stream(stream)


class BatchStager:
    """Copies numpy batches to ``device`` through ``slots`` reused host buffers.

    ``pin`` (default: whether ``device`` is CUDA) page-locks the host buffers.
    ``allocations`` counts host buffers made (constant once shapes settle).
    """

    def __init__(self, device: str, *, slots: int = 2, pin: bool | None = None) -> None:
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.device = torch.device(device)
        self.cuda = _is_cuda(self.device)
        self.pin = self.cuda if pin is None else bool(pin)
        self._slots: list[dict[str, torch.Tensor]] = [{} for _ in range(slots)]
        self._copied: list[Any] = [None] * slots  # event: the copy that last read the slot
        self._next = 0
        self._stream = torch.cuda.Stream(self.device) if self.cuda else None
        self.allocations = 0

    def _host(self, slot: dict[str, torch.Tensor], key: str, arr: np.ndarray) -> torch.Tensor:
        buf = slot.get(key)
        dtype = torch.from_numpy(np.empty(0, arr.dtype)).dtype
        if buf is None or buf.shape != arr.shape or buf.dtype != dtype:
            buf = torch.empty(arr.shape, dtype=dtype, pin_memory=self.pin)
            slot[key] = buf
            self.allocations += 1
        return buf

    def host_slot(self, index: int) -> dict[str, torch.Tensor]:
        """The host buffers of slot ``index`` (for tests and diagnostics)."""
        return self._slots[index]

    def stage(self, data: Mapping[str, np.ndarray], weights: np.ndarray) -> StagedBatch:
        """Copy ``obs, action, reward, next_obs, discount`` (other keys ignored) and
        ``weights`` into the next host slot, then to the device (non-blocking on CUDA)."""
        k = self._next
        self._next = (k + 1) % len(self._slots)
        if self._copied[k] is not None:
            self._copied[k].synchronize()  # that slot's previous copy has left the host
        slot = self._slots[k]
        arrays = {key: data[key] for key in ("obs", "action", "reward", "next_obs", "discount")}
        arrays["weights"] = weights
        hosts = {}
        for key, value in arrays.items():
            arr = np.asarray(value)
            host = self._host(slot, key, arr)
            np.copyto(host.numpy(), arr, casting="no")
            hosts[key] = host
        if not self.cuda:
            tensors = {
                key: self._cast(key, h.to(self.device, copy=True)) for key, h in hosts.items()
            }
            return StagedBatch(tensors)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self._stream):
            start.record()
            moved = {key: h.to(self.device, non_blocking=True) for key, h in hosts.items()}
            tensors = {key: self._cast(key, t) for key, t in moved.items()}
            end.record()
        self._copied[k] = end
        return StagedBatch(tensors, ready=end, h2d_events=(start, end))

    @staticmethod
    def _cast(key: str, t: torch.Tensor) -> torch.Tensor:
        dtype = _DEVICE_DTYPES.get(key)
        return t if dtype is None or t.dtype == dtype else t.to(dtype)


@dataclass(frozen=True)
class FinishedUpdate:
    """One update's results, read back: its ``tag``, ``td_abs`` (float32 numpy, the new
    priorities), ``loss``, ``mean_q``, ``grad_norm``, whether all were finite, and its
    device times in seconds (``nan`` off CUDA)."""

    tag: Any
    number: int
    td_abs: np.ndarray
    loss: float
    mean_q: float
    grad_norm: float
    finite: bool
    compute_s: float = float("nan")
    h2d_s: float = float("nan")

    def metrics(self) -> dict[str, float]:
        """``{"loss", "mean_q", "grad_norm"}`` as :meth:`Learner.update` returns them."""
        return {"loss": self.loss, "mean_q": self.mean_q, "grad_norm": self.grad_norm}


@dataclass
class _InFlight:
    tag: Any
    number: int
    scalars: torch.Tensor  # host: loss, mean_q, grad_norm, finite
    td_abs: torch.Tensor  # host
    done: Any  # event on CUDA
    compute: tuple[Any, Any] | None
    h2d: tuple[Any, Any] | None
    stage_s: float


class ResultPipe:
    """Updates queued on the device whose results have not been read yet (oldest first).

    ``push`` starts the device-to-host copies without waiting; ``pop`` waits for the
    oldest (usually finished already); ``check`` waits for all and says whether
    every one was finite, leaving them to be popped. Device times of popped
    updates feed :meth:`device_stats`.
    """

    def __init__(self, device: str, window: int = 50) -> None:
        self.cuda = _is_cuda(device)
        self._queue: deque[_InFlight] = deque()
        # per update read: wall time, compute s, h2d s, host staging s, host wait for results s
        self._times: deque[tuple[float, ...]] = deque(maxlen=window)

    def __len__(self) -> int:
        return len(self._queue)

    def push(
        self,
        tag: Any,
        number: int,
        scalars: torch.Tensor,
        td_abs: torch.Tensor,
        compute: tuple[Any, Any] | None = None,
        h2d: tuple[Any, Any] | None = None,
        stage_s: float = float("nan"),
    ) -> None:
        """Queue the copies of ``scalars`` (loss, mean_q, grad_norm, finite) and ``td_abs``;
        ``stage_s``: the host time its batch took to stage."""
        host_s = torch.empty(scalars.shape, dtype=torch.float32, pin_memory=self.cuda)
        host_td = torch.empty(td_abs.shape, dtype=torch.float32, pin_memory=self.cuda)
        host_s.copy_(scalars.detach(), non_blocking=self.cuda)
        host_td.copy_(td_abs.detach(), non_blocking=self.cuda)
        done = None
        if self.cuda:
            done = torch.cuda.Event()
            done.record()
        self._queue.append(_InFlight(tag, number, host_s, host_td, done, compute, h2d, stage_s))

    def check(self) -> int | None:
        """Wait for every queued update; the number of the first non-finite one, or None."""
        for item in self._queue:
            if item.done is not None:
                item.done.synchronize()
            if not bool(item.scalars[3].item() > 0.5):
                return item.number
        return None

    def pop(self) -> FinishedUpdate:
        """The oldest queued update's results (waits for its copies)."""
        item = self._queue.popleft()
        t0 = time.perf_counter()
        if item.done is not None:
            item.done.synchronize()
        wait_s = time.perf_counter() - t0
        loss, mean_q, norm, finite = (float(x) for x in item.scalars.tolist())
        compute_s = h2d_s = float("nan")
        if item.compute is not None:
            compute_s = item.compute[0].elapsed_time(item.compute[1]) / 1e3
        if item.h2d is not None:
            h2d_s = item.h2d[0].elapsed_time(item.h2d[1]) / 1e3
        if self.cuda:
            self._times.append((time.perf_counter(), compute_s, h2d_s, item.stage_s, wait_s))
        return FinishedUpdate(
            item.tag,
            item.number,
            item.td_abs.numpy().copy(),
            loss,
            mean_q,
            norm,
            finite > 0.5,
            compute_s,
            h2d_s,
        )

    def device_stats(self) -> dict[str, float]:
        """``learner/device_busy``, ``learner/h2d_s``, ``learner/stage_s`` and
        ``learner/d2h_wait_s`` over the window (CUDA only, else {})."""
        if not self.cuda or len(self._times) < 2:
            return {}
        times = list(self._times)
        wall = times[-1][0] - times[0][0]
        busy = sum(t[1] for t in times[1:])
        out = {"learner/device_busy": min(1.0, busy / wall) if wall > 0 else float("nan")}
        for i, name in ((2, "learner/h2d_s"), (3, "learner/stage_s"), (4, "learner/d2h_wait_s")):
            out[name] = float(np.nanmean([t[i] for t in times]))
        return out


def device_memory(device: str) -> dict[str, float]:
    """``learner/device_mem_bytes`` and ``learner/device_mem_peak_bytes`` (allocated by
    torch's caching allocator now and at its peak) on a CUDA device; ``{}`` elsewhere."""
    if not _is_cuda(device):
        return {}
    dev = torch.device(device)
    return {
        "learner/device_mem_bytes": float(torch.cuda.memory_allocated(dev)),
        "learner/device_mem_peak_bytes": float(torch.cuda.max_memory_allocated(dev)),
    }
