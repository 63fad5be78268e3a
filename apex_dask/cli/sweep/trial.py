"""One trial of a sweep: an ``ApexDriver`` run on its slot's workers, in its own run folder.

::

    outcome = TrialRun(number, cfg, folder, client, group, spec, report, stop).run()
    outcome.state          # "complete" | "pruned" | "failed" | "interrupted"

The folder is a run folder as ``apex-dask-submit --out`` writes one
(``config.yaml``, ``results.jsonl``, ``final.json``, ``weights.npz``,
``placement.json``; ``weights-best.npz`` where the run writes it) plus
``status.json``: the trial's state, objective, env steps and, for a pruned
trial, ``"message": "pruned at step S"``. So ``apex-dask-eval`` and
``apex-dask-submit --config DIR/trial-0003/config.yaml`` work on it.

The trial reports its objective (the best or the last value of the metric so
far) each time it passes one of ``pruner.reports`` equal parts of its budget
(seconds of training or env steps: the report's step), and stops when the
pruner says so; its actors are then released like a finished run's.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apex_dask.cli.outdir import ResultsLog, save_weights, write_json, write_text
from apex_dask.cli.output import merge_final
from apex_dask.cli.sweep.groups import WorkerGroup
from apex_dask.cli.sweep.spec import Objective, SweepSpec
from apex_dask.config import ApexConfig, ConfigError
from apex_dask.runtime.errors import describe

__all__ = ["Score", "TrialOutcome", "TrialRun"]

Report = Callable[[float, int], bool]
"""``report(value, step) -> prune?``: the pruner's answer for one intermediate value."""


@dataclass
class TrialOutcome:
    number: int
    state: str
    value: float | None
    steps: int
    wall_s: float
    message: str = ""
    pruned_at: int | None = None
    """Env steps when the pruner stopped it (the halt may add a few more to ``steps``)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "state": self.state,
            "objective": self.value,
            "steps": self.steps,
            "wall_s": round(self.wall_s, 2),
            "message": self.message,
            **({"pruned_at": self.pruned_at} if self.pruned_at is not None else {}),
        }


class Score:
    """The objective so far: the best or the last finite value of ``objective.metric``."""

    def __init__(self, objective: Objective) -> None:
        self.objective = objective
        self.best: float | None = None
        self.last: float | None = None
        self.count = 0

    def update(self, result: dict[str, Any]) -> None:
        value = result.get(self.objective.metric)
        if not isinstance(value, int | float) or not math.isfinite(value):
            return
        self.count += 1
        self.last = float(value)
        if self.best is None or self.objective.better(self.last, self.best):
            self.best = self.last

    @property
    def value(self) -> float | None:
        return self.best if self.objective.use == "best" else self.last


class TrialRun:
    """Run one trial to its budget, a prune, a stop request or a fault (never raises)."""

    def __init__(
        self,
        number: int,
        cfg: ApexConfig,
        folder: Path,
        client: Any,
        group: WorkerGroup,
        spec: SweepSpec,
        report: Report,
        stop: threading.Event,
    ) -> None:
        self.number, self.cfg, self.folder, self.client = number, cfg, folder, client
        self.group, self.spec, self.report, self.stop = group, spec, report, stop
        self.score = Score(spec.objective)
        self.steps = 0
        self.results = 0
        self.pruned_at: int | None = None
        self.driver: Any = None
        self._last: dict[str, Any] | None = None
        self._log: ResultsLog | None = None

    def run(self) -> TrialOutcome:
        t0 = time.monotonic()
        state, message = "complete", ""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            write_text(self.folder / "config.yaml", self.cfg.to_yaml())
            self._log = ResultsLog(self.folder / "results.jsonl")
            self._start()
            state, message = self._train()
        except Exception as exc:  # a fault of this trial: recorded, the sweep goes on
            state, message = "failed", describe(exc)
            _log_traceback(self.folder, exc)
        finally:
            message = self._teardown(message)
            if self._log is not None:
                self._log.close()
        if self.stop.is_set() and state == "complete" and self._budget_left(t0):
            state, message = "interrupted", "stopped with the sweep"
        if state == "complete" and self.score.value is None:
            state = "failed"
            message = (
                f"{self.spec.objective.metric} was never reported in {self.results} results; "
                "lengthen the budget or shorten eval.interval_s"
            )
        outcome = TrialOutcome(
            self.number,
            state,
            self.score.value,
            self.steps,
            time.monotonic() - t0,
            message,
            self.pruned_at if state == "pruned" else None,
        )
        names = ("config.yaml", "results.jsonl", "final.json", "weights.npz", "weights-best.npz")
        files = [n for n in names if (self.folder / n).is_file()]
        try:
            write_json(self.folder / "status.json", {**outcome.as_dict(), "files": files})
        except Exception:
            pass
        return outcome

    def _budget_left(self, t0: float) -> bool:
        b = self.spec.budget
        return b.progress(time.monotonic() - t0, self.steps) < b.total * 0.999

    def _start(self) -> None:
        from apex_dask.runtime.orchestration.driver import ApexDriver

        run_cfg = self.cfg.override({"topology.learner_worker": self.group.learner.address})
        self.driver = ApexDriver(
            run_cfg, client=self.client, out_dir=self.folder, workers=self.group.addresses
        )
        write_json(self.folder / "placement.json", self.driver.placement, indent=2)

    def _train(self) -> tuple[str, str]:
        from apex_dask.experiment.stop import StopRule

        rule = StopRule(self.cfg.stop, use_eval=self.cfg.eval.episodes > 0)
        budget, reports = self.spec.budget, self.spec.pruner.reports
        every = budget.total / reports
        rung = 1
        t0 = time.monotonic()
        time_s = self.cfg.stop.time_s

        def stop_check() -> bool:
            late = time_s is not None and time.monotonic() - t0 >= time_s
            return self.stop.is_set() or late

        for result in self.driver.iterate(stop_check=stop_check):
            self._record(result)
            progress = budget.progress(time.monotonic() - t0, self.steps)
            while rung < reports and progress >= rung * every - 1e-9:
                step, rung = int(round(rung * every)), rung + 1
                value = self.score.value
                if value is not None and self.report(value, step):
                    self.pruned_at = self.steps
                    return "pruned", f"pruned at step {self.steps}"
            if self.stop.is_set():
                return "interrupted", "stopped with the sweep"
            if rule.after_result(result) or stop_check():
                return "complete", ""
        return ("interrupted", "stopped with the sweep") if self.stop.is_set() else ("complete", "")

    def _record(self, result: dict[str, Any]) -> None:
        self.results += 1
        self._last = result
        self.steps = int(result.get("timesteps_total", self.steps))
        self.score.update(result)
        if self._log is not None:
            self._log.append(result)

    def _teardown(self, message: str) -> str:
        """Halt, record the final counters, save the weights, release the actors."""
        d = self.driver
        if d is None:
            return message
        notes = []
        try:
            final = d.halt()
            if final:
                last = self._last
                if last is None or final.get("timesteps_total", 0) > last.get("timesteps_total", 0):
                    record = dict(final)  # the partial iteration since the last result
                    if last is not None:
                        record["iteration"] = float(last.get("iteration", self.results)) + 1
                    self._record(record)
                else:
                    record = merge_final(last, final)
                write_json(self.folder / "final.json", record)
            refused = save_weights(self.folder, d.learner_weights())
            if refused:
                notes.append(refused)
        except Exception as exc:
            notes.append(f"could not save everything: {describe(exc)}")
        try:
            d.stop()
        except Exception as exc:
            notes.append(f"error while releasing actors: {describe(exc)}")
        self.driver = None
        return "; ".join([m for m in [message, *notes] if m])


def _log_traceback(folder: Path, exc: BaseException) -> None:
    import traceback

    try:
        with open(folder / "trial.log", "a") as f:
            f.write("".join(traceback.format_exception(exc)))
    except OSError:
        pass


def check_trial_config(spec: SweepSpec, overrides: dict[str, Any]) -> ApexConfig:
    """The trial's config, or a ConfigError naming the combination that is not allowed."""
    try:
        return spec.trial_config(overrides)
    except ConfigError as exc:
        raise ConfigError(
            f"the trial's values {overrides} are not allowed together: {exc}"
        ) from None
