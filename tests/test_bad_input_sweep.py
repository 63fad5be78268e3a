"""Bad input through the real entry point (``python -m apex_dask``), before anything starts.

Every row checks the exit code, at most 3 lines on stderr, no traceback on
the console, a time bound, and that an earlier run's folder is byte-identical
afterwards. Each fails before any cluster starts; the full-disk case writes
into a 2 MiB tmpfs mounted by the test. The runs on a real cluster (signals,
a full disk mid-run, a lost worker, a restarted scheduler) are in
``e2e/test_bad_input_runs.py``.
"""

from __future__ import annotations

import os
import socket
import socketserver
import threading
from dataclasses import dataclass, field
from http.server import SimpleHTTPRequestHandler

import pytest
from bad_input import (
    FAST_S,
    ROOT,
    check_console,
    check_no_empty_or_temporary_files,
    has_cuda,
    submit,
)

ENVS = {"PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
"""``tests/misbehaving_envs.py`` importable by the CLI."""


class _Listeners:
    """A silent TCP listener, one that talks first, and an HTTP server (not Dask)."""

    def __init__(self) -> None:
        self.silent = socket.create_server(("127.0.0.1", 0))
        self.talker = socket.create_server(("127.0.0.1", 0))
        self.http = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _QuietHTTP)
        self.http.daemon_threads = True
        threading.Thread(target=self._talk, daemon=True).start()
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def _talk(self) -> None:
        while True:
            try:
                conn, _ = self.talker.accept()
                conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n" * 4)
            except OSError:
                return

    def address(self, name: str) -> str:
        sock = {"silent": self.silent, "talker": self.talker}.get(name)
        port = sock.getsockname()[1] if sock else self.http.server_address[1]
        return f"tcp://127.0.0.1:{port}"

    def close(self) -> None:
        self.silent.close()
        self.talker.close()
        self.http.shutdown()


class _QuietHTTP(SimpleHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def listeners():
    got = _Listeners()
    yield got
    got.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------
# rows that fail before anything starts
# ---------------------------------------------------------------------------


@dataclass
class Row:
    id: str
    args: list[str]
    needles: list[str]
    code: int = 2
    files: dict[str, bytes] = field(default_factory=dict)  # written to tmp_path first
    max_s: float = FAST_S
    skip: str | None = None
    env: dict[str, str] = field(default_factory=dict)  # added to the CLI's environment


NAN_KEYS = [
    "learner.grad_clip",
    "dqn.lr",
    "replay.eps",
    "topology.call_timeout_s",
    "eval.interval_s",
    "learner.max_replay_ratio",
    "workers.epsilon_alpha",
]

FAST = [
    Row("unknown-preset", ["--preset", "pong"], ["unknown preset", "cartpole"]),
    *(Row(f"nan-{k}", ["--set", f"{k}=.nan"], [k, "finite"]) for k in NAN_KEYS),
    Row("inf-lr", ["--set", "dqn.lr=.inf"], ["dqn.lr", "finite"]),
    Row("stop-time-nan", ["--stop-time", "nan"], ["stop.time_s", "finite"]),
    Row("stop-reward-inf", ["--stop-reward", "inf"], ["stop.eval_return", "finite"]),
    Row("stop-train-return-inf", ["--stop-train-return", "inf"], ["stop.train_return", "finite"]),
    Row(
        "connect-timeout-nan",
        ["--scheduler", "tcp://127.0.0.1:9", "--connect-timeout", "nan"],
        ["--connect-timeout", "finite"],
    ),
    Row("jobqueue-wait-inf", ["--jobqueue-wait", "inf"], ["--jobqueue-wait"]),
    Row("adapt-without-cluster", ["--adapt", "1:4"], ["--adapt", "--cluster"]),
    Row("adapt-backwards", ["--cluster", "slurm", "--adapt", "4:1"], ["--adapt", "MIN:MAX"]),
    Row("adapt-not-a-range", ["--cluster", "pbs", "--adapt", "4"], ["--adapt", "MIN:MAX"]),
    Row("per-process-zero", ["--set", "workers.per_process=0"], ["workers.per_process", "> 0"]),
    Row("seed-type", ["--set", "seed=x"], ["seed", "integer"]),
    Row("pendulum", ["--set", "env.env_id=Pendulum-v1"], ["Pendulum-v1", "Discrete"]),
    Row(
        "continuous-mountaincar",
        ["--set", "env.env_id=MountainCarContinuous-v0"],
        ["MountainCarContinuous-v0", "Discrete"],
    ),
    Row("tuple-observations", ["--set", "env.env_id=Blackjack-v1"], ["observation space"]),
    Row(
        "cuda-without-cuda",
        ["--set", "learner.device=cuda"],
        ["learner.device", "CUDA"],
        max_s=3 * FAST_S,  # imports torch to ask
        skip="this machine has CUDA" if has_cuda() else None,
    ),
    Row("cuda-x", ["--set", "learner.device=cuda:x"], ["learner.device", "cuda:N"]),
    Row("unknown-env-kwarg", ["--set", "env.env_kwargs.foo=1"], ["env_kwargs", "foo"]),
    Row("replay-too-large", ["--set", "replay.capacity=1e12"], ["replay.capacity", "lower it"]),
    Row(  # before: started a cluster for 20,000 env workers
        "env-workers-too-large",
        ["--set", "workers.num_workers=20000", "--set", "workers.envs_per_worker=8"],
        ["env worker(s)", "needs about", "lower it, e.g. --set workers.num_workers="],
    ),
    Row(  # before: started, then the learner's process ran out of memory
        "batches-too-large",
        ["--set", "replay.num_shards=1", "--set", "replay.capacity=4000000"]
        + ["--set", "learner.batch_size=4000000"],
        ["replayed batches", "lower it, e.g. --set learner.batch_size="],
    ),
    Row(  # before: hung with no output
        "env-constructor-hangs",
        ["--set", "env.env_id=misbehaving_envs:HangOnMake-v0", "--set", "env.make_timeout_s=1"],
        ["'misbehaving_envs:HangOnMake-v0'", "env.make_timeout_s=1 s", "did not return"],
        env=ENVS,
    ),
    Row(
        "config-without-preset-is-cartpole",  # atari's learning_starts would reject capacity 1000
        ["--config", "{tmp}/run.yaml", "--set", "env.env_id=Pendulum-v1"],
        ["Discrete"],
        files={"run.yaml": b"replay:\n  capacity: 1000\n"},
    ),
    Row(
        "binary-config",
        ["--config", "{tmp}/run.yaml"],
        ["not a UTF-8"],
        files={"run.yaml": bytes(range(256)) * 4},
    ),
    Row(
        "yaml-bad-type",
        ["--config", "{tmp}/run.yaml"],
        ["dqn.lr", "fast"],
        files={"run.yaml": b"learner:\n  lr: fast\n"},
    ),
    Row(
        "used-out-then-bad-env",  # before: truncated results.jsonl, overwrote config.yaml
        ["--set", "env.env_id=Pendulum-v1", "--out", "{old}"],
        ["already holds another run's files"],
    ),
    Row("used-out", ["--out", "{old}"], ["already holds another run's files"]),
    Row("out-is-a-file", ["--out", "{old}/results.jsonl"], ["not writable"]),
    Row("scheduler-file-missing", ["--scheduler-file", "{tmp}/none.json"], ["does not exist"]),
    Row(
        "two-cluster-flags",
        ["--scheduler", "tcp://127.0.0.1:9", "--scheduler-file", "x"],
        ["exclude each other"],
    ),
    Row(
        "nothing-listens",
        ["--scheduler", "tcp://127.0.0.1:{free}", "--connect-timeout", "2"],
        ["cannot reach"],
    ),
    *(
        Row(
            f"not-a-scheduler-{kind}",
            ["--scheduler", "{" + kind + "}", "--connect-timeout", "2"],
            ["is not a Dask scheduler"],
        )
        for kind in ("silent", "talker", "http")
    ),
]


@pytest.mark.parametrize("row", FAST, ids=[r.id for r in FAST])
def test_bad_input_fails_before_anything_starts(row: Row, untouched, listeners, tmp_path):
    if row.skip:
        pytest.skip(row.skip)
    for name, data in row.files.items():
        (tmp_path / name).write_bytes(data)
    fill = {
        "tmp": str(tmp_path),
        "old": str(untouched),
        "free": str(_free_port()),
        **{k: listeners.address(k) for k in ("silent", "talker", "http")},
    }
    args = [a.format(**fill) for a in row.args]
    done = submit(*args, env=row.env, timeout=60)
    check_console(done, row.code, *row.needles)
    assert done.err_lines[-1].startswith("apex-dask-submit: error:"), done.stderr
    assert done.seconds < row.max_s, done.seconds
    assert not (tmp_path / "out").exists()


def test_help_names_the_default_preset_and_the_exit_codes():
    done = submit("--help")
    assert done.code == 0
    text = " ".join(done.stdout.split())
    assert "default: cartpole" in text
    for words in ("0 done", "2 bad input", "3 a runtime fault", "75 preempted", "130 interrupted"):
        assert words in text, words


def test_a_full_disk_before_training_is_one_line_and_leaves_no_empty_file(small_disk):
    small_disk.fill()
    out = small_disk.path / "run"
    done = submit("--out", str(out), "--stop-time", "5", timeout=60)
    check_console(done, 2, "No space left on device", "config.yaml")
    assert done.seconds < FAST_S, done.seconds
    assert not out.exists()  # the folder this run made is removed again: nothing was trained
    check_no_empty_or_temporary_files(small_disk.path)
