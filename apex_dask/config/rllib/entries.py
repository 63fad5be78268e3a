"""An RLlib experiment as the converter's entries: one ``(key, value)`` per RLlib key,
sections walked (``model.fcnet_hiddens``), ``env_config`` down to its nested Tune
samplers, the stop conditions and Tune's experiment keys; and how values are shown.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from apex_dask.config.rllib.files import Experiment
from apex_dask.config.rllib.registry import SECTIONS
from apex_dask.config.rllib.samplers import nested, sampler_of

__all__ = ["CONFIG_ENV", "file_entries", "same", "show", "type_problem"]


def show(value: Any, limit: int = 70) -> str:
    """A value as the table prints it (YAML-like, one line, cut at ``limit`` characters
    without turning the rest into text)."""
    from apex_dask.config.reader import shown

    if isinstance(value, str):
        text = " ".join(value[: limit * 2].split())
        return text if len(text) <= limit else text[: limit - 3] + "..."
    if isinstance(value, float):
        return f"{value:g}"
    return shown(value, limit, json_style=True)


def same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


_EXPONENT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def _number(value: Any) -> Any:
    """``1e-4`` as YAML 1.1 reads it (a string) -> the number it means; lists alike."""
    if isinstance(value, str) and _EXPONENT.match(value):
        return float(value)
    if isinstance(value, list):
        return [_number(v) for v in value]
    return value


def file_entries(exp: Experiment) -> list[tuple[str, Any]]:
    return [(k, _number(v)) for k, v in _raw_entries(exp)]


def _raw_entries(exp: Experiment) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    if exp.env is not None:
        out.append(("env", exp.env))
    for key, value in exp.config.items():
        key = str(key)
        if key == "env" and exp.env is not None:
            if not same(value, exp.env):  # Tune moves the experiment's env into config
                out.append((CONFIG_ENV, value))
            continue
        if key in SECTIONS and value is None:
            continue  # an empty section
        if key in SECTIONS and isinstance(value, Mapping) and sampler_of(value) is None:
            for k, v in value.items():
                out.extend(_split(f"{key}.{k}", v) if key == "env_config" else [(f"{key}.{k}", v)])
        else:
            out.append((key, value))
    out.extend((f"stop.{k}", v) for k, v in exp.stop.items())
    out.extend((str(k), v) for k, v in exp.tune.items())
    return out


CONFIG_ENV = "config.env"
"""The row of a ``config.env`` that the experiment-level ``env`` overrides."""


def _split(key: str, value: Any) -> list[tuple[str, Any]]:
    """``env_config`` keys whose values hold Tune samplers deeper down, one entry per
    nested key (``env_config.opts.a``: ``env.env_kwargs.opts.a``), so each sampler is
    its own sweep dimension."""
    if isinstance(value, Mapping) and sampler_of(value) is None and nested(value):
        return [e for k, v in value.items() for e in _split(f"{key}.{k}", v)]
    return [(key, value)]


def type_problem(targets: dict[str, Any]) -> str | None:
    """Why a converted value does not fit its apex_dask key's type (a whole number for
    an integer key, a number for a float key), named by the RLlib key's row."""
    import types
    import typing

    from apex_dask.config.rllib.rules import integer, number
    from apex_dask.config.tree import key_annotation

    for key, value in targets.items():
        tp = key_annotation(key)
        kind = tp
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            args = typing.get_args(tp)
            if value is None and type(None) in args:
                continue
            kind = next(a for a in args if a is not type(None))
        if kind is int and not integer(value):
            return f"give a whole number, not {show(value)}"
        if kind is float and not number(value):
            return f"give a number, not {show(value)}"
    return None
