"""Tune's search-space values in an RLlib file, as apex-dask-sweep distributions.

In a YAML experiment file a value may be ``{grid_search: [a, b]}`` (every value is
run) or one of Tune's samplers written the same way::

    {choice: [a, b]}          -> {choice: [a, b]}
    {uniform: [lo, hi]}       -> {uniform: [lo, hi]}
    {quniform: [lo, hi, q]}   -> {uniform: [lo, hi], step: q}
    {loguniform: [lo, hi]}    -> {loguniform: [lo, hi]}
    {randint: [lo, hi]}       -> {int: [lo, hi - 1]}   (Tune's upper bound is exclusive)
    {qrandint: [lo, hi, q]}   -> {int: [lo, hi], step: q}
    {lograndint: [lo, hi]}    -> {int: [lo, hi - 1], log: true}

``randn``, ``qrandn``, ``qloguniform``, ``sample_from`` and ``eval`` have no
counterpart and are refused by name. Values of a grid or choice are converted one
by one like any value of the key; a range must be one the key takes as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["MAX_COMBINATIONS", "TUNE_SAMPLERS", "Sampler", "expand_nested", "nested", "sampler_of"]

MAX_COMBINATIONS = 1000
"""Most whole values a value's nested grid_search / choice expand to."""

TUNE_SAMPLERS = (
    "grid_search",
    "choice",
    "uniform",
    "quniform",
    "loguniform",
    "qloguniform",
    "randint",
    "qrandint",
    "lograndint",
    "qlograndint",
    "randn",
    "qrandn",
    "sample_from",
    "eval",
)
_NO_COUNTERPART = ("qloguniform", "qlograndint", "randn", "qrandn", "sample_from", "eval")


def _num(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


@dataclass(frozen=True)
class Sampler:
    """One Tune sampler as written: ``kind`` and its argument."""

    kind: str
    arg: Any

    def __str__(self) -> str:
        return f"{self.kind} {self.arg!r}"

    @property
    def discrete(self) -> bool:
        return self.kind in ("grid_search", "choice")

    def problem(self) -> str | None:
        """Why it cannot become a sweep distribution (None: it can)."""
        if self.kind in _NO_COUNTERPART:
            return f"Tune's {self.kind} has no apex-dask-sweep counterpart; list the values as grid_search"
        a = self.arg
        if self.discrete:
            if not isinstance(a, list) or not a:
                return f"{self.kind} needs a non-empty list of values"
            return None
        want = 3 if self.kind in ("quniform", "qrandint") else 2
        if not (isinstance(a, list) and len(a) in (want, want + 1) and all(_num(x) for x in a)):
            return f"Tune's {self.kind} needs [lo, hi{', q' if want == 3 else ''}]"
        return None

    def candidates(self) -> list[Any]:
        """Values to convert: every value, or a range's ends and middle (none for a
        sampler with a :meth:`problem`: its own row is refused)."""
        if self.problem():
            return []
        if self.discrete:
            return list(self.arg)
        lo, hi = self.arg[0], self.arg[1]
        if self.kind in ("randint", "lograndint"):
            hi = hi - 1
        mid = (lo + hi) / 2 if self.kind not in ("randint", "qrandint", "lograndint") else lo
        return [lo, hi, mid]

    def distribution(self, values: list[Any]) -> dict[str, Any]:
        """The apex-dask-sweep distribution over converted ``values`` (``candidates``' order)."""
        if self.kind == "grid_search":
            return {"grid": values}
        if self.kind == "choice":
            return {"choice": values}
        lo, hi = values[0], values[1]
        if self.kind == "uniform":
            return {"uniform": [lo, hi]}
        if self.kind == "quniform":
            return {"uniform": [lo, hi], "step": self.arg[2]}
        if self.kind == "loguniform":
            return {"loguniform": [lo, hi]}
        if self.kind == "randint":
            return {"int": [int(lo), int(hi)]}
        if self.kind == "qrandint":
            return {"int": [int(lo), int(hi)], "step": int(self.arg[2])}
        return {"int": [int(lo), int(hi)], "log": True}  # lograndint


def sampler_of(value: Any) -> Sampler | None:
    """The Tune sampler ``value`` is (a one-key mapping naming one), else None."""
    if isinstance(value, Mapping) and len(value) == 1:
        ((kind, arg),) = value.items()
        if kind in TUNE_SAMPLERS:
            return Sampler(str(kind), arg)
    return None


def nested(value: Any) -> list[tuple[tuple[Any, ...], Sampler]]:
    """The Tune samplers inside ``value`` (below it, at any depth), with their paths."""
    found: list[tuple[tuple[Any, ...], Sampler]] = []
    stack: list[tuple[tuple[Any, ...], Any]] = []
    if isinstance(value, Mapping):
        stack = [((k,), v) for k, v in value.items()]
    elif isinstance(value, list):
        stack = [((i,), v) for i, v in enumerate(value)]
    while stack:
        path, v = stack.pop()
        sampler = sampler_of(v)
        if sampler is not None:
            found.append((path, sampler))
        elif isinstance(v, Mapping):
            stack.extend(((*path, k), x) for k, x in v.items())
        elif isinstance(v, list):
            stack.extend(((*path, i), x) for i, x in enumerate(v))
    return sorted(found, key=lambda item: [str(p) for p in item[0]])


def _put(value: Any, path: tuple[Any, ...], new: Any) -> Any:
    """A copy of ``value`` with the item at ``path`` replaced by ``new``."""
    if not path:
        return new
    head, rest = path[0], path[1:]
    if isinstance(value, Mapping):
        return {k: (_put(v, rest, new) if k == head else v) for k, v in value.items()}
    return [(_put(v, rest, new) if i == head else v) for i, v in enumerate(value)]


def expand_nested(value: Any) -> Sampler | str:
    """``value``, holding Tune samplers below its top, as one sampler over whole values:
    nested ``grid_search`` es become one grid over every combination (the variants Tune
    runs), nested ``choice`` s one choice over every combination (the same draws); or why
    it cannot (a string)."""
    import itertools

    inner = nested(value)
    kinds = {s.kind for _, s in inner}
    where = ", ".join(".".join(map(str, path)) for path, _ in inner[:3])
    if not kinds <= {"grid_search", "choice"}:
        kind = sorted(kinds - {"grid_search", "choice"})[0]
        return (
            f"Tune's {kind} at {where} inside the value: apex-dask-sweep varies whole keys; "
            "list that value's options as grid_search or choice"
        )
    if len(kinds) > 1:
        return f"grid_search and choice mixed inside one value (at {where}); use one of them"
    for _, sampler in inner:
        problem = sampler.problem()
        if problem:
            return f"at {where}: {problem}"
    count = 1
    for _, sampler in inner:
        count *= len(sampler.arg)
    if count > MAX_COMBINATIONS:
        return f"its nested {kinds.pop()} lists make {count:,} combinations (at most {MAX_COMBINATIONS:,})"
    values = []
    for combo in itertools.product(*(s.arg for _, s in inner)):
        whole = value
        for (path, _), pick in zip(inner, combo, strict=True):
            whole = _put(whole, path, pick)
        values.append(whole)
    return Sampler(kinds.pop(), values)
