"""One RLlib experiment converted: every key looked up in the table, RLlib's defaults
for the keys the file leaves out, Tune samplers turned into a sweep space.

::

    conv = convert(experiment, lenient=False, action_half_range=2.0)
    conv.refusals        # one line per key apex_dask cannot honour (exit 2 unless lenient)
    conv.warnings        # with lenient=True: one line per key left out or converted otherwise
    conv.rows            # the table: each key, its value, what it became
    conv.config()        # the ApexConfig (no samplers), or the sweep's base
    conv.space           # apex-dask-sweep distributions ({} without Tune samplers)

Nothing is dropped silently: a key is mapped, ignored with its reason, or refused;
an RLlib default apex_dask does not reproduce is listed in ``not_reproduced``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from apex_dask.config.rllib.entries import (
    CONFIG_ENV,
    file_entries,
    same,
    show,
    type_problem,
)
from apex_dask.config.rllib.files import TUNE_EXPERIMENT_KEYS, Experiment, RLlibError
from apex_dask.config.rllib.registry import (
    RULES,
    SECTIONS,
    defaults,
    era_of,
    find_rule,
    spelling,
)
from apex_dask.config.rllib.rules import (
    Ctx,
    Ignored,
    Mapped,
    Outcome,
    Refused,
    Rule,
    SampledDependency,
)
from apex_dask.config.rllib.rules_env import env_config_handler, env_image
from apex_dask.config.rllib.samplers import Sampler, expand_nested, nested, sampler_of

__all__ = ["Conversion", "Row", "convert", "show"]


@dataclass(frozen=True)
class Row:
    """One line of the table: an RLlib key, its value and what became of it."""

    key: str
    value: Any
    outcome: Outcome
    default: bool = False
    """An RLlib default for a key the file leaves out."""
    lenient: bool = False
    """Refused, and ``--rllib-lenient`` went on (its fallback, or without the key)."""


@dataclass
class Conversion:
    experiment: Experiment
    era: str
    era_why: str
    rows: list[Row] = field(default_factory=list)
    overrides: dict[str, Any] = field(default_factory=dict)
    space: dict[str, Any] = field(default_factory=dict)
    trials: int = 1
    refusals: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    not_reproduced: list[str] = field(default_factory=list)
    sampled: list[str] = field(default_factory=list)
    """The RLlib keys whose values are Tune samplers (the sweep's space)."""

    def config(self) -> Any:
        """The apex_dask config (a sweep's base: the sampled keys at their defaults)."""
        from apex_dask.config.plumbing import ConfigError
        from apex_dask.config.tree import ApexConfig

        try:
            return ApexConfig().override(self.overrides)
        except ConfigError as exc:
            e = self.experiment
            raise RLlibError(
                f"{e.source}: experiment {e.name!r} converts to an invalid apex_dask config: "
                f"{' '.join(str(exc).split())}"
            ) from None


@dataclass(frozen=True)
class _Entry:
    key: str
    value: Any
    rule: Rule | None
    concept: str | None


def _call(entry: _Entry, value: Any, ctx: Ctx) -> Outcome:
    """The entry's handler on ``value``; a value of a shape the handler cannot take (a
    string for a number, ...) is refused in one line, never an exception."""
    try:
        return _handler(entry)(value, ctx)
    except SampledDependency:
        raise
    except (TypeError, ValueError, ArithmeticError, AttributeError, KeyError, IndexError):
        return Refused(f"{show(value)} is not a value RLlib's {entry.key} takes")


def _handler(entry: _Entry):
    if entry.key.startswith("env_config."):
        return env_config_handler(entry.key.split(".", 1)[1])
    assert entry.rule is not None
    return entry.rule.handle


class _Converter:
    def __init__(self, exp: Experiment, lenient: bool, half_range: float | None) -> None:
        self.exp, self.lenient = exp, lenient
        self.algo = exp.run
        entries = []
        self.nested_why: dict[str, str] = {}
        self.original: dict[str, Any] = {}
        for key, value in file_entries(exp):
            rule = find_rule(key)
            concept = None if rule is None else rule.concept(key)
            if sampler_of(value) is None and nested(value):
                whole = expand_nested(value)
                if isinstance(whole, str):
                    self.nested_why[key] = whole
                else:
                    self.original[key] = value
                    value = {whole.kind: whole.arg}
            entries.append(_Entry(key, value, rule, concept))
        self.entries = entries
        era, why = era_of({e.key for e in entries})
        self.conv = Conversion(exp, era, why)
        self.given: dict[str, _Entry] = {}
        self.clash: dict[str, str] = {}
        for e in entries:
            if e.concept is None or self.algo not in e.rule.algos:  # type: ignore[union-attr]
                continue
            first = self.given.get(e.concept)
            if first is None:
                self.given[e.concept] = e
            elif not same(first.value, e.value):
                self.clash[e.key] = (
                    f"{first.key} = {show(first.value)} is the same key, another era's spelling"
                )
        self.defaults = defaults(self.algo, era)
        dflt = {find_rule(k).concept(k): v for k, v in self.defaults.items()}  # type: ignore[union-attr]
        values = {**dflt, **{c: e.value for c, e in self.given.items()}}
        sampled = {c for c, e in self.given.items() if sampler_of(e.value)}
        env = values.get("env")
        if "env" in sampled:
            env = (sampler_of(env).candidates() or [None])[0]  # type: ignore[union-attr]
        self.ctx = Ctx(self.algo, era, env_image(env), values, set(self.given), sampled, half_range)
        self.merged: dict[str, tuple[Any, str]] = {}

    # -- evaluating one key ------------------------------------------------
    def _with(self, concept: str, value: Any) -> Ctx:
        return replace(
            self.ctx,
            values={**self.ctx.values, concept: value},
            sampled=self.ctx.sampled - {concept},
        )

    def _plain(self, entry: _Entry, value: Any, ctx: Ctx) -> Outcome:
        try:
            return _call(entry, value, ctx)
        except SampledDependency as dep:
            return self._follows(entry, value, dep.concept)

    def _follows(self, entry: _Entry, value: Any, concept: str) -> Outcome:
        """A key whose conversion reads a sampled key: fine if, for every sampled value,
        it sets nothing the sampled key's own conversion does not."""
        source = self.given[concept]
        sampler = sampler_of(source.value)
        assert sampler is not None
        for candidate in sampler.candidates():
            ctx = self._with(concept, candidate)
            try:
                mine = _call(entry, value, ctx)
                theirs = _call(source, candidate, ctx)
            except SampledDependency as dep:
                return Refused(f"depends on {source.key} and {dep.concept}, both Tune samplers")
            if isinstance(mine, Ignored):
                return mine
            ok = isinstance(mine, Mapped) and isinstance(theirs, Mapped)
            if not ok or any(
                k not in theirs.targets or not same(v, theirs.targets[k])  # type: ignore[union-attr]
                for k, v in mine.targets.items()  # type: ignore[union-attr]
            ):
                return Refused(
                    f"depends on {source.key}, a Tune {sampler.kind}; fix {source.key} to one value"
                )
        return Mapped({}, f"follows {source.key}'s {sampler.kind}")

    def _sampled(self, entry: _Entry, sampler: Sampler) -> tuple[Outcome, dict[str, Any]]:
        problem = sampler.problem()
        if problem:
            return Refused(problem), {}
        candidates = sampler.candidates()
        outs = []
        for candidate in candidates:
            try:
                outs.append(_call(entry, candidate, self._with(entry.concept, candidate)))  # type: ignore[arg-type]
            except SampledDependency as dep:
                return Refused(f"depends on {dep.concept}, also a Tune sampler"), {}
        for candidate, out in zip(candidates, outs, strict=True):
            if isinstance(out, Refused):
                return Refused(f"{show(candidate)}: {out.why}"), {}
        if any(isinstance(o, Ignored) for o in outs):
            if all(isinstance(o, Ignored) for o in outs):
                return outs[0], {}
            return Refused("some of its values are ignored and others not; list one value"), {}
        mapped: list[Mapped] = outs  # type: ignore[assignment]
        keys = list(dict.fromkeys(k for o in mapped for k in o.targets))
        first = mapped[0].targets
        constant = {
            k: first[k]
            for k in keys
            if all(k in o.targets and same(o.targets[k], first.get(k)) for o in mapped)
        }
        varying = [k for k in keys if k not in constant]
        if len(varying) > 1:
            return Refused(
                f"its values change {', '.join(varying)} together; apex-dask-sweep varies "
                "each key on its own: write one file per value"
            ), {}
        if not varying:
            return Mapped(constant, "every value converts alike"), {}
        key = varying[0]
        values = [o.targets.get(key) for o in mapped]
        if not sampler.discrete and not all(
            same(v, c) for v, c in zip(values, candidates, strict=True)
        ):
            return Refused(
                f"a Tune {sampler.kind} over a key that is converted ({key}); "
                "list the values as grid_search"
            ), {}
        dist = {key: sampler.distribution(values)}
        return Mapped(constant, f"Tune's {sampler.kind}", sweep=dist), dist

    # -- collecting ------------------------------------------------------
    def _merge(self, row: Row, targets: dict[str, Any]) -> None:
        for key, value in targets.items():
            if key in self.merged and not same(self.merged[key][0], value):
                other_value, other = self.merged[key]
                line = (
                    f"{row.key}={show(row.value)} sets {key} = {show(value)}, but {other} set it "
                    f"to {show(other_value)}"
                )
                (self.conv.warnings if self.lenient else self.conv.refusals).append(line)
                continue
            self.merged[key] = (value, row.key)

    def _record(self, row: Row) -> None:
        out = row.outcome
        if isinstance(out, Mapped) and not row.default:
            problem = type_problem(out.targets)
            if problem:
                row = replace(row, outcome=Refused(problem))
                out = row.outcome
        where = f"{row.key}={show(row.value)}"
        if isinstance(out, Refused):
            if row.default:
                self.conv.not_reproduced.append(f"{where}: {out.why}")
            elif self.lenient:
                row = replace(row, lenient=True)
                if out.fallback is not None:
                    self._merge(row, out.fallback.targets)
                    how = "converted as " + ", ".join(
                        f"{k} = {show(v)}" for k, v in out.fallback.targets.items()
                    )
                else:
                    how = "left out"
                self.conv.warnings.append(f"{where} {how} (--rllib-lenient): {out.why}")
            else:
                self.conv.refusals.append(f"{where}: {out.why}")
        elif isinstance(out, Mapped):
            self._merge(row, out.targets)
        self.conv.rows.append(row)

    def run(self) -> Conversion:
        if "env" not in self.given:
            raise RLlibError(
                f"{self.exp.source}: experiment {self.exp.name!r} has no env: give the gym id, "
                "e.g. env: CartPole-v0"
            )
        for entry in self.entries:
            shown_value = self.original.get(entry.key, entry.value)
            self._record(Row(entry.key, shown_value, self._outcome(entry)))
        for key, value in self.defaults.items():
            rule = find_rule(key)
            assert rule is not None, key
            concept = rule.concept(key)
            if concept in self.given:
                continue
            entry = _Entry(key, value, rule, concept)
            shown = spelling(key, self.conv.era)
            self._record(Row(shown, value, self._plain(entry, value, self.ctx), default=True))
        self.conv.overrides = {k: v for k, (v, _) in self.merged.items()}
        if self.algo == "APEX_DDPG":
            self.conv.overrides = {"algo": "dpg", **self.conv.overrides}
        self._trials()
        return self.conv

    def _outcome(self, entry: _Entry) -> Outcome:
        e = entry
        if e.key == CONFIG_ENV:
            return Ignored(
                f"the experiment-level env: {show(self.exp.env)} takes its place (Tune moves "
                "the experiment's env into config)"
            )
        if e.key in self.exp.tune and e.key not in TUNE_EXPERIMENT_KEYS:
            if e.rule is not None:
                return Refused(
                    "a config key next to run: at the experiment level, which Tune refuses "
                    "(no such experiment setting); move it under config:"
                )
            return Refused(
                "not a Tune experiment setting (Tune refuses it); the settings next to run: "
                "are Tune's (num_samples, checkpoint_freq, stop, config, ...)"
            )
        if e.key in self.nested_why:
            out = self._plain(e, e.value, self.ctx) if e.rule is not None else None
            if isinstance(out, Ignored):
                return out  # what the key holds does not matter
            return Refused(self.nested_why[e.key])
        if e.key in SECTIONS:
            if sampler_of(e.value) is not None:
                return Refused(f"a Tune sampler over the whole {e.key} section; sample its keys")
            return Refused("must be a mapping of keys")
        if e.rule is None:
            import difflib

            known = [k for r in RULES if self.algo in r.algos for k in r.keys]
            close = difflib.get_close_matches(e.key, known, n=1)
            hint = f"did you mean {close[0]}? " if close else ""
            return Refused(
                f"not a key of RLlib's {self.algo} that apex_dask knows (a typo, another "
                f"algorithm's key, or a newer one); {hint}the keys are listed in docs/rllib.md"
            )
        if self.algo not in e.rule.algos:
            return Refused(f"a key of {e.rule.algos[0]}; RLlib's {self.algo} does not read it")
        if e.key in self.clash:
            return Refused(self.clash[e.key])
        sampler = sampler_of(e.value)
        if sampler is None or self.given.get(e.concept) is not e:  # type: ignore[arg-type]
            return self._plain(e, e.value, self.ctx)
        out, dist = self._sampled(e, sampler)
        self.conv.space.update(dist)
        if dist:
            self.conv.sampled.append(e.key)
        return out

    def _trials(self) -> None:
        n = self.ctx.values.get("num_samples", 1)
        n = int(n) if isinstance(n, int) and n >= 1 else 1
        grid = 1
        for dist in self.conv.space.values():
            grid *= len(dist.get("grid", [None]))
        if not self.conv.space and n > 1:
            seed = int(self.conv.overrides.get("seed", 0))
            self.conv.space = {"seed": {"grid": list(range(seed, seed + n))}}
            self.conv.sampled.append("num_samples")
            self.conv.trials = n
        else:
            self.conv.trials = n * grid


def convert(
    exp: Experiment, *, lenient: bool = False, action_half_range: float | None = None
) -> Conversion:
    """Convert one experiment (see the module docstring). ``action_half_range``: half the
    width of the env's action bounds, when the same in every dimension (DDPG's noise)."""
    return _Converter(exp, lenient, action_half_range).run()
