"""The periodic greedy evaluation: one job of the report.

Every ``eval.interval_s`` the evaluator (an env worker with epsilon 0) syncs
to the newest weights and plays ``eval.episodes`` episodes. The report takes
the evaluation that finished during an iteration (:meth:`Evaluation.take`);
``eval/*`` metrics appear in that iteration's result only. An evaluation whose
mean beats the best so far brings back the weights it played, which
:class:`~apex_dask.experiment.best_weights.BestWeights` keeps (and writes as
``weights-best.npz`` when the run has an output folder).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from apex_dask.config.tree import EvalConfig
from apex_dask.experiment.best_weights import BestWeights
from apex_dask.runtime.actors.calls import call_with_timeout
from apex_dask.runtime.orchestration.operations import EnvFailure
from apex_dask.runtime.orchestration.state import RunState
from apex_dask.runtime.orchestration.tasks import Job, TaskSet

__all__ = ["Evaluation"]


class Evaluation(Job):
    """Greedy evaluations on ``state.evaluator``; a lost evaluator goes to ``on_failure``."""

    name = "driver.evaluation"

    def __init__(
        self,
        state: RunState,
        tasks: TaskSet,
        cfg: EvalConfig,
        timeout_s: float,
        on_failure: EnvFailure,
        best: BestWeights | None = None,
    ) -> None:
        super().__init__(tasks, every_s=cfg.interval_s)
        self.state, self.cfg, self.timeout = state, cfg, timeout_s
        self.on_failure = on_failure
        self.best = best if best is not None else BestWeights()
        self.finished: dict[str, Any] | None = None  # finished this iteration
        self.last: dict[str, Any] | None = None
        self.task_failures: dict[str, float] = {}  # the evaluator's, as its last result said
        self._slot = state.evaluator

    def take(self) -> dict[str, Any] | None:
        """The evaluation that finished since the last call (None if none did)."""
        out, self.finished = self.finished, None
        return out

    def due(self, now: float) -> bool:
        slot = self.state.evaluator
        return slot is not None and self.cfg.episodes > 0 and not slot.replacing

    def start(self, now: float) -> Any:
        slot, ev = self.state.evaluator, self.cfg
        assert slot is not None
        seed = int(self.state.rng.integers(2**31))

        async def evaluate() -> tuple[dict[str, Any], float]:
            # the evaluator stops itself at eval.timeout_s; this bound catches a hung env step
            bar = self.best.bar
            got = await call_with_timeout(
                slot.handle.evaluate(ev.episodes, seed, ev.max_episode_steps, ev.timeout_s, bar),
                ev.timeout_s + self.timeout,
            )
            weights = got.pop("weights", None)
            if weights is not None:
                await self._keep_best({**got, "seed": seed}, weights)
            return got, now

        self._slot = slot
        return evaluate()

    async def _keep_best(self, got: dict[str, Any], weights: dict[str, Any]) -> None:
        record = {**got, "timesteps_total": self.state.counters.steps_total}
        version = int(got.get("weights_version", -1))
        try:  # a file write: off the event loop
            await asyncio.get_running_loop().run_in_executor(
                None, self.best.offer, record, version, weights
            )
        except OSError as exc:  # a full disk: the previous best file stays, the run goes on
            self.state.note(f"{self.best.path} not written: {exc.strerror or exc}")

    def done(self, result: Any, exc: BaseException | None) -> None:
        if isinstance(exc, TimeoutError):  # reported as a timed-out evaluation; the run goes on
            self.finished = {"return_mean": math.nan, "timed_out": True}
            return
        if exc is not None:
            self.on_failure(self._slot, exc, False)
            return
        got, t0 = result
        self.task_failures = dict(got.pop("task_failures", None) or {})
        self.state.counters.faults.env_errors += int(got.pop("env_errors", 0))
        for line in got.pop("warnings", ()):
            logging.getLogger("py.warnings").warning("evaluator: %s", line)
        self.finished = self.last = {**got, "duration_s": time.monotonic() - t0}
        self.state.eval_history.append(
            {
                "timesteps_total": self.state.counters.steps_total,
                "return_mean": float(self.last["return_mean"]),
                "weights_version": int(self.last.get("weights_version", -1)),
            }
        )
