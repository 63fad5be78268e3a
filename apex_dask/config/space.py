"""Search spaces over config keys: a plain mapping in, a typed, checked space out.

::

    space = parse_space(
        {
            "dqn.lr": {"loguniform": [3e-5, 1e-3]},
            "replay.alpha": {"uniform": [0.4, 0.7]},
            "learner.n_step": {"int": [1, 5]},
            "dqn.hiddens": {"choice": [[64], [128, 128]]},
            "learner.batch_size": {"grid": [32, 64]},
        },
        ApexConfig.preset("cartpole"),
    )
    space.grid_points()          # [{"learner.batch_size": 32}, {"learner.batch_size": 64}]
    cfg = base.override(space.overrides(params))   # params as a sampler chose them

Each key maps to exactly one distribution:

======================  ==================================================
``{grid: [a, b, ...]}``  every value is run (with ``--trials`` a multiple of
                         the grid, each point as often)
``{choice: [a, ...]}``   one value, chosen by the sampler
``{uniform: [lo, hi]}``  a float in [lo, hi] (``step: s``, or ``log: true``:
                         the same as loguniform)
``{loguniform: [lo, hi]}`` a float in [lo, hi] on a log scale (lo > 0)
``{int: [lo, hi]}``      an integer in [lo, hi] (``step: k`` or ``log: true``)
======================  ==================================================

Keys are dotted (``dqn.lr``) or nested sections (``dqn: {lr: ...}``).
Everything is checked against ``base`` before anything runs: an unknown key,
a distribution that does not fit the key's type (``uniform`` on a string), an
empty range, a choice outside the key's allowed values (each value and each
range end is set on ``base`` and the config's own checks run). Every problem
is one :class:`SpaceError` line naming the key and the fix. This module is
pure (no sampler library): the sweep command and any other front end (a Tune
``grid_search`` translated) build the same :class:`SearchSpace`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from apex_dask.algo.agents.registry import is_agent
from apex_dask.config.plumbing import ConfigError, flatten, unknown_key
from apex_dask.config.reader import shown
from apex_dask.config.renames import route

__all__ = [
    "KINDS",
    "Choice",
    "FloatRange",
    "IntRange",
    "Param",
    "SearchSpace",
    "SpaceError",
    "parse_space",
]

KINDS = ("grid", "choice", "uniform", "loguniform", "int")
"""The distributions a key may have."""

_EXAMPLE = "e.g. dqn.lr: {loguniform: [1.0e-4, 1.0e-2]}"
_SCALARS = (str, int, float, bool, type(None))


class SpaceError(ConfigError):
    """A search space that cannot be run; the message is one line naming the key and fix."""


@dataclass(frozen=True)
class Choice:
    """``grid`` (every value is run) or ``choice`` (the sampler picks one)."""

    key: str
    values: tuple[Any, ...]
    grid: bool = False

    @property
    def kind(self) -> str:
        return "grid" if self.grid else "choice"

    def encoded(self) -> tuple[Any, ...]:
        """The values as a sampler stores them: scalars as they are, lists and
        mappings as their JSON text (samplers keep only scalars)."""
        return tuple(_encode(v) for v in self.values)

    def decode(self, value: Any) -> Any:
        for raw in self.values:
            if _encode(raw) == value:
                return raw
        raise SpaceError(
            f"{self.key}: {shown(value)} is not one of its values {shown(list(self.values))}"
        )


@dataclass(frozen=True)
class FloatRange:
    """``uniform`` or ``loguniform`` (``log``): a float in ``[low, high]``."""

    key: str
    low: float
    high: float
    log: bool = False
    step: float | None = None

    @property
    def kind(self) -> str:
        return "loguniform" if self.log else "uniform"


@dataclass(frozen=True)
class IntRange:
    """``int``: an integer in ``[low, high]`` (every ``step``-th, or on a log scale)."""

    key: str
    low: int
    high: int
    step: int = 1
    log: bool = False

    @property
    def kind(self) -> str:
        return "int"


Param = Choice | FloatRange | IntRange


@dataclass(frozen=True)
class SearchSpace:
    """The checked space: one :data:`Param` per config key, in the file's order."""

    params: tuple[Param, ...]

    @property
    def keys(self) -> list[str]:
        return [p.key for p in self.params]

    @property
    def grid(self) -> list[Choice]:
        return [p for p in self.params if isinstance(p, Choice) and p.grid]

    @property
    def only_grid(self) -> bool:
        """Every key is a grid: the sweep is exactly the grid's points."""
        return len(self.grid) == len(self.params)

    def grid_points(self) -> list[dict[str, Any]]:
        """Every combination of the grid keys' values (encoded), in the file's order."""
        grid = self.grid
        if not grid:
            return []
        combos = itertools.product(*(p.encoded() for p in grid))
        return [dict(zip([p.key for p in grid], combo, strict=True)) for combo in combos]

    def overrides(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """Config overrides (dotted key -> value) for values as a sampler returned them."""
        out = {}
        for p in self.params:
            value = params[p.key]
            out[p.key] = p.decode(value) if isinstance(p, Choice) else value
        return out

    def describe(self) -> list[str]:
        """One short line per key, e.g. ``dqn.lr: loguniform [3e-05, 0.001]``."""
        lines = []
        for p in self.params:
            if isinstance(p, Choice):
                lines.append(f"{p.key}: {p.kind} {list(p.values)}")
            else:
                extra = f" step {p.step}" if p.step not in (None, 1) else ""
                extra += " log" if isinstance(p, IntRange) and p.log else ""
                lines.append(f"{p.key}: {p.kind} [{p.low:g}, {p.high:g}]{extra}")
        return lines


def _encode(value: Any) -> Any:
    if isinstance(value, _SCALARS):
        return value
    return json.dumps(value, sort_keys=True)


# ---------------------------------------------------------------------------
# parsing
# ---------------------------------------------------------------------------


def parse_space(space: Any, base: Any, *, where: str = "space") -> SearchSpace:
    """The typed :class:`SearchSpace` for ``space`` (a mapping, as read from YAML), every
    key and value checked against ``base`` (an :class:`~apex_dask.config.ApexConfig`).
    ``where`` starts each error line (e.g. the file's name). Raises :class:`SpaceError`."""
    if not isinstance(space, Mapping) or not space:
        raise SpaceError(f"{where}: must map config keys to distributions, {_EXAMPLE}")
    flat = _flatten(type(base), space, "", where, is_agent)
    try:  # keys that moved to the agent's section; another agent's keys are refused
        moved = dict(route({k: v for k, v in flat.items() if k != "algo"}, base.algo, saved=False))
    except ConfigError as exc:
        raise SpaceError(f"{where}: {exc}") from None
    flat = {"algo": flat["algo"], **moved} if "algo" in flat else moved
    names = list(base.field_docs())
    params = tuple(_param(key, spec, base, names, where) for key, spec in flat.items())
    return SearchSpace(params)


def _flatten(
    root: Any, data: Mapping[str, Any], prefix: str, where: str, is_agent: Any
) -> dict[str, Any]:
    """Nested sections (and an agent's, named as the agent) to dotted keys, as a config
    file's (a key given twice refused)."""

    def dicts(value: Any) -> Any:
        return {k: dicts(v) for k, v in value.items()} if isinstance(value, Mapping) else value

    try:
        return flatten(root, dicts(data), prefix, agent_section=is_agent)
    except ConfigError as exc:
        raise SpaceError(f"{where}: {exc}") from None


def _base_kind(tp: Any) -> Any:
    """``int | None`` -> ``int``; other annotations as they are."""
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if typing.get_origin(tp) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return args[0] if len(args) == 1 else tp
    return tp


def _param(key: str, spec: Any, base: Any, names: list[str], where: str) -> Param:
    at = f"{where}: {key}"
    tp = base.key_type(key)
    if key.startswith("env.env_kwargs."):
        tp = Any
    elif tp is None:
        raise SpaceError(f"{where}: {unknown_key(key, names)}")
    elif dataclasses.is_dataclass(tp):
        raise SpaceError(f"{at} is a section; give one of its fields, e.g. {key}.<field>")
    kinds = [k for k in KINDS if isinstance(spec, Mapping) and k in spec]
    if len(kinds) != 1:
        what = "a fixed value" if not isinstance(spec, Mapping) else shown(dict(spec))
        raise SpaceError(
            f"{at}: {what} is not a distribution; give exactly one of "
            f"{', '.join(KINDS)}, {_EXAMPLE} (fixed values go under base: set:)"
        )
    kind = kinds[0]
    allowed = {kind, "step", "log"} if kind in ("int", "uniform") else {kind}
    extra = sorted(set(spec) - allowed)
    if extra:
        raise SpaceError(
            f"{at}: {kind} takes no option {shown(extra[0])} (allowed: {sorted(allowed)})"
        )
    base_tp = _base_kind(tp)
    if kind in ("grid", "choice"):
        return _choice(at, key, kind, spec[kind], base)
    numeric = {"uniform": (float,), "loguniform": (float,), "int": (int, float)}[kind]
    if base_tp is not Any and base_tp not in numeric:
        what = _type_name(base_tp)
        fix = "int: [lo, hi]" if base_tp is int else "choice: [...]"
        raise SpaceError(f"{at} is {what}: {kind} does not fit it; use {{{fix}}}")
    low, high = _bounds(at, kind, spec[kind])
    if kind == "int":
        step, log = spec.get("step", 1), spec.get("log", False)
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise SpaceError(f"{at}: int step {shown(step)} must be an integer >= 1")
        if not isinstance(log, bool) or (log and step != 1) or (log and low < 1):
            raise SpaceError(f"{at}: int log must be true or false, with lo >= 1 and no step")
        param: Param = IntRange(key, int(low), int(high), int(step), log)
    else:
        step, log = spec.get("step"), spec.get("log", False)
        if step is not None and (
            isinstance(step, bool) or not isinstance(step, int | float) or not 0 < step
        ):
            raise SpaceError(f"{at}: uniform step {shown(step)} must be a number > 0")
        if not isinstance(log, bool) or (log and step is not None) or (log and low <= 0):
            raise SpaceError(
                f"{at}: uniform log must be true or false, with lo > 0 and no step "
                f"(got log {shown(log)}, [{low:g}, {high:g}])"
            )
        log = log or kind == "loguniform"
        param = FloatRange(key, float(low), float(high), log, step)
    for end in (param.low, param.high):
        _check_value(at, key, end, base, "range end")
    return param


def _type_name(tp: Any) -> str:
    if tp is str:
        return "a string"
    if tp is bool:
        return "true/false"
    if tp is int:
        return "an integer"
    if typing.get_origin(tp) is tuple:
        return "a list"
    if tp is dict or typing.get_origin(tp) is dict:
        return "a mapping"
    return getattr(tp, "__name__", str(tp))


def _bounds(at: str, kind: str, value: Any) -> tuple[float, float]:
    ok = (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
    )
    if ok and kind == "int":
        ok = all(float(v).is_integer() for v in value)
    if not ok:
        what = "two integers" if kind == "int" else "two numbers"
        raise SpaceError(f"{at}: {kind} needs [lo, hi], {what}, got {shown(value)}")
    low, high = value
    if not (math.isfinite(low) and math.isfinite(high)):
        raise SpaceError(f"{at}: {kind} bounds must be finite, got {shown(value)}")
    if not low < high:
        raise SpaceError(
            f"{at}: {kind} range [{low:g}, {high:g}] is empty (lo must be below hi); "
            "for one value put it under base: set:"
        )
    if kind == "loguniform" and low <= 0:
        raise SpaceError(f"{at}: loguniform needs lo > 0, got [{low:g}, {high:g}]; use uniform")
    return low, high


def _choice(at: str, key: str, kind: str, values: Any, base: Any) -> Choice:
    if not isinstance(values, list | tuple) or not values:
        raise SpaceError(f"{at}: {kind} needs a non-empty list of values, got {shown(values)}")
    seen = []
    for v in values:
        if _encode(v) in seen:
            raise SpaceError(f"{at}: {kind} lists {shown(v)} twice; give each value once")
        seen.append(_encode(v))
        _check_value(at, key, v, base, f"{kind} value")
    return Choice(key, tuple(values), grid=kind == "grid")


def _check_value(at: str, key: str, value: Any, base: Any, what: str) -> None:
    """``value`` set on ``base`` passes the config's own checks (else one line)."""
    try:
        base.override({key: value})
    except ConfigError as exc:
        msg = " ".join(str(exc).split())
        raise SpaceError(f"{at}: {what} {shown(value)} is not allowed: {msg}") from None
