"""Which installed distribution provides each import, and whether pyproject.toml declares it.

::

    deps = Declared.from_pyproject(ROOT / "pyproject.toml")
    problems = package_problems(ROOT / "apex_dask", deps)   # [] when every import is declared

Rules for the package (``package_problems``):

- An import of a module that no installed distribution provides is a problem
  (the package must not import what the project cannot install).
- An import without a marker must come from a *core* dependency
  (``[project].dependencies``, and the extras those name, as ``dask[distributed]``).
- An import for an optional feature carries ``# extra: NAME`` on its line: its
  distribution must be in the core list or in extra ``NAME``, and the import must
  not run when the package is imported (it sits in a function or in a ``try`` that
  catches ImportError).

Imports under ``if TYPE_CHECKING:`` and of the standard library are skipped.
``scope_problems`` checks other trees (the tests) against a set of extras:
there, only imports an installed distribution provides are judged (others are
the tests' own helper modules), and they must be declared in that set.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

MARKER = re.compile(r"#.*\bextra:\s*([A-Za-z0-9_.-]+)")
GUARDS = {"ImportError", "ModuleNotFoundError", "Exception", "BaseException"}
# Submodules that need a distribution of their own beyond their top-level package's.
SUBMODULE_DISTRIBUTIONS = {"torch.utils.tensorboard": "tensorboard"}


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirement(req: str) -> tuple[str, list[str]]:
    """``(normalized name, [extras])`` of a requirement string such as ``dask[distributed]>=1``."""
    m = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(?:\[([^\]]*)\])?", req)
    if m is None:
        raise ValueError(f"cannot read requirement {req!r}")
    extras = [e.strip() for e in (m.group(2) or "").split(",") if e.strip()]
    return normalize(m.group(1)), extras


def _extra_requirements(dist: str, extra: str) -> set[str]:
    """Names the installed distribution ``dist`` requires for its extra ``extra``."""
    try:
        reqs = metadata.requires(dist) or []
    except metadata.PackageNotFoundError:
        return set()
    out = set()
    for req in reqs:
        spec, _, marker = req.partition(";")
        if re.search(r"""extra\s*==\s*['"]""" + re.escape(extra) + """['"]""", marker):
            out.add(_requirement(spec)[0])
    return out


@dataclass
class Declared:
    """The project's declared distributions: the core list and each extra (expanded)."""

    project: str
    core: set[str]
    extras: dict[str, set[str]] = field(default_factory=dict)

    @classmethod
    def from_pyproject(cls, path: Path) -> Declared:
        data = tomllib.loads(path.read_text())["project"]
        project = normalize(data["name"])
        raw = {"": data.get("dependencies", []), **data.get("optional-dependencies", {})}

        def expand(key: str, seen: frozenset[str] = frozenset()) -> set[str]:
            names: set[str] = set()
            for req in raw[key]:
                name, extras = _requirement(req)
                if name == project:  # apex_dask[a,b]: the project's own extras
                    for extra in extras:
                        if extra not in seen:
                            names |= expand(extra, seen | {extra})
                    continue
                names.add(name)
                for extra in extras:  # dask[distributed] declares distributed too
                    names |= _extra_requirements(name, extra)
            return names

        core = expand("")
        return cls(project, core, {k: expand(k, frozenset({k})) for k in raw if k})

    def allowed(self, extras: Iterable[str] = ()) -> set[str]:
        names = set(self.core)
        for extra in extras:
            names |= self.extras[extra]
        return names


@dataclass(frozen=True)
class ImportSite:
    """One import statement: where, what, its ``# extra:`` marker, whether it runs at import."""

    path: Path
    line: int
    module: str
    extra: str | None
    at_import_time: bool

    def where(self, root: Path) -> str:
        return f"{self.path.relative_to(root.parent)}:{self.line}"


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _guards_imports(node: ast.Try) -> bool:
    for handler in node.handlers:
        if handler.type is None:
            return True
        types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
        for t in types:
            name = t.id if isinstance(t, ast.Name) else getattr(t, "attr", "")
            if name in GUARDS:
                return True
    return False


def import_sites(path: Path) -> list[ImportSite]:
    """Every absolute import in the file ``path`` (``import_module("x")`` calls included)."""
    text = path.read_text()
    lines = text.splitlines()
    sites: list[ImportSite] = []

    def marker(lineno: int, end: int | None) -> str | None:
        for ln in lines[lineno - 1 : (end or lineno)]:
            m = MARKER.search(ln)
            if m:
                return m.group(1)
        return None

    def add(node: ast.AST, module: str, runs: bool) -> None:
        end = getattr(node, "end_lineno", None)
        sites.append(ImportSite(path, node.lineno, module, marker(node.lineno, end), runs))

    def visit(node: ast.AST, runs: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child, runs)
            return
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            runs = False
        if isinstance(node, ast.Try) and _guards_imports(node):
            for child in node.body:
                visit(child, False)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child, runs)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(node, alias.name, runs)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            add(node, node.module, runs)
        elif isinstance(node, ast.Call):
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", "")
            arg = node.args[0] if node.args else None
            if name in ("import_module", "__import__") and isinstance(arg, ast.Constant):
                if isinstance(arg.value, str) and not arg.value.startswith("."):
                    add(node, arg.value, runs)
        for child in ast.iter_child_nodes(node):
            visit(child, runs)

    visit(ast.parse(text, filename=str(path)), True)
    return sites


@functools.lru_cache(maxsize=1)
def installed_providers() -> dict[str, list[str]]:
    """Top-level import names -> the installed distributions that provide them."""
    return metadata.packages_distributions()


def distributions_of(module: str, providers: dict[str, list[str]]) -> set[str]:
    """Normalized names of the installed distributions that provide ``module``."""
    for prefix, dist in SUBMODULE_DISTRIBUTIONS.items():
        if module == prefix or module.startswith(prefix + "."):
            return {normalize(dist)}
    return {normalize(d) for d in providers.get(module.split(".")[0], [])}


def _third_party(site: ImportSite, own: set[str]) -> bool:
    top = site.module.split(".")[0]
    return top not in sys.stdlib_module_names and top not in own and top != "__future__"


def package_problems(
    package: Path, deps: Declared, providers: dict[str, list[str]] | None = None
) -> list[str]:
    """One line per import in ``package`` (a folder) that breaks the rules above."""
    providers = installed_providers() if providers is None else providers
    own = {package.name}
    out = []
    for path in sorted(package.rglob("*.py")):
        for site in import_sites(path):
            if not _third_party(site, own):
                continue
            where = site.where(package)
            dists = distributions_of(site.module, providers)
            if not dists:
                out.append(f"{where}: `{site.module}` is provided by no installed distribution; "
                           "declare the distribution that provides it in pyproject.toml")  # fmt: skip
                continue
            named = ", ".join(sorted(dists))
            if site.extra is None:
                if not dists & deps.core:
                    out.append(
                        f"{where}: `{site.module}` comes from {named}, which is not a core "
                        "dependency ([project].dependencies); declare it there, or guard the "
                        "import for an optional feature and mark it `# extra: NAME`"
                    )
                continue
            if site.extra not in deps.extras:
                out.append(f"{where}: `# extra: {site.extra}` names no extra of pyproject.toml")
                continue
            if not dists & deps.allowed([site.extra]):
                out.append(f"{where}: `{site.module}` comes from {named}, which extra "
                           f"'{site.extra}' does not declare")  # fmt: skip
            if site.at_import_time:
                out.append(
                    f"{where}: `{site.module}` (extra '{site.extra}') runs when the module is "
                    "imported; import it inside a function or a try/except ImportError"
                )
    return out


def scope_problems(
    folders: Iterable[Path],
    deps: Declared,
    extras: Iterable[str],
    providers: dict[str, list[str]] | None = None,
    in_repo: Iterable[str] = (),
) -> list[str]:
    """Imports in ``folders`` of installed distributions that core + ``extras`` do not declare
    (``in_repo``: distributions built from this repository's own folders, as the example
    agent package ``tests/ext_agent``)."""
    providers = installed_providers() if providers is None else providers
    allowed = deps.allowed(extras) | {deps.project} | {normalize(n) for n in in_repo}
    out = []
    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            for site in import_sites(path):
                if not _third_party(site, set()):
                    continue
                dists = distributions_of(site.module, providers)
                if dists and not dists & allowed:
                    out.append(
                        f"{site.where(folder)}: `{site.module}` comes from "
                        f"{', '.join(sorted(dists))}, which the project does not declare for "
                        f"these files (core + {', '.join(extras)})"
                    )
    return out
