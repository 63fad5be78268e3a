"""The driver's connections to its actors: one open comm per call in flight.

A Dask actor call (``Client(direct_to_workers=True)``) holds one comm of the
client's connection pool for as long as it runs, and an env worker's
``sample_into`` runs for the whole rollout (1.4 s at 35 env steps/s and 50
steps). The pool holds 512 comms by default (``Client(connection_limit=512)``);
once that many are open, every further call makes the pool close all its idle
comms (and log a line) and open a new TCP connection. With 192 simulated env
workers (2 rollouts in flight each, plus weight syncs and stats) the driver
spent about a quarter of its CPU connecting and closing sockets
(``docs/scaling.md``). :func:`fit_connection_pool` grows the pool to the calls
the run keeps in flight, and the process's open-file limit with it::

    needed = calls_in_flight(cfg.workers, num_env_workers, num_shards)
    fit_connection_pool(client, needed)     # on the client's event loop
"""

from __future__ import annotations

import logging
from typing import Any

from apex_dask.config.tree import EnvWorkersConfig

__all__ = ["calls_in_flight", "fit_connection_pool"]

log = logging.getLogger(__name__)

SPARE = 64
"""Comms kept beyond the plan's own calls (the scheduler, checkpoints, a user's calls)."""


def calls_in_flight(workers: EnvWorkersConfig, env_workers: int, shards: int) -> int:
    """The most actor calls the driver keeps open at once: per env worker its rollouts
    in flight, a weight sync and a stats request (a report asks every actor at once);
    per shard a stats request; the learner's few; :data:`SPARE`."""
    return env_workers * (workers.rollouts_in_flight + 2) + shards + 4 + SPARE


def _raise_open_files(needed: int) -> int:
    """The soft open-file limit, raised (up to the hard one) to ``needed`` + 256."""
    try:
        import resource
    except ImportError:  # not on this platform: nothing to raise
        return needed
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = needed + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (ValueError, OSError):
            pass
    return needed if soft == resource.RLIM_INFINITY else max(0, soft - 256)


def fit_connection_pool(client: Any, needed: int) -> int:
    """Grow ``client.rpc`` (Dask's ``ConnectionPool``) to at least ``needed`` comms, within
    the process's open-file limit; never shrink it. The pool's limit after. Must run on
    the client's event loop (the pool's semaphore belongs to it)."""
    pool = getattr(client, "rpc", None)
    sem = getattr(pool, "semaphore", None)
    limit = getattr(pool, "limit", None)
    if sem is None or not isinstance(limit, int):  # not a Dask client's pool: leave it
        return 0
    allowed = _raise_open_files(needed)
    target = min(needed, allowed)
    if target <= limit:
        return limit
    if allowed < needed:
        log.warning(
            "the driver may keep %d actor calls open but may open only %d files; "
            "raise the open-file limit (ulimit -n) for fewer reconnections",
            needed,
            allowed,
        )
    # the pool's invariant: semaphore value == limit - open - connecting
    for _ in range(target - limit):
        sem.release()
    pool.limit = target
    return target
