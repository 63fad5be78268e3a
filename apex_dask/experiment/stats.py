"""Pure helpers that turn component stats into the flat result dict.

Both runners (in-process and Dask) build result dicts from the same pieces,
with the metric names of ``docs/metrics.md``:

* :func:`episode_metrics` -- ``env/episode_return_mean``, ``env/episode_len_mean``,
  ``env/episodes`` from the episodes of the lowest-epsilon third of workers
  (:func:`apex_dask.algo.rollout.exploration.lowest_epsilon_workers`); NaN means none
  finished in the window.
* :func:`window_stat_metrics` -- a :class:`~apex_dask.experiment.timers.WindowStat`
  flattened to ``name`` (mean), ``name/std``, ``name/q0`` ... ``name/q100``.
* :func:`derive_seed` -- the seed of each component from the run's base seed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from apex_dask.experiment.timers import QUANTILES

__all__ = [
    "ROLES",
    "derive_seed",
    "episode_metrics",
    "mean_or_nan",
    "window_stat_metrics",
]

ROLES: dict[str, int] = {"learner": 0, "worker": 1, "shard": 2, "eval": 3, "driver": 4}
"""Component roles that get their own seed stream."""


def derive_seed(base_seed: int, role: str, index: int = 0) -> int:
    """A 31-bit seed for component ``(role, index)``, from ``numpy.random.SeedSequence``.

    Distinct roles and indices get statistically independent streams; the same
    ``(base_seed, role, index)`` always gives the same seed, in every runner.
    """
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}; one of {sorted(ROLES)}")
    seq = np.random.SeedSequence([int(base_seed), ROLES[role], int(index)])
    return int(seq.generate_state(1)[0] & 0x7FFFFFFF)


def mean_or_nan(xs: Sequence[float]) -> float:
    """Mean of ``xs``, NaN when empty."""
    return float(np.mean(xs)) if len(xs) else math.nan


def episode_metrics(returns: Sequence[float], lengths: Sequence[int]) -> dict[str, float]:
    """``env/episode_return_mean``, ``env/episode_len_mean`` (NaN if none), ``env/episodes``."""
    return {
        "env/episode_return_mean": mean_or_nan(returns),
        "env/episode_len_mean": mean_or_nan(lengths),
        "env/episodes": float(len(returns)),
    }


def window_stat_metrics(name: str, stats: Mapping[str, object]) -> dict[str, float]:
    """``WindowStat.stats()`` as ``{name: mean, name/std, name/q0, ..., name/q100}``."""
    out = {name: float(stats["mean"]), f"{name}/std": float(stats["std"])}
    quantiles = stats["quantiles"]
    assert isinstance(quantiles, Iterable)
    for q, v in zip(QUANTILES, quantiles, strict=True):
        out[f"{name}/q{q}"] = float(v)
    return out
