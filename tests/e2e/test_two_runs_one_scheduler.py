"""Two apex-dask-submit runs at once on one scheduler: both kept, both served over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=20) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def submit(address: str, out: Path) -> subprocess.Popen:
    args = [
        str(BIN / "apex-dask-submit"),
        "--scheduler",
        address,
        "--preset",
        "cartpole",
        "--stop-timesteps",
        "3000",
        "--out",
        str(out),
        "--quiet",
        "--set",
        "report.min_iter_time_s=1",
    ]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_runs_at_once_each_keep_their_series(tmp_path):
    from distributed import Client, LocalCluster
    from prometheus_client.parser import text_string_to_metric_families

    from apex_dask.runtime.observability.preload import PRELOAD

    with (
        LocalCluster(
            n_workers=3,
            threads_per_worker=1,
            dashboard_address=":0",
            scheduler_kwargs={"preload": [PRELOAD]},
        ) as cluster,
        Client(cluster) as client,
    ):
        base = f"http://127.0.0.1:{client.scheduler_info()['services']['dashboard']}/"
        outs = [tmp_path / "first", tmp_path / "second"]
        procs = [submit(cluster.scheduler_address, out) for out in outs]
        logs = [p.communicate(timeout=300)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], logs

        status, body = get(base + "apex/metrics.json?series=0")
        assert status == 200
        runs = {r["out"]: r for r in json.loads(body)["runs"]}
        assert set(runs) == {str(out.resolve()) for out in outs}, runs
        assert all(r["done"] for r in runs.values())
        for out in outs:
            run = runs[str(out.resolve())]["run"]
            status, body = get(base + f"apex/metrics.json?run={run}&names=timesteps_total")
            doc = json.loads(body)
            assert status == 200 and doc["run"] == run
            points = doc["series"]["timesteps_total"]
            assert points and points[-1][1] >= 3000  # to its end
            lines = (out / "results.jsonl").read_text().splitlines()
            own = {json.loads(line)["timesteps_total"] for line in lines}
            assert {v for _, v in points} <= own, (points, own)  # this run's results only
        status, body = get(base + "apex/metrics.json?run=no-such-run")
        assert status == 404 and "no-such-run" in body

        _, text = get(base + "metrics")
        labelled = {
            s.labels["run"]
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name == "apex_env_steps_sampled"
        }
        assert labelled == {r["run"] for r in runs.values()}
        assert get(base + "apex")[0] == 200
