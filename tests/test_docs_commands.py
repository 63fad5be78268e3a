"""Every command of a code block the documentation marks runnable is run here.

A page marks a block by an HTML comment on the line before its fence (invisible
on the site and on GitHub)::

    <!-- runnable -->
    ```bash
    apex-dask-submit --preset cartpole --stop-timesteps 30000 --out runs/cartpole
    ```

A run that would be long is run short: each further line of the comment is a
change ``OLD => NEW`` made to the block's text before it runs, and ``OLD`` must be
in the block (so the comment cannot fall behind the command it shortens)::

    <!-- runnable
    --stop-time 300 => --stop-time 300 --stop-timesteps 3000
    -->

A ``bash`` / ``sh`` block runs as one script (``set -eo pipefail``); a block of
another kind runs its ``$ ``-prompted lines. A page's blocks run in order in one
folder of their own, which holds links to the repository's files (so
``docs/examples/...`` and ``.venv/bin/...`` resolve as in a checkout, and what the
commands write, ``runs/``, ``sweeps/``, stays there), with the environment active
(the pages say ``source .venv/bin/activate``). ``bash scripts/setup.sh EXTRAS``
and ``pip install 'apex_dask[EXTRAS]'`` are the suite's own set-up: the extras
they name must be in the ``test`` extra, and they are not run again.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MARK = re.compile(
    r"^<!-- runnable(?P<body>(?:(?!-->).)*?)-->\n(?P<fence>`{3,})(?P<lang>[\w-]*)[^\n]*\n",
    re.M | re.S,
)
SETUP = re.compile(
    r"(?:bash scripts/setup\.sh(?P<extras>(?: +[\w,]+)?)"
    r"|pip install '?apex_dask\[(?P<pip>[\w,]+)\]'?)"
    r"(?= *(?:&&|#|$))",
    re.M,
)
OUTPUTS = {"runs", "sweeps", "site", "videos"}
"""Folders the documented commands write: a checkout's own are not linked in."""


@dataclass
class Block:
    page: str
    line: int
    lang: str
    text: str
    changes: list[tuple[str, str]] = field(default_factory=list)

    def where(self) -> str:
        return f"docs/{self.page}:{self.line}"

    def script(self) -> str:
        """The commands to run: the block with its changes made, the set-up dropped."""
        text = self.text
        for old, new in self.changes:
            if old not in text:
                raise ValueError(
                    f"{self.where()}: the runnable comment's {old!r} is not in the block"
                )
            text = text.replace(old, new)
        if self.lang not in ("bash", "sh"):
            text = "\n".join(line[2:] for line in text.splitlines() if line.startswith("$ "))
        return SETUP.sub(lambda m: _setup(m, self), text)


def _setup(m: re.Match, block: Block) -> str:
    extras = {x for x in re.split(r"[ ,]+", m["extras"] or m["pip"] or "") if x}
    missing = extras - suite_extras()
    if missing:
        raise ValueError(
            f"{block.where()}: sets up extras {sorted(missing)} that the test extra lacks"
        )
    return ":"  # the suite's environment has them


def suite_extras() -> set[str]:
    """The extras the suite's environment has: ``test`` and those it includes."""
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    test = data["project"]["optional-dependencies"]["test"]
    inner = next(x for x in test if x.startswith("apex_dask["))
    return {"test", *inner[len("apex_dask[") : inner.index("]")].split(",")}


def fenced(text: str) -> list[tuple[int, int]]:
    """The spans of ``text`` inside code fences (a mark shown in a block is no mark)."""
    spans, opened, at = [], None, 0
    for line in text.splitlines(keepends=True):
        fence = re.match(r"(`{3,}|~{3,})", line)
        if opened is None and fence:
            opened = (fence[1], at + len(line))
        elif opened is not None and line.rstrip() and set(line.rstrip()) == {opened[0][0]}:
            if len(line.rstrip()) >= len(opened[0]):
                spans.append((opened[1], at))
                opened = None
        at += len(line)
    return spans


def parse(page: str, text: str) -> list[Block]:
    """The runnable blocks of one page's Markdown."""
    blocks = []
    inside = fenced(text)
    for m in MARK.finditer(text):
        if any(a <= m.start() < b for a, b in inside):
            continue
        end = text.find(f"\n{m['fence']}\n", m.end() - 1)
        if end < 0:
            raise ValueError(f"docs/{page}: a runnable block without its closing fence")
        changes = []
        for raw in m["body"].strip().splitlines():
            old, arrow, new = raw.partition(" => ")
            if not arrow or not old.strip():
                raise ValueError(
                    f"docs/{page}: a runnable comment's line is not OLD => NEW: {raw!r}"
                )
            changes.append((old.strip(), new.strip()))
        line = text.count("\n", 0, m.start("fence")) + 1
        blocks.append(Block(page, line, m["lang"], text[m.end() : end + 1], changes))
    return blocks


def runnable_pages() -> dict[str, list[Block]]:
    pages = {}
    for path in sorted(DOCS.rglob("*.md")):
        page = str(path.relative_to(DOCS))
        blocks = parse(page, path.read_text())
        if blocks:
            pages[page] = blocks
    return pages


PAGES = runnable_pages()


def workdir(tmp: Path) -> Path:
    """A folder of links to the checkout's files (not its outputs), as the pages' cwd."""
    for entry in ROOT.iterdir():
        if entry.name in OUTPUTS or entry.name in (".git", ".venv"):
            continue
        (tmp / entry.name).symlink_to(entry)
    (tmp / ".venv").symlink_to(Path(sys.prefix))
    return tmp


def run_block(block: Block, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["VIRTUAL_ENV"] = str(cwd / ".venv")
    env["PATH"] = f"{cwd / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["NO_MKDOCS_2_WARNING"] = "1"
    env.pop("PYTHONHOME", None)
    return subprocess.run(
        ["bash", "-c", "set -eo pipefail\n" + block.script()],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_guides_mark_their_commands_runnable():
    """The reader paths' first commands are marked, and every mark parses and applies."""
    for page in ("getting-started.md", "first-sweep.md", "coming-from-rllib.md", "agents.md"):
        assert page in PAGES, f"docs/{page} has no runnable block"
    for blocks in PAGES.values():
        for block in blocks:
            assert block.script().strip(), block.where()


def test_a_mark_that_no_longer_fits_its_block_is_an_error():
    text = "<!-- runnable\n--stop-time 300 => --stop-time 5\n-->\n```bash\napex-dask-submit --stop-time 60\n```\n"
    (block,) = parse("x.md", text)
    with pytest.raises(ValueError, match="'--stop-time 300' is not in the block"):
        block.script()
    shown = "````markdown\n" + text + "````\n"  # a mark shown as an example is no mark
    assert parse("x.md", shown) == []
    assert len(parse("x.md", shown + text)) == 1
    with pytest.raises(ValueError, match="not OLD => NEW"):
        parse("x.md", "<!-- runnable\n--stop-time 300\n-->\n```bash\ntrue\n```\n")
    (block,) = parse(
        "x.md", "<!-- runnable -->\n```bash\nbash scripts/setup.sh nosuch && true\n```\n"
    )
    with pytest.raises(ValueError, match=r"extras \['nosuch'\]"):
        block.script()


def test_a_failing_command_fails_its_block(tmp_path):
    """A block stops at its first failing command, and a pipe's failure counts."""
    text = (
        "<!-- runnable -->\n```bash\ntrue\nfalse\ntouch reached\n```\n\n"
        "<!-- runnable -->\n```console\n$ false | true\nsome output\n```\n"
        "<!-- runnable -->\n```bash\nbash scripts/setup.sh video && python -c 'import imageio_ffmpeg'"
        " && echo ran  # or: pip install 'apex_dask[video]'\n```\n"
    )
    first, piped, setup = parse("x.md", text)
    cwd = workdir(tmp_path)
    assert run_block(first, cwd, timeout=60).returncode != 0
    assert not (cwd / "reached").exists()
    assert run_block(piped, cwd, timeout=60).returncode != 0
    done = run_block(setup, cwd, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "ran\n"


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("page", sorted(PAGES))
def test_the_runnable_commands_of_a_page_run(page, tmp_path):
    cwd = workdir(tmp_path)
    for block in PAGES[page]:
        done = run_block(block, cwd)
        assert done.returncode == 0, (
            f"{block.where()} exited {done.returncode}:\n{block.script()}\n"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}"
        )
