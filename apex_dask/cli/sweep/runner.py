"""K trials at once on one cluster: one thread per slot, each asking the study for the next.

::

    sweep = SweepRunner(folder, spec, study, client, groups, trials=6, stop=event)
    outcomes = sweep.run()          # returns when the trials are done or ``stop`` is set

Each slot (a :class:`~.groups.WorkerGroup`) runs its trials one after the
other: ask the study, build the trial's config (a combination the config
refuses is a failed trial, one line), run it (:class:`~.trial.TrialRun`),
tell the study, print one progress line. The study is only touched under one
lock. When ``stop`` is set (Ctrl-C, SIGTERM) every running trial halts and
saves; its parameters are queued again and it is marked FAIL with
``interrupted``, so ``--resume`` re-runs it (:mod:`.study`: each point exactly
once). A lost scheduler stops the sweep.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from apex_dask.cli.sweep.groups import WorkerGroup
from apex_dask.cli.sweep.spec import SweepSpec
from apex_dask.cli.sweep.study import counted, suggest
from apex_dask.cli.sweep.trial import TrialOutcome, TrialRun, check_trial_config
from apex_dask.config import ConfigError

__all__ = ["SweepRunner", "format_params", "trial_folder"]


def trial_folder(folder: Path, number: int) -> Path:
    return folder / f"trial-{number:04d}"


def format_params(params: dict[str, Any]) -> str:
    def short(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    return " ".join(f"{k}={short(v)}" for k, v in params.items())


class SweepRunner:
    """Runs the study's remaining trials, ``len(groups)`` at once (see the module docstring)."""

    def __init__(
        self,
        folder: Path,
        spec: SweepSpec,
        study: Any,
        client: Any,
        groups: list[WorkerGroup],
        *,
        trials: int,
        stop: threading.Event,
        say: Callable[[str], None],
        quiet: bool = False,
    ) -> None:
        self.folder, self.spec, self.study, self.client = folder, spec, study, client
        self.groups, self.trials, self.stop, self._say = groups, trials, stop, say
        self.quiet = quiet
        self.lock = threading.Lock()
        self.active = 0
        self.outcomes: list[TrialOutcome] = []
        self.lost_scheduler = False
        self.errors: list[BaseException] = []

    def say(self, line: str) -> None:
        with self.lock:
            self._say(line)

    def run(self, poll: Callable[[], None] | None = None) -> list[TrialOutcome]:
        """Run the slots until done or stopped; ``poll()`` is called every 0.2 s meanwhile
        (the caller's signal check)."""
        threads = [
            threading.Thread(target=self._slot, args=(i,), name=f"apex-sweep-slot-{i}", daemon=True)
            for i in range(len(self.groups))
        ]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            if poll is not None:
                poll()
            for t in threads:
                t.join(0.2 / len(threads))
        if self.errors:
            raise self.errors[0]
        return self.outcomes

    # ----------------------------------------------------------------- slots
    def _slot(self, index: int) -> None:
        try:
            while not self.stop.is_set():
                nxt = self._next()
                if nxt is None:
                    return
                self._run_one(index, *nxt)
                if self._scheduler_gone():
                    self.lost_scheduler = True
                    self.stop.set()
        except BaseException as exc:  # noqa: BLE001 - a bug: stop the sweep, report it
            self.errors.append(exc)
            self.stop.set()

    def _next(self) -> tuple[Any, dict[str, Any]] | None:
        with self.lock:
            done, _ = counted(self.study)
            if done + self.active >= self.trials or self.stop.is_set():
                return None
            trial = self.study.ask()
            params = suggest(trial, self.spec.space)
            self.active += 1
            return trial, params

    def _run_one(self, index: int, trial: Any, params: dict[str, Any]) -> None:
        folder = trial_folder(self.folder, trial.number)
        group = self.groups[index]
        overrides = self.spec.space.overrides(params)
        started = time.monotonic()
        try:
            cfg = check_trial_config(self.spec, overrides)
        except ConfigError as exc:
            outcome = TrialOutcome(trial.number, "failed", None, 0, 0.0, str(exc))
        else:
            if not self.quiet:
                self.say(
                    f"trial {trial.number} started on {group.learner.name}: {format_params(params)}"
                )

            def report(value: float, step: int) -> bool:
                with self.lock:
                    trial.report(value, step)
                    return bool(trial.should_prune())

            outcome = TrialRun(
                trial.number, cfg, folder, self.client, group, self.spec, report, self.stop
            ).run()
        outcome.wall_s = time.monotonic() - started
        self._tell(trial, params, outcome, folder)

    def _tell(self, trial: Any, params: dict[str, Any], o: TrialOutcome, folder: Path) -> None:
        from apex_dask.cli.sweep.study import enqueue, mark_interrupted, slot_of, tell_outcome

        with self.lock:
            if o.state == "interrupted":  # queued again first: a kill now loses nothing
                enqueue(
                    self.study,
                    self.spec,
                    dict(params),
                    slot=slot_of(trial),
                    requeued_from=trial.number,
                )
                mark_interrupted(self.study, trial.number)
            else:
                tell_outcome(self.study, trial.number, o.as_dict())
            self.active -= 1
            self.outcomes.append(o)
            done, _ = counted(self.study)
            self._say(self._line(o, params, done))

    def _line(self, o: TrialOutcome, params: dict[str, Any], done: int) -> str:
        metric = self.spec.objective.metric
        value = "-" if o.value is None else f"{o.value:.4g}"
        head = {
            "complete": "complete",
            "pruned": o.message or "pruned",
            "failed": "failed",
            "interrupted": "interrupted (re-run on --resume)",
        }[o.state]
        tail = f"  {o.message}" if o.state == "failed" and o.message else ""
        best = self._best()
        best_text = f", best: trial {best[0]} {best[1]:.4g}" if best else ""
        return (
            f"trial {o.number} {head}: {metric} {value}, {o.steps:,} steps, {o.wall_s:.0f} s, "
            f"{format_params(params)} [{done}/{self.trials} done{best_text}]{tail}"
        )

    def _best(self) -> tuple[int, float] | None:
        try:
            best = self.study.best_trial
        except ValueError:  # no complete trial yet
            return None
        return best.number, float(best.value)

    def _scheduler_gone(self) -> bool:
        status = getattr(self.client, "status", "running")
        return status not in ("running", "newly-created")
