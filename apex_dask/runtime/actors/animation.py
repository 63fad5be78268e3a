"""The evaluator's animation for the ``/apex`` page (``eval.animation``).

::

    anim = EvalAnimation(run)                    # in the evaluator actor's __init__
    frames = anim.frames()                       # an EpisodeFrames when one is due, else None
    out = worker.evaluate(n, ..., frames=frames) # the first episode's frames, small and few
    anim.send(frames, out, fps, version)         # GIF -> scheduler (topic apex-animation)

At most one animation per :data:`EVERY_S` seconds leaves the evaluator (a
GIF of at most 120 frames of at most 96 pixels a side: a few KB for
CartPole and MinAtar); the scheduler's metrics plugin keeps the newest per run.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import is_dataclass, replace
from typing import Any

from apex_dask.algo.play.video import EpisodeFrames, quiet_pygame
from apex_dask.runtime.observability.metrics import ANIMATION_TOPIC, worker_sink

__all__ = ["EVERY_S", "EvalAnimation", "rendering"]

EVERY_S = 30.0


def rendering(env_factory: Callable[[], Any]) -> Callable[[], Any]:
    """The same env factory with ``render_mode="rgb_array"`` (an :class:`EnvFactory`)."""
    quiet_pygame()
    if is_dataclass(env_factory) and hasattr(env_factory, "env_kwargs"):
        kwargs = {**env_factory.env_kwargs, "render_mode": "rgb_array"}
        return replace(env_factory, env_kwargs=kwargs)  # type: ignore[type-var]
    return env_factory


class EvalAnimation:
    """Frames of the first episode of an evaluation, throttled, sent as a GIF."""

    def __init__(self, run: str, every_s: float = EVERY_S) -> None:
        self.run = run
        self.every_s = float(every_s)
        self._sink = worker_sink()
        self._last = -math.inf
        self.sent = 0

    def frames(self) -> EpisodeFrames | None:
        """A fresh :class:`EpisodeFrames` when an animation is due (else None)."""
        if self._sink is None or time.monotonic() - self._last < self.every_s:
            return None
        return EpisodeFrames()

    def send(self, frames: EpisodeFrames, out: dict[str, Any], fps: float, version: int) -> None:
        """Encode and send; a failure never stops the evaluation."""
        if self._sink is None or not frames.frames:
            return
        self._last = time.monotonic()
        returns, lengths = out.get("returns") or [], out.get("lengths") or []
        try:
            gif = frames.gif(fps)
        except Exception:  # noqa: BLE001 - an animation is never worth the evaluator
            return
        msg = {
            "run": self.run,
            "source": "eval",
            "time": time.time(),
            "gif": gif,
            "return": float(returns[0]) if returns else float("nan"),
            "length": int(lengths[0]) if lengths else 0,
            "weights_version": int(version),
        }
        try:
            self._sink(ANIMATION_TOPIC, msg)
            self.sent += 1
        except Exception:  # a closing worker must not take the evaluator down
            pass
