"""Every YAML or JSON document apex_dask reads from its users, read within bounds.

::

    data = read_document("run.yaml", "config file")     # a file: YAML, or JSON by name
    data = parse_document(text, "sweep file 'x.yaml'")  # text already in hand
    value = parse_value("[256, 256]", "--set dqn.hiddens")   # a --set value
    f"dqn.lr={shown(value)} is invalid"            # a value in a message, cut

Config files, sweep files, RLlib experiment files and ``params.json``, the
``sweep.yaml`` of a sweep folder, the ``config.yaml`` of a run folder and every
``--set`` value pass through here. What a document may be:

- at most :data:`MAX_BYTES` bytes (a config is a few KB; RLlib's ``params.json``
  tens of KB);
- at most :data:`MAX_DEPTH` levels of nested mappings and lists;
- at most :data:`MAX_NODES` values once every YAML alias is expanded: anchors and
  aliases (``&lr 0.001`` ... ``*lr``) work, but a "billion laughs" document, whose
  aliases expand to billions of values, is refused while it is read (the size is
  counted on YAML's node graph, where an alias is one shared node, so nothing is
  expanded to count it); an alias that contains itself is refused too;
- no key twice in one mapping (YAML would keep the last silently).

Anything else is one :class:`InputError` line naming the document and the bound,
raised within a second and without building the oversized value. JSON is read as
JSON (``NaN``, ``Infinity`` and ``-Infinity`` are the floats they name; each key's
own rule then accepts or refuses them).

:func:`shown` prints a value for a message: Python's ``repr`` for anything short,
else its first :data:`SHOWN_CHARS` characters followed by ``...``, produced by
walking only as much of the value as it prints.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from apex_dask.config.errors import ConfigError

__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "MAX_NODES",
    "SHOWN_CHARS",
    "InputError",
    "parse_document",
    "parse_value",
    "read_document",
    "shown",
]

MAX_BYTES = 256 * 1024
"""Largest document read (bytes)."""
MAX_DEPTH = 64
"""Deepest nesting of mappings and lists."""
MAX_NODES = 100_000
"""Most values (scalars, mappings and lists) in a document, aliases expanded."""
SHOWN_CHARS = 80
"""Longest value :func:`shown` prints."""


class InputError(ConfigError):
    """A document or value past a bound, or not YAML/JSON; the message is one line."""


# ---------------------------------------------------------------------------
# values in messages
# ---------------------------------------------------------------------------


def shown(value: Any, limit: int = SHOWN_CHARS, *, json_style: bool = False) -> str:
    """``repr(value)`` when it is at most ``limit`` characters, else its start and
    ``...``; only the part printed is ever turned into text. ``json_style``: as JSON
    writes it (``true``, ``null``, ``"text"``, lists for tuples)."""
    parts: list[str] = []
    left = [limit + 1]

    def emit(text: str) -> bool:
        if left[0] > 0:
            parts.append(text[: left[0]])
            left[0] -= len(text)
        return left[0] > 0

    def walk(v: Any, depth: int) -> bool:
        if depth > 20:
            return emit("...")
        if isinstance(v, dict):
            if not emit("{"):
                return False
            for i, (k, x) in enumerate(v.items()):
                if (i and not emit(", ")) or not walk(k, depth + 1) or not emit(": "):
                    return False
                if not walk(x, depth + 1):
                    return False
            return emit("}")
        if isinstance(v, list | tuple | set | frozenset):
            opening, closing = {list: "[]", tuple: "()"}.get(type(v), "{}")
            if json_style:
                opening, closing = "[", "]"
            if isinstance(v, set | frozenset) and not v:
                return emit(f"{type(v).__name__}()")
            if not emit(opening):
                return False
            for i, x in enumerate(v):
                if (i and not emit(", ")) or not walk(x, depth + 1):
                    return False
            one = type(v) is tuple and len(v) == 1 and not json_style
            return emit(",)" if one else closing)
        return emit(_json_scalar(v, left[0]) if json_style else _scalar(v, left[0]))

    walk(value, 0)
    text = "".join(parts)
    return text if len(text) <= limit else text[: max(0, limit - 3)] + "..."


def _json_scalar(v: Any, room: int) -> str:
    if isinstance(v, bool) or v is None:
        return {True: "true", False: "false", None: "null"}[v]
    if isinstance(v, float):
        return json.dumps(v)
    if isinstance(v, int):
        return _scalar(v, room)
    return json.dumps(v[: room + 2] if isinstance(v, str) else str(v)[: room + 2])


def _scalar(v: Any, room: int) -> str:
    if isinstance(v, str | bytes):
        return repr(v[: room + 2])
    if isinstance(v, int) and not isinstance(v, bool):
        try:
            return repr(v)
        except ValueError:  # more digits than int -> str converts
            return f"<an integer of {v.bit_length()} bits>"
    if v is None or isinstance(v, bool | float):
        return repr(v)
    try:
        text = repr(v)
    except Exception:  # noqa: BLE001 - a message must not fail on a strange value
        text = f"<{type(v).__name__}>"
    return text[: room + 2]


# ---------------------------------------------------------------------------
# reading
# ---------------------------------------------------------------------------


def read_document(path: str | Path, what: str, *, json_text: bool | None = None) -> Any:
    """The document in the file ``path`` (``what`` names it in messages, e.g. "config
    file"). JSON when ``json_text`` is true, YAML when false; None: JSON for a ``.json``
    name, else YAML (a text that opens with ``{`` is tried as JSON first)."""
    p = Path(path).expanduser()
    where = f"{what} {str(path)!r}"
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_BYTES + 1)
    except OSError as exc:
        raise InputError(f"cannot read {where}: {exc.strerror or exc}") from None
    if len(raw) > MAX_BYTES:
        raise InputError(
            f"{where} is larger than {MAX_BYTES // 1024} KiB, the most apex_dask reads; "
            "is it the right file?"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InputError(f"{where} is not a UTF-8 text (YAML or JSON) file") from None
    if json_text is None:
        json_text = p.suffix.lower() == ".json"
        if not json_text and text.lstrip().startswith("{"):
            try:
                return parse_document(text, where, json_text=True)
            except InputError:
                pass  # not JSON after all: YAML reads it (or says why not)
    return parse_document(text, where, json_text=json_text)


def parse_document(text: str, where: str, *, json_text: bool = False) -> Any:
    """The YAML (or JSON) document ``text``, every bound checked; ``where`` starts each
    error line (e.g. ``"config file 'run.yaml'"``)."""
    if len(text) > MAX_BYTES:
        raise InputError(
            f"{where} is longer than {MAX_BYTES // 1024} KiB, the most apex_dask reads"
        )
    if json_text:
        return _json(text, where)
    return _yaml(text, where)


def parse_value(text: str, where: str) -> Any:
    """A ``--set`` value: the YAML scalar or flow collection ``text`` (``0.5``, ``null``,
    ``[64, 64]``) within the bounds; text that is not YAML stays the string it is."""
    if len(text) > MAX_BYTES:
        raise InputError(f"{where}: the value is longer than {MAX_BYTES // 1024} KiB")
    try:
        return _yaml(text, where)
    except _NotYaml:
        return text


class _NotYaml(InputError):
    """Text that YAML (or JSON) cannot read at all."""


def _json(text: str, where: str) -> Any:
    constants = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in items:
            if key in out:
                raise InputError(f"{where}: key {shown(key)} is given twice; give it once")
            out[key] = value
        return out

    try:
        data = json.loads(text, parse_constant=constants.__getitem__, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise _NotYaml(f"{where} is not valid JSON: {exc.msg} (line {exc.lineno})") from None
    except RecursionError:
        raise InputError(_too_deep(where)) from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise InputError(f"{where} is not valid JSON: {_cut(str(exc))}") from None
    _check_tree(data, where)
    return data


def _too_deep(where: str) -> str:
    return f"{where} nests mappings and lists deeper than {MAX_DEPTH} levels"


def _check_tree(data: Any, where: str) -> None:
    """Depth and size of a parsed JSON value (no aliases: a tree), without recursion."""
    stack = [(data, 1)]
    count = 0
    while stack:
        value, depth = stack.pop()
        count += 1
        if count > MAX_NODES:
            raise InputError(_too_big(where))
        if isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                raise InputError(_too_deep(where))
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)


def _too_big(where: str) -> str:
    return (
        f"{where} holds more than {MAX_NODES:,} values once its YAML aliases are expanded "
        "(an alias bomb?); apex_dask reads no document that large"
    )


def _loader_class() -> Any:
    import yaml

    base = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

    class BoundedLoader(base):  # type: ignore[misc, valid-type]
        """The safe loader, with duplicate keys refused (merge keys ``<<`` aside)."""

        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: set[Any] = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    duplicate = key in seen
                    seen.add(key)
                except TypeError:  # an unhashable key: the base class says so
                    break
                if duplicate:
                    line = key_node.start_mark.line + 1
                    raise _Duplicate(f"key {shown(key)} is given twice (line {line}); give it once")
            return super().construct_mapping(node, deep=deep)

    return BoundedLoader


class _Duplicate(Exception):
    pass


_LOADER: Any = None


def _yaml(text: str, where: str) -> Any:
    import yaml

    global _LOADER
    if _LOADER is None:
        _LOADER = _loader_class()
    loader = _LOADER(text)
    try:
        try:
            node = loader.get_single_node()
        except yaml.YAMLError as exc:
            if "maximum nesting depth" in str(exc):  # libyaml's own bound, past ours
                raise InputError(_too_deep(where)) from None
            raise _NotYaml(f"{where} is not valid YAML: {_yaml_problem(exc)}") from None
        except RecursionError:
            raise InputError(_too_deep(where)) from None
        if node is None:
            return None
        _check_graph(node, where)
        try:
            return loader.construct_document(node)
        except _Duplicate as exc:
            raise InputError(f"{where}: {exc}") from None
        except yaml.YAMLError as exc:
            raise _NotYaml(f"{where} is not valid YAML: {_yaml_problem(exc)}") from None
        except (ValueError, OverflowError, TypeError) as exc:  # e.g. 5,000-digit integers
            raise InputError(f"{where}: a value cannot be read: {_cut(str(exc))}") from None
    finally:
        loader.dispose()


def _cut(text: str, limit: int = 120) -> str:
    """One line of at most ``limit`` characters."""
    text = " ".join(text[: limit * 4].split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _yaml_problem(exc: Any) -> str:
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or ["syntax error"])[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return _cut(str(problem)) + where


def _check_graph(root: Any, where: str) -> None:
    """Depth and expanded size of YAML's node graph (an alias is a shared node: each
    node's expanded size is counted once and reused), and no node inside itself."""
    import yaml

    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            on_path.discard(key)
            children = _children(node)
            size[key] = 1 + sum(size[id(c)] for c in children)
            depth[key] = 1 + max((depth[id(c)] for c in children), default=0)
            if size[key] > MAX_NODES:
                raise InputError(_too_big(where))
            if depth[key] > MAX_DEPTH:  # mappings and lists, one level each
                raise InputError(_too_deep(where))
            continue
        if key in size:
            continue
        if key in on_path:
            raise InputError(f"{where}: an alias refers to a node that contains it")
        if isinstance(node, yaml.ScalarNode):
            size[key], depth[key] = 1, 0
            continue
        on_path.add(key)
        stack.append((node, True))
        for child in _children(node):
            if id(child) in on_path:
                raise InputError(f"{where}: an alias refers to a node that contains it")
            if id(child) not in size:
                stack.append((child, False))


def _children(node: Any) -> list[Any]:
    import yaml

    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []
