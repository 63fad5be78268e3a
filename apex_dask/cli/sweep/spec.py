"""The sweep file (``SPACE.yaml``) read and checked: base config, space, objective, budget.

::

    spec = load_sweep("space.yaml")     # SweepError (one line, exit 2) on anything wrong
    spec.trial_config({"dqn.lr": 1e-3})   # the config one trial runs

The file (every key but ``space`` optional; docs/sweeps.md)::

    base: {preset: cartpole, set: {eval.interval_s: 2}}   # or config: FILE.yaml (+ set)
    space:
      dqn.lr: {loguniform: [3.0e-5, 1.0e-3]}
      replay.alpha: {uniform: [0.4, 0.7]}
    objective: {metric: eval/return_mean, mode: max, use: best}   # use: best | final
    budget: {time_s: 600}                  # or env_steps: N (per trial)
    sampler: {name: tpe, seed: 0}          # tpe | random
    pruner: {name: median, reports: 10, startup_trials: 2, warmup_reports: 1}
    trials: 20                             # defaults for --trials / --concurrent
    concurrent: 2
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apex_dask.cli.checks import UsageError
from apex_dask.cli.resolve import DEFAULT_PRESET
from apex_dask.config import ApexConfig, ConfigError
from apex_dask.config.reader import read_document, shown
from apex_dask.config.space import SearchSpace, SpaceError, parse_space

__all__ = [
    "Budget",
    "Objective",
    "PrunerSpec",
    "SamplerSpec",
    "SweepError",
    "SweepSpec",
    "load_sweep",
    "spec_from_dict",
]

TOP_KEYS = ("base", "space", "objective", "budget", "sampler", "pruner", "trials", "concurrent")
SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "halving", "none")
DEFAULT_TIME_S = 600.0


class SweepError(UsageError):
    """A sweep file or flag that cannot run; one line, exit status 2."""


@dataclass(frozen=True)
class Objective:
    """What a trial is scored by: ``metric`` of the result dicts, its ``best`` or ``final``
    value over the trial's reports, maximised (``max``) or minimised (``min``)."""

    metric: str = "eval/return_mean"
    mode: str = "max"
    use: str = "best"

    @property
    def direction(self) -> str:
        return "maximize" if self.mode == "max" else "minimize"

    def better(self, a: float, b: float) -> bool:
        return a > b if self.mode == "max" else a < b


@dataclass(frozen=True)
class Budget:
    """Each trial's budget: ``time_s`` seconds of training or ``env_steps`` env steps."""

    time_s: float | None = None
    env_steps: int | None = None

    @property
    def total(self) -> float:
        return float(self.time_s if self.time_s is not None else self.env_steps)  # type: ignore[arg-type]

    @property
    def unit(self) -> str:
        return "s" if self.time_s is not None else "env steps"

    def progress(self, elapsed_s: float, steps: float) -> float:
        """How much of the budget a trial has used (seconds or env steps)."""
        return elapsed_s if self.time_s is not None else steps

    def as_dict(self) -> dict[str, Any]:
        return {"time_s": self.time_s} if self.time_s is not None else {"env_steps": self.env_steps}


@dataclass(frozen=True)
class SamplerSpec:
    name: str = "tpe"
    seed: int = 0


@dataclass(frozen=True)
class PrunerSpec:
    """``median`` (Optuna's MedianPruner) or ``halving`` (successive halving) over
    ``reports`` equal parts of the budget; ``none`` never prunes."""

    name: str = "median"
    reports: int = 10
    startup_trials: int = 2
    warmup_reports: int = 1
    reduction_factor: int = 3


@dataclass(frozen=True)
class SweepSpec:
    """A checked sweep file."""

    base: ApexConfig
    space: SearchSpace
    raw_space: dict[str, Any]
    objective: Objective = field(default_factory=Objective)
    budget: Budget = field(default_factory=lambda: Budget(time_s=DEFAULT_TIME_S))
    sampler: SamplerSpec = field(default_factory=SamplerSpec)
    pruner: PrunerSpec = field(default_factory=PrunerSpec)
    trials: int | None = None
    concurrent: int | None = None

    def budget_overrides(self) -> dict[str, Any]:
        if self.budget.time_s is not None:
            return {"stop.time_s": self.budget.time_s}
        return {"stop.timesteps": self.budget.env_steps}

    def trial_config(self, overrides: Mapping[str, Any]) -> ApexConfig:
        """The config a trial with these space values runs (its budget as its stop)."""
        return self.base.override({**dict(overrides), **self.budget_overrides()})

    def to_dict(self, base_file: str) -> dict[str, Any]:
        """The file, every default written out; ``base`` as ``{config: base_file}``."""
        o, s, p = self.objective, self.sampler, self.pruner
        return {
            "base": {"config": base_file},
            "space": self.raw_space,
            "objective": {"metric": o.metric, "mode": o.mode, "use": o.use},
            "budget": self.budget.as_dict(),
            "sampler": {"name": s.name, "seed": s.seed},
            "pruner": {
                "name": p.name,
                "reports": p.reports,
                "startup_trials": p.startup_trials,
                "warmup_reports": p.warmup_reports,
                "reduction_factor": p.reduction_factor,
            },
            **({"trials": self.trials} if self.trials is not None else {}),
            **({"concurrent": self.concurrent} if self.concurrent is not None else {}),
        }


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and check the sweep file at ``path`` (relative ``config:`` paths from its folder)."""
    p = Path(path).expanduser()
    try:
        data = read_document(p, "sweep file", json_text=False)
    except ConfigError as exc:
        raise SweepError(str(exc)) from None
    return spec_from_dict(data, p.parent, name=p.name)


def spec_from_dict(data: Any, folder: Path, name: str = "sweep file") -> SweepSpec:
    """Check a sweep file's contents (``folder``: where relative ``config:`` paths start)."""
    if not isinstance(data, Mapping):
        raise SweepError(f"{name} must be a mapping with a space: section, e.g. space: {{...}}")
    unknown = sorted(set(data) - set(TOP_KEYS))
    if unknown:
        raise SweepError(
            f"{name}: unknown section {shown(unknown[0])}; allowed: {', '.join(TOP_KEYS)}"
        )
    if "space" not in data:
        raise SweepError(f"{name} has no space: section (the config keys to search)")
    base = _base(data.get("base"), folder, name)
    try:
        space = parse_space(data["space"], base, where=f"{name}: space")
    except SpaceError as exc:
        raise SweepError(str(exc)) from None
    objective = _objective(_section(data, "objective", name), base, name)
    return SweepSpec(
        base=base,
        space=space,
        raw_space={p.key: data_for(data["space"], p.key) for p in space.params},
        objective=objective,
        budget=_budget(_section(data, "budget", name), base, name),
        sampler=_sampler(_section(data, "sampler", name), name),
        pruner=_pruner(_section(data, "pruner", name), name),
        trials=_count(data.get("trials"), "trials", name),
        concurrent=_count(data.get("concurrent"), "concurrent", name),
    )


def data_for(space: Mapping[str, Any], key: str) -> Any:
    """The raw distribution of ``key`` in a (possibly nested) space mapping."""
    if key in space:
        return space[key]
    head, _, rest = key.partition(".")
    return data_for(space[head], rest)


def _section(data: Mapping[str, Any], key: str, name: str) -> dict[str, Any]:
    value = data.get(key) or {}
    if not isinstance(value, Mapping):
        raise SweepError(f"{name}: {key} must be a mapping, got {shown(value)}")
    return dict(value)


def _unknown(section: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    extra = sorted(set(section) - set(allowed))
    if extra:
        raise SweepError(f"{where}: unknown key {shown(extra[0])}; allowed: {', '.join(allowed)}")


def _base(value: Any, folder: Path, name: str) -> ApexConfig:
    value = value or {}
    if not isinstance(value, Mapping):
        raise SweepError(f"{name}: base must be a mapping such as {{preset: cartpole}}")
    _unknown(dict(value), ("preset", "config", "set"), f"{name}: base")
    data: dict[str, Any] = {}
    if value.get("config") is not None:
        path = folder / Path(str(value["config"])).expanduser()
        try:
            data = read_document(path, f"{name}: base config", json_text=False) or {}
        except ConfigError as exc:
            raise SweepError(str(exc)) from None
        if not isinstance(data, dict):
            raise SweepError(f"{name}: base config {str(path)!r} must hold a mapping of sections")
    if value.get("preset") is not None or "preset" not in data:
        data["preset"] = value.get("preset") or DEFAULT_PRESET
    overrides = value.get("set") or {}
    if not isinstance(overrides, Mapping):
        raise SweepError(f"{name}: base.set must map config keys to values")
    try:
        return ApexConfig.from_dict(data).override(dict(overrides))
    except ConfigError as exc:
        raise SweepError(f"{name}: base: {exc}") from None


def _objective(sec: dict[str, Any], base: ApexConfig, name: str) -> Objective:
    _unknown(sec, ("metric", "mode", "use"), f"{name}: objective")
    o = Objective(**sec)
    where = f"{name}: objective"
    if not isinstance(o.metric, str) or not o.metric:
        raise SweepError(f"{where}: metric must be a result key such as eval/return_mean")
    if o.mode not in ("max", "min"):
        raise SweepError(f"{where}: mode {shown(o.mode)} must be max or min")
    if o.use not in ("best", "final"):
        raise SweepError(f"{where}: use {shown(o.use)} must be best or final")
    if o.metric.startswith("eval/") and base.eval.episodes <= 0:
        raise SweepError(
            f"{where}: {o.metric} needs the greedy evaluation, but base has eval.episodes=0; "
            "set eval.episodes under base: set: or choose another metric"
        )
    return o


def _budget(sec: dict[str, Any], base: ApexConfig, name: str) -> Budget:
    _unknown(sec, ("time_s", "env_steps"), f"{name}: budget")
    if not sec:  # the base config's own stop, else the default
        if base.stop.time_s is not None:
            return Budget(time_s=base.stop.time_s)
        if base.stop.timesteps is not None:
            return Budget(env_steps=base.stop.timesteps)
        return Budget(time_s=DEFAULT_TIME_S)
    if len(sec) != 1:
        raise SweepError(f"{name}: budget takes one of time_s or env_steps, not both")
    ((key, value),) = sec.items()
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if key == "time_s" and number and 0 < value < float("inf"):
        return Budget(time_s=float(value))
    if key == "env_steps" and number and float(value).is_integer() and value >= 1:
        return Budget(env_steps=int(value))
    what = "seconds > 0" if key == "time_s" else "an integer >= 1"
    raise SweepError(f"{name}: budget {key} {shown(value)} must be {what}")


def _sampler(sec: dict[str, Any], name: str) -> SamplerSpec:
    _unknown(sec, ("name", "seed"), f"{name}: sampler")
    s = SamplerSpec(**sec)
    if s.name not in SAMPLERS:
        raise SweepError(
            f"{name}: sampler {shown(s.name)} is unknown; choose {' or '.join(SAMPLERS)} "
            "(a grid: key runs every value with either)"
        )
    if isinstance(s.seed, bool) or not isinstance(s.seed, int) or not 0 <= s.seed < 2**32:
        raise SweepError(
            f"{name}: sampler seed {shown(s.seed)} must be an integer in [0, 2**32 - 1]"
        )
    return s


def _pruner(sec: dict[str, Any], name: str) -> PrunerSpec:
    allowed = ("name", "reports", "startup_trials", "warmup_reports", "reduction_factor")
    _unknown(sec, allowed, f"{name}: pruner")
    p = PrunerSpec(**sec)
    if p.name not in PRUNERS:
        raise SweepError(f"{name}: pruner {shown(p.name)} is unknown; choose {', '.join(PRUNERS)}")
    for key, low in (("reports", 1), ("startup_trials", 0), ("warmup_reports", 0)):
        v = getattr(p, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise SweepError(f"{name}: pruner {key} {shown(v)} must be an integer >= {low}")
    r = p.reduction_factor
    if isinstance(r, bool) or not isinstance(r, int) or r < 2:
        raise SweepError(f"{name}: pruner reduction_factor {shown(r)} must be an integer >= 2")
    return p


def _count(value: Any, key: str, name: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SweepError(f"{name}: {key} {shown(value)} must be an integer >= 1")
    return value
