"""A sweep's folder and study before any trial runs: how many trials, ``sweep.yaml`` and
``base.yaml`` written (a new sweep), or the journal repaired and the study's running
trials settled (``--resume``: :func:`~.study.repair`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from apex_dask.cli.outdir import write_text
from apex_dask.cli.sweep.spec import SweepSpec

__all__ = ["DEFAULT_TRIALS", "open_sweep", "plan_trials"]

DEFAULT_TRIALS = 10


def plan_trials(flag: int | None, folder: Path, spec: SweepSpec, resuming: bool) -> int:
    """Trials in all: --trials, else the file's (a resumed sweep's as it last ran), else
    the grid's size, else :data:`DEFAULT_TRIALS`; a resumed sweep never shrinks."""
    if resuming:
        from apex_dask.config.reader import read_document

        stored = read_document(folder / "sweep.yaml", "sweep file", json_text=False) or {}
        before = stored.get("trials") if isinstance(stored, dict) else None
        before = before if isinstance(before, int) and before >= 1 else DEFAULT_TRIALS
        return max(flag or before, before)
    points = spec.space.grid_points()
    return flag or spec.trials or (len(points) if spec.space.only_grid else DEFAULT_TRIALS)


def open_sweep(
    folder: Path, spec: SweepSpec, trials: int, k: int, resuming: bool, say: Callable[[str], None]
) -> Any:
    """The study, new or resumed (repaired: :func:`~.study.repair`), with ``sweep.yaml``
    saying ``trials``."""
    import yaml

    from apex_dask.cli.sweep.study import JOURNAL, counted, open_study, repair, repair_journal

    stored = {**spec.to_dict("base.yaml"), "trials": trials, "concurrent": k}
    if not resuming:
        write_text(folder / "base.yaml", spec.base.to_yaml())
        write_text(folder / "sweep.yaml", yaml.safe_dump(stored, sort_keys=False))
        study = open_study(folder, spec, trials, create=True)
        say(
            f"{trials} trials, {k} at once, in {folder}; space: " + "; ".join(spec.space.describe())
        )
        return study
    if repair_journal(folder / JOURNAL):
        say("cut a torn last record from the study journal (the sweep was killed mid-write)")
    study = open_study(folder, spec, trials, create=False)
    finished, again = repair(study, spec, folder, trials)
    from apex_dask.config.reader import read_document

    before = read_document(folder / "sweep.yaml", "sweep file", json_text=False) or {}
    if isinstance(before, dict) and before.get("trials") != trials:
        write_text(
            folder / "sweep.yaml", yaml.safe_dump({**before, "trials": trials}, sort_keys=False)
        )
    done, _ = counted(study)
    notes = []
    if finished:
        notes.append(f"trial(s) {', '.join(map(str, finished))} had written their results: counted")
    if again:
        notes.append(f"trial(s) {', '.join(map(str, again))} were interrupted: run again")
    say(f"resuming {folder}: {done} of {trials} trials done" + "".join(f"; {n}" for n in notes))
    return study
