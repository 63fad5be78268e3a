"""An agent from outside apex_dask: the example package ``tests/ext_agent`` (``algo: linq``,
installed by ``bash scripts/setup.sh test``) registers its builder through the
``apex_dask.agents`` entry point group, with no change to ``apex_dask/``. It passes the
contract suite (``test_contract.py`` runs over every registered agent) and trains
through ``apex-dask-submit``; an entry point that is not an agent is refused in one line
when a run names it, and the other agents still run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import apex_dask
from apex_dask.algo.agents.registry import ENTRY_POINTS, agents

HERE = Path(__file__).resolve()
PACKAGE = HERE.parents[2] / "ext_agent"
SUBMIT = Path(sys.executable).parent / "apex-dask-submit"
NOT_INSTALLED = "tests/ext_agent is not installed: run bash scripts/setup.sh test"


def test_the_example_agent_comes_from_its_own_packages_entry_point():
    every = agents()
    assert "linq" in every, NOT_INSTALLED
    source = Path(sys.modules[type(every["linq"]).__module__].__file__).resolve()
    assert PACKAGE in source.parents  # its code is the example package's, not apex_dask's
    assert 'linq = "apex_linq.builder:BUILDER"' in (PACKAGE / "pyproject.toml").read_text()
    package = Path(apex_dask.__file__).parent
    named = [p for p in package.rglob("*.py") if "linq" in p.read_text()]
    assert named == []  # apex_dask names no agent of another package


def test_the_contract_suite_covers_it():
    from test_contract import AGENTS

    assert "linq" in AGENTS, NOT_INSTALLED


def _python(code: str, extra_path: Path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": f"{extra_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )


@pytest.mark.parametrize(
    ("target", "needle"),
    [("no_such_module:BUILDER", "ModuleNotFoundError"), ("json:dumps", "not an AgentBuilder")],
)
def test_an_entry_point_that_is_not_an_agent_is_one_line_when_named(tmp_path, target, needle):
    """A distribution on the path (its ``.dist-info`` with an ``entry_points.txt``) whose
    entry point fails: naming it is one ConfigError line; the built-in agents still run."""
    info = tmp_path / "broken_agent-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-agent\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINTS}]\nbroken = {target}\n")
    code = (
        "import warnings; warnings.simplefilter('ignore')\n"
        "from apex_dask.config import ApexConfig, ConfigError\n"
        "assert ApexConfig.preset('cartpole').override({'dqn.lr': 1e-3}).algo == 'dqn'\n"
        "try:\n    ApexConfig().override({'algo': 'broken'})\n"
        "except ConfigError as exc:\n    print(exc)\n"
    )
    done = _python(code, tmp_path)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert "\n" not in line and "'broken'" in line and needle in line and ENTRY_POINTS in line


@pytest.mark.slow
def test_the_example_agent_trains_through_apex_dask_submit(tmp_path):
    assert "linq" in agents(), NOT_INSTALLED
    out = tmp_path / "run"
    done = subprocess.run(
        [str(SUBMIT), "--preset", "cartpole", "--set", "algo=linq", "--set", "linq.lr=0.01",
         "--stop-iterations", "3", "--out", str(out), "--quiet"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    last = rows[-1]
    assert len(rows) == 3 and last["learner/updates"] > 0
    assert last["learner/weight_norm"] > 0  # the metric the agent's builder declares
    assert last["env/workers/epsilon/max"] > last["env/workers/epsilon/min"]  # summarised
    assert "linq:" in (out / "config.yaml").read_text()
    # the run folder plays with its own agent too
    evaluate = Path(sys.executable).parent / "apex-dask-eval"
    played = subprocess.run(
        [str(evaluate), str(out), "--episodes", "2"], capture_output=True, text=True, timeout=120
    )
    assert played.returncode == 0, played.stderr[-2000:]


def test_its_declared_metric_has_a_line_on_the_apex_page_and_a_row_in_the_json():
    from apex_dask.runtime.observability.dashboard import ApexDashboard
    from apex_dask.runtime.observability.metrics_store import MetricsStore

    assert "linq" in agents(), NOT_INSTALLED
    store = MetricsStore()
    page = ApexDashboard(store)
    assert page.agent in page.figures and "learner/weight_norm" in page.agent.sources
    msg = {"run": "r", "source": "learner", "metrics": {"learner/weight_norm": 2.5}}
    assert store.ingest(msg, now=1.0)
    page.update()
    assert page.agent.sources["learner/weight_norm"].data["value"] == [2.5]
    assert store.to_json()["agent_metrics"]["learner/weight_norm"]["agents"] == ["linq"]
