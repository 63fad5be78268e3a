"""One call to train Ape-X on Dask.

::

    from apex_dask import ApexConfig
    from apex_dask.api import train

    results = train(ApexConfig.preset("cartpole"), stop={"timesteps": 50_000})
    print(results[-1]["eval/return_mean"])

With ``client=None`` an embedded ``LocalCluster`` (one worker process per
core) is started and closed again; pass a ``distributed.Client`` to use a
running cluster (its actors are released at the end, the cluster stays).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from apex_dask.config import ApexConfig, StopConfig
from apex_dask.runtime.driver import ApexDriver

__all__ = ["train"]


def train(
    config: ApexConfig,
    client: Any = None,
    stop: StopConfig | Mapping[str, Any] | None = None,
    before_learn_on_batch: Callable[[dict[str, Any], int], dict[str, Any]] | None = None,
) -> list[dict[str, float]]:
    """Train until a stop condition (``config.stop`` merged with ``stop``); the result dicts.

    ``stop`` keys: ``timesteps``, ``reward``, ``time_s``, ``iterations`` (the
    first met wins). ``before_learn_on_batch(batch, shard_id) -> batch`` runs on
    the learner's worker for every replayed batch. Raises
    :class:`~apex_dask.runtime.errors.ApexRuntimeError` for a run that cannot
    start or go on.
    """
    with ApexDriver(config, client, before_learn_on_batch=before_learn_on_batch) as driver:
        return driver.run(stop)
