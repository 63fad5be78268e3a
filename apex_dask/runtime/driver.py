"""``ApexDriver``: Ape-X on a Dask cluster, from a script, a notebook or the CLI.

::

    with ApexDriver(ApexConfig.preset("cartpole")) as driver:   # embedded LocalCluster
        print(driver.placement["learner"]["name"], driver.dashboard_link)
        for result in driver.iterate():                           # one dict per iteration
            print(result["timesteps_total"], result["env/episode_return_mean"])
            if result["iteration"] >= 5:
                break
        version, weights = driver.learner_weights()

    results = ApexDriver(cfg, client).run(stop={"timesteps": 50_000})

The driver places the actors (:mod:`apex_dask.runtime.placement`), pins each
to its worker, keeps every actor's Future for the whole run (Dask deletes an
actor whose Future is dropped), wires the handles and runs the execution plan
(:mod:`apex_dask.runtime.plan`) as an asyncio task on the client's event loop
thread. So ``iterate()`` works where an event loop already runs (Jupyter): it
only waits on a thread-safe queue of results. Bulk data (rollouts, batches,
weights) never passes through the driver; only summaries and stats do.
"""

from __future__ import annotations

import asyncio
import gc
import queue
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from apex_dask.algo.env_worker import probe_spaces
from apex_dask.algo.envs import UnknownEnvError, make_env_factory
from apex_dask.algo.exploration import apex_epsilons
from apex_dask.algo.results import derive_seed
from apex_dask.builder import env_worker_kwargs, learner_kwargs
from apex_dask.config import ApexConfig, StopConfig
from apex_dask.local import resolve_stop
from apex_dask.runtime.actors import EnvWorkerActor, LearnerActor, ReplayShardActor
from apex_dask.runtime.cluster import start_local_cluster, wait_for_workers
from apex_dask.runtime.errors import ApexRuntimeError
from apex_dask.runtime.placement import plan_placement, workers_from_scheduler_info
from apex_dask.runtime.plan import EnvSlot, ExecutionPlan
from apex_dask.runtime.report import stop_reason

__all__ = ["ApexDriver", "ApexRuntimeError"]

Hook = Callable[[dict[str, Any], int], dict[str, Any]]


def _bind(handle: Any, client: Any) -> Any:
    """A handle to the same actor bound to ``client`` (not whatever client is the default)."""
    from distributed.actor import Actor

    with client.as_current():
        return Actor(handle._cls, handle._address, handle.key)


def _live_actors(keys: set, dask_worker: Any = None) -> int:
    return sum(1 for k in dask_worker.state.actors if k in keys)


class ApexDriver:
    """Runs Ape-X with ``config`` on ``client``'s cluster (an embedded one when None).

    ``before_learn_on_batch(batch, shard_id) -> batch`` runs on the learner's
    worker for every replayed batch (``batch`` has ``indices``, ``weights``,
    ``data``). ``min_replay_ratio`` (rho; default ``config.learner.min_replay_ratio``
    when the config has that field): once training has started, env workers
    wait while transitions trained < rho * (env steps sampled - a few
    fragments of slack), so a learner
    slower than its env workers keeps the sample efficiency of the in-process
    runner (which trains at ``learner.max_replay_ratio``). None: env workers
    run free, as in Ape-X. Raises :class:`ApexRuntimeError` (one line) for an unknown env
    id (checked before anything starts), a cluster without workers or actors
    that cannot be created.
    """

    def __init__(
        self,
        config: ApexConfig,
        client: Any = None,
        *,
        before_learn_on_batch: Hook | None = None,
        dashboard_address: str | None = ":8787",
        worker_wait_s: float = 30.0,
        min_replay_ratio: float | None = None,
    ) -> None:
        self.config = config
        self.run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
        try:
            self._env_factory = make_env_factory(config.env.env_id, config.env.env_kwargs)
        except UnknownEnvError as exc:
            raise ApexRuntimeError(str(exc)) from None
        self._cluster = None
        self._owns_client = client is None
        self._stopped = False
        self._futures: list[Any] = []
        self._core: Any = None
        self._results: queue.Queue = queue.Queue()
        self._plan: ExecutionPlan | None = None
        self._timeout = float(config.topology.call_timeout_s)
        if min_replay_ratio is None:
            min_replay_ratio = getattr(config.learner, "min_replay_ratio", None)
        if min_replay_ratio is not None:
            top = config.learner.max_replay_ratio
            if not min_replay_ratio > 0 or (top is not None and min_replay_ratio > top):
                raise ApexRuntimeError(
                    f"min_replay_ratio={min_replay_ratio!r} must be > 0 and <= "
                    f"learner.max_replay_ratio ({top})"
                )
        self._min_replay_ratio = min_replay_ratio
        if client is None:
            self._cluster, client = start_local_cluster(
                config.topology.local_workers, dashboard_address=dashboard_address
            )
        elif getattr(client, "asynchronous", False):
            raise ApexRuntimeError("ApexDriver needs a synchronous dask Client (not asynchronous)")
        self._client = client
        try:
            workers = wait_for_workers(client, 1, worker_wait_s)
            self._placement = plan_placement(
                workers,
                num_shards=config.replay.num_shards,
                num_env_workers=config.workers.num_workers,
                learner_worker=config.topology.learner_worker,
                colocate_shards=config.replay.colocate_with_learner,
            )
            self.placement: dict[str, Any] = self._placement.as_dict()
            self.dashboard_link: str | None = self._dashboard()
            self._create_actors(before_learn_on_batch)
        except BaseException:
            self._release()
            raise

    # ------------------------------------------------------------------ setup
    def _dashboard(self) -> str | None:
        from apex_dask.runtime.preload import dashboard_url, ensure_plugin

        try:
            page = True if self._cluster is not None else bool(ensure_plugin(self._client))
        except Exception:  # a scheduler that cannot import apex_dask
            page = False
        try:
            return dashboard_url(self._client) if page else self._client.dashboard_link
        except Exception:
            return None

    def _env_kwargs(self, index: int, epsilon: float, seed: int) -> dict[str, Any]:
        cfg = self.config
        return {
            "epsilon": float(epsilon),
            "seed": int(seed),
            **env_worker_kwargs(cfg),
            "call_timeout_s": self._timeout,
            "run": self.run_id,
        }

    def _submit(self, cls: type, *args: Any, where: str, **kwargs: Any) -> Any:
        fut = self._client.submit(cls, *args, actor=True, workers=[where], pure=False, **kwargs)
        self._futures.append(fut)
        return fut

    def _create_actors(self, hook: Hook | None) -> None:
        cfg, c, p = self.config, self._client, self._placement
        n_shards, n_env = cfg.replay.num_shards, cfg.workers.num_workers
        seeds = [
            int(s) for s in np.random.SeedSequence(cfg.seed).generate_state(n_shards + n_env + 2)
        ]
        self._seeds = seeds
        create_timeout = max(self._timeout, 120.0)
        probe = c.submit(probe_spaces, self._env_factory, workers=[p.learner.address], pure=False)
        try:
            obs_space, act_space = probe.result(timeout=create_timeout)
        except Exception as exc:
            raise ApexRuntimeError(
                f"cannot make env {cfg.env.env_id!r} on a worker: {exc}"
            ) from None
        shard_futs = [
            self._submit(
                ReplayShardActor,
                k,
                cfg.replay.shard_capacity,
                alpha=cfg.replay.alpha,
                beta=cfg.replay.beta,
                eps=cfg.replay.eps,
                learning_starts=cfg.replay.shard_learning_starts,
                batch_size=cfg.learner.batch_size,
                seed=derive_seed(cfg.seed, "shard", k),
                run=self.run_id,
                where=p.shards[k].address,
            )
            for k in range(n_shards)
        ]
        lr = cfg.learner
        learner_fut = self._submit(
            LearnerActor,
            obs_space,
            act_space,
            shard_futs,
            learner_kwargs=learner_kwargs(cfg),
            batch_size=lr.batch_size,
            inqueue_size=lr.inqueue_size,
            prefetch_per_shard=lr.prefetch_per_shard,
            max_replay_ratio=lr.max_replay_ratio,
            call_timeout_s=self._timeout,
            before_learn_on_batch=hook,
            run=self.run_id,
            where=p.learner.address,
        )
        self._epsilons = apex_epsilons(n_env, cfg.workers.epsilon_base, cfg.workers.epsilon_alpha)
        env_futs = [
            self._submit(
                EnvWorkerActor,
                i,
                self._env_factory,
                shard_futs,
                learner_fut,
                where=p.env_workers[i].address,
                **self._env_kwargs(i, self._epsilons[i], derive_seed(cfg.seed, "worker", i)),
            )
            for i in range(n_env)
        ]
        eval_fut = None
        if cfg.eval.episodes > 0:
            eval_fut = self._submit(
                EnvWorkerActor,
                -1,
                self._env_factory,
                shard_futs,
                learner_fut,
                where=p.evaluator.address,
                **self._env_kwargs(-1, 0.0, derive_seed(cfg.seed, "eval")),
            )
        roles = (
            [f"replay shard {k}" for k in range(n_shards)]
            + ["learner"]
            + [f"env worker {i}" for i in range(n_env)]
            + (["evaluator"] if eval_fut is not None else [])
        )
        handles = []
        for role, fut in zip(roles, list(self._futures), strict=True):
            try:
                handles.append(_bind(fut.result(timeout=create_timeout), c))
            except Exception as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                raise ApexRuntimeError(
                    f"cannot create the {role} actor: {type(exc).__name__}: {first}"
                ) from None
        self._shards = handles[:n_shards]
        self._learner = handles[n_shards]
        slots = [
            EnvSlot(i, env_futs[i], handles[n_shards + 1 + i], p.env_workers[i].address, float(e))
            for i, e in enumerate(self._epsilons)
        ]
        self._evaluator = (
            EnvSlot(-1, eval_fut, handles[-1], p.evaluator.address, 0.0)
            if eval_fut is not None
            else None
        )
        self._plan = ExecutionPlan(
            config=cfg,
            client=c,
            run_id=self.run_id,
            learner=self._learner,
            shards=self._shards,
            slots=slots,
            evaluator=self._evaluator,
            learner_address=p.learner.address,
            shard_addresses=[w.address for w in p.shards],
            results=self._results,
            replace_env_worker=self._replace_env_worker,
            seed=cfg.seed,
            min_replay_ratio=self._min_replay_ratio,
        )

    async def _replace_env_worker(self, slot: EnvSlot, info: Mapping[str, Any]) -> None:
        """Re-create a lost env worker on the surviving worker with the fewest env workers."""
        workers = workers_from_scheduler_info(info)
        learner = self._placement.learner.address
        alive = [w for w in workers if w.address != learner] or workers
        if not alive:
            raise ApexRuntimeError(f"env worker {slot.index} was lost and no worker is left")
        assert self._plan is not None
        load = {w.address: 0 for w in alive}
        for s in self._plan.slots:
            if s.address in load:
                load[s.address] += 1
        where = min(alive, key=lambda w: load[w.address])
        seed = self._seeds[len(self._shards) + slot.index] + 7919 * (
            1 + self._plan.env_workers_replaced
        )
        fut = self._client.submit(
            EnvWorkerActor,
            slot.index,
            self._env_factory,
            self._futures[: len(self._shards)],
            self._futures[len(self._shards)],
            actor=True,
            workers=[where.address],
            pure=False,
            **self._env_kwargs(slot.index, slot.epsilon, seed),
        )
        self._futures.append(fut)
        handle = await self._client.gather(fut, asynchronous=True)
        slot.future, slot.handle, slot.address = fut, _bind(handle, self._client), where.address
        slot.version, slot.steps_since_sync = -1, self.config.workers.max_weight_sync_delay
        if slot.index < 0:
            self.placement["evaluator"] = where.as_dict()
        else:
            self.placement["env_workers"][slot.index] = where.as_dict()

    # ---------------------------------------------------------------- running
    def _ensure_running(self) -> None:
        if self._stopped or self._plan is None:
            raise ApexRuntimeError("this ApexDriver was stopped; create a new one")
        if self._core is None:
            loop = self._client.loop.asyncio_loop
            self._core = asyncio.run_coroutine_threadsafe(self._plan.run(), loop)

    def iterate(self) -> Iterator[dict[str, float]]:
        """Start (or resume) training and yield one result dict per iteration, forever.

        Break out of the loop to pause the consumer; :meth:`halt` pauses the
        actors, :meth:`stop` releases them.
        """
        self._ensure_running()
        while True:
            try:
                item = self._results.get(timeout=0.2)
            except queue.Empty:
                core = self._core
                if core is None or not core.done():
                    continue
                self._core = None
                core.result()  # raises the plan's error, if any
                return
            yield item

    def run(self, stop: StopConfig | Mapping[str, Any] | None = None) -> list[dict[str, float]]:
        """Train until a stop condition (``config.stop`` merged with ``stop``); halt; return results."""
        cond = resolve_stop(self.config.stop, stop)
        use_eval = self.config.eval.episodes > 0
        results: list[dict[str, float]] = []
        for result in self.iterate():
            results.append(result)
            if stop_reason(cond, result, use_eval):
                break
        self.halt()
        return results

    def halt(self) -> dict[str, float] | None:
        """Pause: finish calls in flight, stop the learner; return consistent final stats.

        After a halt every hop's counters agree (``flow/*``); :meth:`iterate`
        resumes.
        """
        core, self._core = self._core, None
        if core is not None and self._plan is not None:
            self._plan.halting = True
            core.result(timeout=3 * self._timeout + 10)
        return self.final

    @property
    def final(self) -> dict[str, float] | None:
        """Stats taken after the last :meth:`halt` (None before one)."""
        return None if self._plan is None else self._plan.final

    def learner_weights(self) -> tuple[int, dict[str, np.ndarray]]:
        """``(version, {name: array})`` of the learner's online network."""
        return self._learner.get_weights().result(timeout=self._timeout)

    def learner_state(self) -> dict[str, Any]:
        """The learner's full state (online, target, optimizer, counters) as numpy."""
        return self._learner.state_dict().result(timeout=self._timeout)

    # ---------------------------------------------------------------- teardown
    def stop(self) -> None:
        """Halt, close and release every actor; close the cluster the driver started."""
        if self._stopped:
            return
        self._stopped = True
        try:
            self.halt()
        except Exception:
            pass
        if self._plan is not None:
            handles = [self._learner, *self._shards, *(s.handle for s in self._plan.slots)]
            if self._plan.evaluator is not None:
                handles.append(self._plan.evaluator.handle)
            for h in handles:
                try:
                    h.close().result(timeout=10)
                except Exception:
                    pass
        self._release()

    def _release(self) -> None:
        client, futures = self._client, self._futures
        keys = {f.key for f in futures}
        self._futures, self._plan = [], None
        self._learner = self._shards = self._evaluator = None
        if futures:
            try:
                client.cancel(futures, force=True)
            except Exception:
                pass
        del futures
        gc.collect()
        if self._cluster is not None:
            try:
                client.close()
            finally:
                self._cluster.close()
                self._cluster = None
            return
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if not any(client.run(_live_actors, keys).values()):
                    return
            except Exception:
                return
            time.sleep(0.1)

    def __enter__(self) -> ApexDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
