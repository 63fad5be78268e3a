"""The pieces of the RLlib mapping table: what one RLlib key becomes.

Each RLlib key is one :class:`Rule`: its spellings across RLlib's eras, a handler
that turns the key's value into an :data:`Outcome`, and two strings for the
table in ``docs/rllib.md`` (``to``: the apex_dask side, ``how``: the meaning
converted or why the key is ignored or refused). A handler sees the whole
effective RLlib config (RLlib's defaults for the algorithm, with the file on top)
through :class:`Ctx`, so a key whose meaning depends on another one (the noise
ladder on ``num_workers``, ``tau`` on ``target_network_update_freq``) is
converted once, the same way from each key involved.

Outcomes:

* :class:`Mapped`: apex_dask keys and values (none: the value changes nothing);
* :class:`Ignored`: no effect in apex_dask, and why (Ray's own machinery, a key
  RLlib itself did not use in Ape-X);
* :class:`Refused`: apex_dask cannot do what the value asks; why, in one line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Ctx",
    "Ignored",
    "Mapped",
    "Outcome",
    "Refused",
    "Rule",
    "SampledDependency",
    "group",
    "ignore",
    "noop",
    "only",
    "refuse",
    "to",
]


@dataclass(frozen=True)
class Mapped:
    """The value becomes ``targets`` (apex_dask dotted keys); ``note`` says how."""

    targets: dict[str, Any] = field(default_factory=dict)
    note: str = ""
    sweep: dict[str, Any] = field(default_factory=dict)
    """A Tune sampler's apex-dask-sweep distribution (apex_dask key -> distribution)."""


@dataclass(frozen=True)
class Ignored:
    why: str


@dataclass(frozen=True)
class Refused:
    """Not honoured: ``why``. ``fallback``: what ``--rllib-lenient`` does instead of
    leaving the key out (None: left out)."""

    why: str
    fallback: Mapped | None = None


Outcome = Mapped | Ignored | Refused


class SampledDependency(Exception):
    """A handler needed a key that is a Tune sampler (its value is not one value)."""

    def __init__(self, concept: str) -> None:
        super().__init__(concept)
        self.concept = concept


@dataclass
class Ctx:
    """What a handler may know besides its own value."""

    algo: str
    era: str
    image: bool
    """The env's observations are Atari frames (the conv net; ``model.fcnet_*`` unused)."""
    values: dict[str, Any]
    """Concept -> effective RLlib value (the file's, else RLlib's default)."""
    given: set[str]
    """Concepts the file sets."""
    sampled: set[str] = field(default_factory=set)
    action_half_range: float | None = None
    """Half the width of the env's action bounds (DDPG: absolute noise -> half ranges);
    None when unknown or when the bounds differ between dimensions."""

    @property
    def ddpg(self) -> bool:
        return self.algo == "APEX_DDPG"

    def value(self, concept: str, default: Any = None) -> Any:
        if concept in self.sampled:
            raise SampledDependency(concept)
        return self.values.get(concept, default)

    def has(self, concept: str) -> bool:
        return concept in self.given


Handler = Callable[[Any, Ctx], Outcome]


@dataclass(frozen=True)
class Rule:
    """RLlib keys handled alike. ``same``: the keys are one key's spellings in other
    eras (``keys[0]`` names it); else a group of distinct keys sharing a handler."""

    keys: tuple[str, ...]
    handle: Handler
    to: str
    how: str = ""
    algos: tuple[str, ...] = ("APEX", "APEX_DDPG")
    same: bool = True

    def concept(self, key: str) -> str:
        """The name ``key`` goes by in :class:`Ctx` (its newest spelling)."""
        if not self.same or self.keys[0].endswith(".*"):
            return key
        return self.keys[0]


def rule(
    keys: str | Iterable[str],
    handle: Handler,
    to_: str,
    how: str = "",
    algos: tuple[str, ...] = ("APEX", "APEX_DDPG"),
) -> Rule:
    """One key (its spellings in RLlib's eras, newest first)."""
    ks = (keys,) if isinstance(keys, str) else tuple(keys)
    return Rule(ks, handle, to_, how, algos)


def group(
    keys: Iterable[str],
    handle: Handler,
    to_: str,
    how: str = "",
    algos: tuple[str, ...] = ("APEX", "APEX_DDPG"),
) -> Rule:
    """Distinct keys with one handler (e.g. Ray's machinery, ignored alike)."""
    return Rule(tuple(keys), handle, to_, how, algos, same=False)


# ---------------------------------------------------------------------------
# handler builders
# ---------------------------------------------------------------------------


def to(key: str, convert: Callable[[Any], Any] | None = None, note: str = "") -> Handler:
    """The value, converted by ``convert``, becomes ``key``."""

    def handle(value: Any, ctx: Ctx) -> Outcome:
        return Mapped({key: convert(value) if convert else value}, note)

    return handle


def ignore(why: str) -> Handler:
    return lambda value, ctx: Ignored(why)


def refuse(why: str) -> Handler:
    return lambda value, ctx: Refused(why)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def noop(ok: Iterable[Any], why_ok: str, why_not: str) -> Handler:
    """Values in ``ok`` change nothing here (``why_ok``); any other is refused (``why_not``)."""
    allowed = list(ok)

    def handle(value: Any, ctx: Ctx) -> Outcome:
        if any(_same(value, a) for a in allowed):
            return Mapped({}, why_ok)
        return Refused(why_not)

    return handle


def only(ok: Iterable[Any], why_not: str, then: Handler) -> Handler:
    """``then`` for values in ``ok``; refused otherwise."""
    allowed = list(ok)

    def handle(value: Any, ctx: Ctx) -> Outcome:
        if any(_same(value, a) for a in allowed):
            return then(value, ctx)
        return Refused(why_not)

    return handle


def number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def integer(value: Any) -> bool:
    return number(value) and float(value).is_integer()
