"""A second local user cannot run code on the clusters the launchers start on this machine.

The user is made with ``useradd`` for the test and runs ``outsider.py`` (plain TCP,
a CA of its own, TLS without checking the scheduler, no certificate) with this
environment's Python (``seconduser.py``). Launchers here: the embedded cluster of
``apex-dask-submit`` (a real CLI run) and of ``apex-dask-eval`` (its cluster flags),
the quickstart notebook's cluster (its cells in a real kernel) and
``cluster/local.sh --serve``; the SLURM site's job is in ``test_slurm.py``. With TLS
turned off on purpose, the same probe gets in and runs code as the owner: it can tell.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import nbformat
import pytest
import seconduser
from proctrack import MARK, assert_nothing_left
from seconduser import assert_kept_out, second_user

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from polling import poll  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
_REASON = seconduser.unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_REASON is not None, reason=str(_REASON))]


def assert_gets_in_as_the_owner(got: dict[str, dict]) -> None:
    assert got["plain_tcp"]["outcome"] == "CONNECTED", got["plain_tcp"]
    assert got["plain_tcp"]["uid"] == [os.getuid()], got["plain_tcp"]  # ran code as the owner


def test_apex_dask_submit_embedded_cluster_keeps_a_second_user_out(tmp_path):
    marker = uuid.uuid4().hex
    out = tmp_path / "run"
    log = tmp_path / "cli.log"
    argv = [str(BIN / "apex-dask-submit"), "--preset", "cartpole", "--stop-time", "240",
            "--out", str(out), "--quiet", "--no-tensorboard",
            "--set", "topology.local_workers=2", "--set", "report.min_iter_time_s=1"]  # fmt: skip
    with log.open("w") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT,
                                env={**os.environ, MARK: marker}, start_new_session=True)  # fmt: skip
    try:
        at = poll(lambda: re.search(r"embedded LocalCluster at (\S+)", log.read_text())
                  or proc.poll(), 120)  # fmt: skip
        assert proc.poll() is None, log.read_text()
        address = at.group(1)
        assert address.startswith("tls://127.0.0.1:"), address
        poll(lambda: (out / "placement.json").exists(), 60)
        worker = json.loads((out / "placement.json").read_text())["learner"]["address"]
        assert worker.startswith("tls://127.0.0.1:"), worker
        with second_user() as other:
            assert_kept_out(other.outsider(worker))  # a worker
            got = other.outsider(address)  # the scheduler
        assert not (out / "tls").exists()  # the embedded cluster's files are not in the run
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(90) == 130, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        assert_nothing_left(marker)
    assert "TLS off" not in log.read_text()
    # the scheduler (in the CLI's process) logs each refusal to the run's log
    assert_kept_out(got, scheduler_log=(out / "apex-dask-submit.log").read_text())


def _eval_cluster(*flags: str):
    """The cluster ``apex-dask-eval`` opens for these flags, as its ``run`` opens it."""
    from apex_dask.cli.clusterflags import open_cluster
    from apex_dask.cli.evaluate import build_parser
    from apex_dask.config import ApexConfig

    args = build_parser().parse_args(["RUN", *flags])
    return open_cluster(args, ApexConfig.preset("cartpole"), prefix="apex-dask-eval:",
                        local_workers=1, local_kwargs={"dashboard_address": None})  # fmt: skip


def test_apex_dask_eval_cluster_requires_tls_and_no_tls_is_open_with_one_warning(capfd):
    from apex_dask.cli.clusterflags import close_cluster

    logged: list[str] = []  # the scheduler runs in this process: its log, here
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("distributed.comm").addHandler(handler)
    client, cluster = _eval_cluster()
    try:
        address = cluster.scheduler_address
        assert address.startswith("tls://127.0.0.1:"), address
        creds = cluster.apex_credentials
        assert creds.exist() and oct(creds.folder.stat().st_mode & 0o777) == "0o700"
        with second_user() as other:
            got = other.outsider(address, creds.folder)
        assert_kept_out(got, scheduler_log="\n".join(logged))
        assert client.run(os.getuid) == {w: os.getuid() for w in cluster.scheduler_info["workers"]}
    finally:
        close_cluster(client, cluster)
        logging.getLogger("distributed.comm").removeHandler(handler)
    del client, cluster
    poll(lambda: gc.collect() >= 0 and not creds.folder.exists(), 20)  # gone with the cluster

    capfd.readouterr()
    client, cluster = _eval_cluster("--no-tls")
    try:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        err = capfd.readouterr().err.splitlines()
        warned = [line for line in err if "WARNING" in line]
        assert warned == [
            f"apex-dask-eval: WARNING: TLS off: the Dask cluster at {cluster.scheduler_address} "
            "accepts any user of this machine, who can run any code as you (plain TCP)"
        ], err
        with second_user() as other:
            assert_gets_in_as_the_owner(other.outsider(cluster.scheduler_address))
    finally:
        close_cluster(client, cluster)


def test_the_quickstart_notebooks_cluster_keeps_a_second_user_out(tmp_path, monkeypatch):
    from nbclient import NotebookClient

    marker = uuid.uuid4().hex
    monkeypatch.setenv(MARK, marker)
    for name in ("APEX_SCHEDULER_FILE", "APEX_SCHEDULER_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    nb = nbformat.read(ROOT / "notebooks" / "quickstart.ipynb", as_version=4)
    setup = [i for i, c in enumerate(nb.cells) if "start_local_cluster(" in c.source]
    params = [i for i, c in enumerate(nb.cells) if "BUDGET_TIMESTEPS = " in c.source]
    assert len(setup) == 1 and len(params) == 1
    kernel = NotebookClient(nb, timeout=180, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}})  # fmt: skip

    def run(source: str) -> str:
        cell = nbformat.v4.new_code_cell(source)
        kernel.execute_cell(cell, 0)
        return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")

    try:
        with kernel.setup_kernel():
            for index in (params[0], setup[0]):  # the notebook's own cells, as they are
                kernel.execute_cell(nb.cells[index], index)
            shown = run("print(cluster.scheduler_address, cluster.apex_credentials.folder)")
            address, folder = shown.split()
            assert address.startswith("tls://127.0.0.1:"), shown
            with second_user() as other:
                assert_kept_out(other.outsider(address, Path(folder)))
            assert run("print(sorted(set(client.run(os.getuid).values())))").strip() == str(
                [os.getuid()]
            )  # the notebook itself is in
            run("client.close(); cluster.close()")
    finally:
        assert_nothing_left(marker)


def test_local_sh_on_loopback_keeps_a_second_user_out_and_no_tls_warns(tmp_path):
    marker = uuid.uuid4().hex
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
           "APEX_DASHBOARD": "127.0.0.1:0", MARK: marker}  # fmt: skip

    def serve(workdir: Path, *flags: str):
        log = workdir.parent / f"{workdir.name}.log"
        with log.open("w") as sink:
            proc = subprocess.Popen(
                [str(ROOT / "cluster" / "local.sh"), "--serve", "--workers", "1",
                 "--workdir", str(workdir), *flags],
                env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        poll(lambda: "Ctrl-C stops the cluster" in log.read_text() or proc.poll() is not None,
             120)  # fmt: skip
        assert proc.poll() is None, log.read_text()
        return proc, log

    try:
        proc, log = serve(tmp_path / "secure")
        sched = tmp_path / "secure" / "scheduler.json"
        address = json.loads(sched.read_text())["address"]
        assert address.startswith("tls://127.0.0.1:"), address
        from apex_dask.runtime.orchestration.cluster import connect

        owner = connect(scheduler_file=sched, timeout=20)  # finds tls/ beside the file
        try:
            workers = sorted(owner.scheduler_info(n_workers=-1)["workers"])
            assert set(owner.run(os.getuid).values()) == {os.getuid()}
        finally:
            owner.close()
        workdir = tmp_path / "secure"
        with second_user() as other:
            # the scheduler's and the workers' own words for each refusal, from their logs
            got = other.outsider(address, workdir / "tls")
            assert_kept_out(got, scheduler_log=(workdir / "scheduler.log").read_text())
            got = other.outsider(workers[0], workdir / "tls")
            logs = "".join((workdir / f).read_text() for f in ("learner.log", "cpu.log"))
            assert_kept_out(got, scheduler_log=logs)
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 130
        assert "WARNING" not in log.read_text()

        proc, log = serve(tmp_path / "open", "--no-tls")
        warned = [line for line in log.read_text().splitlines() if "WARNING" in line]
        assert warned == [
            "local.sh: WARNING: TLS off (--no-tls or APEX_TLS=off): plain TCP; the cluster is "
            "open to any user of this machine, who can run any code as you"
        ], log.read_text()
        address = json.loads((tmp_path / "open" / "scheduler.json").read_text())["address"]
        with second_user() as other:
            assert_gets_in_as_the_owner(other.outsider(address))
        os.killpg(proc.pid, signal.SIGINT)
        assert proc.wait(60) == 130
    finally:
        assert_nothing_left(marker)  # kills what is left, then fails


def test_second_user_helper_sees_this_environment_and_not_the_run_folders(tmp_path):
    """The probe's premise: the user runs this Python with apex_dask and distributed, and
    pytest's folders (where runs keep their credentials) are closed to it."""
    secret = tmp_path / "secret.txt"
    secret.write_text("x")
    code = (
        "import os, sys, apex_dask, distributed; print(os.getuid(), sys.executable); "
        f"print(os.access({str(secret)!r}, os.R_OK))"
    )
    with second_user() as other:
        done = other.run([sys.executable, "-c", code], timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        uid, exe = done.stdout.split("\n")[0].split()
        assert int(uid) == other.uid != os.getuid() and exe == sys.executable
        assert done.stdout.split("\n")[1] == "False"
