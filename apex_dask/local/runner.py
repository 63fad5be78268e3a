"""The in-process runner's :class:`LocalApex` (see :mod:`apex_dask.local`)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from apex_dask.algo.agents.registry import make_env_worker, make_learner
from apex_dask.algo.envs.probe import probe_spaces
from apex_dask.algo.rollout.exploration import lowest_epsilon_workers
from apex_dask.algo.rollout.worker import ActingWorker
from apex_dask.config import ApexConfig
from apex_dask.experiment.best_weights import BestWeights
from apex_dask.experiment.builder import (
    Hook,
    agent_of,
    agent_spec,
    build_shards,
    env_factory,
    exploration_ladder,
    learner_seed,
    resolve_hook,
    worker_spec,
)
from apex_dask.experiment.checkpoints.runner import (
    load_newest_runner_checkpoint,
    restore_runner,
    runner_state,
    save_runner,
)
from apex_dask.experiment.flow import FaultCounters, LearnerFlow, ShardFlow
from apex_dask.experiment.results import (
    IterationWindow,
    build_result,
    env_metrics,
    learner_metrics,
    shard_metrics,
)
from apex_dask.experiment.stats import derive_seed
from apex_dask.experiment.stop import StopRule
from apex_dask.experiment.timers import Timer, WindowStat

__all__ = ["LocalApex", "run_local"]

_METRIC_WINDOW = 100


class LocalApex:
    """The in-process Ape-X runner; see the module docstring.

    ``step()`` runs one round (rollouts, updates, maybe an evaluation);
    ``iterate(stop)`` repeats it and yields a result dict per iteration;
    ``result()`` assembles the dict for the iteration so far.
    ``before_learn_on_batch(batch, shard_id) -> batch`` (else the config's
    ``learner.before_learn_on_batch`` import path) runs on every replayed batch.
    """

    def __init__(self, config: ApexConfig, before_learn_on_batch: Hook | None = None) -> None:
        torch.set_num_threads(1)
        self.config = cfg = config
        self.hook = resolve_hook(cfg, before_learn_on_batch)
        self.hook_calls = 0
        self.env_factory = env_factory(cfg)
        obs_space, act_space = probe_spaces(self.env_factory, cfg.env.make_timeout_s)
        self.learner = make_learner(agent_spec(cfg), obs_space, act_space, seed=learner_seed(cfg))
        self.explorations = exploration_ladder(cfg)
        spec = worker_spec(cfg)
        self.workers = [
            make_env_worker(
                spec,
                self.env_factory,
                exploration=float(eps),
                seed=derive_seed(cfg.seed, "worker", i),
                where=f"env worker {i}",
            )
            for i, eps in enumerate(self.explorations)
        ]
        eval_seed = derive_seed(cfg.seed, "eval")
        self.evaluator = (
            make_env_worker(spec, self.env_factory, exploration=0.0, seed=eval_seed)
            if cfg.eval.episodes > 0
            else None
        )
        self.shards = build_shards(cfg)
        self.rng = np.random.default_rng(derive_seed(cfg.seed, "driver"))
        self.selected_workers = lowest_epsilon_workers(cfg.workers.num_workers)

        self.steps_sampled = 0
        self.weight_syncs = 0
        self.rollouts = 0
        self._since_sync = [0] * len(self.workers)
        self.worker_rollouts = [0] * len(self.workers)
        self.shard_rollouts = [0] * len(self.shards)
        self.shard_batches = [0] * len(self.shards)
        self.weight_snapshots = 0
        self._snapshot_version = -1
        self.shard_cursor = 0
        self.dequeue_timer, self.grad_timer, self.overall_timer = Timer(), Timer(), Timer()
        self.grad_cpu_timer = Timer()
        self.queue_size = WindowStat("learner/queue_size", 50)
        self._recent: deque[tuple[float, float, float]] = deque(maxlen=_METRIC_WINDOW)
        self.eval_time_s = 0.0
        self.last_eval: dict[str, Any] | None = None
        self.best = BestWeights()  # the best greedy evaluation's record and weights
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

    def _sync(self, worker: ActingWorker) -> None:
        worker.set_weights(*self._weights())
        self.weight_syncs += 1

    def step(self) -> None:
        """One round: a fragment from every worker, then updates, then a due evaluation."""
        delay = self.config.workers.max_weight_sync_delay
        for i, worker in enumerate(self.workers):
            out = worker.sample()
            k = int(self.rng.integers(len(self.shards)))
            self.shards[k].add(out.batch, out.priorities)
            self.rollouts += 1
            self.worker_rollouts[i] += 1
            self.shard_rollouts[k] += 1
            self.steps_sampled += out.steps
            if i in self.selected_workers:
                self._window.episode_returns += out.episode_returns
                self._window.episode_lengths += out.episode_lengths
            self._since_sync[i] += out.steps
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
        k = ready[self.shard_cursor % len(ready)]
        self.shard_cursor += 1
        self.shard_batches[k] += 1
        lc, rc = self.config.learner, self.config.replay
        with self.overall_timer:
            self.queue_size.push(0)  # no inqueue in-process: batches are sampled on demand
            with self.dequeue_timer:
                s = self.shards[k].sample(lc.batch_size, rc.beta)
            batch = s.with_shard_id(k)  # its ``added``: items ever added to shard k
            if self.hook is not None:
                batch = batch.with_hook_batch(self.hook(batch.as_hook_batch(), k))
                self.hook_calls += 1
            c0 = time.thread_time()
            with self.grad_timer:
                td_abs, metrics = self.learner.update(batch.data, batch.weights)
            self.grad_cpu_timer.push(time.thread_time() - c0)
            update = batch.priority_update(td_abs)
            self.shards[update.shard_id].update_priorities(*update.args()[:3])
        self._recent.append((metrics["loss"], metrics["mean_q"], metrics["grad_norm"]))
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
        ev = self.config.eval
        out = self.evaluator.evaluate(ev.episodes, None, ev.max_episode_steps, ev.timeout_s)
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
        self._window_eval = self.last_eval
        self.best.offer(self.last_eval, version, weights)  # in memory: self.best.weights
        return self.last_eval

    # -- iterations -----------------------------------------------------
    def _begin_iteration(self) -> None:
        self._iter_start = time.perf_counter()
        self._iter_steps0 = self.steps_sampled
        self._iter_updates0 = self.learner.num_updates
        self._iter_grad0 = self.grad_timer.total_s
        self._iter_worker_steps0 = [w.steps_sampled for w in self.workers]
        self._window = IterationWindow()
        self._window_eval: dict[str, Any] | None = None

    def _iteration_complete(self) -> bool:
        rep = self.config.report
        return (
            time.perf_counter() - self._iter_start >= rep.min_iter_time_s
            and self.steps_sampled - self._iter_steps0 >= rep.timesteps_per_iteration
        )

    def result(self) -> dict[str, float]:
        """The flat result dict of the current iteration (see ``docs/metrics.md``).

        Quantities that only exist between processes take their in-process
        value: no inqueue (``learner/queue_size`` 0, nothing blocked, nothing
        in flight or lost), no failed actors, every shard local to the learner.
        """
        now = time.perf_counter()
        wall = max(now - self._iter_start, 1e-9)
        lr, updates = self.learner, self.learner.num_updates
        self._window.wall_s = wall
        self._window.steps = self.steps_sampled - self._iter_steps0
        everyone = [*self.workers, *([self.evaluator] if self.evaluator else [])]
        learner = learner_metrics(
            lr,
            dequeue=self.dequeue_timer,
            grad=self.grad_timer,
            grad_cpu=self.grad_cpu_timer,
            overall=self.overall_timer,
            queue_size=self.queue_size,
            recent=list(self._recent),
            counters={
                "learner/enqueue_blocked_s": 0.0,
                "learner/ratio_wait_s": 0.0,
                "learner/hook_calls": self.hook_calls,
                "learner/local_shards": len(self.shards),
                "learner/weight_snapshots": self.weight_snapshots,
            },
            flow=LearnerFlow(
                batches_received=updates, batches_trained=updates, priority_updates_sent=updates
            ),
        )
        shards = [
            shard_metrics(
                k,
                s.stats(),
                ShardFlow(
                    rollouts_stored=self.shard_rollouts[k],
                    batches_sampled=self.shard_batches[k],
                    priority_updates_applied=self.shard_batches[k],
                ),
            )
            for k, s in enumerate(self.shards)
        ]
        envs = [
            env_metrics(
                i,
                exploration=eps,
                exploration_name=agent_of(self.config).exploration,
                steps_sampled=w.steps_sampled,
                steps_per_s=(w.steps_sampled - self._iter_worker_steps0[i]) / wall,
                rollouts_sent=self.worker_rollouts[i],
                weights_version=w.weights_version,
                env_errors=w.env_errors,
            )
            for i, (eps, w) in enumerate(zip(self.explorations, self.workers, strict=True))
        ]
        return build_result(
            iteration=self.iteration + 1,
            time_s=now - self.start_time,
            window=self._window,
            steps_total=self.steps_sampled,
            learner=learner,
            prev_learner={
                "learner/updates": self._iter_updates0,
                "learner/grad_total_s": self._iter_grad0,
            },
            shards=shards,
            envs=envs,
            acting_versions=[w.weights_version for w in self.workers],
            weight_syncs=self.weight_syncs,
            eval_result=self._window_eval,
            extra=FaultCounters(env_errors=sum(w.env_errors for w in everyone)).metrics(),
            per_worker_keys=self.config.report.per_worker_keys,
        )

    def _eval_return(self) -> float | None:
        return None if self.last_eval is None else float(self.last_eval["return_mean"])

    def iterate(self, stop: Any = None) -> Iterator[dict[str, float]]:
        """Run rounds; yield a result dict per iteration until a stop condition holds.

        ``stop`` (dict or object with ``timesteps``, ``train_return``,
        ``eval_return``, ``time_s``, ``iterations``) overrides the config's ``stop``
        section field by field (:class:`~apex_dask.experiment.stop.StopRule`).
        ``eval_return`` is compared with the newest greedy evaluation's mean return
        (checked after every round), ``train_return`` with the iteration's
        ``env/episode_return_mean``. With no stop condition it runs forever.
        """
        rule = StopRule.resolve(self.config.stop, stop, use_eval=self.evaluator is not None)

        def reason(result: dict[str, float] | None) -> str | None:
            return rule.reason(
                timesteps=self.steps_sampled,
                time_s=self.elapsed(),
                iterations=self.iteration,
                train_return=None if result is None else result["env/episode_return_mean"],
                eval_return=self._eval_return(),
            )

        while True:
            self.step()
            stopping = reason(None) is not None
            if not (stopping or self._iteration_complete()):
                continue
            if self.config.eval.interval_s == 0 and self.evaluator is not None:
                self.evaluate()
                stopping = stopping or reason(None) is not None
            result = self.result()
            self.iteration += 1
            stopping = stopping or reason(result) is not None
            yield result
            if stopping:
                return
            self._begin_iteration()

    # -- checkpoints (experiment.checkpoints.stateful.Stateful) ---------
    def state_dict(self) -> dict[str, Any]:
        """The checkpoint's parts: the learner's, each shard's, the runner's counters."""
        return runner_state(self)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Load :meth:`state_dict`'s parts into this freshly built runner."""
        restore_runner(self, state)

    def save(self, path: str | Path) -> Path:
        """Write a checkpoint directory (atomically): learner, every shard, counters, config.

        Env workers' episodes in progress are not saved: after :meth:`restore`
        they start new episodes with the restored learner's weights.
        """
        return save_runner(self, path)

    @classmethod
    def restore(cls, path: str | Path, config: ApexConfig | None = None) -> LocalApex:
        """A runner continuing from :meth:`save`'s checkpoint (with its config, unless given),
        or from the newest good one in a folder of ``ckpt-N`` (``load_newest_runner_checkpoint``)."""
        parts, meta, _ = load_newest_runner_checkpoint(path)  # refuses NaN weights, names it
        apex = cls(config if config is not None else ApexConfig.from_dict(meta["config"]))
        apex.load_state_dict(parts)
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


def run_local(
    config: ApexConfig, stop: Any = None, before_learn_on_batch: Hook | None = None
) -> Iterator[dict[str, float]]:
    """Run Ape-X in this process; yield one flat result dict per iteration.

    See :class:`LocalApex` and the module docstring; ``stop`` as in
    :meth:`LocalApex.iterate`. The envs are closed when the generator ends.
    """
    with LocalApex(config, before_learn_on_batch) as apex:
        yield from apex.iterate(stop)
