"""The documentation site's reference pages, rendered from the code at build time.

Nothing here is written by hand: the config keys come from the config dataclasses
(the shared sections and every built-in agent's own section, found through the
agent registry) and the presets, the command-line flags from the three CLIs'
argument parsers, the agents' metrics from their builders' declarations.
:func:`undocumented` lists the public symbols of an API page that have no docstring
(the site's build fails on them).

    config_page()     # Markdown of reference/config.md
    cli_page()        # Markdown of reference/cli.md
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import inspect
import json
import textwrap
from collections.abc import Callable, Iterator
from typing import Any

# -- config keys ------------------------------------------------------------------


def _cell(text: str) -> str:
    """``text`` safe inside a Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _value(value: Any) -> str:
    """A config value as YAML would spell it (tuples as lists, None as null)."""
    if isinstance(value, tuple):
        value = list(value)
    try:
        text = json.dumps(value)
    except TypeError:
        text = str(value)
    return f"`{_cell(text)}`"


def _keys(cls: type, instance: Any, docs: dict[str, str], prefix: str) -> Iterator[tuple]:
    """``(key, type, default)`` of each leaf of the dataclass ``cls`` (``instance``
    holds the defaults), in declaration order; ``docs`` names the leaves."""
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        value = getattr(instance, f.name)
        if key in docs or not dataclasses.is_dataclass(value):
            yield key, str(f.type), value
        else:
            yield from _keys(type(value), value, docs, f"{key}.")


def _flat(tree: dict[str, Any], docs: dict[str, str], prefix: str = "") -> dict[str, Any]:
    """A preset's nested dict as ``{dotted key: value}``, down to the documented keys."""
    out: dict[str, Any] = {}
    for name, value in tree.items():
        key = f"{prefix}{name}"
        if isinstance(value, dict) and key not in docs:
            out.update(_flat(value, docs, f"{key}."))
        else:
            out[key] = value
    return out


def config_sections() -> dict[str, list[tuple[str, str, Any]]]:
    """``{section: [(key, type, default), ...]}``: the shared sections, then each
    built-in agent's section under its name (``dqn``, ``dpg``, ``r2d2``)."""
    from apex_dask.algo.agents.registry import AGENTS
    from apex_dask.config import ApexConfig

    docs = ApexConfig.field_docs()
    root = ApexConfig()
    sections: dict[str, list[tuple[str, str, Any]]] = {}
    for key, typ, default in _keys(ApexConfig, root, docs | {"agent": ""}, ""):
        if key == "agent":
            continue
        sections.setdefault(key.split(".")[0] if "." in key else "run", []).append(
            (key, typ, default)
        )
    for name, builder in AGENTS.items():
        cls = builder.config
        sections[name] = list(_keys(cls, cls(), docs, f"{name}."))
    return sections


def config_page() -> str:
    """Every config key: its type, default, documentation and the presets' values."""
    from apex_dask.algo.agents.registry import AGENTS
    from apex_dask.config import ApexConfig
    from apex_dask.config.presets import PRESETS

    docs = ApexConfig.field_docs()
    presets = {name: _flat(tree, docs) for name, tree in PRESETS.items()}
    sections = config_sections()
    count = sum(len(keys) for keys in sections.values())
    lines = [
        "# Config keys",
        "",
        f"Every key of the config tree ({count} keys), generated when the site is built from",
        "the config dataclasses (`apex_dask.config` and each agent's own",
        "`apex_dask/algo/agents/<name>/config.py`) and the presets",
        "(`apex_dask/config/presets.py`). `apex-dask-submit --list-keys` prints the same",
        "keys and documentation. Set a key with `--set KEY=VALUE`, in a YAML file",
        "(`KEY: VALUE` under its section, or the dotted key), or from Python with",
        '`ApexConfig.preset("cartpole").override({"KEY": VALUE})`.',
        "",
        "Under each key, **Presets** shows what each preset (`--preset NAME`) sets where it",
        "sets the key; the default applies otherwise. The shared sections apply to every",
        "agent; an agent's section (named as the agent: "
        + ", ".join(f"`{a}`" for a in AGENTS)
        + ") is read only when `algo` names that agent.",
        "",
        "Presets: "
        + "; ".join(
            f"`{name}` (algo `{tree.get('algo', 'dqn')}`)" for name, tree in PRESETS.items()
        )
        + ".",
        "",
    ]
    for section, keys in sections.items():
        title = section if section != "run" else "run (top level)"
        agent = f" (the `{section}` agent's section)" if section in AGENTS else ""
        lines += [f"## {title}{agent}", ""]
        for key, typ, default in keys:  # a heading each: the search lists the key itself
            set_by = [f"`{p}`: {_value(flat[key])}" for p, flat in presets.items() if key in flat]
            presets_line = f" Presets: {'; '.join(set_by)}." if set_by else ""
            lines += [
                f"### {key} {{#{key}}}",
                "",
                f"Type `{_cell(typ)}`, default {_value(default)}.{presets_line}",
                "",
                _cell(docs.get(key, "")),
                "",
            ]
    return "\n".join(lines)


# -- command lines ----------------------------------------------------------------


def _parsers() -> list[tuple[str, Callable[[], argparse.ArgumentParser]]]:
    from apex_dask.cli.evaluate import build_parser as eval_parser
    from apex_dask.cli.main import build_parser as submit_parser
    from apex_dask.cli.sweep.main import build_parser as sweep_parser

    return [
        ("apex-dask-submit", submit_parser),
        ("apex-dask-eval", eval_parser),
        ("apex-dask-sweep", sweep_parser),
    ]


def _flag_rows(parser: argparse.ArgumentParser, group: Any) -> list[str]:
    formatter = parser._get_formatter()
    rows = []
    for action in group._group_actions:
        if action.help == argparse.SUPPRESS:
            continue
        names = ", ".join(f"`{o}`" for o in action.option_strings) or f"`{action.dest}`"
        metavar = ""
        if action.nargs != 0:
            metavar = formatter._format_args(
                action,
                formatter._get_default_metavar_for_optional(action)
                if action.option_strings
                else action.dest,
            )
        default = action.default
        shown = ""
        if default not in (None, argparse.SUPPRESS, False, []) and action.nargs != 0:
            shown = _value(default)
        text = formatter._expand_help(action) if action.help else ""
        rows.append(
            f"| {names} | {('`' + _cell(metavar) + '`') if metavar else ''} | {shown} "
            f"| {_cell(text)} |"
        )
    return rows


def cli_page() -> str:
    """The three commands' flags, from their argument parsers."""
    lines = [
        "# Command line",
        "",
        "The flags of the three commands, generated when the site is built from their",
        "argument parsers (`--help` prints the same). Config keys are on",
        "[Config keys](config.md).",
        "",
    ]
    for prog, build in _parsers():
        parser = build()
        parser.prog = prog
        lines += [f"## {prog}", ""]
        if parser.description:
            lines += [textwrap.dedent(parser.description).strip(), ""]
        lines += ["```text", parser.format_usage().strip(), "```", ""]
        for group in parser._action_groups:
            rows = _flag_rows(parser, group)
            if not rows:
                continue
            title = group.title or "arguments"
            lines += [f"### {prog}: {title}", ""]
            if group.description:
                lines += [_cell(group.description), ""]
            lines += ["| flag | argument | default | meaning |", "| --- | --- | --- | --- |"]
            lines += rows
            lines.append("")
        if parser.epilog:
            lines += ["```text", textwrap.dedent(parser.epilog).strip(), "```", ""]
    return "\n".join(lines)


# -- undocumented public symbols --------------------------------------------------


def _field_docstrings(cls: type) -> set[str]:
    """Names of the class-level annotated attributes of ``cls`` followed by a string."""
    try:
        node = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    except (OSError, TypeError, IndexError):
        return set()
    found = set()
    body = getattr(node, "body", [])
    for stmt, nxt in zip(body, body[1:], strict=False):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            found.add(stmt.target.id)
    return found


def _has_doc(obj: Any) -> bool:
    doc = obj.__dict__.get("__doc__") if isinstance(obj, type) else getattr(obj, "__doc__", None)
    return bool(doc and doc.strip())


def _class_gaps(cls: type, path: str) -> list[str]:
    gaps = [] if _has_doc(cls) else [path]
    if dataclasses.is_dataclass(cls):
        documented = _field_docstrings(cls)
        for f in dataclasses.fields(cls):
            if not f.name.startswith("_") and f.name not in documented:
                gaps.append(f"{path}.{f.name}")
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, staticmethod | classmethod):
            member = member.__func__
        if isinstance(member, property) or inspect.isfunction(member):
            if not _has_doc(member):
                gaps.append(f"{path}.{name}")
    return gaps


def undocumented(identifier: str) -> list[str]:
    """The public symbols that ``::: identifier`` shows, which have no docstring:
    the object itself; a module's ``__all__`` (or its public names defined there);
    a class's public methods and properties, and a dataclass's fields."""
    module_name, obj = identifier, None
    while True:
        try:
            module = importlib.import_module(module_name)
            break
        except ModuleNotFoundError:
            if "." not in module_name:
                raise
            module_name = module_name.rsplit(".", 1)[0]
    obj = module
    for part in identifier[len(module_name) :].strip(".").split("."):
        if part:
            obj = getattr(obj, part)
    if inspect.ismodule(obj):
        gaps = [] if _has_doc(obj) else [identifier]
        names = getattr(obj, "__all__", None)
        if names is None:
            names = [
                n
                for n, v in vars(obj).items()
                if not n.startswith("_")
                and getattr(v, "__module__", None) == obj.__name__
                and (inspect.isclass(v) or inspect.isfunction(v))
            ]
        for name in names:
            gaps += undocumented(f"{identifier}.{name}")
        return gaps
    if inspect.isclass(obj):
        return _class_gaps(obj, identifier)
    if callable(obj) and not _has_doc(obj):
        return [identifier]
    return []
