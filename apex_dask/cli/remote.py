"""Checks on a remote cluster, once connected and before any actor exists.

::

    client = connect(address=...)
    check_learner_worker(client, cfg, spaces)   # UsageError (exit 2), one line

The learner's worker is chosen as the driver will choose it
(:func:`~apex_dask.runtime.orchestration.placement.plan_placement`); then

- ``learner.device=cuda[:N]`` must exist there: torch on that worker is
  asked (a task on it, bounded by ``timeout_s``), since the driver's machine
  may have no GPU while the worker does, or the other way round;
- what each worker will hold (the replay, the learner's networks and batches,
  env workers; :mod:`.memory`) must fit its memory limit.

A placement that cannot be planned, or a worker that does not answer in
time, is left to the driver, which reports it in its own words.
"""

from __future__ import annotations

from typing import Any

from apex_dask.cli.checks import (
    EnvSpaces,
    UsageError,
    cuda_device_count,
    device_problem,
)
from apex_dask.cli.memory import check_memory, plan_holdings
from apex_dask.config import ApexConfig

__all__ = ["check_learner_worker"]


def _learner_worker(client: Any, cfg: ApexConfig) -> tuple[str, dict[str, Any], Any] | None:
    """``(address, scheduler info of the workers, placement)``: where the learner goes."""
    from apex_dask.runtime.orchestration.placement import (
        plan_placement,
        workers_from_scheduler_info,
    )

    try:
        info = client.scheduler_info(n_workers=-1)
        workers = workers_from_scheduler_info(info)
        if not workers:
            return None  # the driver waits for workers and says so
        placement = plan_placement(
            workers,
            num_shards=cfg.replay.num_shards,
            num_env_workers=cfg.workers.num_workers,
            learner_worker=cfg.topology.learner_worker,
            replay_placement=cfg.replay.placement,
        )
        return placement.learner.address, info["workers"], placement
    except Exception:  # placement errors are the driver's to report
        return None


def _worker_cuda_devices(client: Any, address: str, timeout_s: float) -> int | None:
    """How many CUDA devices torch sees on the worker at ``address`` (None: no answer)."""
    future = client.submit(
        cuda_device_count, workers=[address], allow_other_workers=False, pure=False
    )
    try:
        return int(future.result(timeout=timeout_s))
    except Exception:  # lost, busy or slow: the driver's own bounded calls report it
        return None
    finally:
        future.cancel()


def check_learner_worker(
    client: Any, cfg: ApexConfig, spaces: EnvSpaces, timeout_s: float = 60.0
) -> None:
    """The learner's device and the replay's memory, on the worker that will hold them."""
    found = _learner_worker(client, cfg)
    if found is None:
        return
    address, workers, placement = found
    where = f"the learner's worker {address}"
    if cfg.learner.device.startswith("cuda"):
        count = _worker_cuda_devices(client, address, timeout_s)
        problem = None if count is None else device_problem(cfg.learner.device, count, where)
        if problem:
            raise UsageError(problem)
    limits = {a: float(w.get("memory_limit") or 0) for a, w in workers.items()}
    names = {a: f"the worker {a}" for a in workers}
    names[address] = where
    check_memory(cfg, spaces, plan_holdings(cfg, spaces, placement), limits, names)
