"""apex_dask.algo is the algorithm only: it must never import dask or distributed."""

import ast
import pathlib
import subprocess
import sys

import apex_dask.algo

ALGO_DIR = pathlib.Path(apex_dask.algo.__file__).parent
FORBIDDEN = ("dask", "distributed")


def _algo_modules():
    return sorted(
        "apex_dask.algo." + ".".join(p.relative_to(ALGO_DIR).with_suffix("").parts)
        for p in ALGO_DIR.rglob("*.py")
        if p.stem != "__init__"
    )


def _imported_names(tree):
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def test_no_algo_source_file_imports_dask():
    offenders = []
    for path in sorted(ALGO_DIR.rglob("*.py")):
        for name in _imported_names(ast.parse(path.read_text(), str(path))):
            if name.split(".")[0] in FORBIDDEN:
                offenders.append(f"{path.name}: import {name}")
    assert not offenders, offenders


def test_importing_every_algo_module_loads_no_dask():
    modules = _algo_modules()
    assert "apex_dask.algo.agents.dqn.learner" in modules  # the glob found the package
    code = (
        "import importlib, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "", f"algo modules pulled in: {out.stdout.strip()}"
