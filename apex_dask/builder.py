"""What each Ape-X component is built with, read from the one config tree.

Both runners (``apex_dask.local`` in one process, ``apex_dask.runtime.driver``
on Dask) build the same learner and env workers; these functions are the one
place that maps :class:`~apex_dask.config.ApexConfig` fields to the
components' explicit arguments. The runners add only what differs per
instance (epsilon, seed) or per runtime (timeouts, run id).
"""

from __future__ import annotations

from typing import Any

from apex_dask.algo.results import derive_seed
from apex_dask.config import ApexConfig

__all__ = ["env_worker_kwargs", "learner_kwargs"]


def learner_kwargs(cfg: ApexConfig) -> dict[str, Any]:
    """Keyword arguments of :class:`apex_dask.algo.learner.Learner` (after the spaces)."""
    lc = cfg.learner
    return {
        "hiddens": lc.hiddens,
        "dueling": lc.dueling,
        "double_q": lc.double_q,
        "lr": lc.lr,
        "adam_eps": lc.adam_eps,
        "grad_clip": lc.grad_clip,
        "target_update_freq": lc.target_update_freq,
        "device": lc.device,
        "num_threads": lc.num_threads,
        "seed": derive_seed(cfg.seed, "learner"),
    }


def env_worker_kwargs(cfg: ApexConfig) -> dict[str, Any]:
    """Keyword arguments every :class:`apex_dask.algo.env_worker.EnvWorker` shares
    (each adds its own ``epsilon`` and ``seed``)."""
    lc = cfg.learner
    return {
        "n_step": lc.n_step,
        "gamma": lc.gamma,
        "fragment_length": cfg.workers.rollout_fragment_length,
        "hiddens": lc.hiddens,
        "dueling": lc.dueling,
        "double_q": lc.double_q,
    }
