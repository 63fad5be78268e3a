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
import subprocess
import sys

import pytest

from apex_dask.algo.agents.registry import AGENTS
from apex_dask.config import ApexConfig
from apex_dask.local import run_local
from apex_dask.runtime.orchestration.driver import train

DOC = pathlib.Path(__file__).parents[2] / "docs" / "metrics.md"
ITERATIONS = 3


def documented() -> dict[str, set[str]]:
    """``{"dask": names, "local": names, "cuda": names, <agent>: names, ...}`` from the
    tables of ``docs/metrics.md`` (the shared table and the agents' generated one)."""
    agents = set(AGENTS)
    out: dict[str, set[str]] = {k: set() for k in ("dask", "local", "cuda", *agents)}
    in_table = False
    for line in DOC.read_text().splitlines():
        if line.startswith("| name | meaning | in results |"):
            in_table = True
            continue
        if in_table and not line.startswith("|"):
            in_table = False
        if not in_table or line.startswith("| ---"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        names = set(re.findall(r"`([^`]+)`", cells[0]))
        where = cells[-1]
        if where == "cuda":  # both runners, a CUDA learner only: absent on this CPU
            out[where] |= names
            continue
        if where not in ("both", "dask", "local"):  # both runners, those agents only
            listed = {a.strip() for a in where.split(",")}
            assert listed <= agents, f"bad runner column: {line}"
            for a in listed:
                out[a] |= names
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
            key = re.sub(r"^env/([a-z_]+)/\d+$", r"env/\1/<i>", key)
            key = re.sub(r"^env/\d+/", "env/<i>/", key)
            key = re.sub(r"^env/workers/[a-z_]+/", "env/workers/<x>/", key)
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
            "report.per_worker_keys": True,  # every documented key, the per-worker ones too
        }
    )


def test_the_table_parses_into_names():
    docs = documented()
    assert {"timesteps_total", "learner/queue_size/q90", "replay/<k>/size"} <= docs["dask"]
    assert len(docs["local"]) > 50


def test_the_cuda_only_rows_are_the_learners_device_metrics():
    from apex_dask.algo.agents.device_batches import DEVICE_METRICS

    assert documented()["cuda"] == set(DEVICE_METRICS)


@pytest.mark.parametrize("algo", sorted(AGENTS))
def test_each_agents_rows_are_what_its_builder_declares(algo):
    declared = {m.name for m in AGENTS[algo].declared_metrics()}
    assert documented()[algo] == declared


def test_the_r2d2_learner_reports_what_its_builder_declares():
    from gymnasium import spaces

    from apex_dask.algo.agents.r2d2.learner import R2D2Learner

    learner = R2D2Learner(spaces.Box(-1.0, 1.0, (2,)), spaces.Discrete(2))
    declared = {m.name for m in AGENTS["r2d2"].metrics}
    assert set(learner.agent_stats()) == declared == {"learner/state_staleness"}


def test_the_agent_table_is_generated_from_the_declarations():
    done = subprocess.run(
        [sys.executable, str(DOC.parents[1] / "scripts" / "metrics_doc.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_in_process_results_have_exactly_the_documented_keys(config):
    results = list(run_local(config, stop={"iterations": ITERATIONS}))
    assert len(results) == ITERATIONS
    assert folded(results) == documented()["local"] | documented()["dqn"]


def test_rows_hold_summaries_not_per_worker_keys_by_default(config):
    """A row's size does not grow with the env workers: their keys are summarised."""
    sizes = {}
    for n in (2, 6):
        cfg = config.override({"report.per_worker_keys": False, "workers.num_workers": n})
        last = list(run_local(cfg, stop={"iterations": 1}))[-1]
        assert not [k for k in last if re.match(r"^env/(\d+/|[a-z_]+/\d+$)", k)]
        sizes[n] = len(last)
        ladder = sorted(last_eps := [cfg_eps for cfg_eps in exploration(cfg)])
        assert last["env/workers/epsilon/min"] == pytest.approx(ladder[0])
        assert last["env/workers/epsilon/max"] == pytest.approx(ladder[-1])
        low = ladder[: -(-n // 3)]
        assert last["env/workers/epsilon/low_third_mean"] == pytest.approx(sum(low) / len(low))
        assert last["env/workers/rollouts_sent/max"] >= last["env/workers/rollouts_sent/min"]
        assert len(last_eps) == n
    assert sizes[2] == sizes[6]


def exploration(cfg):
    from apex_dask.experiment.builder import exploration_ladder

    return [float(e) for e in exploration_ladder(cfg)]


@pytest.mark.parametrize("preset", ["pendulum", "cartpole_pomdp"])
def test_the_other_agents_in_process_results_have_exactly_their_documented_keys(preset):
    cfg = ApexConfig.preset(preset).override(
        {
            "replay.learning_starts": 64,
            "report.min_iter_time_s": 0.2,
            "report.timesteps_per_iteration": 200,
            "eval.interval_s": 0.0,
            "eval.episodes": 1,
            "report.per_worker_keys": True,
        }
    )
    results = list(run_local(cfg, stop={"iterations": 2}))
    assert folded(results) == documented()["local"] | documented()[cfg.algo]


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
    assert folded(results) == documented()["dask"] | documented()["dqn"]
    last = results[-1]
    assert 0 < last["learner/shared_batches"] <= last["flow/batches_received"]
    assert last["learner/local_shards"] == 0
    assert not ours()  # each shard unlinked its block
