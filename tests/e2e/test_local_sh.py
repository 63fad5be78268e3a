"""cluster/local.sh end to end: real `dask scheduler`/`dask worker` processes, a short
CartPole run through apex-dask-submit, and nothing left running afterwards.

Every process the launcher starts inherits a unique ``APEX_E2E_MARKER``
environment value; after the launcher exits, no live process may carry it
(nanny-spawned worker processes included, whose command lines do not name the
scheduler file).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from netnsprobe import namespaces_unavailable
from proctrack import MARK, assert_nothing_left
from tlsprobe import (
    assert_only_the_run_gets_in,
    assert_private_credentials,
    http_get,
    who_gets_in,
)

ROOT = Path(__file__).resolve().parents[2]
LOCAL_SH = ROOT / "cluster" / "local.sh"
BIN = Path(sys.executable).parent


def launcher_env(marker: str) -> dict[str, str]:
    return dict(
        os.environ,
        PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}",
        APEX_DASHBOARD="127.0.0.1:0",
        **{MARK: marker},
    )


def read_results(run: Path) -> list[dict]:
    path = run / "results.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_local_sh_trains_cartpole_on_its_own_processes_and_stops_them_all(tmp_path):
    marker = uuid.uuid4().hex
    run = tmp_path / "run"
    try:
        proc = subprocess.run(
            [str(LOCAL_SH), "--workers", "2", "--workdir", str(tmp_path / "cluster"), "--"]
            + ["--preset", "cartpole", "--stop-timesteps", "3000", "--quiet"]
            + ["--set", "report.min_iter_time_s=1", "--out", str(run)],
            env=launcher_env(marker),
            capture_output=True,
            text=True,
            timeout=150,
        )
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, output
        results = read_results(run)
        assert results and results[-1]["timesteps_total"] >= 3000, output
        assert results[-1]["learner/steps_trained"] > 0
        placement = json.loads((run / "placement.json").read_text())
        # The learner went to the worker the launcher started with --resources GPU=1,
        # the env workers to the CPU workers (named cpu-0, cpu-1 by --nworkers).
        assert placement["learner"]["name"] == "learner"
        assert placement["learner"]["resources"] == {"GPU": 1.0}
        assert {w["name"] for w in placement["env_workers"]} <= {"cpu-0", "cpu-1"}
        assert placement["learner"]["address"].startswith("tls://127.0.0.1:")  # TLS on loopback
        assert "stopping 3 process(es)" in proc.stderr
    finally:
        assert_nothing_left(marker)


@pytest.mark.slow
def test_ctrl_c_during_training_stops_every_process_and_exits_130(tmp_path):
    marker = uuid.uuid4().hex
    run = tmp_path / "run"
    log = (tmp_path / "launcher.log").open("w")
    # A new session stands in for the terminal: Ctrl-C sends SIGINT to its foreground group.
    proc = subprocess.Popen(
        [str(LOCAL_SH), "--workers", "1", "--workdir", str(tmp_path / "cluster"), "--"]
        + ["--preset", "cartpole", "--stop-time", "600", "--quiet", "--out", str(run)]
        + ["--set", "report.min_iter_time_s=1"],
        env=launcher_env(marker),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not read_results(run):
            assert proc.poll() is None, (tmp_path / "launcher.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "launcher.log").read_text()
            time.sleep(0.3)
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=90)
        text = (tmp_path / "launcher.log").read_text()
        assert code == 130, text
        assert "interrupted" in text
        assert "stopping 3 process(es)" in text
        assert (run / "weights.npz").stat().st_size > 0  # saved before the cluster went down
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        assert_nothing_left(marker)


@pytest.mark.slow
def test_sigterm_to_the_script_reaches_the_driver_which_checkpoints_and_exits_75(tmp_path):
    """SIGTERM to local.sh alone (``kill PID``, a container or service manager): it goes
    on to apex-dask-submit, which writes a checkpoint before the cluster is stopped."""
    marker = uuid.uuid4().hex
    run = tmp_path / "run"
    log = (tmp_path / "launcher.log").open("w")
    proc = subprocess.Popen(
        [str(LOCAL_SH), "--workers", "1", "--workdir", str(tmp_path / "cluster"), "--"]
        + ["--preset", "cartpole", "--stop-time", "600", "--quiet", "--out", str(run)]
        + ["--set", "report.min_iter_time_s=1", "--set", "checkpoint.grace_s=20"],
        env=launcher_env(marker),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not read_results(run):
            assert proc.poll() is None, (tmp_path / "launcher.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "launcher.log").read_text()
            time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)  # the script only, not its process group
        code = proc.wait(timeout=60)
        text = (tmp_path / "launcher.log").read_text()
        assert code == 75, text
        checkpoints = sorted((run / "checkpoints").glob("ckpt-*/manifest.json"))
        assert checkpoints and f"preempted (SIGTERM); checkpoint {checkpoints[-1].parent}" in text
        assert "stopping 3 process(es)" in text
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        assert_nothing_left(marker)


def test_bad_worker_count_is_a_one_line_error_and_starts_nothing(tmp_path):
    marker = uuid.uuid4().hex
    proc = subprocess.run(
        [str(LOCAL_SH), "--workers", "0", "--workdir", str(tmp_path)],
        env=launcher_env(marker),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "local.sh: --workers must be a positive integer, got '0'"
    ]
    assert not (tmp_path / "scheduler.json").exists()
    assert_nothing_left(marker, grace_s=0)


_NS_REASON = namespaces_unavailable()
DASHBOARD_HOSTS = ("127.0.0.1", "198.18.2.1")


@pytest.fixture
def machine_with_a_network():
    """A network namespace with loopback and an interface d0 at 198.18.2.1 (its veth peer
    is in the same namespace: nothing else is connected), so local.sh listening on d0
    listens beyond loopback."""
    ns = "apexls" + uuid.uuid4().hex[:6]
    subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
    try:
        for cmd in (["link", "set", "lo", "up"],
                    ["link", "add", "d0", "type", "veth", "peer", "name", "d1"],
                    ["addr", "add", "198.18.2.1/24", "dev", "d0"],
                    ["link", "set", "d1", "up"], ["link", "set", "d0", "up"]):  # fmt: skip
            subprocess.run(["ip", "-n", ns, *cmd], check=True, capture_output=True)
        yield ["ip", "netns", "exec", ns]
    finally:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def serve(where: list[str], workdir: Path, marker: str, **env: str) -> tuple[str, dict]:
    """local.sh --serve on d0 until it is ready; probe it and its dashboard (on loopback
    only, unless APEX_DASHBOARD asks for d0); Ctrl-C it. Its output + probes."""
    log = workdir.parent / f"{workdir.name}.log"
    environ = {**launcher_env(marker), **env}
    if "APEX_DASHBOARD" not in env:
        del environ["APEX_DASHBOARD"]  # the default (this namespace's port 8787 is free)
    with log.open("w") as out:
        proc = subprocess.Popen(
            [*where, str(LOCAL_SH), "--serve", "--workers", "1", "--interface", "d0",
             "--workdir", str(workdir)],
            env=environ, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while "Ctrl-C stops the cluster" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.3)
        got = who_gets_in(workdir / "scheduler.json", where)
        port = json.loads((workdir / "scheduler.json").read_text())["services"]["dashboard"]
        route = f":{port}/apex/metrics.json"
        got["dashboard"] = {a: http_get(where, f"http://{a}{route}") for a in DASHBOARD_HOSTS}
        if env.get("APEX_TLS") != "off":
            assert_only_the_run_gets_in(workdir / "scheduler.json", where)
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        assert_nothing_left(marker)
    return log.read_text(), got


@pytest.mark.slow
@pytest.mark.skipif(_NS_REASON is not None, reason=str(_NS_REASON))
def test_serve_beyond_loopback_requires_tls_and_keeps_the_dashboard_on_loopback_by_default(
    tmp_path, machine_with_a_network
):
    where = machine_with_a_network
    output, got = serve(where, tmp_path / "secure", uuid.uuid4().hex)
    assert "TLS required; this run's credentials are in" in output
    assert_private_credentials(tmp_path / "secure" / "tls")
    # the dashboard listens on loopback, not on d0, though the cluster does
    assert got["dashboard"]["127.0.0.1"] == "200", got["dashboard"]
    assert "Connection refused" in got["dashboard"]["198.18.2.1"], got["dashboard"]
    assert "ssh -N -L 8787:127.0.0.1:8787" in output  # how to reach it from elsewhere
    output, got = serve(
        where, tmp_path / "open", uuid.uuid4().hex, APEX_TLS="off", APEX_DASHBOARD="198.18.2.1:0"
    )
    warnings = [line for line in output.splitlines() if "APEX_TLS=off" in line]
    assert len(warnings) == 1 and "open to anyone" in warnings[0], output
    assert got["address"].startswith("tcp://198.18.2.1:"), got
    assert got["no_credentials"].startswith("CONNECTED"), got  # open, as it warned
    assert got["dashboard"]["198.18.2.1"] == "200", got["dashboard"]  # on d0: it was asked
    assert not (tmp_path / "open" / "tls").exists()
