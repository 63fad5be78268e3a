"""The env worker actor: an agent's rollouts sent straight to a replay shard.

The env and the policy run in a private one-thread executor and the actor
only ``await``s on the worker's loop, so two requests in flight pipeline
(one samples while the other's rollout travels to its shard).
"""

from __future__ import annotations

import asyncio
import pickle
import re
import threading
import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from apex_dask.algo.agents.spec import WorkerSpec
from apex_dask.algo.envs.guard import EnvFailed
from apex_dask.experiment.messages import RolloutSummary
from apex_dask.experiment.results import env_metrics
from apex_dask.runtime.actors.calls import (
    PeerCalls,
    PeerReplaced,
    Throttled,
    as_handle,
    current_worker,
    until_released,
)
from apex_dask.runtime.actors.failpoints import failpoint
from apex_dask.runtime.actors.heap import keep_freed_heap
from apex_dask.runtime.actors.supervision import TaskFailures, start_supervised

__all__ = ["EnvWorkerActor"]

T = TypeVar("T")

_WARNINGS: deque[str] = deque(maxlen=50)
"""Python warnings raised in this process (an env's, gymnasium's passive env checker's),
kept instead of printed: they travel with the next summary to the driver's log."""


def _keep_warning(message: Any, category: type, filename: str, lineno: int, *_: Any) -> None:
    text = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(message)).split())  # no colours
    _WARNINGS.append(f"{category.__name__}: {text} ({filename}:{lineno})")


def _take_warnings() -> tuple[str, ...]:
    out = []
    while _WARNINGS:
        out.append(_WARNINGS.popleft())
    return tuple(out)


class EnvWorkerActor:
    """An env worker of the run's agent (made by the agent's builder from ``spec``:
    :class:`~apex_dask.algo.agents.spec.WorkerSpec`), exploring with ``exploration`` (its agent's parameter:
    an epsilon, DPG's noise scale).

    ``sample_into(k)`` runs one rollout of ``fragment_length`` env steps with
    the worker's current (possibly stale) weights, computes its initial
    priorities |TD| there, sends the rollout straight to shard ``k`` and
    returns a :class:`~apex_dask.experiment.messages.RolloutSummary`;
    ``sample_into([k1, k2, ...])`` does one rollout per shard id in turn and
    returns one summary for them all (fewer, smaller driver messages).

    ``sync_weights()`` pulls the learner's weights if it has a newer version
    (one pickled blob per version, made once by the learner) and returns the
    version applied, or None. ``evaluate(n)`` pulls fresh weights and plays
    ``n`` greedy episodes on the worker's own evaluation env; with
    ``animation`` (the evaluator, ``eval.animation``) the first episode's
    frames go to the ``/apex`` page (:mod:`.animation`).

    The env and the policy live in a private one-thread executor, so at most
    one env step runs at a time and weights never change mid-rollout.
    """

    def __init__(
        self,
        index: int,
        env_factory: Callable[[], Any],
        shards: Sequence[Any],
        learner: Any,
        spec: WorkerSpec,
        *,
        exploration: float,
        seed: int,
        call_timeout_s: float = 60.0,
        run: str = "",
        animation: bool = False,
        simulate_steps_per_s: float | None = None,
        metrics_interval_s: float = 1.0,
    ) -> None:
        from apex_dask.algo.agents.registry import agent, make_env_worker
        from apex_dask.runtime.actors.animation import EvalAnimation, rendering

        self._animation = EvalAnimation(run) if animation else None
        keep_freed_heap()  # batched forwards of image stacks: see heap.py
        warnings.showwarning = _keep_warning  # to the driver's log, not the worker's stderr
        self.index = int(index)
        self._shards = [as_handle(s) for s in shards]
        self._learner = as_handle(learner)
        self._learner_ref = learner if isinstance(learner, tuple) else None
        self._relay: Any = None  # this host's weights relay (set_relay), or None
        self._calls = PeerCalls()  # to shards and the learner: given up when one is rebuilt
        self._dask_worker = current_worker()
        self._orphan_watch: asyncio.Task | None = None
        self.failures = TaskFailures("the evaluator" if index < 0 else f"env worker {index}")
        self._timeout = float(call_timeout_s)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=f"apex-env-{index}")
        where = f"env worker {index}" if index >= 0 else "the evaluator"
        if simulate_steps_per_s is not None and index >= 0:  # simulate.env_steps_per_s
            from apex_dask.algo.rollout.simulated import SimulatedWorker

            self._worker = SimulatedWorker(
                env_factory,
                spec.rollout,
                index=index,
                exploration=exploration,
                seed=seed,
                steps_per_s=simulate_steps_per_s,
            )
        else:
            self._worker = make_env_worker(
                spec, env_factory, exploration=exploration, seed=seed, where=where
            )
        if self._animation is not None:  # the evaluator's eval env renders rgb_array frames
            modes = (getattr(self._worker.env, "metadata", None) or {}).get("render_modes") or []
            if "rgb_array" in modes:
                self._worker.env_factory = rendering(env_factory)
                self._pool.submit(self._warm_render)  # pygame's start-up, off the eval's path
            else:
                self._animation = None
        self.exploration = float(exploration)
        self._exploration_name = agent(spec.agent.algo).exploration
        self._closed = False
        self.rollouts_sent = 0
        self.steps_sampled = 0
        self.weight_syncs = 0
        self.relay_syncs = self.relay_fallbacks = 0
        self.direct_blobs = 0  # blobs pulled from the learner itself (no relay, or its fallback)
        self._errors_reported = 0
        self._store_s: deque[float] = deque(maxlen=10_000)  # rollout ready -> stored
        self._weight_bytes = 0
        self._weight_bytes_direct = 0  # of them, pulled from the learner itself
        self._last_eval: dict[str, Any] | None = None
        self._applied: dict[str, Any] | None = None  # the evaluator's weights, as pulled
        self._t0 = time.monotonic()
        source = f"env/{self.index}" if self.index >= 0 else "eval"
        self._pub = Throttled(source, run, min_interval_s=metrics_interval_s)

    async def _in_pool(self, fn: Callable[..., T], *args: Any) -> T:
        if self._orphan_watch is None and self._dask_worker is not None:
            self._orphan_watch = start_supervised(
                "env.orphan_watch", self._close_when_released, self.failures
            )
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _close_when_released(self) -> None:
        """An env worker Dask deleted (its driver released it, or died) closes its envs
        and their threads."""
        await until_released(
            self, self._dask_worker, tick=lambda: self.failures.check("env.orphan_watch")
        )
        await self.close()

    async def sample_into(self, shard_ids: int | Sequence[int]) -> RolloutSummary:
        """One rollout per shard id, each stored in its shard; one small summary of them.

        A failure in the first rollout raises; a later one ends the call early
        with the summary of the rollouts already stored (the next call meets
        the failure again and raises), so the summary counts every stored rollout.
        """
        ids = [int(shard_ids)] if isinstance(shard_ids, int) else [int(k) for k in shard_ids]
        steps = version = done = 0
        returns: list[float] = []
        lengths: list[int] = []
        for k in ids:
            try:
                out = await self._in_pool(self._worker.sample)
                ready = time.monotonic()
                self.rollouts_sent += 1
                add = self._shards[k].add(out.batch, out.priorities)
                await self._calls.call(("shard", k), add, self._timeout)
                self._store_s.append(time.monotonic() - ready)
            except EnvFailed as exc:  # with this process's warnings, for the driver's log
                raise EnvFailed(exc.message, exc.warnings + _take_warnings()) from None
            except Exception:
                if done == 0:
                    raise
                break
            done += 1
            steps += int(out.steps)
            version = int(out.weights_version)
            returns += [float(x) for x in out.episode_returns]
            lengths += [int(x) for x in out.episode_lengths]
        self.steps_sampled += steps
        self._pub.maybe(self._metrics)
        errors = self._new_env_errors()
        return RolloutSummary(
            steps, done, version, tuple(returns), tuple(lengths), errors, _take_warnings()
        )

    def _new_env_errors(self) -> int:
        """Env errors survived since the last call (the driver adds them up)."""
        new = self._worker.env_errors - self._errors_reported
        self._errors_reported += new
        return new

    async def sync_weights(self) -> int | None:
        """Pull and apply the learner's weights if newer; the version applied, or None.

        With a relay (:meth:`set_relay`) the pull goes to it; a relay call that fails
        (a lost relay, its ask of the learner failed) pulls from the learner itself,
        counted in ``relay_fallbacks``: a sync never fails for its relay. A learner
        rebuilt while the pull waited on the lost one is asked at once."""
        while self.index >= 0 and failpoint("stall_weight_sync"):  # a failpoint: stuck
            await asyncio.sleep(0.1)
        blob, direct = None, True
        if self._relay is not None and self._learner_ref is not None:
            try:
                blob = await self._calls.call(
                    "relay",
                    self._relay.weights_if_newer(self._worker.weights_version, self._learner_ref),
                    self._timeout,
                )
                direct = False
                self.relay_syncs += 1
            except Exception:  # the relay or its ask: the learner answers instead
                self.relay_fallbacks += 1
        if direct:
            try:
                blob = await self._pull_weights()
            except PeerReplaced:
                blob = await self._pull_weights()
        if blob is None:
            return None
        self._weight_bytes += len(blob)
        if direct:
            self._weight_bytes_direct += len(blob)
            self.direct_blobs += 1
        version = await self._in_pool(self._apply_weights, blob)
        self.weight_syncs += 1
        return version

    async def _pull_weights(self) -> bytes | None:
        have = self._worker.weights_version
        return await self._calls.call(
            "learner", self._learner.weights_if_newer(have), self._timeout
        )

    def _apply_weights(self, blob: bytes) -> int:
        version, weights = pickle.loads(blob)
        if version > self._worker.weights_version:
            self._worker.set_weights(version, weights)
            if self.index < 0:  # the evaluator: a best evaluation sends back what it played
                self._applied = weights
        if back := failpoint("weights_version_back"):  # a failpoint: an old version, kept
            self._worker.weights_version = int(back)
        return int(self._worker.weights_version)

    async def evaluate(
        self,
        num_episodes: int,
        seed: int | None = None,
        max_steps: int | None = None,
        timeout_s: float | None = None,
        weights_above: float | None = None,
    ) -> dict[str, Any]:
        """Sync to the newest weights, then ``num_episodes`` greedy episodes of at most
        ``max_steps`` steps each, stopped after ``timeout_s`` (``timed_out``); their stats.
        With ``weights_above``: a mean return above it sends the weights played along
        (``weights``), the ones a run keeps as its best."""
        await self.sync_weights()
        while failpoint("stall_evaluator"):  # a failpoint: the evaluation never finishes
            await asyncio.sleep(0.1)
        frames = None if self._animation is None else self._animation.frames()
        try:
            out = await self._in_pool(
                self._worker.evaluate, int(num_episodes), seed, max_steps, timeout_s, frames
            )
        except EnvFailed as exc:
            raise EnvFailed(exc.message, exc.warnings + _take_warnings()) from None
        if frames is not None and frames.failed is not None:
            self._animation = None  # e.g. pygame missing: no more attempts
            why = f"eval.animation is off: the env cannot render ({frames.failed})"
            warnings.warn(why, stacklevel=1)
        elif frames is not None:  # encoded and sent after this result is returned
            self._pool.submit(
                self.failures.call, "evaluator.animation", self._send_animation, frames, out
            )
        out = dict(out)
        out["weights_version"] = int(self._worker.weights_version)
        mean = out.get("return_mean")
        if weights_above is not None and self._applied is not None and mean > weights_above:
            out["weights"] = self._applied  # NaN (no episode finished) is never above
        out["env_errors"] = self._new_env_errors()
        out["warnings"] = _take_warnings()
        out["task_failures"] = self.failures.metrics()
        self._last_eval = out
        self._pub.now(self._metrics)
        return out

    def _warm_render(self) -> None:
        """Render one frame of a throwaway env (imports and starts pygame for classic
        control); an env that cannot render turns the animation off at its first try."""
        try:
            env = self._worker.env_factory()
            try:
                env.reset(seed=0)
                env.render()
            finally:
                env.close()
        except Exception:  # noqa: BLE001 - the first evaluation says why, in the run's log
            pass

    def _send_animation(self, frames: Any, out: dict[str, Any]) -> None:
        env = self._worker._eval_env or self._worker.env
        fps = float((getattr(env, "metadata", None) or {}).get("render_fps") or 30)
        if self._animation is not None:
            self._animation.send(frames, out, fps, self._worker.weights_version)

    async def set_shard(self, shard_id: int, handle: Any, lost: bool = False) -> None:
        """Send rollouts for shard ``shard_id`` to its new actor from now on. ``lost``: the
        old one died with its worker; a rollout still waiting on it is given up now (its
        call fails with :class:`~apex_dask.runtime.actors.calls.PeerReplaced`: a lost
        rollout) rather than after the call timeout."""
        self._shards[int(shard_id)] = as_handle(handle)
        if lost:
            self._calls.replaced(("shard", int(shard_id)))

    async def set_learner(self, handle: Any, lost: bool = False) -> None:
        """Pull weights from a rebuilt learner from now on; its first weights are applied
        whatever their version (a restored learner may count from an older checkpoint).
        ``lost``: a pull still waiting on the lost learner asks the new one at once (an
        evaluation waiting for its weights goes on now, not after the call timeout)."""
        self._learner = as_handle(handle)
        self._learner_ref = handle if isinstance(handle, tuple) else None
        self._worker.weights_version = -1
        if lost:
            self._calls.replaced("learner")
            self._calls.replaced("relay")  # a relay waiting on the lost one: ask the new

    async def set_relay(self, handle: Any, lost: bool = False) -> None:
        """Pull weights through this host's relay ``handle`` from now on (None: from the
        learner). ``lost``: a pull still waiting on the old relay goes to the learner now."""
        self._relay = None if handle is None else as_handle(handle)
        if lost:
            self._calls.replaced("relay")

    async def stats(self) -> dict[str, float]:
        """``env/<i>/*`` counters and this worker's exploration parameter."""
        return self._metrics()

    async def transport(self) -> dict[str, Any]:
        """How this worker's data travelled since the last call: ``store_s``, the seconds
        from each rollout being made to its shard's reply (stored), the last 10,000;
        ``weight_sync_bytes``, the bytes of weights pulled, ``weight_sync_bytes_direct``
        those pulled from the learner itself, not through a relay (``benchmarks/scale.py``)."""
        out = {
            "store_s": list(self._store_s),
            "weight_sync_bytes": self._weight_bytes,
            "weight_sync_bytes_direct": self._weight_bytes_direct,
        }
        self._store_s.clear()
        self._weight_bytes = self._weight_bytes_direct = 0
        return out

    async def close(self) -> None:
        """Close the envs and stop the env thread (after the step in progress)."""
        self._pub.now(self._metrics)
        self._pool.shutdown(wait=False, cancel_futures=True)
        close = getattr(self._worker, "close", None)
        if close is not None and not self._closed:  # the envs' own threads end with them
            self._closed = True
            name = f"apex-env-close-{self.index}"
            threading.Thread(target=self._close_envs, args=(close,), name=name, daemon=True).start()

    def _close_envs(self, close: Callable[[], None]) -> None:
        self._pool.shutdown(wait=True)  # the step in progress first
        close()

    def _metrics(self) -> dict[str, float]:
        i = self.index
        if i < 0:  # the evaluator
            ev = self._last_eval or {}
            return {
                "eval/return_mean": float(ev.get("return_mean", float("nan"))),
                "eval/return_std": float(ev.get("return_std", float("nan"))),
                "eval/weights_version": float(self._worker.weights_version),
                **self.failures.metrics(),
            }
        return self.failures.metrics() | env_metrics(
            i,
            exploration=self.exploration,
            exploration_name=self._exploration_name,
            steps_sampled=self.steps_sampled,
            steps_per_s=self.steps_sampled / max(1e-9, time.monotonic() - self._t0),
            rollouts_sent=self.rollouts_sent,
            weights_version=self._worker.weights_version,
            env_errors=self._worker.env_errors,
            relay_syncs=self.relay_syncs,
            relay_fallbacks=self.relay_fallbacks,
            direct_blobs=self.direct_blobs,
        )
