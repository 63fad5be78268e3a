"""apex-dask-submit --out writes TensorBoard event files, an offline W&B run and ETA lines.

One short real run on the embedded LocalCluster; the event files are read back
with TensorBoard's own ``EventAccumulator`` and compared with ``results.jsonl``.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")
from tensorboard.backend.event_processing.event_accumulator import (  # noqa: E402
    EventAccumulator,
)

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
ITERATIONS = 4
HAVE_WANDB = importlib.util.find_spec("wandb") is not None


def documented_patterns() -> list[re.Pattern[str]]:
    """The names of the docs/metrics.md tables (the shared one and the agents'),
    ``<k>``/``<i>`` as index wildcards, any other ``<name>`` as one name."""
    names = set()
    for part in DOC.read_text().split("| name | meaning | in results |")[1:]:
        table = part.split("\n\n", 1)[0].split("\n<!--", 1)[0]
        for line in table.splitlines()[2:]:
            names |= set(re.findall(r"`([^`]+)`", line.split("|")[1]))

    def pattern(name: str) -> re.Pattern[str]:
        text = re.escape(name).replace("<k>", r"\d+").replace("<i>", r"-?\d+")
        return re.compile(re.sub(r"<[a-z]+>", r"[A-Za-z0-9_.]+", text) + "$")  # <task>, <law>, <x>

    return [pattern(n) for n in names]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tracking")
    out = tmp / "run"
    env = dict(os.environ, WANDB_MODE="offline", WANDB_SILENT="true")
    for var in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        env[var] = str(tmp / var.lower())
    argv = [str(BIN / "apex-dask-submit"), "--preset", "cartpole", "--out", str(out)]
    argv += ["--set", "report.min_iter_time_s=1", "--set", "topology.local_workers=2"]
    argv += ["--set", "eval.interval_s=0", "--stop-iterations", str(ITERATIONS)]
    if HAVE_WANDB:
        argv += ["--wandb", "apex-dask-test"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]
    return out, proc, results


def test_event_files_hold_every_result_metric_at_timesteps_total(run):
    out, _, results = run
    assert len(results) == ITERATIONS
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    patterns = documented_patterns()
    assert tags, "no scalars in the event files"
    assert all(any(p.match(tag) for p in patterns) for tag in tags), tags
    expected_tags = {k for r in results for k, v in r.items() if math.isfinite(v)}
    assert tags == expected_tags
    for doc_tag in ("timesteps_total", "env/steps_per_s", "learner/loss", "eval/return_mean"):
        assert doc_tag in tags, doc_tag
    for tag in tags:
        expected = [
            (int(r["timesteps_total"]), r[tag])
            for r in results
            if math.isfinite(r.get(tag, math.nan))
        ]
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in expected], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in expected], rel=1e-6), tag
    assert "config/text_summary" in acc.Tags()["tensors"]


@pytest.mark.skipif(not HAVE_WANDB, reason="needs the wandb extra")
def test_offline_wandb_run_directory_holds_the_metrics_and_the_config(run):
    out, proc, _ = run
    runs = list((out / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, list((out / "wandb").iterdir())
    data = next(runs[0].glob("run-*.wandb")).read_bytes()
    for name in (b"timesteps_total", b"learner/loss", b"env/episode_return_mean"):
        assert name in data, name
    assert b"CartPole-v1" in data  # the config went in as the run config
    assert "tensorboard, wandb to" in proc.stdout


def test_progress_lines_are_plain_with_fraction_and_eta(run):
    _, proc, _ = run
    lines = [line for line in proc.stdout.splitlines() if line.startswith("it ")]
    assert len(lines) == ITERATIONS
    for i, line in enumerate(lines, start=1):
        assert re.search(rf"\| {100 * i // ITERATIONS}% \| eta (\d+[smh]|\?)", line), line
    assert "\r" not in proc.stdout and "\x1b" not in proc.stdout
