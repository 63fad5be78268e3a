"""The progress line of ``apex-dask-submit``: how far along the run is and when it ends.

::

    progress = ProgressPrinter(rule.stop, quiet=args.quiet)
    for result in driver.iterate():
        progress.update(result)   # a line per result; redrawn in place on a terminal
    progress.close()              # ends a line drawn in place

**Fraction done** is the largest of ``timesteps_total / stop.timesteps``,
``time_s / stop.time_s`` and ``iteration / stop.iterations`` over the
conditions that are set: the first condition met ends the run, so the one
closest to its target tells how far along it is. A reward target has no
fraction (returns do not grow at a steady rate); it may end the run sooner.

**ETA** is the smallest, over the same conditions, of (target - value) /
rate, where the rate is that quantity's growth per second over the results
of the last ``window_s`` seconds (the run's start, ``time_s = 0`` with
nothing done, counts as a result until it falls out of the window). For
``time_s`` the rate is 1.

On a terminal, with a stop condition set, the line is redrawn in place and
starts with a bar; otherwise (a file, a pipe, a batch log, or no condition
with a fraction) each result prints one plain line, today's fields followed
by ``| 42% | eta 1m05s`` when there is a fraction.
"""

from __future__ import annotations

import math
import shutil
import sys
from collections import deque
from collections.abc import Mapping
from typing import IO, Any

from apex_dask.cli.output import format_progress
from apex_dask.config import StopConfig

__all__ = ["ProgressPrinter", "StopProgress", "format_eta"]

# (stop field, result key) of the conditions that have a fraction.
_CONDITIONS = (
    ("timesteps", "timesteps_total"),
    ("time_s", "time_s"),
    ("iterations", "iteration"),
)


class StopProgress:
    """Fraction of the stop condition done and the ETA, from a stream of results."""

    def __init__(self, stop: StopConfig, window_s: float = 30.0) -> None:
        self.targets = {
            key: float(getattr(stop, field))
            for field, key in _CONDITIONS
            if getattr(stop, field) is not None and getattr(stop, field) > 0
        }
        self.window_s = float(window_s)
        self._points: deque[dict[str, float]] = deque([{key: 0.0 for _, key in _CONDITIONS}])

    @property
    def active(self) -> bool:
        """True when some stop condition has a fraction."""
        return bool(self.targets)

    def observe(self, result: Mapping[str, Any]) -> tuple[float | None, float | None]:
        """``(fraction done in [0, 1], ETA in seconds)``; None where unknown."""
        if not self.targets:
            return None, None
        point = {key: _number(result.get(key)) for _, key in _CONDITIONS}
        if any(v is None for v in point.values()):
            return None, None
        self._points.append(point)  # type: ignore[arg-type]
        now = point["time_s"]
        while len(self._points) > 2 and now - self._points[1]["time_s"] >= self.window_s:
            self._points.popleft()  # keep the newest point at least window_s old
        first = self._points[0]
        fraction = min(1.0, max(point[k] / t for k, t in self.targets.items()))
        etas = []
        for key, target in self.targets.items():
            left = target - point[key]
            if left <= 0:
                etas.append(0.0)
                continue
            if key == "time_s":
                etas.append(left)
                continue
            dt = now - first["time_s"]
            rate = (point[key] - first[key]) / dt if dt > 0 else 0.0
            if rate > 0:
                etas.append(left / rate)
        return fraction, (min(etas) if etas else None)


def format_eta(seconds: float | None) -> str:
    """``14s``, ``2m05s``, ``1h02m``; ``?`` when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def format_bar(fraction: float, width: int = 20) -> str:
    filled = int(fraction * width)
    return "[" + "#" * filled + "-" * (width - filled) + "]"


class ProgressPrinter:
    """Prints one progress line per result: plain lines, or one line redrawn on a TTY."""

    def __init__(
        self,
        stop: StopConfig,
        *,
        quiet: bool = False,
        stream: IO[str] | None = None,
        tty: bool | None = None,
        window_s: float = 30.0,
    ) -> None:
        self.stream = sys.stdout if stream is None else stream
        self.quiet = quiet
        self.progress = StopProgress(stop, window_s)
        if tty is None:
            isatty = getattr(self.stream, "isatty", None)
            tty = bool(isatty and isatty())
        self.in_place = tty and self.progress.active
        self._drawn = False

    def line(self, result: Mapping[str, Any]) -> str:
        """The text for ``result`` (no control characters)."""
        fraction, eta = self.progress.observe(result)
        fields = format_progress(dict(result))
        if fraction is None:
            return fields
        if self.in_place:  # the bar first, so a narrow terminal cuts the fields, not it
            return f"{format_bar(fraction)} {fraction:>4.0%} eta {format_eta(eta)} | {fields}"
        return f"{fields} | {fraction:.0%} | eta {format_eta(eta)}"

    def update(self, result: Mapping[str, Any]) -> None:
        if self.quiet:
            return
        text = self.line(result)
        if self.in_place:
            width = shutil.get_terminal_size((120, 24)).columns - 1
            self.stream.write("\r\x1b[2K" + text[:width])
            self._drawn = True
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End a line drawn in place, so what follows starts on its own line."""
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
