"""Creating, replacing and releasing the actors of one run.

::

    actors = ActorSet(client, config, placement, env_factory, run_id)
    state = actors.create(before_learn_on_batch)   # a RunState holding every handle
    future, handle, address = await actors.replace_env_worker(slot, scheduler_info)
    handle = await actors.rebuild_shard(k, where)   # the caller puts it in the state
    actors.close(state.handles()); actors.release()

Every actor is pinned to the worker its placement names, and its Future is
kept until :meth:`ActorSet.release` (Dask deletes an actor whose Future is
dropped, even while other actors hold its handle). This owns the Futures,
the refs new actors are wired with and the placement; the handles live in
the :class:`~.state.RunState` only. Handles are bound to the driver's
client. Bulk data never passes through here: the shards, the learner and
the env workers get each other's handles.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable, Mapping
from typing import Any

from apex_dask.algo.envs.probe import probe_spaces
from apex_dask.config import ApexConfig
from apex_dask.experiment.builder import (
    Hook,
    agent_spec,
    exploration_ladder,
    learner_seed,
    shard_actor_kwargs,
    worker_spec,
)
from apex_dask.experiment.stats import derive_seed
from apex_dask.runtime.actors import EnvWorkerActor, LearnerActor, ReplayShardActor
from apex_dask.runtime.actors.calls import ActorRef, bind
from apex_dask.runtime.actors.contracts import EnvWorkerHandle, LearnerHandle, ShardHandle
from apex_dask.runtime.errors import ApexRuntimeError, describe
from apex_dask.runtime.orchestration.creation import created
from apex_dask.runtime.orchestration.placement import (
    Placement,
    WorkerInfo,
    workers_from_scheduler_info,
)
from apex_dask.runtime.orchestration.state import EnvSlot, RunState

__all__ = ["ActorSet"]


def _probe_on_worker(env_factory: Any, make_timeout_s: float) -> tuple[Any, str | None]:
    """``(spaces, None)``, or ``(None, why)`` if the env cannot be made: the error comes
    back as a value, so the worker does not log it (with a traceback) to its console."""
    try:
        return probe_spaces(env_factory, make_timeout_s), None
    except Exception as exc:
        return None, str(exc)


def _live_actors(keys: set, dask_worker: Any = None) -> int:
    return sum(1 for k in dask_worker.state.actors if k in keys)


ENV_METRICS_PER_S = 32.0
"""Metrics events all env workers together send the scheduler per second, at most."""


def env_metrics_interval_s(num_workers: int) -> float:
    """Seconds between one env worker's metrics events: 1 s up to 32 env workers, then
    longer, so the scheduler gets at most :data:`ENV_METRICS_PER_S` of them a second
    whatever the count (each worker's own rollouts would otherwise be one event each at
    the paper's rate: 252/s from 360 actors)."""
    return max(1.0, num_workers / ENV_METRICS_PER_S)


class ActorSet:
    """The actors of one Ape-X run on ``client``'s cluster, placed by ``placement``."""

    def __init__(
        self,
        client: Any,
        config: ApexConfig,
        placement: Placement,
        env_factory: Callable[[], Any],
        run_id: str,
    ) -> None:
        self.client = client
        self.config = config
        self.placement = placement
        self.env_factory = env_factory
        self.run_id = run_id
        self.timeout = float(config.topology.call_timeout_s)
        self.futures: list[Any] = []
        self._refs: dict[str, ActorRef] = {}  # Future key -> the ref its handle is made from
        self.replaced = 0
        # the current Future of each shard and of the learner (a rebuilt actor's replaces
        # a lost one's: new actors must never wait on a lost Future)
        self.shard_refs: list[tuple] = []
        self.learner_ref: tuple = ()
        self._spaces: tuple[Any, Any] | None = None
        self._hook: Hook | None = None
        self._worker_spec = worker_spec(config)

    def _submit(self, cls: type, *args: Any, where: str, **kwargs: Any) -> Any:
        fut = self.client.submit(cls, *args, actor=True, workers=[where], pure=False, **kwargs)
        self.futures.append(fut)
        self._refs[fut.key] = (cls, where, fut.key)
        return fut

    def _handle(self, fut: Any) -> Any:
        """The handle of the (created) actor of ``fut``, bound to the driver's client."""
        return bind(self._refs[fut.key], self.client)

    def _env_worker(self, index: int, exploration: float, seed: int, where: str) -> Any:
        animation = index < 0 and self.config.eval.animation  # the evaluator's
        return self._submit(
            EnvWorkerActor,
            index,
            self.env_factory,
            list(self.shard_refs),
            self.learner_ref,
            self._worker_spec,
            exploration=float(exploration),
            seed=int(seed),
            call_timeout_s=self.timeout,
            run=self.run_id,
            animation=animation,
            simulate_steps_per_s=self.config.simulate.env_steps_per_s,
            metrics_interval_s=env_metrics_interval_s(self.config.workers.num_workers),
            where=where,
        )

    def _shard(self, k: int, where: str) -> Any:
        kwargs = shard_actor_kwargs(self.config, k)
        fut = self._submit(
            ReplayShardActor, k, **kwargs, run=self.run_id, call_timeout_s=self.timeout, where=where
        )
        ref = self._refs[fut.key]
        if k < len(self.shard_refs):
            self.shard_refs[k] = ref
        else:
            self.shard_refs.append(ref)
        return fut

    def _learner(self, where: str) -> Any:
        assert self._spaces is not None
        lr = self.config.learner
        fut = self._submit(
            LearnerActor,
            *self._spaces,
            list(self.shard_refs),
            agent=agent_spec(self.config),
            seed=learner_seed(self.config),
            batch_size=lr.batch_size,
            inqueue_size=lr.inqueue_size,
            prefetch_per_shard=lr.prefetch_per_shard,
            max_replay_ratio=lr.max_replay_ratio,
            call_timeout_s=self.timeout,
            before_learn_on_batch=self._hook,
            run=self.run_id,
            shared_memory=self.config.replay.shared_memory,
            audit_priorities=self.config.replay.audit_priorities,
            where=where,
        )
        self.learner_ref = self._refs[fut.key]
        return fut

    def create(self, hook: Hook | None) -> RunState:
        """Create every actor and wait for them; the run state holding their handles
        (one-line :class:`ApexRuntimeError` if one fails)."""
        cfg, p = self.config, self.placement
        n_shards = cfg.replay.num_shards
        used = [i for i, w in enumerate(p.env_workers) if w is not None]  # elastic: some slots
        create_timeout = max(self.timeout, 120.0)
        probe = self.client.submit(
            _probe_on_worker,
            self.env_factory,
            cfg.env.make_timeout_s,
            workers=[p.learner.address],
            pure=False,
        )
        try:
            spaces, error = probe.result(timeout=create_timeout)
        except Exception as exc:
            spaces, error = None, str(exc)
        if spaces is None:
            raise ApexRuntimeError(f"cannot make env {cfg.env.env_id!r} on a worker: {error}")
        obs_space, act_space = spaces
        self._spaces, self._hook = (obs_space, act_space), hook

        def wait(roles: list[str], futs: list[Any]) -> list[Any]:
            out = []
            for role, fut in zip(roles, futs, strict=True):
                try:
                    fut.result(timeout=create_timeout)
                except Exception as exc:
                    raise ApexRuntimeError(
                        f"cannot create the {role} actor: {describe(exc)}"
                    ) from None
                out.append(self._handle(fut))
            return out

        # in order: actors are wired by refs, not Futures, so Dask does not order them
        shard_futs = [self._shard(k, p.shards[k].address) for k in range(n_shards)]
        handles = wait([f"replay shard {k}" for k in range(n_shards)], shard_futs)
        handles += wait(["learner"], [self._learner(p.learner.address)])
        ladder = self.ladder()
        where = [p.env_worker(i).address for i in used]
        env_futs = [
            self._env_worker(i, ladder[i], derive_seed(cfg.seed, "worker", i), a)
            for i, a in zip(used, where, strict=True)
        ]
        with_eval = cfg.eval.episodes > 0
        if with_eval:
            seed = derive_seed(cfg.seed, "eval")
            env_futs.append(self._env_worker(-1, 0.0, seed, p.evaluator.address))
        roles = [f"env worker {i}" for i in used] + (["evaluator"] if with_eval else [])
        envs = wait(roles, env_futs)
        slots = [EnvSlot(i, env_futs[j], envs[j], where[j], ladder[i]) for j, i in enumerate(used)]
        evaluator = None
        if with_eval:
            evaluator = EnvSlot(-1, env_futs[-1], envs[-1], p.evaluator.address, 0.0)
        return RunState(
            learner=handles[n_shards],
            learner_address=p.learner.address,
            shards=handles[:n_shards],
            slots=slots,
            evaluator=evaluator,
            seed=cfg.seed,
        )

    async def replace_env_worker(
        self, slot: EnvSlot, info: Mapping[str, Any]
    ) -> tuple[Any, EnvWorkerHandle, str]:
        """Re-create a lost env worker on the surviving worker with the fewest env workers;
        ``(future, handle, address)`` of the new actor, for :meth:`EnvSlot.rebind`.

        The new actor has no weights: the plan syncs it before its first rollout.
        """
        workers = workers_from_scheduler_info(info)
        learner = self.placement.learner.address
        alive = [w for w in workers if w.address != learner] or workers
        if not alive:
            raise ApexRuntimeError(f"env worker {slot.index} was lost and no worker is left")
        load = {w.address: 0 for w in alive}
        for w in self.placement.env_workers:
            if w is not None and w.address in load:
                load[w.address] += 1
        where = min(alive, key=lambda w: load[w.address])
        self.replaced += 1
        role = ("eval", 0) if slot.index < 0 else ("worker", slot.index)
        seed = derive_seed(self.config.seed, *role) + 7919 * self.replaced
        fut = self._env_worker(slot.index, slot.exploration, seed & 0x7FFFFFFF, where.address)
        handle = await self._created(fut, where)  # ActorNotCreated if ``where`` leaves meanwhile
        self.placement = self.placement.moved(slot.index, where)
        return fut, handle, where.address

    def ladder(self) -> list[float]:
        """The fixed exploration ladder (epsilons, or noise scales under ``algo: dpg``): one
        per slot of ``workers.num_workers``."""
        return [float(e) for e in exploration_ladder(self.config)]

    async def add_env_worker(self, index: int, where: WorkerInfo) -> EnvSlot:
        """A new env worker in slot ``index`` (its ladder exploration) on ``where`` (a worker
        that joined); its slot. It has no weights: the plan syncs it before it acts."""
        self.replaced += 1
        seed = derive_seed(self.config.seed, "worker", index) + 7919 * self.replaced
        exploration = self.ladder()[index]
        fut = self._env_worker(index, exploration, seed & 0x7FFFFFFF, where.address)
        handle = await self._created(fut, where)
        self.placement = self.placement.moved(index, where)
        return EnvSlot(index, fut, handle, where.address, exploration)

    async def add_relay(self, host: str, where: WorkerInfo) -> tuple[Any, Any, ActorRef]:
        """A weights relay for ``host`` on ``where``; ``(future, handle, ref)``."""
        from apex_dask.runtime.actors.weight_relay import WeightRelayActor

        max_age = float(self.config.topology.weight_relay_max_age_s)
        fut = self._submit(
            WeightRelayActor,
            host,
            call_timeout_s=self.timeout,
            max_age_s=max_age,
            where=where.address,
        )
        handle = await self._created(fut, where)
        return fut, handle, self._refs[fut.key]

    async def move_shard(self, k: int, where: WorkerInfo) -> tuple[ShardHandle, Any, Any]:
        """A new, empty replay shard ``k`` on ``where`` beside the old one, which lives on
        until :meth:`retire`; ``(new handle, its ref, the old one's Future)``."""
        old = next(f for f in self.futures if f.key == self.shard_refs[k][2])
        handle = await self._created(self._shard(k, where.address), where)
        self.placement = self.placement.shard_moved(k, where)
        return handle, self.shard_refs[k], old

    async def move_learner(self, where: WorkerInfo) -> tuple[LearnerHandle, Any]:
        """A new learner on ``where`` (not started) beside the old one, which lives on
        until :meth:`retire`; ``(new handle, the old one's Future)``."""
        old = next(f for f in self.futures if f.key == self.learner_ref[2])
        handle = await self._created(self._learner(where.address), where)
        self.placement = self.placement.learner_moved(where)
        return handle, old

    def ref(self, fut: Any) -> ActorRef:
        """The ref of the actor of ``fut`` (what other actors are given)."""
        return self._refs[fut.key]

    async def retire(self, fut: Any) -> None:
        """Delete the actor of ``fut`` (handed over, or its env worker retired)."""
        self._drop(fut.key)
        await self._cancel(fut)

    async def _cancel(self, fut: Any) -> None:
        """Ask the scheduler to forget ``fut`` (bounded; best effort)."""
        try:
            cancel = self.client.cancel([fut], force=True, asynchronous=True)
            await asyncio.wait_for(cancel, min(self.timeout, 10.0))
        except Exception:
            pass

    async def _created(self, fut: Any, where: WorkerInfo | None = None) -> Any:
        """The handle of the actor of ``fut`` once it exists (:func:`.creation.created`:
        at most ``max(call timeout, 120 s)``, :class:`ActorNotCreated` at once if
        ``where``, the worker it is pinned to, leaves); on any failure its Future is
        dropped."""
        try:
            await created(self.client, fut, where, max(self.timeout, 120.0))
        except BaseException:
            self._drop(fut.key)
            await self._cancel(fut)
            raise
        return self._handle(fut)

    async def rebuild_shard(self, k: int, where: WorkerInfo) -> ShardHandle:
        """A new, empty replay shard ``k`` on ``where``; its handle."""
        self._drop(self.shard_refs[k][2])
        handle = await self._created(self._shard(k, where.address), where)
        self.placement = self.placement.shard_moved(k, where)
        return handle

    async def rebuild_learner(self, where: WorkerInfo) -> LearnerHandle:
        """A new learner on ``where``, wired to the current shards (not started)."""
        self._drop(self.learner_ref[2])
        handle = await self._created(self._learner(where.address), where)
        self.placement = self.placement.learner_moved(where)
        return handle

    def _drop(self, key: str) -> None:
        """Forget a lost actor's Future (else the scheduler would re-create the actor
        where its worker comes back)."""
        self.futures = [f for f in self.futures if f.key != key]
        self._refs.pop(key, None)

    def close(self, handles: list[Any], timeout_s: float = 10.0) -> None:
        """Ask every actor in ``handles`` to stop and flush its metrics, all at once, for
        at most ``timeout_s`` in all (best effort: a lost actor never answers)."""

        async def close_all() -> None:
            async def one(h: Any) -> None:
                await h.close()

            calls = [asyncio.ensure_future(one(h)) for h in handles]
            if calls:
                await asyncio.wait(calls, timeout=timeout_s)
            for c in calls:
                c.cancel()

        try:
            fut = asyncio.run_coroutine_threadsafe(close_all(), self.client.loop.asyncio_loop)
            fut.result(timeout=timeout_s + 1.0)
        except Exception:
            pass

    def release(self, wait: bool = True, timeout_s: float = 10.0) -> None:
        """Drop every Future (Dask deletes the actors); with ``wait``, wait up to
        ``timeout_s`` until they are gone."""
        client, futures = self.client, self.futures
        keys = {f.key for f in futures}
        self.futures, self._refs = [], {}
        bound = max(1.0, min(timeout_s, 10.0))
        if futures:
            try:
                cancel = asyncio.wait_for(
                    client.cancel(futures, force=True, asynchronous=True), bound
                )
                asyncio.run_coroutine_threadsafe(cancel, client.loop.asyncio_loop).result(bound + 1)
            except Exception:
                pass
        del futures
        gc.collect()
        deadline = time.monotonic() + (timeout_s if wait else 0)
        while time.monotonic() < deadline:
            try:
                live = client.run(
                    _live_actors, keys, callback_timeout=max(1.0, deadline - time.monotonic())
                )
                if not any(live.values()):
                    return
            except Exception:
                return
            time.sleep(0.1)
