"""Dask actors for Ape-X: thin wrappers around the algorithm objects.

Three roles, each created with ``client.submit(Cls, ..., actor=True,
workers=[address])`` and wired by handles (never by moving bulk data through
the driver)::

    shard   = ReplayShardActor(k, capacity, ...)               # prioritized replay
    learner = LearnerActor(obs_space, act_space, [shards], ...) # see learner_actor.py
    worker  = EnvWorkerActor(i, env_factory, [shards], learner, ...)

    summary = await worker.sample_into(k)   # env worker -> shard k, one hop
    version = await worker.sync_weights()   # learner -> env worker, one hop

Every method is ``async def``. A Dask worker runs the *sync* methods of all
its actors on one thread, so a slow sync method would stall every colocated
actor; async methods run on the worker's event loop and must stay short:

- shard methods do only numpy work (microseconds to a few milliseconds);
- env workers run the environment in a private one-thread executor and only
  ``await`` on the loop, so two requests in flight pipeline (one samples while
  the other's rollout travels to its shard).

Every actor-to-actor call carries a timeout (``call_timeout_s``): a dead peer
never answers. Each actor publishes its metrics (names from
``docs/metrics.md``) to the scheduler about once a second.
"""

from __future__ import annotations

import asyncio
import pickle
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from apex_dask.runtime.calls import Throttled, call_with_timeout
from apex_dask.runtime.learner_actor import LearnerActor

__all__ = [
    "EnvWorkerActor",
    "LearnerActor",
    "ReplayShardActor",
    "call_with_timeout",
    "shard_metrics",
]

T = TypeVar("T")


def shard_metrics(shard_id: int, stats: Mapping[str, Any]) -> dict[str, float]:
    """``ReplayShard.stats()`` plus actor counters -> ``replay/<k>/<name>`` metric names."""
    keys = ("size", "added", "sampled", "evicted", "add_s", "sample_s", "update_s")
    out = {f"replay/{shard_id}/{k}": float(stats[k]) for k in keys if k in stats}
    return out


class ReplayShardActor:
    """One prioritized replay shard (:class:`apex_dask.algo.replay.ReplayShard`).

    ``sample()`` returns None until the shard holds ``learning_starts`` items
    (the run's ``learning_starts / num_shards``); then a dict
    ``{"shard_id", "indices", "weights", "data", "added"}`` with ``batch_size``
    items drawn with probability P(i) = p_i^alpha / sum_k p_k^alpha and weights
    w_i = (N P(i))^-beta / max_j w_j (``beta`` constant). ``added`` is the
    number of items ever added (the learner's replay-ratio gate reads it).

    Flow counters (``stats()``): ``rollouts_stored`` (``add`` calls),
    ``batches_sampled`` (non-None ``sample`` replies) and
    ``priority_updates_applied`` (``update_priorities`` calls).
    """

    def __init__(
        self,
        shard_id: int,
        capacity: int,
        *,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-6,
        learning_starts: int = 0,
        batch_size: int = 32,
        seed: int | None = None,
        run: str = "",
    ) -> None:
        from apex_dask.algo.replay import ReplayShard

        self.shard_id = int(shard_id)
        self._shard = ReplayShard(capacity, alpha=alpha, eps=eps, seed=seed)
        self._beta = float(beta)
        self._learning_starts = max(1, int(learning_starts))
        self._batch_size = int(batch_size)
        self.rollouts_stored = 0
        self.batches_sampled = 0
        self.priority_updates_applied = 0
        self._pub = Throttled(f"replay/{self.shard_id}", run)

    async def add(self, batch: dict[str, np.ndarray], priorities: np.ndarray | None = None) -> int:
        """Store one rollout (dict of arrays) with its initial priorities; return the size."""
        self._shard.add(batch, priorities)
        self.rollouts_stored += 1
        self._pub.maybe(self._metrics)
        return len(self._shard)

    async def sample(self, batch_size: int | None = None) -> dict[str, Any] | None:
        """A prioritized batch, or None while fewer than ``learning_starts`` items are held."""
        if len(self._shard) < self._learning_starts:
            return None
        s = self._shard.sample(batch_size or self._batch_size, self._beta)
        self.batches_sampled += 1
        return {
            "shard_id": self.shard_id,
            "indices": s.indices,
            "weights": s.weights,
            "data": s.data,
            "added": self._shard.stats()["added"],
        }

    async def update_priorities(self, indices: np.ndarray, priorities: np.ndarray) -> None:
        """Set p_i = priorities (the learner's |TD|; the shard adds eps in the mass)."""
        self._shard.update_priorities(indices, priorities)
        self.priority_updates_applied += 1
        self._pub.maybe(self._metrics)

    async def added(self) -> int:
        """Items ever added to this shard."""
        return int(self._shard.stats()["added"])

    async def stats(self) -> dict[str, float]:
        """Metric-named stats: ``replay/<k>/*`` and this shard's flow counters."""
        return self._metrics()

    async def state_dict(self) -> dict[str, Any]:
        """The shard's contents and priorities (see ``ReplayShard.state_dict``)."""
        return self._shard.state_dict()

    async def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        self._shard.load_state_dict(state)

    async def close(self) -> None:
        """Flush pending metrics."""
        self._pub.now(self._metrics)

    def _metrics(self) -> dict[str, float]:
        k = self.shard_id
        out = shard_metrics(k, self._shard.stats())
        out[f"replay/{k}/rollouts_stored"] = float(self.rollouts_stored)
        out[f"replay/{k}/batches_sampled"] = float(self.batches_sampled)
        out[f"replay/{k}/priority_updates_applied"] = float(self.priority_updates_applied)
        return out


class EnvWorkerActor:
    """An epsilon-greedy env worker (:class:`apex_dask.algo.env_worker.EnvWorker`).

    ``sample_into(k)`` runs one rollout of ``fragment_length`` env steps with
    the worker's current (possibly stale) weights, computes its initial
    priorities |TD| there, sends the rollout straight to shard ``k`` and
    returns a small summary to the caller::

        {"worker", "shard_id", "steps", "episode_returns", "episode_lengths",
         "weights_version", "epsilon", "rollouts_sent", "sample_s", "send_s"}

    ``sync_weights()`` pulls the learner's weights if it has a newer version
    (one pickled blob per version, made once by the learner) and returns the
    version applied, or None. ``evaluate(n)`` pulls fresh weights and plays
    ``n`` greedy episodes on the worker's own evaluation env.

    The env and the policy live in a private one-thread executor, so at most
    one env step runs at a time and weights never change mid-rollout.
    """

    def __init__(
        self,
        index: int,
        env_factory: Callable[[], Any],
        shards: Sequence[Any],
        learner: Any,
        *,
        epsilon: float,
        seed: int,
        n_step: int,
        gamma: float,
        fragment_length: int,
        hiddens: Sequence[int],
        dueling: bool,
        double_q: bool,
        call_timeout_s: float = 60.0,
        run: str = "",
    ) -> None:
        from apex_dask.algo.env_worker import EnvWorker

        self.index = int(index)
        self._shards = list(shards)
        self._learner = learner
        self._timeout = float(call_timeout_s)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"apex-env-{index}")
        self._worker = EnvWorker(
            env_factory,
            epsilon=epsilon,
            seed=seed,
            n_step=n_step,
            gamma=gamma,
            fragment_length=fragment_length,
            hiddens=tuple(hiddens),
            dueling=dueling,
            double_q=double_q,
        )
        self.epsilon = float(epsilon)
        self.rollouts_sent = 0
        self.steps_sampled = 0
        self.weight_syncs = 0
        self._last_eval: dict[str, Any] | None = None
        self._t0 = time.monotonic()
        self._pub = Throttled(f"env/{self.index}" if self.index >= 0 else "eval", run)

    async def _in_pool(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def sample_into(self, shard_id: int) -> dict[str, Any]:
        """One rollout, stored in shard ``shard_id``; returns the small summary."""
        t0 = time.perf_counter()
        out = await self._in_pool(self._worker.sample)
        t1 = time.perf_counter()
        self.rollouts_sent += 1
        await call_with_timeout(
            self._shards[shard_id].add(out["batch"], out["priorities"]), self._timeout
        )
        t2 = time.perf_counter()
        self.steps_sampled += int(out["steps"])
        self._pub.maybe(self._metrics)
        return {
            "worker": self.index,
            "shard_id": int(shard_id),
            "steps": int(out["steps"]),
            "episode_returns": [float(x) for x in out["episode_returns"]],
            "episode_lengths": [int(x) for x in out["episode_lengths"]],
            "weights_version": int(out["weights_version"]),
            "epsilon": float(out["epsilon"]),
            "rollouts_sent": self.rollouts_sent,
            "sample_s": t1 - t0,
            "send_s": t2 - t1,
        }

    async def sync_weights(self) -> int | None:
        """Pull and apply the learner's weights if newer; the version applied, or None."""
        have = self._worker.weights_version
        blob = await call_with_timeout(self._learner.weights_if_newer(have), self._timeout)
        if blob is None:
            return None
        version = await self._in_pool(self._apply_weights, blob)
        self.weight_syncs += 1
        return version

    def _apply_weights(self, blob: bytes) -> int:
        version, weights = pickle.loads(blob)
        if version > self._worker.weights_version:
            self._worker.set_weights(version, weights)
        return int(self._worker.weights_version)

    async def evaluate(self, num_episodes: int, seed: int | None = None) -> dict[str, Any]:
        """Sync to the newest weights, then ``num_episodes`` greedy episodes; their stats."""
        await self.sync_weights()
        out = await self._in_pool(self._worker.evaluate, int(num_episodes), seed)
        out = dict(out)
        out["weights_version"] = int(self._worker.weights_version)
        self._last_eval = out
        self._pub.now(self._metrics)
        return out

    async def stats(self) -> dict[str, float]:
        """``env/<i>/*`` counters and this worker's epsilon."""
        return self._metrics()

    async def close(self) -> None:
        """Stop the env thread (waits for the step in progress)."""
        self._pub.now(self._metrics)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _metrics(self) -> dict[str, float]:
        i = self.index
        if i < 0:  # the evaluator
            ev = self._last_eval or {}
            return {
                "eval/return_mean": float(ev.get("return_mean", float("nan"))),
                "eval/return_std": float(ev.get("return_std", float("nan"))),
                "eval/weights_version": float(self._worker.weights_version),
            }
        return {
            f"env/epsilon/{i}": self.epsilon,
            f"env/{i}/steps_sampled": float(self.steps_sampled),
            f"env/{i}/steps_per_s": self.steps_sampled / max(1e-9, time.monotonic() - self._t0),
            f"env/{i}/rollouts_sent": float(self.rollouts_sent),
            f"env/{i}/weights_version": float(self._worker.weights_version),
        }
