"""The Optuna study of a sweep: its journal file, sampler, pruner, and what resume repairs.

::

    optuna = import_optuna()                  # one line with the install hint if missing
    study = open_study(folder, spec, create=True)
    trial = study.ask(); params = suggest(trial, spec.space)
    study.tell(trial, value) / mark_pruned(...) / mark_failed(...)

**Storage.** The study lives in ``DIR/study.journal``, Optuna's journal file
(``JournalStorage`` + ``JournalFileBackend``): an append-only log, one JSON
operation per line, each written whole and fsync'd. A SIGKILL can at worst
leave the last line torn, which :func:`repair_journal` cuts off before the
study is read again; SQLite would also survive the kill, but its locking is
unsafe on the network filesystems a cluster's shared home often is, and it
needs a database file format to inspect. Only the sweep process writes the
journal (trials run in its threads); ``DIR/.sweep.lock`` (an ``flock`` the
kernel drops when the process dies) keeps a second sweep off the same folder.

**Interrupted trials** (the sweep was killed or stopped while they ran) are
marked FAIL with the user attribute ``interrupted`` and re-run from scratch,
with the same parameters, as new trials: they do not count toward ``--trials``.

**Grid keys** are run by enqueueing each grid point as a trial's fixed
parameters (round-robin over ``--trials``); the other keys come from the
sampler (TPE by default, seeded). Optuna's own ``GridSampler`` would take
neither list values (``dqn.hiddens``) nor sampled keys beside the grid,
and counts a failed point as visited, so an interrupted one would never re-run.
"""

from __future__ import annotations

import fcntl
import os
import warnings
from pathlib import Path
from typing import Any

from apex_dask.cli.sweep.spec import SweepError, SweepSpec
from apex_dask.config.space import Choice, FloatRange, SearchSpace

__all__ = [
    "JOURNAL",
    "STUDY_NAME",
    "SweepLock",
    "counted",
    "import_optuna",
    "open_study",
    "repair_journal",
    "suggest",
]

JOURNAL = "study.journal"
STUDY_NAME = "apex-sweep"
INSTALL_HINT = "pip install 'apex_dask[sweep]' (Optuna and matplotlib)"


def import_optuna() -> Any:
    """``optuna``, or a one-line :class:`SweepError` saying how to install it."""
    try:
        import optuna  # extra: sweep
        from optuna.storages.journal import JournalFileBackend  # noqa: F401  # extra: sweep
    except ImportError as exc:
        raise SweepError(f"apex-dask-sweep needs Optuna >= 4.0 ({exc}); {INSTALL_HINT}") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


class SweepLock:
    """An exclusive ``flock`` on ``DIR/.sweep.lock`` for as long as the sweep runs."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / ".sweep.lock"
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._fd)
            raise SweepError(
                f"another apex-dask-sweep is running on {str(folder)!r}; stop it first"
            ) from None
        os.ftruncate(self._fd, 0)
        os.write(self._fd, f"{os.getpid()}\n".encode())

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def repair_journal(path: Path) -> bool:
    """Cut a torn last line (a write killed half-way) and drop a lock file left by a killed
    writer; only while holding :class:`SweepLock`. Whether anything was cut."""
    lock = Path(str(path) + ".lock")
    if lock.is_symlink() or lock.exists():
        lock.unlink()
    if not path.is_file() or path.stat().st_size == 0:
        return False
    with open(path, "rb+") as f:
        data = f.read()
        if data.endswith(b"\n"):
            return False
        f.truncate(data.rfind(b"\n") + 1)
        f.flush()
        os.fsync(f.fileno())
    return True


def _storage(optuna: Any, folder: Path) -> Any:
    from optuna.storages.journal import JournalFileBackend, JournalStorage  # extra: sweep

    return JournalStorage(JournalFileBackend(str(folder / JOURNAL)))


def _sampler(optuna: Any, spec: SweepSpec, offset: int = 0) -> Any:
    """The sampler, seeded; ``offset`` (the trials already in a resumed study) moves the
    seed so a resumed sweep does not draw its first values again."""
    seed = spec.sampler.seed + offset
    if spec.sampler.name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed)


def _pruner(optuna: Any, spec: SweepSpec) -> Any:
    p, every = spec.pruner, spec.budget.total / spec.pruner.reports
    if p.name == "none":
        return optuna.pruners.NopPruner()
    if p.name == "halving":
        return optuna.pruners.SuccessiveHalvingPruner(
            min_resource=max(1, int(round(every))), reduction_factor=p.reduction_factor
        )
    return optuna.pruners.MedianPruner(
        n_startup_trials=p.startup_trials,
        n_warmup_steps=int(round(every * p.warmup_reports)),
    )


def open_study(folder: Path, spec: SweepSpec, trials: int, *, create: bool) -> Any:
    """The sweep's study (created with its grid points enqueued, or loaded to resume)."""
    optuna = import_optuna()
    storage = _storage(optuna, folder)
    kwargs = {"sampler": _sampler(optuna, spec), "pruner": _pruner(optuna, spec)}
    if create:
        study = optuna.create_study(
            storage=storage, study_name=STUDY_NAME, direction=spec.objective.direction, **kwargs
        )
        study.set_user_attr("trials", trials)
    else:
        try:
            study = optuna.load_study(storage=storage, study_name=STUDY_NAME, **kwargs)
        except KeyError:
            raise SweepError(
                f"{folder / JOURNAL} holds no study (the sweep was stopped before its first "
                "trial); start it again in a new folder"
            ) from None
        study.sampler = _sampler(optuna, spec, offset=len(study.get_trials(deepcopy=False)))
    queued = int(study.user_attrs.get("grid_enqueued", 0))
    points = spec.space.grid_points()
    if points and trials > queued:  # round-robin over the grid up to the trial count
        for i in range(queued, trials):
            study.enqueue_trial(points[i % len(points)])
        study.set_user_attr("grid_enqueued", trials)
    return study


def counted(study: Any) -> tuple[int, list[Any]]:
    """``(trials that count toward --trials, trials still marked RUNNING)``: complete,
    pruned and failed trials count, except those failed because the sweep stopped."""
    from optuna.trial import TrialState  # extra: sweep

    done, running = 0, []
    for t in study.get_trials(deepcopy=False):
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
            done += 1
        elif t.state == TrialState.FAIL and not t.user_attrs.get("interrupted"):
            done += 1
        elif t.state == TrialState.RUNNING:
            running.append(t)
    return done, running


def requeue_interrupted(study: Any, running: list[Any]) -> list[int]:
    """Mark trials left RUNNING by a killed sweep FAIL (``interrupted``) and enqueue their
    parameters again, ahead of new ones; their numbers."""
    from optuna.trial import TrialState  # extra: sweep

    numbers = []
    import optuna  # extra: sweep

    for t in running:
        optuna.trial.Trial(study, t._trial_id).set_user_attr("interrupted", True)
        study.tell(t.number, state=TrialState.FAIL)
        study.enqueue_trial(dict(t.params))
        numbers.append(t.number)
    return numbers


def suggest(trial: Any, space: SearchSpace) -> dict[str, Any]:
    """The trial's value for every key of ``space`` (as Optuna stores them)."""
    params: dict[str, Any] = {}
    for p in space.params:
        if isinstance(p, Choice):
            params[p.key] = trial.suggest_categorical(p.key, list(p.encoded()))
        elif isinstance(p, FloatRange):
            params[p.key] = trial.suggest_float(p.key, p.low, p.high, log=p.log, step=p.step)
        else:
            step = None if p.log else p.step
            params[p.key] = trial.suggest_int(p.key, p.low, p.high, step=step or 1, log=p.log)
    return params


def check_resumable(folder: Path) -> None:
    """``folder`` holds a sweep (its file and journal), else one line."""
    if not folder.is_dir():
        raise SweepError(f"--resume {str(folder)!r} does not exist; give a sweep's --out folder")
    missing = [n for n in ("sweep.yaml", JOURNAL) if not (folder / n).is_file()]
    if missing:
        raise SweepError(
            f"--resume {str(folder)!r} holds no sweep (no {missing[0]}); give a sweep's --out folder"
        )
