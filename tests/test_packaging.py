"""The package metadata, environment.yml and the README agree."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]

# conda-forge names that differ from PyPI names.
CONDA_TO_PYPI = {"pytorch": "torch", "pyyaml": "pyyaml"}


def _name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req.strip(), maxsplit=1)[0].lower().replace("_", "-")


def _spec(req: str) -> str:
    return re.sub(r"^[A-Za-z0-9_.\-]+(\[[^\]]*\])?", "", req.strip()).replace(" ", "")


def pyproject_runtime() -> dict[str, str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    deps = {}
    for req in data["project"]["dependencies"]:
        name = _name(req)
        deps[name] = _spec(req)
        if req.startswith("dask[distributed]"):
            deps["distributed"] = _spec(req)
    return deps


def environment_runtime() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    deps = {}
    for item in env["dependencies"]:
        if not isinstance(item, str):
            continue
        name = _name(item)
        if name in ("python", "pip"):
            continue
        deps[CONDA_TO_PYPI.get(name, name)] = _spec(item)
    return deps


def test_environment_yml_lists_the_same_runtime_deps_as_pyproject():
    assert environment_runtime() == pyproject_runtime()


def test_environment_yml_uses_conda_forge_only():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert env["channels"] == ["conda-forge"]


def test_python_floor_matches():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert data["project"]["requires-python"] == ">=3.10"
    assert "python>=3.10" in env["dependencies"]


def test_readme_first_screen_has_exactly_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    first_screen = "\n".join(readme.splitlines()[:40])
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", first_screen, flags=re.S)
    assert len(blocks) == 2, blocks
    test_cmd = blocks[1].strip()
    ci = (ROOT / ".ci" / "run").read_text()
    assert test_cmd in ci


def test_console_script_is_declared():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert data["project"]["scripts"]["apex-dask-submit"] == "apex_dask.cli:main"
    assert data["project"]["scripts"]["apex-dask-eval"] == "apex_dask.cli.evaluate:main"
    assert data["project"]["scripts"]["apex-dask-sweep"] == "apex_dask.cli.sweep:main"


def test_extras_exist():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = data["project"]["optional-dependencies"]
    for name in ("test", "bench", "video"):
        assert extras[name], name
    assert any(x.startswith("imageio-ffmpeg") for x in extras["video"])
    assert "video" in next(x for x in extras["test"] if x.startswith("apex_dask["))
    assert {_name(x) for x in extras["sweep"]} == {"optuna", "matplotlib"}
    assert "sweep" in next(x for x in extras["test"] if x.startswith("apex_dask["))
    # apex-dask-eval --export FILE.onnx / --policy FILE.onnx; the suite runs ONNX files
    assert {_name(x) for x in extras["export"]} == {"onnx", "onnxscript", "onnxruntime"}
    assert "export" in next(x for x in extras["test"] if x.startswith("apex_dask["))


def test_public_api_is_importable_and_import_stays_light():
    import subprocess
    import sys

    code = (
        "import sys, apex_dask\n"
        "assert 'distributed' not in sys.modules and 'torch' not in sys.modules\n"
        "from apex_dask import ApexConfig, ApexDriver, train, run_local\n"
        "assert callable(train) and callable(run_local) and ApexDriver.__name__ == 'ApexDriver'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
