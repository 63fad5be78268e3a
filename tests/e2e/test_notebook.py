"""The notebooks, executed top to bottom in a real kernel with nbclient.

``quickstart.ipynb`` starts its own LocalCluster and trains with a small
budget (``APEX_NOTEBOOK_BUDGET``); ``connect_existing.ipynb`` connects to a
cluster that ``cluster/local.sh --serve`` started, which Ctrl-C then stops.
Any cell error fails the test; afterwards no process started for the test may
still run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import nbformat
import pytest
from proctrack import MARK, assert_nothing_left

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
BIN = Path(sys.executable).parent


def execute(name: str, workdir: Path) -> nbformat.NotebookNode:
    """Run every cell in a fresh python3 kernel (raises CellExecutionError on any error)."""
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(workdir)}}
    )
    client.execute()
    return nb


def stream_text(nb: nbformat.NotebookNode) -> str:
    return "".join(
        out.get("text", "")
        for cell in nb.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
        if out.output_type == "stream"
    )


@pytest.mark.parametrize("name", ["quickstart.ipynb", "connect_existing.ipynb"])
def test_committed_notebook_is_valid_and_has_its_outputs_cleared(name):
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    nbformat.validate(nb)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, cell.source[:60]


@pytest.mark.slow
def test_quickstart_trains_saves_reloads_and_evaluates_with_a_small_budget(tmp_path, monkeypatch):
    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARK, marker)  # the kernel and its LocalCluster inherit it
    monkeypatch.setenv("APEX_NOTEBOOK_BUDGET", "1500")
    monkeypatch.setenv("APEX_NOTEBOOK_OUT", str(tmp_path))
    monkeypatch.delenv("APEX_SCHEDULER_ADDRESS", raising=False)
    monkeypatch.delenv("APEX_SCHEDULER_FILE", raising=False)
    try:
        nb = execute("quickstart.ipynb", tmp_path)
        text = stream_text(nb)
        assert "learner and replay shards on:" in text
        # The live cell redraws after every result (clear_output), so only the last
        # iteration's line stays, followed by the summary: check what they promise.
        lines = re.findall(r"iteration (\d+): ([\d,]+) env steps", text)
        assert lines, text
        done = re.search(r"done: (\d+) iterations, ([\d,]+) env steps \(budget 1,500\)", text)
        assert done, text
        iterations, steps = int(done.group(1)), int(done.group(2).replace(",", ""))
        assert (int(lines[-1][0]), int(lines[-1][1].replace(",", ""))) == (iterations, steps)
        assert iterations >= 1 and steps >= 1500
        grown = re.search(r"Dask workers: (\d+), env workers now: (\d+)", text)
        cores = os.cpu_count() or 1  # the notebook's LocalCluster: one worker per core
        assert grown and int(grown.group(1)) == cores + 1, text  # it followed scale(n + 1)
        assert int(grown.group(2)) == min(4, 2 * cores)
        assert "saved and reloaded weights version" in text
        assert "greedy return over 10 episodes:" in text
        mimes = {
            key
            for cell in nb.cells
            for out in cell.get("outputs", [])
            for key in out.get("data", {})
        }
        assert "application/vnd.bokehjs_exec.v0+json" in mimes  # the live plot rendered
        assert (tmp_path / "apex_cartpole_weights.npz").stat().st_size > 0
        recorded = re.search(r"recorded a greedy episode: return \d+, (\d+) steps", text)
        assert recorded, text  # the test extra includes the video extra
        videos = [
            out["data"]["text/html"]
            for cell in nb.cells
            for out in cell.get("outputs", [])
            if "<video" in out.get("data", {}).get("text/html", "")
        ]
        assert len(videos) == 1 and "data:video/mp4;base64," in videos[0]
        import imageio.v2 as imageio

        reader = imageio.get_reader(tmp_path / "apex_cartpole_episode.mp4")
        assert sum(1 for _ in reader) == int(recorded.group(1)) + 1
    finally:
        assert_nothing_left(marker)


@pytest.mark.slow
def test_connect_existing_trains_on_local_sh_serve_which_ctrl_c_then_stops(tmp_path, monkeypatch):
    marker = uuid.uuid4().hex
    env = dict(
        os.environ,
        PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}",
        APEX_DASHBOARD="127.0.0.1:0",
        **{MARK: marker},
    )
    log = (tmp_path / "serve.log").open("w")
    server = subprocess.Popen(
        [str(ROOT / "cluster" / "local.sh"), "--serve", "--workers", "1"]
        + ["--workdir", str(tmp_path / "cluster")],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 90
        while "local.sh: ready" not in (tmp_path / "serve.log").read_text():
            assert server.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.2)
        monkeypatch.setenv("APEX_SCHEDULER_FILE", str(tmp_path / "cluster" / "scheduler.json"))
        monkeypatch.setenv("APEX_NOTEBOOK_BUDGET", "1500")
        monkeypatch.delenv("APEX_SCHEDULER_ADDRESS", raising=False)
        nb = execute("connect_existing.ipynb", tmp_path)
        text = stream_text(nb)
        assert "learner on learner" in text  # the worker local.sh started with GPU=1
        assert "resources={'GPU': 1.0}" in text
        assert "transitions trained" in text
        assert server.poll() is None  # the notebook left the cluster running
        os.killpg(server.pid, signal.SIGINT)
        assert server.wait(timeout=60) == 130
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
        assert_nothing_left(marker)


@pytest.mark.slow
def test_connect_existing_without_a_cluster_fails_fast_with_one_line(tmp_path, monkeypatch):
    from nbclient.exceptions import CellExecutionError

    missing = tmp_path / "no-scheduler.json"
    monkeypatch.setenv("APEX_SCHEDULER_FILE", str(missing))
    monkeypatch.delenv("APEX_SCHEDULER_ADDRESS", raising=False)
    t0 = time.monotonic()
    with pytest.raises(CellExecutionError) as info:
        execute("connect_existing.ipynb", tmp_path)
    took = time.monotonic() - t0
    message = re.sub(r"\x1b\[[0-9;]*m", "", str(info.value))  # the kernel's colours
    assert "SystemExit: connect_existing: scheduler file" in message
    assert str(missing) in message and "does not exist" in message
    assert took < 60, took  # kernel start-up included; the cell itself gives up at once


@pytest.mark.slow
def test_connect_existing_with_a_dead_scheduler_address_gives_up_within_its_timeout(
    tmp_path, monkeypatch
):
    import socket

    from nbclient.exceptions import CellExecutionError

    with socket.socket() as s:  # a free port: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("APEX_SCHEDULER_ADDRESS", f"tcp://127.0.0.1:{port}")
    t0 = time.monotonic()
    with pytest.raises(CellExecutionError) as info:
        execute("connect_existing.ipynb", tmp_path)
    took = time.monotonic() - t0
    message = re.sub(r"\x1b\[[0-9;]*m", "", str(info.value))
    assert (
        f"SystemExit: connect_existing: cannot reach the Dask scheduler at tcp://127.0.0.1:{port}"
        in message
    )
    assert took < 75, took
