"""MkDocs hooks of the documentation site (``mkdocs.yml`` names this file).

At every build:

- the reference pages ``reference/config.md`` and ``reference/cli.md`` are generated
  from the code (:mod:`reference`);
- the agents' metrics table of ``metrics.md`` is rendered again from the agents'
  declarations (``scripts/metrics_doc.py``), whatever the file holds;
- a page's link to a repository file outside ``docs/`` (``../cluster/README.md``)
  points to a copy of that file the build adds under ``repo/`` (Markdown files
  become pages), and that file's own links into ``docs/`` point to the pages;
- every ``::: identifier`` of an API page is checked: a public symbol it shows
  without a docstring is a warning, which fails the strict build.
"""

from __future__ import annotations

import importlib.util
import logging
import posixpath
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import reference  # noqa: E402

log = logging.getLogger("mkdocs.hooks.apex_docs")

GENERATED = {
    "reference/config.md": reference.config_page,
    "reference/cli.md": reference.cli_page,
}
REPO = "repo"  # where the copies of linked repository files go
LINK = re.compile(r"(\]\()([^)\s#]+)((?:#[^)\s]*)?\))")
DIRECTIVE = re.compile(r"^::: *([\w.]+)", re.M)


def _metrics_doc():
    spec = importlib.util.spec_from_file_location("metrics_doc", ROOT / "scripts/metrics_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _outside_links(text: str, where: str) -> set[str]:
    """Repository paths (from the repository root) of the relative links in ``text``
    (a file at ``where``, a repository path) that leave ``docs/``."""
    found = set()
    for m in LINK.finditer(text):
        target = m.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            continue
        path = posixpath.normpath(posixpath.join(posixpath.dirname(where), target))
        if not path.startswith(("docs/", "../")) and (ROOT / path).is_file():
            found.add(path)
    return found


def on_files(files: Files, config) -> Files:
    for path, make in GENERATED.items():
        files.append(File.generated(config, path, content=make()))
    docs = Path(config["docs_dir"])
    todo = set()
    for f in files:
        if f.src_uri.endswith(".md") and f.abs_src_path and Path(f.abs_src_path).is_file():
            todo |= _outside_links(Path(f.abs_src_path).read_text(), f"docs/{f.src_uri}")
    done: set[str] = set()
    while todo:  # the linked files, and the files they link to in turn
        path = todo.pop()
        done.add(path)
        text = (ROOT / path).read_text()
        if path.endswith(".md"):
            todo |= _outside_links(text, path) - done
        files.append(File.generated(config, f"{REPO}/{path}", content=text))
    assert docs.is_dir()
    return files


def _rewrite(markdown: str, src_uri: str) -> str:
    """Links of the page ``src_uri`` (docs-relative) that leave ``docs/``, pointed at the
    build's copies; a copied file's links into ``docs/``, at the pages."""
    here = posixpath.dirname(src_uri)
    in_repo = src_uri.startswith(f"{REPO}/")
    repo_path = src_uri[len(REPO) + 1 :] if in_repo else f"docs/{src_uri}"

    def fix(m: re.Match) -> str:
        target = m.group(2)
        if "://" in target or target.startswith(("/", "mailto:")):
            return m.group(0)
        path = posixpath.normpath(posixpath.join(posixpath.dirname(repo_path), target))
        if path.startswith("docs/"):
            if not in_repo:
                return m.group(0)
            new = path[len("docs/") :]
        elif (ROOT / path).is_file():
            new = f"{REPO}/{path}"
        else:
            return m.group(0)
        return f"{m.group(1)}{posixpath.relpath(new, here or '.')}{m.group(3)}"

    return LINK.sub(fix, markdown)


def on_page_markdown(markdown: str, page, config, files) -> str:
    src = page.file.src_uri
    if src == "metrics.md":
        metrics_doc = _metrics_doc()
        markdown = metrics_doc.render(markdown)
    for identifier in DIRECTIVE.findall(markdown):
        for symbol in reference.undocumented(identifier):
            log.warning(f"{src}: the public symbol {symbol} has no docstring")
    return _rewrite(markdown, src)
