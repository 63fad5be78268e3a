"""Both runners' result dicts carry exactly the metrics documented in ``docs/metrics.md``.

One short run of each (the in-process ``run_local`` and ``train`` on a real
2-process LocalCluster), the same config; the union of their result keys,
with shard and worker indices folded to ``<k>`` / ``<i>``, must equal the
table's names for that runner (``both`` or the runner's own).
"""

from __future__ import annotations

import os
import pathlib
import re

import pytest

from apex_dask.config import ApexConfig
from apex_dask.local import run_local
from apex_dask.runtime.orchestration.driver import train

DOC = pathlib.Path(__file__).parents[2] / "docs" / "metrics.md"
ITERATIONS = 3


def documented() -> dict[str, set[str]]:
    """``{"dask": names, "local": names}`` from the table of ``docs/metrics.md``."""
    out: dict[str, set[str]] = {"dask": set(), "local": set(), "cuda": set(), "r2d2": set()}
    in_table = False
    for line in DOC.read_text().splitlines():
        if line.startswith("| name | meaning | in results |"):
            in_table = True
            continue
        if in_table and not line.startswith("|"):
            break
        if not in_table or line.startswith("| ---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = set(re.findall(r"`([^`]+)`", cells[0]))
        where = cells[-1]
        assert where in ("both", "dask", "local", "cuda", "r2d2"), f"bad runner column: {line}"
        if where in ("cuda", "r2d2"):  # both runners, a CUDA learner / algo r2d2 only: absent
            out[where] |= names  # on this CPU and in the DQN runs below
            continue
        for runner in ("dask", "local"):
            if where in ("both", runner):
                out[runner] |= names
    return out


def folded(results: list[dict[str, float]]) -> set[str]:
    keys: set[str] = set()
    for result in results:
        for key in result:
            key = re.sub(r"^replay/\d+/", "replay/<k>/", key)
            key = re.sub(r"^env/epsilon/\d+$", "env/epsilon/<i>", key)
            key = re.sub(r"^env/\d+/", "env/<i>/", key)
            key = re.sub(r"^health/task_failures/[^/]+$", "health/task_failures/<task>", key)
            key = re.sub(
                r"^health/invariant_violations/[^/]+$", "health/invariant_violations/<law>", key
            )
            keys.add(key)
    return keys


@pytest.fixture(scope="module")
def config() -> ApexConfig:
    return ApexConfig.preset("cartpole").override(
        {
            "replay.learning_starts": 300,
            "report.min_iter_time_s": 0.2,
            "report.timesteps_per_iteration": 300,
            "eval.interval_s": 0.0,
            "eval.episodes": 1,
            "topology.call_timeout_s": 30.0,
        }
    )


def test_the_table_parses_into_names():
    docs = documented()
    assert {"timesteps_total", "learner/queue_size/q90", "replay/<k>/size"} <= docs["dask"]
    assert len(docs["local"]) > 50


def test_the_cuda_only_rows_are_the_learners_device_metrics():
    from apex_dask.algo.agents.device_batches import DEVICE_METRICS

    assert documented()["cuda"] == set(DEVICE_METRICS)


def test_the_r2d2_only_rows_are_what_the_r2d2_learner_adds():
    from gymnasium import spaces

    from apex_dask.algo.agents.r2d2.learner import R2D2Learner

    learner = R2D2Learner(spaces.Box(-1.0, 1.0, (2,)), spaces.Discrete(2))
    assert documented()["r2d2"] == set(learner.device_stats())


def test_in_process_results_have_exactly_the_documented_keys(config):
    results = list(run_local(config, stop={"iterations": ITERATIONS}))
    assert len(results) == ITERATIONS
    assert folded(results) == documented()["local"]


@pytest.mark.slow
def test_dask_results_have_exactly_the_documented_keys(config, client):
    """Shards in the other worker process (``learner_host``): their batches reach the
    learner through shared memory, and the blocks are gone once the run ends."""
    # Block names carry the writer's pid: only this cluster's workers' blocks count
    # (another test in another process may hold blocks of its own meanwhile).
    pids = set(client.run(os.getpid).values())

    def ours() -> set[pathlib.Path]:
        return {
            p
            for p in pathlib.Path("/dev/shm").glob("apex*_*_*")
            if int(p.name.split("_")[1]) in pids
        }

    assert not ours()
    cfg = config.override({"replay.placement": "learner_host"})
    results = train(cfg, client, stop={"iterations": ITERATIONS})
    assert len(results) >= ITERATIONS
    assert folded(results) == documented()["dask"]
    last = results[-1]
    assert 0 < last["learner/shared_batches"] <= last["flow/batches_received"]
    assert last["learner/local_shards"] == 0
    assert not ours()  # each shard unlinked its block
