"""``ApexDriver``: Ape-X on a Dask cluster, from a script, a notebook or the CLI.

::

    with ApexDriver(ApexConfig.preset("cartpole")) as driver:   # embedded LocalCluster
        print(driver.placement["learner"]["name"], driver.dashboard_link)
        for result in driver.iterate():                           # one dict per iteration
            print(result["timesteps_total"], result["env/episode_return_mean"])
            if result["iteration"] >= 5:
                break
        version, weights = driver.learner_weights()

    results = train(cfg, client, stop={"timesteps": 50_000})      # the same, in one call
    ApexDriver(cfg, tensorboard_dir="runs/cartpole")  # + TensorBoard: tensorboard --logdir runs/

The driver places the actors (:mod:`.placement`), creates and pins them
(:mod:`.launch`, which keeps every actor's Future for the whole run) and runs
the execution plan (:mod:`.plan`) as an asyncio task on the client's event
loop thread. So ``iterate()`` works where an event loop already runs
(Jupyter): it only waits on a thread-safe queue of results. Bulk data
(rollouts, batches, weights) never passes through the driver; only
summaries and stats do.
"""

from __future__ import annotations

import asyncio
import os
import queue
import secrets
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from apex_dask.algo.envs.factory import UnknownEnvError
from apex_dask.config import ApexConfig, ConfigError, StopConfig
from apex_dask.experiment.best_weights import BestWeights
from apex_dask.experiment.builder import Hook, env_factory, resolve_hook
from apex_dask.experiment.stop import StopRule
from apex_dask.experiment.tracking import TensorBoardSink, TrackingError, require_tensorboard
from apex_dask.runtime.errors import ApexRuntimeError
from apex_dask.runtime.orchestration.announce import announce, dashboard_link
from apex_dask.runtime.orchestration.cluster import (
    close_local_cluster,
    start_local_cluster,
    wait_for_workers,
)
from apex_dask.runtime.orchestration.elastic import install_handover, start_placement
from apex_dask.runtime.orchestration.launch import ActorSet
from apex_dask.runtime.orchestration.placement import only_workers
from apex_dask.runtime.orchestration.plan import ExecutionPlan
from apex_dask.runtime.orchestration.resume import (
    StartCheckpoints,
    open_tensorboard,
    restore_newest,
)
from apex_dask.runtime.orchestration.state import RunState
from apex_dask.runtime.orchestration.views import RunViews

__all__ = ["ApexDriver", "ApexRuntimeError", "train"]


def _slow_s(call_timeout_s: float) -> float:
    """A checkpoint's bound without a budget: its parts' (>= 120 s) and a minute."""
    return max(call_timeout_s, 120.0) + 60.0


def _share(end: float | None, part: float, cap: float) -> float:
    """``part`` of the seconds left until ``end``, at most ``cap`` (``cap``: no end)."""
    return cap if end is None else max(0.1, min(cap, part * (end - time.monotonic())))


class ApexDriver(RunViews):
    """Runs Ape-X with ``config`` on ``client``'s cluster (an embedded one when None).

    ``before_learn_on_batch(batch, shard_id) -> batch`` runs on the learner's
    worker for every replayed batch (``batch`` has ``indices``, ``weights``,
    ``data``); without it, ``learner.before_learn_on_batch`` (an import path)
    is used. ``min_replay_ratio`` (rho; default ``config.learner.min_replay_ratio``
    when the config has that field): once training has started, env workers
    wait while transitions trained < rho * (items added to the replay - a few
    fragments of slack), so a learner slower than its env workers keeps the
    sample efficiency of the in-process runner (which trains at
    ``learner.max_replay_ratio``). None: env workers run free, as in Ape-X.
    ``tensorboard_dir``: every result dict that :meth:`iterate` yields is also
    written there as TensorBoard scalars (tag = metric name, step =
    ``timesteps_total``; needs the ``tensorboard`` extra), appending to any log
    in the folder (a resumed run purges the events past its checkpoint's step);
    the config goes to the Text tab. ``out_dir`` (the run's output folder) is
    shown beside the run id on the ``/apex`` page (marked done once :meth:`stop`
    returns) and gets the best evaluation's ``weights-best.npz`` (:attr:`best`).
    ``resume_from``: a checkpoint, or a folder whose newest checkpoint that
    verifies is restored (:attr:`resumed_path`; skipped ones and leftovers removed
    from ``checkpoint_dir``: one line each in :attr:`startup_notes`). ``workers``: only
    these workers (runs sharing a cluster). Raises :class:`ApexRuntimeError` for an unknown env
    id or a missing tensorboard package (checked before anything starts), a
    cluster without workers or actors that cannot be created.
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
        tensorboard_dir: str | os.PathLike[str] | None = None,
        checkpoint_dir: str | os.PathLike[str] | None = None,
        resume_from: str | os.PathLike[str] | None = None,
        out_dir: str | os.PathLike[str] | None = None,
        workers: Sequence[str] | None = None,
    ) -> None:
        self.config = config
        self._out_dir = None if out_dir is None else str(Path(out_dir).resolve())
        self._checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        self.run_id = f"{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(3)}"
        try:
            self._env_factory = env_factory(config)
            hook = resolve_hook(config, before_learn_on_batch)
            if tensorboard_dir is not None:  # its sink opens once the step to go on from is known
                require_tensorboard()
        except (UnknownEnvError, ConfigError, TrackingError) as exc:
            raise ApexRuntimeError(str(exc)) from None
        start = StartCheckpoints.prepare(self._checkpoint_dir, resume_from)
        self.startup_notes = start.notes  # leftovers removed, checkpoints skipped: one line each
        self._tensorboard: TensorBoardSink | None = None
        self._cluster = None
        self._stopped = False
        self._saved_at = -1
        self.resumed_from: dict[str, Any] | None = None
        self.resumed_path: Path | None = None
        self._actors: ActorSet | None = None
        self._state: RunState | None = None
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
            found = only_workers(wait_for_workers(client, 1, worker_wait_s), workers)
            placement = start_placement(found, config)
            if config.topology.elastic:
                install_handover(client)
            self.dashboard_link: str | None = dashboard_link(client, self._cluster is not None)
            announce(client, self.run_id, out=self._out_dir)
            self._actors = ActorSet(client, config, placement, self._env_factory, self.run_id)
            self._state = self._actors.create(hook)
            self._plan = self._make_plan(self._actors, self._state)
            if start.candidates:
                restoring = restore_newest(self._plan.checkpoints, start.candidates, start)
                got = self._sync(restoring, _slow_s(self._timeout) * len(start.candidates))
                self.resumed_path, self.resumed_from = got.path, got.metadata
            if tensorboard_dir is not None:  # past the checkpoint's step: no fold in the curves
                self._tensorboard = open_tensorboard(
                    tensorboard_dir, self.config, self.run_id, self.resumed_from
                )
        except BaseException:
            self._release()
            raise

    def _make_plan(self, actors: ActorSet, state: RunState) -> ExecutionPlan:
        return ExecutionPlan(
            config=self.config,
            client=self._client,
            run_id=self.run_id,
            state=state,
            actors=actors,
            results=self._results,
            min_replay_ratio=self._min_replay_ratio,
            checkpoint_root=None if self._checkpoint_dir is None else str(self._checkpoint_dir),
            best_weights_dir=self._out_dir,
        )

    def _sync(self, coro: Any, timeout_s: float) -> Any:
        """Run ``coro`` on the client's loop (where the plan runs); its result. Past
        ``timeout_s`` it is cancelled and ``TimeoutError`` raised."""
        fut = asyncio.run_coroutine_threadsafe(coro, self._client.loop.asyncio_loop)
        try:
            return fut.result(timeout=timeout_s)
        except TimeoutError:
            fut.cancel()
            raise

    def save_checkpoint(self, reason: str = "requested", *, within_s: float | None = None) -> Path:
        """Write a checkpoint now (while training or halted) under ``checkpoint_dir``; its path.

        The learner and every shard write their own part in parallel; see
        :mod:`apex_dask.runtime.orchestration.checkpointing`. ``within_s``: all of it
        within that many seconds (a stop's grace), keeping the newest replay items
        that fit; :attr:`checkpoint_left_out` says what was left out.
        """
        if self._plan is None:
            raise ApexRuntimeError("this ApexDriver was stopped; create a new one")
        bound = _slow_s(self._timeout) if within_s is None else within_s + 1.0
        path = self._sync(self._plan.checkpoints.save(reason, within_s=within_s), bound)
        self._saved_at = self._plan.state.counters.steps_total
        return path

    def _ensure_running(self) -> None:
        if self._stopped or self._plan is None:
            raise ApexRuntimeError("this ApexDriver was stopped; create a new one")
        if self._core is None:
            loop = self._client.loop.asyncio_loop
            self._core = asyncio.run_coroutine_threadsafe(self._plan.run(), loop)

    def iterate(self, stop_check: Callable[[], bool] | None = None) -> Iterator[dict[str, float]]:
        """Start (or resume) training and yield one result dict per iteration, forever.

        Break out of the loop to pause the consumer; :meth:`halt` pauses the
        actors, :meth:`stop` releases them. ``stop_check()``, if given, is called
        about every 0.2 s while a result is awaited; when it returns True the
        iterator ends mid-iteration (the actors run on: :meth:`halt`, whose
        ``final`` then covers the partial iteration).
        """
        self._ensure_running()
        while True:
            try:
                item = self._results.get(timeout=0.2)
            except queue.Empty:
                if stop_check is not None and stop_check():
                    return
                core = self._core
                if core is None or not core.done():
                    continue
                self._core = None
                core.result()  # raises the plan's error, if any
                return
            if self._tensorboard is not None:
                self._tensorboard.write(item)
            yield item

    def run(self, stop: StopConfig | Mapping[str, Any] | None = None) -> list[dict[str, float]]:
        """Train until a stop condition (``config.stop`` merged with ``stop``); halt; return results."""
        rule = StopRule.resolve(self.config.stop, stop, use_eval=self.config.eval.episodes > 0)
        results: list[dict[str, float]] = []
        for result in self.iterate():
            results.append(result)
            if rule.after_result(result):
                break
        self.halt()
        return results

    def halt(self, timeout_s: float | None = None) -> dict[str, float] | None:
        """Pause: finish calls in flight, stop the learner; return consistent final stats
        (every hop's ``flow/*`` counters agree); :meth:`iterate` resumes. ``timeout_s``: all
        of it (else the call timeout each); what is left then, :class:`ApexRuntimeError`."""
        core, self._core = self._core, None
        plan = self._plan
        if core is not None and plan is not None:
            if timeout_s is not None:  # the loop starts draining within 0.1 s
                plan.drain_s = max(0.1, timeout_s - 0.3)
            plan.state.halting = True
            bound = 3 * self._timeout + 10 if timeout_s is None else timeout_s
            try:
                core.result(timeout=bound)
            except TimeoutError:  # a bounded drain ends by itself, soon; another is cancelled
                if timeout_s is None:
                    core.cancel()
                raise ApexRuntimeError(f"the actors did not halt within {bound:.3g} s") from None
            finally:
                plan.drain_s = None
        if self._tensorboard is not None:
            self._tensorboard.flush()
        return self.final

    @property
    def checkpoint_left_out(self) -> dict[str, Any] | None:
        """What the last checkpoint left out of the replay (``summary``, ...); None: nothing."""
        return None if self._plan is None else self._plan.checkpoints.left_out

    @property
    def last_checkpoint(self) -> Path | None:
        """The newest checkpoint this driver wrote or resumed from."""
        return None if self._plan is None else self._plan.checkpoints.last_path

    # ---------------------------------------------------------------- running
    def count_partial_iteration(self) -> None:
        """Count the partial iteration a caller recorded from :attr:`final` (after a
        halt mid-iteration), so later results and checkpoints number after it."""
        if self._plan is not None:
            self._plan.state.counters.next_row()

    @property
    def final(self) -> dict[str, float] | None:
        """Stats taken after the last :meth:`halt` (None before one)."""
        return None if self._plan is None else self._plan.final

    @property
    def best(self) -> BestWeights | None:
        """The best greedy evaluation so far: ``record`` (``eval/return_mean``,
        ``timesteps_total``, ``weights_version``), ``weights``, ``path`` (``weights-best.npz``
        under ``out_dir``; None without one) and ``summary()``."""
        return None if self._plan is None else self._plan.evaluation.best

    # ---------------------------------------------------------------- teardown
    def stop(self, timeout_s: float | None = None) -> None:
        """Halt, close and release every actor; close the cluster the driver started.
        ``timeout_s``: all of it within that many seconds (a stop's grace); an ``end``
        checkpoint (something is new since the last) then keeps what fits in half."""
        if self._stopped:
            return
        self._stopped = True
        end = None if timeout_s is None else time.monotonic() + timeout_s
        try:
            self.halt(None if end is None else _share(end, 0.3, 3 * self._timeout + 10))
        except Exception:
            pass
        plan = self._plan
        if plan is not None and self._checkpoint_dir is not None:
            if plan.state.counters.steps_total > self._saved_at:  # something new since the last one
                try:
                    self.save_checkpoint(
                        "end", within_s=None if end is None else _share(end, 0.5, 1e9)
                    )
                except Exception:  # a lost learner or shard: the previous checkpoint stands
                    pass
        if self._actors is not None and self._state is not None:
            self._actors.close(self._state.handles(), timeout_s=_share(end, 0.3, 10.0))
        announce(self._client, self.run_id, timeout_s=_share(end, 0.2, 5.0), done=True)
        self._release(None if end is None else max(0.5, end - time.monotonic()))

    def _release(self, timeout_s: float | None = None) -> None:
        """Release the actors, close the cluster the driver started (within ``timeout_s``)."""
        end = time.monotonic() + (60.0 if timeout_s is None else timeout_s)
        if self._tensorboard is not None:
            self._tensorboard.close()
        actors, self._actors, self._plan, self._state = self._actors, None, None, None
        if actors is not None:
            bound = 10.0 if timeout_s is None else max(0.1, 0.4 * timeout_s)
            actors.release(wait=self._cluster is None, timeout_s=bound)
        cluster, self._cluster = self._cluster, None
        if cluster is not None:
            close_local_cluster(self._client, cluster, max(1.0, end - time.monotonic()))

    def __enter__(self) -> ApexDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def train(
    config: ApexConfig,
    client: Any = None,
    stop: StopConfig | Mapping[str, Any] | None = None,
    before_learn_on_batch: Hook | None = None,
    tensorboard_dir: str | os.PathLike[str] | None = None,
) -> list[dict[str, float]]:
    """Train until a stop condition (``config.stop`` merged with ``stop``); the result dicts.

    With ``client=None`` an embedded ``LocalCluster`` (one worker process per
    core) is started and closed again; with a ``distributed.Client`` its
    actors are released at the end and the cluster stays. ``stop`` keys:
    ``timesteps``, ``reward``, ``time_s``, ``iterations`` (the first met wins).
    ``tensorboard_dir`` as in :class:`ApexDriver`. Raises :class:`ApexRuntimeError` for a run that cannot start or go on.
    """
    with ApexDriver(
        config,
        client,
        before_learn_on_batch=before_learn_on_batch,
        tensorboard_dir=tensorboard_dir,
    ) as driver:
        return driver.run(stop)
