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

**Each point exactly once.** A sweep killed at any moment (SIGKILL included) and
resumed runs every grid point exactly once (``tests/cli/test_sweep_kill.py`` kills it
after each journal write in turn). How:

- *Grid points are slots.* Trial slot ``j`` (0 ... trials - 1) runs grid point
  ``j mod len(grid)``; each enqueued trial carries its slot as a user attribute in
  the one journal record that creates it. Opening the study enqueues exactly the
  slots that have no trial yet (:func:`fill_queue`), so a grid whose enqueueing was
  cut short is completed, never enqueued twice.
- *Interrupted trials* (the sweep stopped or was killed while they ran) are marked
  FAIL with the user attribute ``interrupted`` and their values are enqueued again as
  a new trial with the same slot (``requeued_from``: the trial it replaces); they do
  not count toward ``--trials``. A running sweep enqueues the replacement before it
  marks the trial, and :func:`fill_queue` enqueues one for any interrupted trial that
  has none, so a kill between the two writes loses nothing and doubles nothing.
- *A trial whose results were written counts as done.* A trial writes
  ``trial-NNNN/status.json`` before the study is told; :func:`repair` (at
  ``--resume``) tells the study what a trial left RUNNING wrote there; only a trial
  with no such file, or one saying ``interrupted``, runs again.
- The sweep's signal handlers are installed before the journal is first written;
  from then on a signal asks the sweep to stop between journal writes.

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
    "enqueue",
    "fill_queue",
    "mark_interrupted",
    "outcome_of",
    "repair",
    "slot_of",
    "tell_outcome",
    "import_optuna",
    "open_study",
    "repair_journal",
    "suggest",
]

JOURNAL = "study.journal"
STUDY_NAME = "apex-sweep"
SLOT = "slot"
"""User attribute: the trial's grid slot (its point is ``grid[slot % len(grid)]``)."""
REQUEUED_FROM = "requeued_from"
"""User attribute: the interrupted trial whose values this one runs again."""
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
    seed = (spec.sampler.seed + offset) % 2**32  # numpy takes seeds below 2**32
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
    """The sweep's study: created (a new sweep, or a resumed one killed before its study
    was written) or loaded; its queue filled (:func:`fill_queue`)."""
    optuna = import_optuna()
    storage = _storage(optuna, folder)
    kwargs = {"sampler": _sampler(optuna, spec), "pruner": _pruner(optuna, spec)}
    study = None
    if not create:
        try:
            study = optuna.load_study(storage=storage, study_name=STUDY_NAME, **kwargs)
        except KeyError:
            study = None  # killed before its first journal record: start it now
        else:
            study.sampler = _sampler(optuna, spec, offset=len(study.get_trials(deepcopy=False)))
    if study is None:
        study = optuna.create_study(
            storage=storage, study_name=STUDY_NAME, direction=spec.objective.direction, **kwargs
        )
    if int(study.user_attrs.get("trials", 0)) < trials:
        study.set_user_attr("trials", trials)
    fill_queue(study, spec, max(trials, int(study.user_attrs.get("trials", trials))))
    return study


def slot_of(t: Any) -> int | None:
    """The grid slot of a trial (None: not a grid slot's)."""
    slot = t.user_attrs.get(SLOT)
    return slot if isinstance(slot, int) and not isinstance(slot, bool) else None


def fill_queue(study: Any, spec: SweepSpec, trials: int) -> list[int]:
    """Enqueue what should be queued and is not: a replacement for each interrupted
    trial that has none, then each grid slot below ``trials`` that has no trial at
    all. Idempotent (run at every open). The numbers of the trials it replaced."""
    from optuna.trial import TrialState  # extra: sweep

    every = study.get_trials(deepcopy=False)
    replaced = {t.user_attrs.get(REQUEUED_FROM) for t in every}
    again = []
    for t in every:
        interrupted = t.state == TrialState.FAIL and t.user_attrs.get("interrupted")
        if interrupted and t.number not in replaced:
            enqueue(study, spec, dict(t.params), slot=slot_of(t), requeued_from=t.number)
            again.append(t.number)
    if spec.space.grid_points():
        taken = {slot_of(t) for t in study.get_trials(deepcopy=False)}
        first = int(study.user_attrs.get("grid_enqueued", 0))  # sweeps from before slots
        for j in range(first, trials):
            if j not in taken:
                enqueue(study, spec, {}, slot=j)
    return again


def enqueue(
    study: Any,
    spec: SweepSpec,
    params: dict[str, Any],
    *,
    slot: int | None = None,
    requeued_from: int | None = None,
) -> None:
    """One trial queued with ``params`` fixed (its slot's grid point on top), in one
    journal record together with its slot and the trial it replaces."""
    points = spec.space.grid_points()
    attrs: dict[str, Any] = {}
    if slot is not None:
        attrs[SLOT] = slot
        if points:
            params = {**params, **points[slot % len(points)]}
    if requeued_from is not None:
        attrs[REQUEUED_FROM] = requeued_from
    study.enqueue_trial(params, user_attrs=attrs)


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


def repair(study: Any, spec: SweepSpec, folder: Path, trials: int) -> tuple[list[int], list[int]]:
    """After a sweep was killed: each trial it left RUNNING is told what its
    ``status.json`` says (its results were written: it counts), or marked interrupted;
    then :func:`fill_queue` queues what is missing. ``(finished, interrupted)``."""
    import json

    finished, interrupted = [], []
    for t in counted(study)[1]:
        try:
            status = json.loads((folder / f"trial-{t.number:04d}" / "status.json").read_text())
        except (OSError, ValueError):
            status = None
        if isinstance(status, dict) and status.get("state") in ("complete", "pruned", "failed"):
            tell_outcome(study, t.number, status)
            finished.append(t.number)
        else:
            mark_interrupted(study, t.number)
            interrupted.append(t.number)
    fill_queue(study, spec, trials)
    return finished, interrupted


OUTCOME = "outcome"
"""User attribute: what a trial's ``status.json`` says, in one journal record."""
_OUTCOME_KEYS = ("folder", "steps", "wall_s", "message", "pruned_at")


def outcome_of(t: Any) -> dict[str, Any]:
    """A finished trial's ``folder``, ``steps``, ``wall_s``, ``message`` and
    ``pruned_at`` (from :data:`OUTCOME`; older sweeps kept one attribute each)."""
    out = {k: t.user_attrs[k] for k in _OUTCOME_KEYS if k in t.user_attrs}
    got = t.user_attrs.get(OUTCOME)
    return {**out, **got} if isinstance(got, dict) else out


def _trial(study: Any, number: int) -> Any:
    import optuna  # extra: sweep

    trial_id = study._storage.get_trial_id_from_study_id_trial_number(study._study_id, number)
    return optuna.trial.Trial(study, trial_id)


def tell_outcome(study: Any, number: int, status: dict[str, Any]) -> None:
    """Record a trial's outcome (``status.json``'s fields) and tell the study: two
    journal records, the outcome first (a told trial takes no attribute)."""
    from optuna.trial import TrialState  # extra: sweep

    attrs = {
        "folder": f"trial-{number:04d}",
        "steps": status.get("steps", 0),
        "wall_s": status.get("wall_s", 0.0),
        "message": status.get("message", ""),
        "pruned_at": status.get("pruned_at"),
    }
    _trial(study, number).set_user_attr(OUTCOME, attrs)
    state, value = status.get("state"), status.get("objective")
    if state == "complete" and isinstance(value, int | float):
        study.tell(number, float(value))
    elif state == "pruned":
        study.tell(number, state=TrialState.PRUNED)
    else:
        study.tell(number, state=TrialState.FAIL)


def mark_interrupted(study: Any, number: int) -> None:
    """FAIL with ``interrupted`` (the attribute first: a told trial takes none)."""
    from optuna.trial import TrialState  # extra: sweep

    _trial(study, number).set_user_attr("interrupted", True)
    study.tell(number, state=TrialState.FAIL)


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
    """``folder`` holds a sweep (its ``sweep.yaml``; the journal may be missing if the
    sweep was killed before writing it), else one line."""
    if not folder.is_dir():
        raise SweepError(f"--resume {str(folder)!r} does not exist; give a sweep's --out folder")
    if not (folder / "sweep.yaml").is_file():
        raise SweepError(
            f"--resume {str(folder)!r} holds no sweep (no sweep.yaml); give a sweep's --out folder"
        )
