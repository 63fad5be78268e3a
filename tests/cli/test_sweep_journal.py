"""The sweep's study journal, cut after every record: what ``--resume`` makes of it.

A journal cut after record k is what a sweep killed right after its k-th write leaves
(Optuna's journal is one JSON record per line). For every k: the grid is queued with each
slot exactly once; a trial whose ``status.json`` was written counts as done; an
interrupted trial is queued again exactly once, whichever of "mark it" and "queue it
again" the kill fell between. No cluster here: the study as the sweep keeps it; the
end-to-end kill of the real CLI is ``test_sweep_kill.py``.
"""

from __future__ import annotations

import json
import shutil

import pytest

optuna = pytest.importorskip("optuna")

from apex_dask.cli.sweep.spec import spec_from_dict  # noqa: E402
from apex_dask.cli.sweep.study import (  # noqa: E402
    JOURNAL,
    counted,
    enqueue,
    fill_queue,
    mark_interrupted,
    open_study,
    repair,
    slot_of,
    suggest,
)

SPACE = {
    "base": {"preset": "cartpole"},
    "space": {"learner.n_step": {"grid": [1, 2]}, "replay.alpha": {"uniform": [0.4, 0.7]}},
    "budget": {"env_steps": 1000},
}


def _spec(tmp_path):
    return spec_from_dict(SPACE, tmp_path, name="space")


def _waiting(study):
    from optuna.trial import TrialState

    return sorted(
        (slot_of(t), t.system_attrs["fixed_params"].get("learner.n_step"))
        for t in study.get_trials(deepcopy=False)
        if t.state == TrialState.WAITING
    )


def _cut(src, dst, k):
    """``dst``: a sweep folder whose journal is ``src``'s first ``k`` records."""
    dst.mkdir()
    lines = (src / JOURNAL).read_text().splitlines(keepends=True)
    (dst / JOURNAL).write_text("".join(lines[:k]))
    for status in src.glob("trial-*/status.json"):
        (dst / status.parent.name).mkdir(exist_ok=True)
        shutil.copy(status, dst / status.parent.name / "status.json")
    return len(lines)


def test_a_grid_cut_after_any_record_is_queued_once_per_slot(tmp_path):
    spec = _spec(tmp_path)
    whole = tmp_path / "whole"
    whole.mkdir()
    study = open_study(whole, spec, 4, create=True)
    want = [(0, 1), (1, 2), (2, 1), (3, 2)]
    assert _waiting(study) == want
    n = len((whole / JOURNAL).read_text().splitlines())
    assert n == 6  # the study, its trial count, one record per slot
    for k in range(0, n + 1):
        folder = tmp_path / f"cut-{k}"
        _cut(whole, folder, k)
        again = open_study(folder, spec, 4, create=False)
        assert _waiting(again) == want, k
        assert _waiting(open_study(folder, spec, 4, create=False)) == want, k  # idempotent


def _run_to(study, spec, folder, state):
    """Ask the next trial and leave it as a killed sweep would: RUNNING, and
    ``status.json`` written with ``state`` (None: not written)."""
    trial = study.ask()
    params = suggest(trial, spec.space)
    if state is not None:
        (folder / f"trial-{trial.number:04d}").mkdir()
        status = {"number": trial.number, "state": state, "objective": 42.5, "steps": 1000}
        (folder / f"trial-{trial.number:04d}" / "status.json").write_text(json.dumps(status))
    return trial, params


def test_a_trial_whose_results_were_written_counts_and_an_unwritten_one_runs_again(tmp_path):
    spec = _spec(tmp_path)
    study = open_study(tmp_path, spec, 2, create=True)
    done, params_done = _run_to(study, spec, tmp_path, "complete")
    lost, params_lost = _run_to(study, spec, tmp_path, None)
    finished, interrupted = repair(study, spec, tmp_path, 2)
    assert (finished, interrupted) == ([done.number], [lost.number])
    trials = {t.number: t for t in study.get_trials()}
    assert trials[done.number].state.name == "COMPLETE" and trials[done.number].value == 42.5
    assert trials[lost.number].user_attrs["interrupted"] is True
    assert counted(study)[0] == 1
    # the interrupted one is queued again once, with its slot and all its values
    (again,) = [t for t in study.get_trials() if t.state.name == "WAITING"]
    assert slot_of(again) == slot_of(trials[lost.number])
    assert again.system_attrs["fixed_params"] == params_lost
    assert again.user_attrs["requeued_from"] == lost.number
    assert fill_queue(study, spec, 2) == [] and len(study.get_trials()) == 3


@pytest.mark.parametrize("order", ["mark, then queue", "queue, then mark"])
def test_an_interrupted_trial_is_queued_again_exactly_once_whatever_the_kill_cut(tmp_path, order):
    """The two records of "interrupted": cut after either, the values run once more."""
    spec = _spec(tmp_path)
    whole = tmp_path / "whole"
    whole.mkdir()
    study = open_study(whole, spec, 2, create=True)
    trial, params = _run_to(study, spec, whole, "interrupted")
    before = len((whole / JOURNAL).read_text().splitlines())
    if order == "mark, then queue":
        mark_interrupted(study, trial.number)
        enqueue(study, spec, params, slot=slot_of(trial), requeued_from=trial.number)
    else:  # what the running sweep does
        enqueue(study, spec, params, slot=slot_of(trial), requeued_from=trial.number)
        mark_interrupted(study, trial.number)
    after = len((whole / JOURNAL).read_text().splitlines())
    for k in range(before, after + 1):
        folder = tmp_path / f"cut-{k}"
        _cut(whole, folder, k)
        resumed = open_study(folder, spec, 2, create=False)
        repair(resumed, spec, folder, 2)
        repair(resumed, spec, folder, 2)  # a second resume adds nothing
        trials = resumed.get_trials()
        replays = [t for t in trials if t.state.name == "WAITING" and slot_of(t) == slot_of(trial)]
        assert len(replays) == 1, (k, [(t.number, t.state.name, t.user_attrs) for t in trials])
        assert replays[0].system_attrs["fixed_params"] == params, k
        assert [t.state.name for t in trials if t.number == trial.number] == ["FAIL"], k
