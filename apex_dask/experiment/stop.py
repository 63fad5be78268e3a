"""The one stop rule both runners follow.

::

    rule = StopRule.resolve(cfg.stop, {"train_return": 475}, use_eval=cfg.eval.episodes > 0)
    reason = rule.reason(timesteps=..., time_s=..., iterations=..., train_return=...,
                         eval_return=...)

The first condition met wins. Two return conditions, one meaning each:
``train_return`` reads an iteration's ``env/episode_return_mean`` (the training
episodes of the least-exploring third of the env workers), ``eval_return`` the
newest greedy evaluation's ``eval/return_mean``. The retired ``reward`` (a
``stop`` mapping's key, as ``train(cfg, stop={"reward": 475})`` wrote it) still
works: it is ``eval_return`` when evaluation is on, else ``train_return``, with one
``FutureWarning`` line saying which.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from apex_dask.config import StopConfig

__all__ = ["EVAL_KEY", "TRAIN_KEY", "StopRule", "resolve_stop"]

TRAIN_KEY = "env/episode_return_mean"
"""The result key ``stop.train_return`` reads."""
EVAL_KEY = "eval/return_mean"
"""The result key ``stop.eval_return`` reads."""


def resolve_stop(base: StopConfig, stop: Any = None, *, use_eval: bool = False) -> StopConfig:
    """``base`` with the non-None fields of ``stop`` (a dict, StopConfig or object) on top
    (``use_eval``: what a retired ``reward`` key means, see the module docstring)."""
    if stop is None:
        return base
    names = [f.name for f in dataclasses.fields(StopConfig)]
    if isinstance(stop, Mapping):
        values = dict(stop)
        if "reward" in values:
            from apex_dask.config.renames import reward_stop

            mapped = reward_stop(values.pop("reward"), eval_on=use_eval)
            if mapped is not None:
                values.setdefault(mapped[0].split(".", 1)[1], mapped[1])
        unknown = set(values) - set(names)
        if unknown:
            raise ValueError(f"unknown stop condition(s) {sorted(unknown)}; use {names}")
    else:
        values = {n: getattr(stop, n, None) for n in names}
    return dataclasses.replace(base, **{k: v for k, v in values.items() if v is not None})


@dataclass(frozen=True)
class StopRule:
    """Stop conditions plus where the reward is read."""

    stop: StopConfig
    use_eval: bool

    @classmethod
    def resolve(cls, base: StopConfig, stop: Any = None, *, use_eval: bool) -> StopRule:
        """The rule for ``base`` overridden by ``stop`` (see :func:`resolve_stop`)."""
        return cls(resolve_stop(base, stop, use_eval=use_eval), bool(use_eval))

    def reason(
        self,
        *,
        timesteps: float,
        time_s: float,
        iterations: float,
        train_return: float | None = None,
        eval_return: float | None = None,
    ) -> str | None:
        """Why training should stop now (a short phrase), or None to go on.

        ``train_return``: the iteration's ``env/episode_return_mean``; ``eval_return``:
        the newest ``eval/return_mean`` (None or NaN: not known yet).
        """
        s = self.stop
        if s.timesteps is not None and timesteps >= s.timesteps:
            return f"timesteps_total >= {s.timesteps}"
        if s.time_s is not None and time_s >= s.time_s:
            return f"time_s >= {s.time_s:g}"
        if s.iterations is not None and iterations >= s.iterations:
            return f"iteration >= {s.iterations}"
        for target, value, key in (
            (s.train_return, train_return, TRAIN_KEY),
            (s.eval_return, eval_return, EVAL_KEY),
        ):
            if target is not None and value is not None and not math.isnan(value):
                if value >= target:
                    return f"{key} >= {target:g}"
        return None

    def after_result(self, result: Mapping[str, float]) -> str | None:
        """:meth:`reason` read from one result dict."""
        return self.reason(
            timesteps=result["timesteps_total"],
            time_s=result["time_s"],
            iterations=result["iteration"],
            train_return=result.get(TRAIN_KEY),
            eval_return=result.get(EVAL_KEY),
        )
