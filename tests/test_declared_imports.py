"""Every import is declared: the package's against the core list or its feature's extra,
the tests', benchmarks' and notebooks' against the extras they are run with
(rules in ``declared_imports.py``). The probes show the check catches what it should."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from declared_imports import Declared, package_problems, scope_problems

ROOT = Path(__file__).resolve().parents[1]


def deps() -> Declared:
    return Declared.from_pyproject(ROOT / "pyproject.toml")


def test_every_import_of_the_package_is_declared_core_or_in_its_features_extra():
    assert package_problems(ROOT / "apex_dask", deps()) == []


def test_credentials_and_the_cli_need_only_core_dependencies():
    core = deps().core
    # what the secure-by-default launch and the CLI's process handling import
    assert {"cryptography", "psutil", "tornado"} <= core


def test_tests_benchmarks_and_notebooks_import_only_declared_packages(tmp_path):
    d = deps()
    example = "apex-dask-linq"  # tests/ext_agent: an agent package of this repository
    assert example in (ROOT / "tests" / "ext_agent" / "pyproject.toml").read_text()
    assert scope_problems([ROOT / "tests"], d, ["test"], in_repo=[example]) == []
    assert scope_problems([ROOT / "benchmarks"], d, ["test", "bench"]) == []
    cells = tmp_path / "notebooks"
    cells.mkdir()
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        code = [
            "".join(cell["source"])
            for cell in json.loads(nb.read_text())["cells"]
            if cell["cell_type"] == "code"
        ]
        (cells / f"{nb.stem}.py").write_text("\n\n".join(code) + "\n")
    assert scope_problems([cells], d, ["notebook", "video"]) == []


def write(folder: Path, name: str, code: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(textwrap.dedent(code))


def test_probe_the_check_catches_undeclared_unmarked_misplaced_and_misnamed_imports(tmp_path):
    pkg = tmp_path / "probe_pkg"
    write(pkg, "__init__.py", "")
    write(pkg, "undeclared.py", "import yaml\n")  # installed (pyyaml), not declared
    write(pkg, "missing.py", "def f():\n    import apex_surely_not_a_module_xyz\n")
    write(pkg, "optional_at_top.py", "import imageio  # extra: video\n")
    write(pkg, "wrong_extra.py", "def f():\n    import imageio  # extra: atari\n")
    write(pkg, "core_in_extra.py", "import imageio\n")  # an extra's package, unmarked
    write(
        pkg,
        "fine.py",
        """
        from typing import TYPE_CHECKING
        import numpy
        from . import undeclared
        try:
            import imageio  # extra: video
        except ImportError:
            imageio = None
        if TYPE_CHECKING:
            import yaml
        def later():
            from importlib import import_module
            import imageio.v2  # extra: video
            return import_module("numpy")
        """,
    )
    fake = Declared("probe-pkg", core={"numpy"}, extras={"video": {"imageio"}})
    problems = package_problems(pkg, fake)
    where = sorted(p.split(": ", 1)[0] for p in problems)
    assert where == [
        "probe_pkg/core_in_extra.py:1",
        "probe_pkg/missing.py:2",
        "probe_pkg/optional_at_top.py:1",
        "probe_pkg/undeclared.py:1",
        "probe_pkg/wrong_extra.py:2",
    ], problems
    text = "\n".join(problems)
    assert "`yaml` comes from pyyaml, which is not a core dependency" in text
    assert "`apex_surely_not_a_module_xyz` is provided by no installed distribution" in text
    assert "(extra 'video') runs when the module is imported" in text
    assert "`# extra: atari` names no extra" in text


def test_probe_the_project_without_cryptography_fails_on_the_credentials_module(tmp_path):
    text = (ROOT / "pyproject.toml").read_text()
    assert '    "cryptography>=41",\n' in text
    old = tmp_path / "pyproject.toml"
    old.write_text(text.replace('    "cryptography>=41",\n', ""))
    problems = package_problems(ROOT / "apex_dask", Declared.from_pyproject(old))
    assert problems and all("runtime/credentials.py" in p for p in problems), problems
    assert all("`cryptography" in p and "not a core dependency" in p for p in problems)


def test_probe_a_test_importing_an_undeclared_package_is_caught(tmp_path):
    write(tmp_path / "tests", "test_x.py", "import yaml\nimport declared_imports_helper\n")
    fake = Declared("probe-pkg", core={"numpy"}, extras={"test": {"pytest"}})
    problems = scope_problems([tmp_path / "tests"], fake, ["test"])
    assert len(problems) == 1 and "tests/test_x.py:1: `yaml` comes from pyyaml" in problems[0]
