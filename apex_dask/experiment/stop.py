"""The one stop rule both runners follow.

::

    rule = StopRule.resolve(cfg.stop, {"reward": 475}, use_eval=cfg.eval.episodes > 0)
    reason = rule.reason(timesteps=..., time_s=..., iterations=..., reward_value=...)

The first condition met wins. The reward condition reads the newest greedy
evaluation's mean return when evaluation is on (``eval.episodes > 0``), else
the iteration's ``env/episode_return_mean``; :meth:`StopRule.reward_key` names
which.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from apex_dask.config import StopConfig

__all__ = ["StopRule", "resolve_stop"]


def resolve_stop(base: StopConfig, stop: Any = None) -> StopConfig:
    """``base`` with the non-None fields of ``stop`` (a dict, StopConfig or object) on top."""
    if stop is None:
        return base
    names = [f.name for f in dataclasses.fields(StopConfig)]
    if isinstance(stop, Mapping):
        unknown = set(stop) - set(names)
        if unknown:
            raise ValueError(f"unknown stop condition(s) {sorted(unknown)}; use {names}")
        values = dict(stop)
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
        return cls(resolve_stop(base, stop), bool(use_eval))

    @property
    def reward_key(self) -> str:
        """The result key the reward condition reads."""
        return "eval/return_mean" if self.use_eval else "env/episode_return_mean"

    def reason(
        self,
        *,
        timesteps: float,
        time_s: float,
        iterations: float,
        reward_value: float | None,
    ) -> str | None:
        """Why training should stop now (a short phrase), or None to go on.

        ``reward_value`` is the newest value of :attr:`reward_key` (None or NaN:
        not known yet).
        """
        s = self.stop
        if s.timesteps is not None and timesteps >= s.timesteps:
            return f"timesteps_total >= {s.timesteps}"
        if s.time_s is not None and time_s >= s.time_s:
            return f"time_s >= {s.time_s:g}"
        if s.iterations is not None and iterations >= s.iterations:
            return f"iteration >= {s.iterations}"
        if s.reward is not None and reward_value is not None and not math.isnan(reward_value):
            if reward_value >= s.reward:
                return f"{self.reward_key} >= {s.reward:g}"
        return None

    def after_result(self, result: Mapping[str, float]) -> str | None:
        """:meth:`reason` read from one result dict."""
        return self.reason(
            timesteps=result["timesteps_total"],
            time_s=result["time_s"],
            iterations=result["iteration"],
            reward_value=result.get(self.reward_key),
        )
