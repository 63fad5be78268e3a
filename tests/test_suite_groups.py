"""The README's test command keeps each xdist group on one worker.

``-n 2 --dist loadgroup`` sends the tests of one ``xdist_group`` to one worker: the
chaos matrix shares one cluster, the site groups one set of namespaces or one SLURM
site. pytest 9.2 with pytest-xdist 3.8 silently split every group (both ways of
marking); this runs a small suite with the installed versions and checks where each
test ran.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections import defaultdict

MODULE_MARKED = """
import json, os, pytest
pytestmark = pytest.mark.xdist_group("matrix")

@pytest.mark.parametrize("i", range(6))
def test_row(i, record):
    record("matrix", i)
"""

HOOK_MARKED = """
@pytest.mark.parametrize("i", range(6))
def test_site(i, record):
    record("site", i)
"""

UNGROUPED = """
import time, pytest

@pytest.mark.parametrize("i", range(12))
def test_free(i, record):
    time.sleep(0.05)
    record("free", i)
"""

CONFTEST = """
import json, os, pytest

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:  # as tests/conftest.py marks its site files
        if item.path.name == "test_site.py":
            item.add_marker(pytest.mark.xdist_group("site"))

@pytest.fixture
def record(tmp_path_factory):
    def write(group, i):
        out = os.environ["GROUPS_OUT"]
        with open(out, "a") as f:
            f.write(json.dumps([group, i, os.environ.get("PYTEST_XDIST_WORKER")]) + "\\n")
    return write
"""


def test_each_group_runs_on_one_worker_and_ungrouped_tests_spread(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    (suite / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (suite / "test_matrix.py").write_text(textwrap.dedent(MODULE_MARKED))
    (suite / "test_site.py").write_text("import pytest\n" + textwrap.dedent(HOOK_MARKED))
    (suite / "test_free.py").write_text(textwrap.dedent(UNGROUPED))
    out = tmp_path / "ran.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-q"]
        + ["-p", "no:cacheprovider", str(suite)],
        cwd=suite,
        env={**os.environ, "GROUPS_OUT": str(out)},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    workers: dict[str, set[str]] = defaultdict(set)
    ran: dict[str, int] = defaultdict(int)
    for line in out.read_text().splitlines():
        group, _, worker = json.loads(line)
        workers[group].add(worker)
        ran[group] += 1
    assert ran == {"matrix": 6, "site": 6, "free": 12}
    assert len(workers["matrix"]) == 1, f"the module-marked group ran on {workers['matrix']}"
    assert len(workers["site"]) == 1, f"the hook-marked group ran on {workers['site']}"
    assert workers["free"] <= {"gw0", "gw1"} and None not in workers["free"]
