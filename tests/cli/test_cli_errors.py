"""apex-dask-submit turns bad input into one line on stderr and a non-zero exit."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

SUBMIT = [sys.executable, "-m", "apex_dask"]


def submit(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SUBMIT, *args], capture_output=True, text=True, timeout=timeout, env=os.environ.copy()
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    assert lines[0].startswith("apex-dask-submit: error:")
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--preset", "pong"], ["unknown preset", "cartpole"]),
        (["--set", "replay.alpha=3"], ["replay.alpha", "[0, 1]"]),
        (["--set", "learner.batch_size=-1"], ["learner.batch_size", "> 0"]),
        (["--set", "replay.alhpa=0.5"], ["unknown config key", "replay.alpha"]),
        (["--set", "replay.alpha"], ["KEY=VALUE"]),
        (
            ["--scheduler-file", "/nonexistent/sched.json"],
            ["/nonexistent/sched.json", "does not exist"],
        ),
        (["--scheduler", "tcp://127.0.0.1:1", "--scheduler-file", "x"], ["exclude each other"]),
        (["--set", "env.env_id=NoSuchEnv-v9"], ["NoSuchEnv-v9"]),
        (["--config", "/nonexistent/run.yaml"], ["cannot read config file"]),
        (["--preset", "cartpole", "--set", "algo=dpg"], ["Discrete(2)", "dpg", "algo=dqn"]),
        (["--preset", "pendulum", "--set", "algo=dqn"], ["Box(", "dqn", "algo=dpg"]),
        (
            ["--set", "dqn.num_atoms=51", "--set", "dqn.loss=hl_gauss"],
            ["dqn.loss='hl_gauss'", "dqn.num_atoms=51", "dqn.loss=huber"],
        ),
        (
            ["--preset", "cartpole", "--set", "dqn.encoder=impala"],
            ["dqn.encoder=impala", "vectors", "dqn.encoder=auto"],
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needles):
    assert_one_line_error(submit(*args), *needles)


def test_bad_yaml_types_name_the_field(tmp_path):
    cfg = tmp_path / "run.yaml"
    cfg.write_text("preset: cartpole\nlearner:\n  lr: fast\n")
    assert_one_line_error(submit("--config", str(cfg)), "dqn.lr", "fast")


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere; covered by the file case")
def test_unwritable_out_dir_is_refused(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    assert_one_line_error(submit("--out", str(locked / "run")), "--out", "not writable")


def test_out_that_is_a_file_is_refused_and_the_file_is_kept(tmp_path):
    target = tmp_path / "results"
    target.write_text("precious")
    assert_one_line_error(submit("--out", str(target)), "--out", "not writable")
    assert target.read_text() == "precious"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_scheduler_fails_fast_with_one_line():
    port = _free_port()  # nothing listens here
    start = time.monotonic()
    proc = submit("--scheduler", f"tcp://127.0.0.1:{port}", "--connect-timeout", "3", timeout=90)
    elapsed = time.monotonic() - start
    assert_one_line_error(proc, f"127.0.0.1:{port}")
    assert elapsed < 45, elapsed


def test_list_keys_prints_every_documented_key():
    proc = submit("--list-keys")
    assert proc.returncode == 0
    assert "replay.alpha" in proc.stdout and "Priority exponent" in proc.stdout


def test_help_mentions_presets_and_flags():
    proc = submit("--help")
    assert proc.returncode == 0
    for flag in ("--preset", "--scheduler-file", "--stop-reward", "--out", "cartpole"):
        assert flag in proc.stdout


class SchedulerInfo:
    """The one client call the remote checks make on a CPU-only learner: ``scheduler_info``."""

    def __init__(self, workers: dict[str, dict]) -> None:
        self.workers = workers

    def scheduler_info(self, n_workers: int = 5) -> dict:
        return {"workers": self.workers}


def test_replay_too_large_for_the_learners_worker_is_refused_naming_that_worker():
    from apex_dask.cli.checks import UsageError, probe_env
    from apex_dask.cli.remote import check_learner_worker
    from apex_dask.config import ApexConfig

    gib = 2**30
    client = SchedulerInfo(
        {
            "tcp://h:1": {"name": 0, "host": "h", "memory_limit": 64 * gib},
            "tcp://h:2": {"name": 1, "host": "h", "memory_limit": 2 * gib, "resources": {"GPU": 1}},
        }
    )
    cfg = ApexConfig.preset("cartpole")
    spaces = probe_env(cfg)
    check_learner_worker(client, cfg, spaces)  # the preset's replay fits in 2 GiB
    check_learner_worker(SchedulerInfo({}), cfg, spaces)  # no workers yet: the driver's to say
    big = cfg.override({"replay.capacity": 100_000_000})
    with pytest.raises(UsageError) as err:  # the learner goes to the GPU worker: 2 GiB there
        check_learner_worker(client, big, spaces)
    message = str(err.value)
    assert "\n" not in message
    assert "replay.capacity=100,000,000" in message and "lower it" in message
    assert "the learner's worker tcp://h:2, which has 2.0 GiB" in message


def test_action_spaces_each_agent_refuses_name_the_other_agent():
    import numpy as np
    from gymnasium import spaces

    from apex_dask.algo.agents.registry import agent

    def action_space_problem(algo: str, act: spaces.Space) -> str | None:
        return agent(algo).check_spaces(spaces.Box(-1.0, 1.0, (3,), np.float32), act)

    box = spaces.Box(-1.0, 1.0, (2,), np.float32)
    unbounded = spaces.Box(-np.inf, np.inf, (2,), np.float32)
    assert action_space_problem("dpg", box) is None
    assert action_space_problem("dqn", spaces.Discrete(3)) is None
    for algo, space, needles in (
        ("dpg", unbounded, ["finite action bounds", "dqn"]),
        ("dpg", spaces.Discrete(3), ["bounded Box", "algo=dqn"]),
        ("dqn", box, ["Discrete", "algo=dpg"]),
        ("dpg", spaces.MultiBinary(3), ["bounded Box", "dqn"]),
    ):
        problem = action_space_problem(algo, space)
        assert problem is not None and "\n" not in problem
        for needle in needles:
            assert needle in problem, (needle, problem)


def test_the_retired_env_error_key_is_one_note_line_naming_the_new_keys(tmp_path):
    cfg = tmp_path / "old.yaml"  # a config file from before the cap per env steps
    cfg.write_text("preset: cartpole\nworkers:\n  max_env_errors_per_min: 100\n")
    proc = submit("--config", str(cfg), "--set", "env.env_id=NoSuchEnv-v9")
    assert_one_line_error(proc, "NoSuchEnv-v9")  # the config itself loaded
    notes = [line for line in proc.stdout.splitlines() if "max_env_errors_per_min" in line]
    assert len(notes) == 1, proc.stdout
    assert notes[0].startswith("apex-dask-submit: note: workers.max_env_errors_per_min is no")
    assert "workers.max_env_errors_per_1k_steps" in notes[0]
    assert "workers.max_consecutive_env_errors" in notes[0]


def test_a_moved_key_runs_with_one_note_line_and_another_agents_key_is_one_error():
    moved = submit("--preset", "cartpole", "--set", "learner.lr=0.001", "--print-config")
    assert moved.returncode == 0, moved.stderr
    notes = [line for line in moved.stdout.splitlines() if "note:" in line]
    assert len(notes) == 1 and "learner.lr" in notes[0] and "dqn.lr" in notes[0]
    assert "lr: 0.001" in moved.stdout.split("dqn:", 1)[1]
    assert_one_line_error(
        submit("--preset", "cartpole", "--set", "dpg.tau=0.1"), "dpg.tau", "dpg agent", "algo=dpg"
    )
