"""The sweep file and its search space, checked before anything starts (no cluster here).

Bad spaces go through the real ``apex-dask-sweep`` process: one stderr line
naming the key, exit 2, no folder made. The typed space, the split of workers
into trial slots and the journal repair are tested as the pure functions they are.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from apex_dask.cli.sweep.groups import split_workers
from apex_dask.config import ApexConfig
from apex_dask.config.space import Choice, FloatRange, IntRange, SpaceError, parse_space
from apex_dask.runtime.orchestration.placement import WorkerInfo

SWEEP = [sys.executable, "-c", "import sys; from apex_dask.cli.sweep import main; sys.exit(main())"]

BASE = "base: {preset: cartpole}\nbudget: {time_s: 10}\n"

BAD_SPACES = [
    # (space section, words the one line must hold)
    ("learner.lrr: {loguniform: [1.0e-4, 1.0e-2]}", ["learner.lrr", "unknown config key"]),
    ("dqn.lrr: {loguniform: [1.0e-4, 1.0e-2]}", ["dqn.lrr", "dqn.lr"]),
    ("dpg.tau: {uniform: [0.1, 0.2]}", ["dpg.tau", "dpg agent", "algo is dqn"]),
    ("replay.placement: {uniform: [0.1, 0.5]}", ["replay.placement", "a string", "choice"]),
    ("dqn.lr: {choice: [0.001, fast]}", ["dqn.lr", "'fast'", "must be a number"]),
    ("learner.batch_size: {uniform: [32, 64]}", ["learner.batch_size", "integer", "int:"]),
    ("dqn.lr: {loguniform: [1.0e-2, 1.0e-4]}", ["dqn.lr", "empty"]),
    ("learner.n_step: {int: [3, 3]}", ["learner.n_step", "empty"]),
    ("dqn.lr: {loguniform: [0.0, 1.0e-2]}", ["dqn.lr", "lo > 0"]),
    ("dqn.lr: {choice: []}", ["dqn.lr", "non-empty"]),
    ("replay.placement: {choice: [learner_process, nowhere]}", ["replay.placement", "'nowhere'"]),
    ("replay.alpha: {uniform: [0.4, 1.5]}", ["replay.alpha", "1.5", "not allowed"]),
    ("learner.device: {grid: [cpu, tpu]}", ["learner.device", "'tpu'"]),
    ("dqn.lr: 0.001", ["dqn.lr", "not a distribution"]),
    ("dqn: {lr: {normal: [0, 1]}}", ["dqn.lr", "not a distribution"]),
    ("dqn.lr: {uniform: [1.0e-4, 1.0e-2], steps: 2}", ["dqn.lr", "'steps'"]),
]


def sweep(tmp_path: Path, space: str, *flags: str) -> subprocess.CompletedProcess:
    (tmp_path / "space.yaml").write_text(BASE + "space:\n  " + space + "\n")
    out = tmp_path / "out"
    return subprocess.run(
        [*SWEEP, str(tmp_path / "space.yaml"), "--out", str(out), *flags],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )


@pytest.mark.parametrize(("space", "words"), BAD_SPACES, ids=[s for s, _ in BAD_SPACES])
def test_a_bad_space_is_one_line_and_exit_2_before_anything_starts(tmp_path, space, words):
    done = sweep(tmp_path, space)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("apex-dask-sweep: error:"), done.stderr
    assert "Traceback" not in done.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert not (tmp_path / "out").exists()  # nothing made, nothing started
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("extra", "words"),
    [
        ("objective: {metric: eval/return_mean, mode: up}", ["mode", "max or min"]),
        ("budget: {time_s: 10, env_steps: 100}", ["budget", "not both"]),
        ("sampler: {name: cmaes}", ["sampler", "tpe or random"]),
        ("pruner: {name: hyperband}", ["pruner", "median"]),
        ("spaces: {}", ["unknown section 'spaces'"]),
    ],
)
def test_bad_sections_are_one_line_too(tmp_path, extra, words):
    (tmp_path / "s.yaml").write_text(
        "base: {preset: cartpole}\nspace: {dqn.lr: {uniform: [1.0e-3, 2.0e-3]}}\n" + extra
    )
    done = subprocess.run(
        [*SWEEP, str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    for word in words:
        assert word in done.stderr
    assert not (tmp_path / "o").exists()


def test_resume_of_a_folder_that_is_no_sweep_is_one_line(tmp_path):
    done = subprocess.run(
        [*SWEEP, "--resume", str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and "holds no sweep" in done.stderr, done.stderr


def test_the_space_is_typed_and_values_come_back_as_the_config_takes_them():
    base = ApexConfig.preset("cartpole")
    space = parse_space(
        {
            "learner": {"lr": {"loguniform": [3e-5, 1e-3]}},
            "replay.alpha": {"uniform": [0.4, 0.7], "step": 0.1},
            "learner.n_step": {"int": [1, 5], "step": 2},
            "dqn.hiddens": {"choice": [[64], [128, 128]]},
            "learner.batch_size": {"grid": [32, 64]},
            "env.env_kwargs.max_episode_steps": {"grid": [100, 200]},
        },
        base,
    )
    kinds = {p.key: type(p) for p in space.params}
    assert kinds == {
        "dqn.lr": FloatRange,
        "replay.alpha": FloatRange,
        "learner.n_step": IntRange,
        "dqn.hiddens": Choice,
        "learner.batch_size": Choice,
        "env.env_kwargs.max_episode_steps": Choice,
    }
    assert space.params[0].log and not space.params[1].log
    assert space.grid_points() == [
        {"learner.batch_size": 32, "env.env_kwargs.max_episode_steps": 100},
        {"learner.batch_size": 32, "env.env_kwargs.max_episode_steps": 200},
        {"learner.batch_size": 64, "env.env_kwargs.max_episode_steps": 100},
        {"learner.batch_size": 64, "env.env_kwargs.max_episode_steps": 200},
    ]
    hiddens = space.params[3]
    assert hiddens.encoded() == ("[64]", "[128, 128]")  # samplers keep scalars only
    stored = {
        "dqn.lr": 1e-4,
        "replay.alpha": 0.5,
        "learner.n_step": 3,
        "dqn.hiddens": "[128, 128]",
        "learner.batch_size": 64,
        "env.env_kwargs.max_episode_steps": 200,
    }
    cfg = base.override(space.overrides(stored))
    assert cfg.agent.hiddens == (128, 128) and cfg.learner.batch_size == 64
    assert cfg.agent.lr == 1e-4 and cfg.env.env_kwargs == {"max_episode_steps": 200}


def test_an_error_names_where_it_is():
    with pytest.raises(SpaceError, match=r"^my.yaml: space: learner.gamma: uniform range"):
        parse_space(
            {"learner.gamma": {"uniform": [0.99, 0.9]}}, ApexConfig(), where="my.yaml: space"
        )


def w(name: str, host: str, gpu: bool = False) -> WorkerInfo:
    return WorkerInfo(f"tcp://{host}:{name}", name, host, {"GPU": 1} if gpu else {})


def test_learners_go_to_gpus_then_to_hosts_without_a_learner():
    workers = [w("1", "a"), w("2", "a"), w("3", "b"), w("4", "b"), w("5", "c", gpu=True)]
    groups = split_workers(workers, 3)
    assert [g.learner.name for g in groups] == ["5", "1", "3"]  # GPU first, then one per host
    assert sorted(x.name for g in groups for x in g.workers) == ["1", "2", "3", "4", "5"]
    assert [len(g.workers) for g in groups] == [1, 2, 2]
    assert groups[1].addresses == ["tcp://a:1", "tcp://a:2"]  # env workers beside the learner


def test_two_slots_on_one_host_split_the_workers_evenly():
    groups = split_workers([w(str(i), "h") for i in range(5)], 2)
    assert [[x.name for x in g.workers] for g in groups] == [["0", "2", "4"], ["1", "3"]]


def test_fewer_workers_than_slots_share():
    groups = split_workers([w("0", "h"), w("1", "h")], 3)
    assert [g.learner.name for g in groups] == ["0", "1", "0"]


def test_a_torn_last_journal_line_is_cut_and_the_study_reads_back(tmp_path):
    optuna = pytest.importorskip("optuna")
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    from apex_dask.cli.sweep.study import JOURNAL, repair_journal

    path = tmp_path / JOURNAL
    study = optuna.create_study(storage=JournalStorage(JournalFileBackend(str(path))))
    study.tell(study.ask(), 1.0)
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"op_code": 4, "worker_id"')  # a write killed half-way
    Path(str(path) + ".lock").write_text("")  # and the lock its writer held
    assert repair_journal(path)
    assert path.read_bytes() == whole and not Path(str(path) + ".lock").exists()
    again = optuna.load_study(
        study_name=study.study_name, storage=JournalStorage(JournalFileBackend(str(path)))
    )
    again.tell(again.ask(), 2.0)  # appends after a whole line
    assert [t.value for t in again.trials] == [1.0, 2.0]


def test_the_sweep_file_defaults_and_its_written_form_read_back_the_same(tmp_path):
    import yaml

    from apex_dask.cli.sweep.spec import spec_from_dict

    data = {
        "base": {"preset": "cartpole", "set": {"stop.timesteps": 4000, "eval.episodes": 3}},
        "space": {"dqn": {"lr": {"loguniform": [1e-4, 1e-2]}}},
    }
    spec = spec_from_dict(data, tmp_path)
    assert spec.budget.env_steps == 4000 and spec.budget.time_s is None  # the base's own stop
    assert (spec.objective.metric, spec.objective.mode, spec.objective.use) == (
        "eval/return_mean",
        "max",
        "best",
    )
    assert (spec.sampler.name, spec.pruner.name) == ("tpe", "median")
    cfg = spec.trial_config({"dqn.lr": 1e-3})
    assert cfg.agent.lr == 1e-3 and cfg.stop.timesteps == 4000 and cfg.eval.episodes == 3
    (tmp_path / "base.yaml").write_text(spec.base.to_yaml())
    again = spec_from_dict(yaml.safe_load(yaml.safe_dump(spec.to_dict("base.yaml"))), tmp_path)
    assert again.base == spec.base and again.space == spec.space
    assert (again.objective, again.budget, again.pruner) == (
        spec.objective,
        spec.budget,
        spec.pruner,
    )


def test_the_score_is_the_best_or_the_last_finite_value():
    from apex_dask.cli.sweep.spec import Objective
    from apex_dask.cli.sweep.trial import Score

    values = [
        {"eval/return_mean": 20.0},
        {"x": 1},
        {"eval/return_mean": float("nan")},
        {"eval/return_mean": 50.0},
        {"eval/return_mean": 30.0},
    ]
    best, final, low = (
        Score(Objective()),
        Score(Objective(use="final")),
        Score(Objective(mode="min")),
    )
    for v in values:
        for s in (best, final, low):
            s.update(v)
    assert (best.value, final.value, low.value) == (50.0, 30.0, 20.0)
    assert best.count == 3
