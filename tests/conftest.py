"""Suite-wide hooks, and the fixtures of the bad-input tests.

The README's test command runs the suite on two pytest-xdist workers
(``-n 2 --dist loadgroup``): most slow tests wait on clusters starting and
stopping, so two at a time finish sooner on two cores. Tests that build a
site (network namespaces, the private SLURM site) are put in xdist groups
(:data:`SITE_GROUPS`): the tests of one group run one after the other on one
worker. The two groups use subnets of their own (``netns``: 198.18.0-2.0/24;
``slurm``: 198.19.N.0/24) and run beside each other, each sent out first (they
are the longest); without xdist the markers do nothing.

``untouched`` is an earlier run's folder that must be byte-identical after the
test; ``small_disk`` is a 2 MiB tmpfs (skipped where it cannot be mounted).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from bad_input import SmallDisk, snapshot

SITE_GROUPS = {
    "test_multihost.py": "netns",  # cluster/netns.sh hosts on 198.18.0.0/24 and 198.18.1.0/24
    "test_local_sh.py": "netns",  # a namespace at 198.18.2.1
    "test_slurm.py": "slurm",  # the private SLURM site, 198.19.N.0/24
    "test_jobqueue.py": "slurm",  # sbatch on PATH or not, PBS shims
}
"""Test files that build network namespaces or a SLURM site, and the xdist group of each."""

FIXTURE_GROUPS = (
    "test_checkpoints.py",  # a CartPole run trained to 450 (about 50 s)
    "test_submit_tracking.py",  # an apex-dask-submit run (about 30 s)
    "test_driver.py",  # trained CartPole and Pendulum drivers
    "test_dashboard_run.py",  # a run behind the dashboard
    "test_bad_input_runs.py",  # a running cluster
    "test_r2d2_run.py",  # an r2d2 run of the cartpole_pomdp preset (about 40 s)
    "test_docs_site.py",  # the documentation site, built once (about 30 s)
    "test_export_formats.py",  # every agent and head exported, each runtime run (about 45 s)
)
"""Test files whose module-scoped fixture trains or starts a cluster: each file's tests run
on one worker, so the fixture runs once instead of once per worker."""


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the groups
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        group = SITE_GROUPS.get(item.path.name)
        if group is None and item.path.name in FIXTURE_GROUPS:
            group = f"fixture-{item.path.stem}"
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput"):  # an xdist worker: the long site groups go out first
        items.sort(key=lambda item: item.path.name not in SITE_GROUPS)


_UNGROUPED: str | None = None
"""Why the grouped tests cannot run on this xdist worker (None: they can)."""


def pytest_collection_finish(session) -> None:
    """On an xdist worker under ``--dist loadgroup``: were the groups applied?

    pytest-xdist marks a grouped test by a suffix on its node id; pytest 9.2 ignores
    that suffix (xdist 3.8 writes an attribute 9.2 no longer reads), so every group is
    silently split over the workers: two chaos clusters and two site builds at once.
    Then each grouped test errors with that line (an error raised here would only crash
    the worker, without the line).
    """
    global _UNGROUPED
    config = session.config
    if not (hasattr(config, "workerinput") and config.getvalue("loadgroup")):
        return
    lost = [
        item.nodeid
        for item in session.items
        if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid
    ]
    if lost:
        import xdist

        _UNGROUPED = (
            f"pytest-xdist {xdist.__version__} under pytest {pytest.__version__} did not "
            f"group {len(lost)} tests marked xdist_group; install the versions "
            "pyproject.toml pins with: bash scripts/setup.sh test"
        )


def pytest_runtest_setup(item) -> None:
    if _UNGROUPED is not None and item.get_closest_marker("xdist_group") is not None:
        pytest.fail(_UNGROUPED, pytrace=False)


@pytest.fixture(scope="module")
def old_run(tmp_path_factory) -> Path:
    """An earlier run's folder: results, config, weights, final dict."""
    run = tmp_path_factory.mktemp("runs") / "ok"
    run.mkdir()
    (run / "config.yaml").write_text("env:\n  env_id: CartPole-v1\n")
    lines = [json.dumps({"iteration": i, "timesteps_total": 1000 * i}) for i in (1, 2, 3)]
    (run / "results.jsonl").write_text("\n".join(lines) + "\n")
    (run / "final.json").write_text(json.dumps({"iteration": 3}))
    np.savez(run / "weights.npz", __version__=np.asarray(7), w=np.ones(4, np.float32))
    return run


@pytest.fixture
def untouched(old_run):
    before = snapshot(old_run)
    yield old_run
    assert snapshot(old_run) == before, "an earlier run's folder changed"


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    cmd = ["mount", "-t", "tmpfs", "-o", "size=2M", "tmpfs", str(mount)]
    try:
        subprocess.run(cmd, check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        pytest.skip(f"cannot mount a tmpfs here (needs root or CAP_SYS_ADMIN): {exc}")
    try:
        yield SmallDisk(mount)
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True, timeout=30)
