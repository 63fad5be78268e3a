"""Evaluation episodes spread over a Dask cluster's workers, as plain tasks.

::

    played = play_on_cluster(client, factory, weights, episodes=100, base_seed=7,
                             hiddens=(64, 64), dueling=True)
    played.rows         # one dict per episode, by index: return, length, seconds (video)
    played.wall_s       # seconds from the first task sent to the last result
    played.workers      # how many workers played

First every worker makes one env and imports torch (``client.run``): an env
that a worker cannot make (its package missing there) is one line naming the
worker, before any episode starts, and the time the imports take is not
counted in ``wall_s``. The weights go to every worker once
(``scatter(broadcast=True)``). Episodes to record are one task each (so they
spread); the others go in chunks of about ``episodes / (4 x workers)``, which
the scheduler hands to whichever worker is free. Episode ``i`` is seeded from
``base_seed`` and ``i`` alone (:func:`apex_dask.algo.play.episodes.episode_rng`), so the
returns do not depend on how many workers play them or in which order.
Tasks, not actors: an episode chunk holds no state between calls, and a task
whose worker is lost is simply run again elsewhere by the scheduler.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from apex_dask.algo.agents.spec import AgentSpec
from apex_dask.algo.play.episodes import play_episodes
from apex_dask.algo.play.exported import PolicyFile
from apex_dask.runtime.errors import ApexRuntimeError, describe

__all__ = ["EpisodeFailed", "PlayedEpisodes", "chunks", "play_on_cluster"]


class EpisodeFailed(ApexRuntimeError):
    """An episode raised on a worker (the env or the policy failed while playing)."""


@dataclass
class PlayedEpisodes:
    rows: list[dict[str, Any]]
    wall_s: float
    workers: int


def chunks(indices: Sequence[int], n_workers: int, per_worker: int = 4) -> list[list[int]]:
    """``indices`` cut into about ``per_worker`` chunks per worker, in order."""
    if not indices:
        return []
    size = max(1, math.ceil(len(indices) / (per_worker * max(1, n_workers))))
    return [list(indices[i : i + size]) for i in range(0, len(indices), size)]


def _warm(env_factory: Callable[[], Any]) -> str | None:
    """Run on each worker: make (and close) one env, import torch; the error, if any."""
    try:
        import torch  # noqa: F401

        env = env_factory()
        env.close()
    except Exception as exc:  # noqa: BLE001 - reported as one line by the caller
        return describe(exc)
    return None


def play_on_cluster(
    client: Any,
    env_factory: Callable[[], Any],
    agent: AgentSpec | PolicyFile,
    weights: Mapping[str, Any],
    *,
    episodes: int,
    base_seed: int,
    epsilon: float = 0.0,
    max_steps: int | None = None,
    record: Collection[int] = (),
    render_factory: Callable[[], Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
    cancel_on_error: bool = True,
    warm_timeout_s: float = 300.0,
    stall_s: float = 1800.0,
) -> PlayedEpisodes:
    """Play episodes ``0 .. episodes-1`` on the cluster (see the module docstring), with
    the greedy policy of ``agent``'s weights (or of an exported policy file: ``agent`` a
    :class:`~apex_dask.algo.play.exported.PolicyFile`, ``weights`` empty).

    A failure or Ctrl-C cancels the episode tasks still running, unless
    ``cancel_on_error`` is False (a cluster about to be closed anyway: its
    workers would only log each cancelled task). Nothing waits without a bound:
    the workers must make their env within ``warm_timeout_s``, and some episodes
    must finish every ``stall_s`` (a hung env step otherwise holds the command
    for ever; ``env.step_timeout_s`` ends such a step itself).
    """
    from distributed import wait

    info = client.scheduler_info(n_workers=-1)
    n_workers = len(info.get("workers", {}))
    if n_workers == 0:
        raise ApexRuntimeError(
            f"the Dask scheduler at {client.scheduler.address} has no workers; start some "
            f"with `dask worker {client.scheduler.address}`"
        )
    factory = render_factory if record else env_factory
    try:
        problems = client.run(_warm, factory, callback_timeout=warm_timeout_s)
    except TimeoutError:
        raise ApexRuntimeError(
            f"the workers did not make the env within {warm_timeout_s:g} s (does it hang "
            "when made?)"
        ) from None
    bad = {addr: why for addr, why in problems.items() if why}
    if bad:
        addr, why = sorted(bad.items())[0]
        raise ApexRuntimeError(
            f"worker {addr} cannot make the env ({why}); install what it needs on every worker"
        )
    [weights_future] = client.scatter([dict(weights)], broadcast=True)
    shared = [weights_future]
    if isinstance(agent, PolicyFile):  # the file's bytes, like weights: once per worker
        [agent] = client.scatter([agent], broadcast=True)  # type: ignore[list-item]
        shared.append(agent)
    recorded = sorted(i for i in set(record) if 0 <= i < episodes)
    rest = [i for i in range(episodes) if i not in set(recorded)]
    groups = [[i] for i in recorded] + chunks(rest, n_workers)
    common = {
        "base_seed": int(base_seed),
        "epsilon": float(epsilon),
        "max_steps": max_steps,
        "record": recorded,
        "render_factory": render_factory,
    }
    t0 = time.perf_counter()
    futures = [
        client.submit(
            play_episodes, env_factory, agent, weights_future, group, pure=False, **common
        )
        for group in groups
    ]
    rows: list[dict[str, Any]] = []
    try:
        pending = set(futures)
        while pending:
            try:
                done, pending = wait(pending, timeout=stall_s, return_when="FIRST_COMPLETED")
            except TimeoutError:
                raise EpisodeFailed(
                    f"no evaluation episode finished in {stall_s:g} s (a hung env step? "
                    "set env.step_timeout_s)"
                ) from None
            for future in done:
                try:
                    rows.extend(future.result())
                except Exception as exc:
                    raise EpisodeFailed(f"an evaluation episode failed: {describe(exc)}") from None
                if progress is not None:
                    progress(len(rows), episodes)
        wall = time.perf_counter() - t0
    except BaseException:
        if cancel_on_error:
            client.cancel(futures + shared)
        raise
    client.cancel(futures + shared)  # all done: frees the weights' copies
    rows.sort(key=lambda r: r["index"])
    return PlayedEpisodes(rows, wall, n_workers)
