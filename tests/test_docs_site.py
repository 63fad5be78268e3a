"""The documentation site builds strictly, and its reference pages come from the code.

The site (``mkdocs.yml``, ``docs/``) is built here with the project's ``docs``
extra, as ``.venv/bin/mkdocs build`` builds it: strict, so a broken link or
anchor, a page left out of the navigation or a public symbol of an API page
without a docstring fails it (each is broken on purpose in a copy below). The
generated pages are checked against the config dataclasses, the presets, the
argument parsers and the agents' metric declarations they come from.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "docsite"))

import reference  # noqa: E402


def build(config: Path, site: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def text(site: Path, page: str) -> str:
    """The visible text of a built page (tags dropped, entities decoded)."""
    raw = (site / page / "index.html").read_text()
    return plain(html.unescape(re.sub(r"<[^>]+>", " ", raw)))


def plain(s: str) -> str:
    """``s`` without Markdown's code and emphasis marks, its spaces collapsed."""
    s = " ".join(re.sub(r"[`*]", "", s).split())
    return re.sub(r"([(\[]) ", r"\1", re.sub(r" ([,.;:)\]])", r"\1", s))


def test_every_nav_page_is_built(site):
    import yaml

    class Loader(yaml.SafeLoader):
        pass

    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *a: None)
    nav = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)["nav"]

    def pages(items):
        for item in items:
            value = next(iter(item.values())) if isinstance(item, dict) else item
            if isinstance(value, list):
                yield from pages(value)
            else:
                yield value

    listed = list(pages(nav))
    written = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    assert set(listed) == written | {"reference/config.md", "reference/cli.md"}
    for page in listed:
        name = "" if page == "index.md" else page.removesuffix(".md")
        assert (site / name / "index.html").is_file(), page
    # the repository files the pages link to are built in too
    assert (site / "repo" / "cluster" / "index.html").is_file()


def test_config_reference_lists_every_key_with_type_default_and_presets(site):
    from apex_dask.algo.agents.registry import AGENTS, agents
    from apex_dask.config import ApexConfig
    from apex_dask.config.presets import PRESETS

    page = text(site, "reference/config")
    raw = (site / "reference/config/index.html").read_text()
    docs = ApexConfig.field_docs()
    plugins = set(agents()) - set(AGENTS)  # other packages' agents: not the package's docs
    expected = [k for k in docs if k.split(".")[0] not in plugins]
    assert any(k.startswith("r2d2.") for k in expected) and len(expected) > 100
    for key in expected:  # each key once, a heading with its anchor, and its documentation
        assert raw.count(f'id="{key}"') == 1, f"{key}: not one heading"
        assert plain(" ".join(docs[key].split()[:6])) in page, key
    # types and defaults from the dataclasses, the presets' values from PRESETS
    assert re.search(r"replay\.alpha ¶ Type float, default 0\.6\. ", page), "replay.alpha"
    assert PRESETS["cartpole"]["dqn"]["lr"] == 4e-3
    assert re.search(
        r"dqn\.lr ¶ Type float, default [0-9.e-]+\. Presets: [^¶]*cartpole: 0\.004", page
    )
    assert PRESETS["cartpole_pomdp"]["r2d2"]["lstm_size"] == 64
    assert re.search(r"r2d2\.lstm_size ¶ Type int, default \d+\. Presets: cartpole_pomdp: 64", page)


def test_cli_reference_lists_every_flag_of_the_three_commands(site):
    page = text(site, "reference/cli")
    for prog, make in reference._parsers():
        assert f"{prog}" in page
        for action in make()._actions:
            if action.help == argparse.SUPPRESS:
                continue
            for flag in action.option_strings:
                assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", page), (prog, flag)
    assert "--list-keys" in page and "--from-rllib" in page and "--export" in page


def test_metrics_page_has_the_declared_agent_metrics(site):
    from apex_dask.algo.agents.registry import AGENTS, declared_metrics

    page = text(site, "metrics")
    for name, declared in declared_metrics().items():
        if any(a in AGENTS for a, _ in declared):
            assert name in page, name
            for _, metric in declared:
                assert plain(" ".join(metric.meaning.split()[:5])) in page, name


def test_api_pages_show_the_docstrings(site):
    page = text(site, "reference/api-running")
    from apex_dask.config import ApexConfig
    from apex_dask.runtime.orchestration.driver import ApexDriver

    for obj in (ApexConfig.preset, ApexDriver.iterate, ApexConfig):
        first = obj.__doc__.strip().splitlines()[0]
        words = re.sub(r"[`:*]|\{[^}]*\}", "", first).split()[:4]
        assert " ".join(words) in re.sub(r"[`:*]", "", page), first
    agents = text(site, "reference/api-agents")
    for name in ("AgentBuilder", "LearnerProtocol", "AgentMetric", "RolloutSpec"):
        assert name in agents


def test_undocumented_finds_a_public_symbol_without_a_docstring(tmp_path, monkeypatch):
    (tmp_path / "halfdoc.py").write_text(
        '"""A module."""\n'
        "import dataclasses\n"
        "__all__ = ['Box', 'bare', 'told']\n"
        "@dataclasses.dataclass\n"
        "class Box:\n"
        '    """A box."""\n'
        "    size: int = 1\n"
        '    """Its size."""\n'
        "    colour: str = 'red'\n"
        "    def open(self):\n"
        "        return 1\n"
        "    def _inside(self):\n"
        "        return 2\n"
        "def bare():\n"
        "    pass\n"
        "def told():\n"
        '    """Documented."""\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert sorted(reference.undocumented("halfdoc")) == [
        "halfdoc.Box.colour",
        "halfdoc.Box.open",
        "halfdoc.bare",
    ]
    assert reference.undocumented("halfdoc.told") == []


def _copy_site_sources(tmp: Path) -> Path:
    """A copy of docs/ and mkdocs.yml in ``tmp`` whose hooks and API paths are the tree's."""
    shutil.copytree(ROOT / "docs", tmp / "docs")
    cfg = (ROOT / "mkdocs.yml").read_text()
    cfg = cfg.replace("docs_dir: docs", f"docs_dir: {tmp / 'docs'}")
    cfg = cfg.replace("- scripts/docsite/hooks.py", f"- {ROOT / 'scripts/docsite/hooks.py'}")
    cfg = cfg.replace("paths: [.]", f"paths: [{ROOT}, {tmp}]")
    (tmp / "mkdocs.yml").write_text(cfg)
    return tmp / "mkdocs.yml"


BREAKS = {
    "link": ("index.md", "\n[gone](no-such-page.md)\n", "no-such-page.md"),
    "anchor": ("index.md", "\n[gone](cluster.md#no-such-heading)\n", "#no-such-heading"),
    "page": ("orphan.md", "# Not in the navigation\n", "orphan.md"),
    "docstring": ("reference/api-running.md", "\n::: nodoc_mod.bare\n", "nodoc_mod.bare"),
}


@pytest.mark.slow
@pytest.mark.parametrize("what", sorted(BREAKS))
def test_a_broken_site_fails_the_strict_build(tmp_path, what, monkeypatch):
    config = _copy_site_sources(tmp_path)
    (tmp_path / "nodoc_mod.py").write_text('"""A module."""\ndef bare():\n    return 0\n')
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    page, added, named = BREAKS[what]
    with open(tmp_path / "docs" / page, "a") as f:
        f.write(added)
    done = build(config, tmp_path / "site")
    assert done.returncode != 0, f"the build passed with a broken {what}"
    said = done.stdout + done.stderr
    assert named in said, said[-3000:]
    assert "strict mode" in said


# -- the built site in a real browser -------------------------------------------------

SEARCHED_KEY = "replay.alpha"
SCREENSHOT = ROOT / "docs" / "img" / "site_search.png"

# True once the search (opened by ?q=, the theme's shared-search link) lists first the
# config reference with the key's own entry; the search runs in a web worker over the
# built search index, so this waits for the index to load and answer.
FOUND_JS = """
(() => {
  const first = document.querySelector(".md-search-result__item");
  if (!first) return false;
  return [...first.querySelectorAll("a")].some(a => {
    const href = a.getAttribute("href") || "";
    return href.includes("reference/config/") && href.endsWith("#%s");
  });
})()
"""
# True once the search has answered a query with nothing.
NOTHING_JS = """
(() => {
  const meta = document.querySelector(".md-search-result__meta");
  return !!meta && /no matching/i.test(meta.textContent)
    && document.querySelectorAll(".md-search-result__item").length === 0;
})()
"""


@pytest.fixture(scope="module")
def served(site):
    """The built site over HTTP on 127.0.0.1 (the search needs HTTP, not file://)."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=site))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.slow
def test_chromium_searches_the_built_site_for_a_config_key(served, tmp_path):
    """Real Chromium opens the built site, its search lists a config key's own entry in
    the reference first, and the screenshot of the results is kept as docs/img/site_search.png;
    a word no page holds finds nothing (so the first check can fail)."""
    sys.path.insert(0, str(ROOT / "tests" / "runtime"))
    from browser import require_chromium, screenshot

    chromium = require_chromium()
    shot = screenshot(
        f"{served}/?q={SEARCHED_KEY}",
        tmp_path / "search.png",
        ready_js=FOUND_JS % SEARCHED_KEY,
        width=1280,
        height=800,
        timeout_s=90,
        chromium=chromium,
    )
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    shutil.copyfile(shot, SCREENSHOT)
    screenshot(
        f"{served}/?q=zzqxnotaword",
        tmp_path / "nothing.png",
        ready_js=NOTHING_JS,
        timeout_s=90,
        chromium=chromium,
    )
