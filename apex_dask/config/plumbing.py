"""Dict <-> frozen-dataclass plumbing for the config tree, with typed, named errors.

Used by :mod:`apex_dask.config`: flattening nested YAML sections into dotted
keys, setting dotted keys, rebuilding the dataclass tree with every value
checked against its annotation, and reading field docstrings from source.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Iterable
from typing import Any

from apex_dask.config.errors import ConfigError

__all__ = ["ConfigError", "build", "coerce", "collect_docs", "flatten", "plain", "set_dotted"]


def plain(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple | list):
        return [plain(v) for v in obj]
    return obj


def flatten(
    root: Any,
    data: dict[str, Any],
    prefix: str = "",
    agent_section: Callable[[str], bool] = lambda name: False,
) -> dict[str, Any]:
    """Nested sections of ``root`` (a dataclass) and the top-level sections for which
    ``agent_section(name)`` holds (an agent's, named as the agent) -> dotted keys; other
    mappings stay values. A key given twice (``replay: {alpha: ..}`` and ``replay.alpha: ..``)
    is refused."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise ConfigError(f"config key {_shown(key)} must be a string")
        name = f"{prefix}{key}"
        if (
            isinstance(value, dict)
            and not prefix
            and not is_section(root, name)
            and agent_section(name)
        ):
            inner = {f"{key}.{k}": v for k, v in flatten(dict, value).items()}
        elif isinstance(value, dict) and name != "env.env_kwargs" and is_section(root, name):
            inner = flatten(root, value, name + ".")
        else:
            inner = {name: value}
        for dotted, v in inner.items():
            if dotted in flat:
                raise ConfigError(
                    f"config key {_shown(dotted)} is given twice (nested and dotted); give it once"
                )
            flat[dotted] = v
    return flat


def _shown(value: Any) -> str:
    from apex_dask.config.reader import shown

    return shown(value)


def _set_kwarg(kwargs: dict[str, Any], path: str, value: Any) -> None:
    """``env.env_kwargs.a.b``: ``kwargs["a"]["b"] = value`` (mappings made as needed)."""
    *heads, leaf = path.split(".")
    node = kwargs
    for i, head in enumerate(heads):
        child = node.setdefault(head, {})
        if not isinstance(child, dict):
            inner = ".".join(heads[: i + 1])
            raise ConfigError(
                f"env.env_kwargs.{inner} is {_shown(child)}, not a mapping: "
                f"env.env_kwargs.{path} cannot be set inside it"
            )
        node[head] = child = dict(child)
        node = child
    node[leaf] = value


def is_section(root: Any, dotted: str) -> bool:
    """Whether ``dotted`` names a nested dataclass section of ``root``."""
    cls: Any = root
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(cls):
            return False
        hints = typing.get_type_hints(cls)
        if part not in hints:
            return False
        cls = hints[part]
    return dataclasses.is_dataclass(cls)


def set_dotted(tree: dict[str, Any], key: str, value: Any, names: Iterable[str]) -> None:
    """Set ``key`` (dotted) in the nested ``tree``; unknown keys name a close match in ``names``."""
    if not isinstance(key, str):
        raise ConfigError(f"config key {_shown(key)} must be a string such as 'replay.alpha'")
    if key.startswith("env.env_kwargs."):
        if isinstance(value, str):
            from apex_dask.config.reader import parse_value

            value = parse_value(value, f"--set {key}")
        kwargs = tree["env"]["env_kwargs"]
        if not isinstance(kwargs, dict):
            raise ConfigError(
                f"env.env_kwargs is {_shown(kwargs)}, not a mapping: {key} cannot be set inside it"
            )
        _set_kwarg(kwargs, key[len("env.env_kwargs.") :], value)
        return
    parts = key.split(".")
    node: Any = tree
    for part in parts[:-1]:
        if not isinstance(node, dict) or not isinstance(node.get(part), dict):
            raise ConfigError(unknown_key(key, names))
        node = node[part]
    leaf = parts[-1]
    if not isinstance(node, dict) or leaf not in node:
        raise ConfigError(unknown_key(key, names))
    if isinstance(node[leaf], dict) and key != "env.env_kwargs":
        raise ConfigError(
            f"{key} is a section, not a value; set one of its fields, e.g. {key}.<field>"
        )
    node[leaf] = value


def unknown_key(key: str, names: Iterable[str]) -> str:
    """The one-line message for an unknown key, with the closest known one."""
    import difflib

    close = difflib.get_close_matches(key, names, n=1) if len(key) <= 100 else []
    hint = f"; did you mean {close[0]!r}?" if close else "; see `apex-dask-submit --list-keys`"
    return f"unknown config key {_shown(key)}{hint}"


def build(cls: Any, data: dict[str, Any], prefix: str, names: Iterable[str]) -> Any:
    """The dataclass tree ``cls`` from nested ``data``, each value checked by its annotation."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        name = f"{prefix}{f.name}"
        if f.name not in data:
            continue
        tp = hints[f.name]
        value = data[f.name]
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise ConfigError(f"{name} must be a section (mapping), got {_shown(value)}")
            kwargs[f.name] = build(tp, value, name + ".", names)
        else:
            kwargs[f.name] = coerce(name, value, tp)
    unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ConfigError(unknown_key(prefix + sorted(unknown)[0], names))
    return cls(**kwargs)


def coerce(name: str, value: Any, tp: Any) -> Any:
    """Parse strings as YAML scalars, then check/convert against the annotation."""
    if isinstance(value, str) and tp is not str and tp != (str | None):
        from apex_dask.config.reader import parse_value

        value = parse_value(value, f"--set {name}")
    if isinstance(value, str) and tp in (int, float, int | None, float | None):
        try:  # YAML 1.1 reads 1e12 and nan as strings; numbers are meant
            value = float(value)
        except ValueError:
            pass
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return coerce(name, value, inner[0])
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{name}={_shown(value)} is invalid: must be true or false")
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{name}={_shown(value)} is invalid: must be an integer")
        if isinstance(value, float) and not value.is_integer():
            raise ConfigError(f"{name}={_shown(value)} is invalid: must be an integer")
        return int(value)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{name}={_shown(value)} is invalid: must be a number")
        try:
            number = float(value)
        except OverflowError:
            number = math.inf
        if not math.isfinite(number):
            raise ConfigError(f"{name}={_shown(value)} is invalid: must be a finite number")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name}={_shown(value)} is invalid: must be a string")
        return value
    if origin is tuple:
        if isinstance(value, int) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, list | tuple):
            raise ConfigError(
                f"{name}={_shown(value)} is invalid: must be a list of integers, e.g. [256, 256]"
            )
        return tuple(coerce(name, v, args[0]) for v in value)
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{name}={_shown(value)} is invalid: must be a mapping")
        bad = [k for k in value if not isinstance(k, str)]
        if bad:
            raise ConfigError(f"{name} key {_shown(bad[0])} is invalid: keys must be strings")
        return dict(value)
    return value


def collect_docs(module: Any, root_name: str, *more: Any) -> dict[str, str]:
    """Dotted field name -> its attribute docstring, read from the source of ``module``
    (and of ``more`` modules holding sections)."""
    import ast
    import inspect

    docs: dict[str, str] = {}
    classes = {
        node.name: node
        for mod in (module, *more)
        for node in ast.parse(inspect.getsource(mod)).body
        if isinstance(node, ast.ClassDef)
    }

    def walk(cls_name: str, prefix: str) -> None:
        node = classes[cls_name]
        body = node.body
        for i, stmt in enumerate(body):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                fname = stmt.target.id
                doc = ""
                if i + 1 < len(body) and isinstance(body[i + 1], ast.Expr):
                    val = body[i + 1].value
                    if isinstance(val, ast.Constant) and isinstance(val.value, str):
                        doc = " ".join(val.value.split())
                ann = ast.unparse(stmt.annotation)
                if ann in classes:
                    walk(ann, f"{prefix}{fname}.")
                else:
                    docs[f"{prefix}{fname}"] = doc

    walk(root_name, "")
    return docs
