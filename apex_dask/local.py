"""The whole Ape-X loop in one process, with the same pieces as the Dask runtime.

``run_local(config)`` yields one flat result dict per iteration (metric names
in ``docs/metrics.md``)::

    from apex_dask.config import ApexConfig
    from apex_dask.local import run_local

    for result in run_local(ApexConfig.preset("cartpole"), stop={"reward": 475}):
        print(result["iteration"], result["eval/return_mean"])

The three concurrent operations of Ape-X run here as one round-robin
(:meth:`LocalApex.step`), repeated:

1. **rollouts**: each env worker (epsilon_i from :func:`apex_epsilons`)
   samples one fragment; it goes with its initial priorities to a random
   replay shard; a worker that has produced ``max_weight_sync_delay`` steps
   since its last sync gets the learner's weights, if a newer version exists;
2. **replay + learn**: batches are sampled from the shards that hold at least
   ``learning_starts / num_shards`` items (round-robin over those), trained
   on, and their new priorities go back to the source shard. Updates per round:
   with ``learner.max_replay_ratio`` = rho, as many as keep
   ``steps_trained <= rho * steps_sampled`` (transitions trained / env steps
   sampled); without it, one update per fragment stored (what a round-robin of
   RLlib's concurrent ops does), a replay ratio of batch_size / fragment_length;
3. **evaluation**: every ``eval.interval_s`` seconds (``0``: at the end of each
   iteration), ``eval.episodes`` greedy episodes on a separate env with the
   learner's newest weights.

An iteration ends once it lasted ``report.min_iter_time_s`` seconds *and*
sampled ``report.timesteps_per_iteration`` env steps, or when a stop
condition holds. ``torch.set_num_threads(1)`` is called for the process.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from apex_dask.algo.checkpoint import load_checkpoint, save_checkpoint
from apex_dask.algo.env_worker import EnvWorker, probe_spaces
from apex_dask.algo.envs import make_env_factory
from apex_dask.algo.exploration import apex_epsilons, lowest_epsilon_workers
from apex_dask.algo.learner import Learner
from apex_dask.algo.replay import ReplayShard
from apex_dask.algo.results import derive_seed
from apex_dask.algo.timers import Timer, WindowStat
from apex_dask.builder import env_worker_kwargs, learner_kwargs
from apex_dask.config import ApexConfig, StopConfig
from apex_dask.local_results import local_result

__all__ = ["LocalApex", "run_local", "resolve_stop"]

_METRIC_WINDOW = 100


def resolve_stop(base: StopConfig, stop: Any = None) -> StopConfig:
    """``base`` with the non-None fields of ``stop`` (a dict, StopConfig or object) on top."""
    if stop is None:
        return base
    names = [f.name for f in dataclasses.fields(StopConfig)]
    if isinstance(stop, Mapping):
        unknown = set(stop) - set(names)
        if unknown:
            raise ValueError(f"unknown stop condition(s) {sorted(unknown)}; use {names}")
        values = dict(stop)
    else:
        values = {n: getattr(stop, n, None) for n in names}
    return dataclasses.replace(base, **{k: v for k, v in values.items() if v is not None})


class LocalApex:
    """The in-process Ape-X runner; see the module docstring.

    ``step()`` runs one round (rollouts, updates, maybe an evaluation);
    ``iterate(stop)`` repeats it and yields a result dict per iteration;
    ``result()`` assembles the dict for the iteration so far.
    """

    def __init__(self, config: ApexConfig) -> None:
        torch.set_num_threads(1)
        self.config = cfg = config
        wc, rc = cfg.workers, cfg.replay
        self.env_factory = make_env_factory(cfg.env.env_id, cfg.env.env_kwargs)
        obs_space, act_space = probe_spaces(self.env_factory)
        self.learner = Learner(obs_space, act_space, **learner_kwargs(cfg))
        self.epsilons = apex_epsilons(wc.num_workers, wc.epsilon_base, wc.epsilon_alpha)
        worker_kwargs = env_worker_kwargs(cfg)
        self.workers = [
            EnvWorker(
                self.env_factory,
                epsilon=float(eps),
                seed=derive_seed(cfg.seed, "worker", i),
                **worker_kwargs,
            )
            for i, eps in enumerate(self.epsilons)
        ]
        self.evaluator = (
            EnvWorker(
                self.env_factory, epsilon=0.0, seed=derive_seed(cfg.seed, "eval"), **worker_kwargs
            )
            if cfg.eval.episodes > 0
            else None
        )
        self.shards = [
            ReplayShard(
                rc.shard_capacity,
                alpha=rc.alpha,
                eps=rc.eps,
                seed=derive_seed(cfg.seed, "shard", k),
            )
            for k in range(rc.num_shards)
        ]
        self.rng = np.random.default_rng(derive_seed(cfg.seed, "driver"))
        self.selected_workers = lowest_epsilon_workers(wc.num_workers)

        self.steps_sampled = 0
        self.weight_syncs = 0
        self.rollouts = 0
        self._since_sync = [0] * len(self.workers)
        self.worker_rollouts = [0] * len(self.workers)
        self.shard_rollouts = [0] * len(self.shards)
        self.shard_batches = [0] * len(self.shards)
        self.weight_snapshots = 0
        self._snapshot_version = -1
        self._shard_cursor = 0
        self.dequeue_timer, self.grad_timer, self.overall_timer = Timer(), Timer(), Timer()
        self.queue_size = WindowStat("learner/queue_size", 50)
        self._loss: deque[float] = deque(maxlen=_METRIC_WINDOW)
        self._mean_q: deque[float] = deque(maxlen=_METRIC_WINDOW)
        self._grad_norm: deque[float] = deque(maxlen=_METRIC_WINDOW)
        self.eval_time_s = 0.0
        self.last_eval: dict[str, Any] | None = None
        self._last_eval_at: float | None = None
        self.iteration = 0
        self.start_time = time.perf_counter()
        self._begin_iteration()
        for worker in self.workers:
            self._sync(worker)

    # -- the round ------------------------------------------------------
    def elapsed(self) -> float:
        """Seconds since the runner was built."""
        return time.perf_counter() - self.start_time

    def _weights(self) -> tuple[int, dict[str, np.ndarray]]:
        version, weights = self.learner.get_weights()
        if version != self._snapshot_version:
            self._snapshot_version = version
            self.weight_snapshots += 1
        return version, weights

    def _sync(self, worker: EnvWorker) -> None:
        worker.set_weights(*self._weights())
        self.weight_syncs += 1

    def step(self) -> None:
        """One round: a fragment from every worker, then updates, then a due evaluation."""
        delay = self.config.workers.max_weight_sync_delay
        for i, worker in enumerate(self.workers):
            out = worker.sample()
            k = int(self.rng.integers(len(self.shards)))
            self.shards[k].add(out["batch"], out["priorities"])
            self.rollouts += 1
            self.worker_rollouts[i] += 1
            self.shard_rollouts[k] += 1
            self.steps_sampled += out["steps"]
            if i in self.selected_workers:
                self._iter_returns += out["episode_returns"]
                self._iter_lengths += out["episode_lengths"]
            self._since_sync[i] += out["steps"]
            if self._since_sync[i] >= delay and self.learner.version > worker.weights_version:
                self._sync(worker)
                self._since_sync[i] = 0
        for _ in range(self._updates_allowed(len(self.workers))):
            if not self.train_once():
                break
        if self.config.eval.interval_s > 0 and self._eval_due():
            self.evaluate()

    def _updates_allowed(self, fragments: int) -> int:
        ratio = self.config.learner.max_replay_ratio
        if ratio is None:
            return fragments
        budget = ratio * self.steps_sampled - self.learner.steps_trained
        return max(0, int(budget // self.config.learner.batch_size))

    def _ready_shards(self) -> list[int]:
        need = max(1, self.config.replay.shard_learning_starts)
        return [k for k, s in enumerate(self.shards) if len(s) >= need]

    def train_once(self) -> bool:
        """One learner step from a ready shard (round-robin); False if none is ready."""
        ready = self._ready_shards()
        if not ready:
            return False
        k = ready[self._shard_cursor % len(ready)]
        self._shard_cursor += 1
        self.shard_batches[k] += 1
        lc, rc = self.config.learner, self.config.replay
        with self.overall_timer:
            self.queue_size.push(0)  # no inqueue in-process: batches are sampled on demand
            with self.dequeue_timer:
                sample = self.shards[k].sample(lc.batch_size, rc.beta)
            with self.grad_timer:
                td_abs, metrics = self.learner.update(sample.data, sample.weights)
            self.grad_timer.push_units_processed(len(td_abs))
            self.shards[k].update_priorities(sample.indices, td_abs)
        self._loss.append(metrics["loss"])
        self._mean_q.append(metrics["mean_q"])
        self._grad_norm.append(metrics["grad_norm"])
        return True

    def _eval_due(self) -> bool:
        if self.evaluator is None:
            return False
        since = self._last_eval_at if self._last_eval_at is not None else self.start_time
        return time.perf_counter() - since >= self.config.eval.interval_s

    def evaluate(self) -> dict[str, Any] | None:
        """Greedy episodes with the learner's newest weights; stored in ``last_eval``."""
        if self.evaluator is None:
            return None
        t0 = time.perf_counter()
        version, weights = self._weights()
        if self.evaluator.weights_version != version:
            self.evaluator.set_weights(version, weights)
        out = self.evaluator.evaluate(self.config.eval.episodes)
        t1 = time.perf_counter()
        self.eval_time_s += t1 - t0
        self._last_eval_at = t1
        self.last_eval = {
            **out,
            "time_s": t1 - self.start_time,
            "duration_s": t1 - t0,
            "timesteps": self.steps_sampled,
            "weights_version": version,
            "eval_time_s": self.eval_time_s,
        }
        self._iter_eval = self.last_eval
        return self.last_eval

    # -- iterations -----------------------------------------------------
    def _begin_iteration(self) -> None:
        self._iter_start = time.perf_counter()
        self._iter_steps0 = self.steps_sampled
        self._iter_updates0 = self.learner.num_updates
        self._iter_grad0 = self.grad_timer.total_s
        self._iter_worker_steps0 = [w.steps_sampled for w in self.workers]
        self._iter_returns: list[float] = []
        self._iter_lengths: list[int] = []
        self._iter_eval: dict[str, Any] | None = None

    def _iteration_complete(self) -> bool:
        rep = self.config.report
        return (
            time.perf_counter() - self._iter_start >= rep.min_iter_time_s
            and self.steps_sampled - self._iter_steps0 >= rep.timesteps_per_iteration
        )

    def result(self) -> dict[str, float]:
        """The flat result dict of the current iteration (see ``docs/metrics.md``)."""
        return local_result(self)

    def _reward_reached(self, stop: StopConfig, result: Mapping[str, float] | None) -> bool:
        if stop.reward is None:
            return False
        if self.evaluator is not None:
            return self.last_eval is not None and self.last_eval["return_mean"] >= stop.reward
        value = math.nan if result is None else result["env/episode_return_mean"]
        return not math.isnan(value) and value >= stop.reward

    def _stop_now(self, stop: StopConfig) -> bool:
        return (
            (stop.timesteps is not None and self.steps_sampled >= stop.timesteps)
            or (stop.time_s is not None and self.elapsed() >= stop.time_s)
            or (self.evaluator is not None and self._reward_reached(stop, None))
        )

    def iterate(self, stop: Any = None) -> Iterator[dict[str, float]]:
        """Run rounds; yield a result dict per iteration until a stop condition holds.

        ``stop`` (dict or object with ``timesteps``, ``reward``, ``time_s``,
        ``iterations``) overrides the config's ``stop`` section field by field.
        ``reward`` is compared with the newest greedy evaluation's mean return
        (checked after every evaluation) when evaluation is enabled
        (``eval.episodes > 0``), else with the iteration's
        ``env/episode_return_mean``. With no stop condition it runs forever.
        """
        stop_cfg = resolve_stop(self.config.stop, stop)
        while True:
            self.step()
            stopping = self._stop_now(stop_cfg)
            if not (stopping or self._iteration_complete()):
                continue
            if self.config.eval.interval_s == 0 and self.evaluator is not None:
                self.evaluate()
                stopping = stopping or self._stop_now(stop_cfg)
            result = self.result()
            self.iteration += 1
            stopping = (
                stopping
                or (stop_cfg.iterations is not None and self.iteration >= stop_cfg.iterations)
                or self._reward_reached(stop_cfg, result)
            )
            yield result
            if stopping:
                return
            self._begin_iteration()

    # -- checkpoints ----------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write a checkpoint directory (atomically): learner, every shard, counters, config.

        Env workers' episodes in progress are not saved: after :meth:`restore`
        they start new episodes with the restored learner's weights.
        """
        runner = {
            "steps_sampled": self.steps_sampled,
            "weight_syncs": self.weight_syncs,
            "rollouts": self.rollouts,
            "iteration": self.iteration,
            "shard_cursor": self._shard_cursor,
            "rng": self.rng.bit_generator.state,
            "worker_rollouts": self.worker_rollouts,
            "shard_rollouts": self.shard_rollouts,
            "shard_batches": self.shard_batches,
            "weight_snapshots": self.weight_snapshots,
        }
        parts: dict[str, Any] = {"learner": self.learner.state_dict(), "runner": runner}
        parts.update({f"shard_{k}": s.state_dict() for k, s in enumerate(self.shards)})
        meta = {"timesteps": self.steps_sampled, "config": self.config.to_dict()}
        return save_checkpoint(path, parts, metadata=meta)

    @classmethod
    def restore(cls, path: str | Path, config: ApexConfig | None = None) -> LocalApex:
        """A runner continuing from :meth:`save`'s checkpoint (with its config, unless given)."""
        parts, meta = load_checkpoint(path)
        apex = cls(config if config is not None else ApexConfig.from_dict(meta["config"]))
        apex.learner.load_state_dict(parts["learner"])
        for k, shard in enumerate(apex.shards):
            shard.load_state_dict(parts[f"shard_{k}"])
        r = parts["runner"]
        apex.steps_sampled = int(r["steps_sampled"])
        apex.weight_syncs = int(r["weight_syncs"])
        apex.rollouts = int(r["rollouts"])
        apex.iteration = int(r["iteration"])
        apex._shard_cursor = int(r["shard_cursor"])
        apex.rng.bit_generator.state = r["rng"]
        apex.worker_rollouts = list(r["worker_rollouts"])
        apex.shard_rollouts = list(r["shard_rollouts"])
        apex.shard_batches = list(r["shard_batches"])
        apex.weight_snapshots = int(r["weight_snapshots"])
        for worker in apex.workers:
            apex._sync(worker)
        apex._begin_iteration()
        return apex

    def close(self) -> None:
        """Close every env."""
        for worker in self.workers:
            worker.close()
        if self.evaluator is not None:
            self.evaluator.close()

    def __enter__(self) -> LocalApex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def run_local(config: ApexConfig, stop: Any = None) -> Iterator[dict[str, float]]:
    """Run Ape-X in this process; yield one flat result dict per iteration.

    See :class:`LocalApex` and the module docstring; ``stop`` as in
    :meth:`LocalApex.iterate`. The envs are closed when the generator ends.
    """
    with LocalApex(config) as apex:
        yield from apex.iterate(stop)
