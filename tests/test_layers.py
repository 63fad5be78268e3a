"""The package's layers, checked statically: who may import whom, and no import cycle.

Layers (``docs/architecture.md``)::

    algo          numpy / torch / gymnasium only; inside it, folders by role (below)
    config        itself, the agent registry (the names ``algo`` takes, each agent's
                  own config section and checks), the shared sections the algorithm
                  reads (``algo/agents/config.py``, ``algo/rollout/spec.py``)
    experiment    algo, config                  (shared by both runners)
    local         algo, config, experiment      (the in-process runner)
    runtime       algo, config, experiment      (the Dask runtime; never local)
      observability   nothing else of runtime
      actors          observability, errors
      orchestration   actors, observability, errors, credentials
    cli           config, experiment, runtime   (never local)

Inside ``algo/`` each folder imports only the folders below it, and no agent's
folder imports another agent's (what two agents share lives in ``agents/``
beside them)::

    play          episodes, video, export          -> agents, rollout, replay, envs
    agents        shared learner pieces, registry   -> rollout, replay, envs
      dqn/, dpg/  one folder per agent              -> agents (shared), rollout, replay, envs
    rollout       the acting loop, n-step, exploration -> replay, envs
    replay        the shard and its parts
    envs          factories, guards, vector envs

Every ``import`` counts, in functions too, and so do those under ``if TYPE_CHECKING:``:
they never run, but a name the types need is a dependency all the same, and a
module whose types need the module that imports it is one module split in two.

Beyond the layers, rules about cohesion (what belongs together stays together):
only ``runtime`` and ``cli`` import Dask (``distributed``, ``bokeh``, ``tornado``);
``algo`` imports numpy, torch, gymnasium and the media packages its recorder
uses, nothing else outside the standard library; no agent imports another; no
module imports ``apex_dask`` modules in a circle. Length is no rule: a module is
as long as what it owns, with a backstop of 600 lines and a written reason in
:data:`LONG_MODULES` for each one above 400.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys

import pytest

import apex_dask

ROOT = pathlib.Path(apex_dask.__file__).parent

ALLOWED: dict[str, set[str]] = {
    "algo": {"algo"},
    "algo.agents.registry": {"algo"},
    "algo.agents.config": {"algo"},
    "algo.rollout.spec": {"algo"},
    "config": {"config", "algo.agents.registry", "algo.agents.config", "algo.rollout.spec"},
    "experiment": {"algo", "config", "experiment"},
    "local": {"algo", "config", "experiment", "local"},
    "runtime.observability": {"algo", "config", "experiment", "runtime.observability"},
    "runtime.actors": {
        "algo",
        "config",
        "experiment",
        "runtime.errors",
        "runtime.observability",
        "runtime.actors",
    },
    "runtime.orchestration": {
        "algo",
        "config",
        "experiment",
        "runtime.errors",
        "runtime.credentials",
        "runtime.observability",
        "runtime.actors",
        "runtime.orchestration",
    },
    "runtime.errors": set(),
    "runtime.credentials": set(),
    "runtime.preload": {"runtime.observability"},
    "runtime": set(),
    "cli": {"algo", "config", "experiment", "runtime", "cli"},
    "__main__": {"cli"},
    "": {"config"},  # apex_dask/__init__.py (the rest is imported lazily, by name)
}


def _module_name(path: pathlib.Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = ["apex_dask", *rel.parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _all_imports(path: pathlib.Path, *, run_time_only: bool = False) -> set[str]:
    """Every module the file at ``path`` imports (absolute names; ``run_time_only``:
    leaving out those under ``if TYPE_CHECKING:``)."""
    tree = ast.parse(path.read_text(), str(path))
    skip: set[int] = set()
    if run_time_only:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and _is_type_checking(node.test):
                skip.update(id(n) for child in node.body for n in ast.walk(child))
    here = _module_name(path) if path.is_relative_to(ROOT) else path.stem  # a test's probe
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            submodules = {f"{module}.{a.name}" for a in node.names}
            hits = {m for m in submodules if m in MODULES}
            found.update(hits or {module})
    return found


def _imports(path: pathlib.Path, *, run_time_only: bool = False) -> set[str]:
    """Modules of ``apex_dask`` that the file at ``path`` imports."""
    found = _all_imports(path, run_time_only=run_time_only)
    return {m for m in found if m == "apex_dask" or m.startswith("apex_dask.")}


def _third_party(path: pathlib.Path) -> set[str]:
    """Top-level names of what the file at ``path`` imports from outside ``apex_dask``
    and the standard library."""
    tops = {m.partition(".")[0] for m in _all_imports(path)}
    return {t for t in tops if t and t != "apex_dask" and t not in sys.stdlib_module_names}


FILES = sorted(ROOT.rglob("*.py"))
MODULES = {_module_name(p) for p in FILES}
GRAPH = {_module_name(p): _imports(p) for p in FILES}
"""Who imports whom, ``TYPE_CHECKING`` imports included."""
RUN_TIME_GRAPH = {_module_name(p): _imports(p, run_time_only=True) for p in FILES}
"""The same without the ``TYPE_CHECKING`` imports: what importing a module runs."""


def _layer(module: str) -> str:
    rest = module.removeprefix("apex_dask").lstrip(".")
    best = ""
    for layer in ALLOWED:
        if layer and (rest == layer or rest.startswith(layer + ".")) and len(layer) > len(best):
            best = layer
    if not best and rest:
        raise AssertionError(f"{module} belongs to no layer; add it to ALLOWED")
    return best


def test_the_scan_sees_the_package():
    assert {"apex_dask.local", "apex_dask.runtime.orchestration.driver"} <= MODULES
    assert "apex_dask.experiment.results" in GRAPH["apex_dask.local.runner"]
    typed = "apex_dask.algo.agents.base"  # imported for its types only
    assert typed in GRAPH["apex_dask.experiment.results"]
    assert typed not in RUN_TIME_GRAPH["apex_dask.experiment.results"]


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_module_imports_only_what_its_layer_allows(module):
    layer = _layer(module)
    bad = []
    for target in sorted(GRAPH[module]):
        target_layer = _layer(target)
        if target_layer == layer or target == "apex_dask":
            continue
        if target_layer not in ALLOWED[layer] and not any(
            target_layer.startswith(a + ".") for a in ALLOWED[layer]
        ):
            bad.append(f"{module} -> {target}")
    assert not bad, f"imports across layers: {bad}"


def test_runtime_and_local_never_import_each_other():
    crossings = [
        f"{m} -> {t}"
        for m, targets in GRAPH.items()
        for t in targets
        if (m.startswith("apex_dask.runtime") and t.startswith("apex_dask.local"))
        or (m.startswith("apex_dask.local") and t.startswith("apex_dask.runtime"))
    ]
    assert crossings == []


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` (``[a, b, ..., a]``), or None."""
    state: dict[str, int] = {}  # 1 visiting, 2 done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph.get(m, ())):
            if t == m or t not in graph:
                continue
            if state.get(t) == 1:
                return [*stack[stack.index(t) :], t]
            if t not in state and (cycle := visit(t)):
                return cycle
        stack.pop()
        state[m] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_the_cycle_scan_finds_a_circle(tmp_path):
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b", "a"}, "b": set()}) is None
    # a circle closed by an import for types only is one too
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from apex_dask.local.runner import LocalApex\n"
    )
    typed = _imports(probe)
    assert typed == {"apex_dask.local.runner"} and _imports(probe, run_time_only=True) == set()
    graph = {"apex_dask.local.runner": {"probe"}, "probe": typed}
    assert _cycle(graph) == ["apex_dask.local.runner", "probe", "apex_dask.local.runner"]


def test_no_import_cycle_among_apex_dask_modules():
    """Not even through ``TYPE_CHECKING`` imports: two modules whose types need each
    other are one module split in two."""
    cycle = _cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


ALGO_FLOORS = ("envs", "replay", "rollout", "agents", "play")
"""The folders of ``algo/``, bottom first: each may import only those before it."""
AGENTS_DIR = ROOT / "algo" / "agents"
AGENT_FOLDERS = sorted(p.name for p in AGENTS_DIR.iterdir() if (p / "builder.py").is_file())


def _algo_place(module: str) -> tuple[str, str | None]:
    """``(floor, agent)`` of a module of ``apex_dask.algo`` (agent None outside an agent)."""
    parts = module.split(".")[2:]  # after apex_dask.algo
    floor = parts[0] if parts else ""
    agent = parts[1] if floor == "agents" and len(parts) > 2 else None
    return floor, agent


def test_algo_is_only_its_role_folders():
    loose = sorted(p.name for p in (ROOT / "algo").glob("*.py") if p.name != "__init__.py")
    folders = sorted(p.name for p in (ROOT / "algo").iterdir() if (p / "__init__.py").is_file())
    assert loose == [] and folders == sorted(ALGO_FLOORS)


def test_each_algo_folder_imports_only_the_folders_below_it():
    bad = []
    for module, targets in GRAPH.items():
        if not module.startswith("apex_dask.algo."):
            continue
        floor, _ = _algo_place(module)
        for target in targets:
            if not target.startswith("apex_dask.algo."):
                continue
            to = _algo_place(target)[0]
            if to != floor and ALGO_FLOORS.index(to) > ALGO_FLOORS.index(floor):
                bad.append(f"{module} -> {target}")
    assert bad == []


def test_each_built_in_agent_is_a_folder_and_one_registry_line():
    """A new agent is its folder and its line in ``AGENTS``: nothing here names one."""
    from apex_dask.algo.agents.registry import AGENTS

    assert AGENT_FOLDERS == sorted(AGENTS) and len(AGENT_FOLDERS) >= 3


def test_no_agent_imports_another_agents_folder():
    bad = [
        f"{module} -> {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if module.startswith("apex_dask.algo.agents.")
        and (mine := _algo_place(module)[1]) is not None
        and target.startswith("apex_dask.algo.agents.")
        and (theirs := _algo_place(target)[1]) is not None
        and theirs != mine
    ]
    assert bad == []


def test_the_agent_scan_places_a_module_in_its_agent():
    assert _algo_place("apex_dask.algo.agents.dqn.learner") == ("agents", "dqn")
    assert _algo_place("apex_dask.algo.agents.dqn") == ("agents", None)
    assert _algo_place("apex_dask.algo.agents.base") == ("agents", None)
    assert "apex_dask.algo.agents.dqn.heads" in GRAPH["apex_dask.algo.agents.dqn.networks"]


def test_each_agent_folder_has_the_same_role_files():
    roles = {"config", "networks", "loss", "learner", "worker", "policy", "builder"}
    for name in AGENT_FOLDERS:
        files = {p.stem for p in (AGENTS_DIR / name).glob("*.py")} - {"__init__"}
        assert roles <= files, (name, sorted(roles - files))


def test_the_registry_is_the_only_place_that_names_an_agent():
    """No module outside an agent's folder and the registry compares ``algo`` to a name."""
    names = "|".join(AGENT_FOLDERS)
    pattern = re.compile(rf"""algo\s*(==|!=|in)\s*\(?\s*["']({names})["']""")
    assert pattern.search('if cfg.algo == "dpg":') and pattern.search("algo in ('r2d2', 'x')")
    own = tuple(f"algo/agents/{name}/" for name in AGENT_FOLDERS)
    hits = [
        f"{p.relative_to(ROOT)}:{i}"
        for p in FILES
        if not str(p.relative_to(ROOT)).startswith(own)
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


DASK = {"dask", "distributed", "bokeh", "tornado"}
"""The Dask stack: imported by ``runtime`` and ``cli`` only."""
ALGO_THIRD_PARTY = {
    "numpy",
    "torch",
    "gymnasium",
    # optional, each imported only where it is used (the project's extras):
    "ale_py",  # Atari's own vector env (algo/envs/native.py)
    "numba",  # the sum tree's compiled kernels (algo/replay/sumtree_kernels.py)
    "PIL",  # the video recorder (algo/play/video.py)
    "imageio",
    "imageio_ffmpeg",
    "moviepy",
    "onnxruntime",  # an exported .onnx file played back (algo/play/exported.py)
}
"""All ``algo`` may import from outside ``apex_dask`` and the standard library."""


def test_the_third_party_scan_sees_type_only_imports():
    assert "bokeh" in _third_party(ROOT / "runtime" / "observability" / "dashboard.py")
    assert "gymnasium" in _third_party(ROOT / "algo" / "agents" / "builder.py")
    assert not {"os", "typing", "apex_dask", "__future__"} & _third_party(ROOT / "cli" / "main.py")


@pytest.mark.parametrize("layer", ["algo", "config", "experiment", "local"])
def test_only_runtime_and_cli_import_dask(layer):
    bad = {
        str(p.relative_to(ROOT)): sorted(found)
        for p in sorted((ROOT / layer).rglob("*.py"))
        if (found := _third_party(p) & DASK)
    }
    assert bad == {}


def test_algo_imports_only_numpy_torch_gymnasium_and_media():
    bad = {
        str(p.relative_to(ROOT)): sorted(found)
        for p in sorted((ROOT / "algo").rglob("*.py"))
        if (found := _third_party(p) - ALGO_THIRD_PARTY)
    }
    assert bad == {}


BACKSTOP = 600
"""No module is longer: past this a module holds more than one thing."""
LONG_MODULES: dict[str, str] = {
    "config/tree.py": (
        "ApexConfig and its shared sections, each field documented where it is declared "
        "(the docs' config reference is generated from those comments), with the dotted-key "
        "lookups that read the same tree; split, a section would sit apart from the root "
        "that nests it"
    ),
    "local/runner.py": (
        "the in-process runner's one round-robin (rollouts, replay and learning, evaluation, "
        "weight syncs, iteration results) over counters every step shares; what a checkpoint "
        "of it holds and how lives in experiment/checkpoints/runner.py"
    ),
    "runtime/observability/metrics_store.py": (
        "one point budget and one lock: admitting, resizing and dropping series and runs, "
        "and every read that copies under that lock (the JSON document a series at a time) "
        "must see the same bookkeeping; the series and the per-run view are their own modules"
    ),
    "runtime/actors/env_worker.py": (
        "one actor's calls over one event loop and one env thread: rollouts, weight syncs "
        "through its host's relay or the learner, stats and transport share the counters "
        "the driver's ledgers compare"
    ),
    "runtime/actors/learner.py": (
        "one actor's learner thread, prefetcher, priority sender and versioned weight blobs "
        "share one model lock and the counters its stats report"
    ),
    "runtime/orchestration/invariants.py": (
        "every law of the counters reads one watch of the run (which actor each number came "
        "from, the calm after a fault, when each counter last rose); split, a law would sit "
        "apart from the rule that excuses it after a fault"
    ),
    "runtime/orchestration/launch.py": (
        "the one ActorSet that creates, refers to and retires every actor of a run (learner, "
        "shards, env workers, relays), so a rebuilt actor's Future replaces the lost one's "
        "in one place"
    ),
}
"""Each module above 400 lines, and why it is one module."""


def _lengths() -> dict[str, int]:
    return {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in FILES}


def test_no_module_is_longer_than_the_backstop():
    assert {m: n for m, n in _lengths().items() if n > BACKSTOP} == {}


def test_each_module_above_400_lines_says_why():
    lengths = _lengths()
    unexplained = sorted(m for m, n in lengths.items() if n > 400 and m not in LONG_MODULES)
    stale = sorted(m for m in LONG_MODULES if lengths.get(m, 0) <= 400)
    assert (unexplained, stale) == ([], [])
    assert all(len(why.split()) >= 8 for why in LONG_MODULES.values())


ORCHESTRATION = ROOT / "runtime" / "orchestration"
PLAN_OWNERS = {"plan.py", "driver.py"}  # the only files that may hold the execution plan


def _plan_references(path: pathlib.Path) -> list[str]:
    """Ways the file at ``path`` reaches the plan: importing it (TYPE_CHECKING too), a
    parameter or attribute named ``plan``, or an ``ExecutionPlan`` annotation."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").endswith("orchestration.plan"):
            found.append(f"line {node.lineno}: imports the plan module")
        elif isinstance(node, ast.arg) and (
            node.arg == "plan" or "ExecutionPlan" in ast.unparse(node.annotation or ast.Pass())
        ):
            found.append(f"line {node.lineno}: takes the plan ({node.arg})")
        elif isinstance(node, ast.Attribute) and node.attr == "plan":
            found.append(f"line {node.lineno}: keeps or reads .plan")
    return found


def test_the_scan_finds_a_plan_reference(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("class Helper:\n    def __init__(self, plan):\n        self.plan = plan\n")
    assert len(_plan_references(probe)) == 2


@pytest.mark.parametrize(
    "name", sorted(p.name for p in ORCHESTRATION.glob("*.py") if p.name not in PLAN_OWNERS)
)
def test_no_orchestration_helper_keeps_the_plan(name):
    """Helpers get the run state and their collaborators, never the plan."""
    assert _plan_references(ORCHESTRATION / name) == []


def _wired_after_construction(path: pathlib.Path) -> list[str]:
    """Assignments to a helper's attribute (``self.faults.restart = ...``): a collaborator
    given after the helper was built, not in its constructor. The run state's fields
    (``self.state.halting``) are state, not wiring."""
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for t in targets:
            if (
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Attribute)
                and isinstance(t.value.value, ast.Name)
                and t.value.value.id == "self"
                and t.value.attr != "state"
            ):
                found.append(f"line {node.lineno}: {ast.unparse(t)}")
    return found


def test_the_wiring_scan_finds_a_late_collaborator(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "class Plan:\n"
        "    def __init__(self):\n"
        "        self.state.halting = False\n"
        "        self.faults.restart = self.store.start\n"
    )
    assert _wired_after_construction(probe) == ["line 4: self.faults.restart"]


@pytest.mark.parametrize("name", sorted(PLAN_OWNERS))
def test_the_plan_gives_its_helpers_their_collaborators_when_it_builds_them(name):
    assert _wired_after_construction(ORCHESTRATION / name) == []
