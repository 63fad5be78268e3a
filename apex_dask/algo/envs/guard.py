"""Envs that misbehave: bounded calls, non-finite values, and the restart policy.

Real envs are simulators that crash, hang or return garbage. An env worker
makes and drives its envs through this module::

    guard = EnvGuard(env_id, make_timeout_s=60, step_timeout_s=None)
    env = guard.make(factory)                  # EnvFault if it raises or does not return
    out = guard.call(env.step, action)         # EnvFault if it hangs (step_timeout_s)
    check_finite(obs, reward, env_id, step)    # EnvFault on NaN / inf
    policy = EnvErrorPolicy(env_id, restart=True, max_per_1k_steps=10, max_consecutive=5)
    policy.completed(steps)                    # env steps made: the window counts them
    policy.record(fault, where, slot=j)        # EnvFailed: the run must end

A call that must be bounded runs on a daemon thread and the caller waits
for it at most ``timeout_s``. A thread cannot be killed: a call that does
not return is abandoned with its thread and its env (the thread closes the
env and exits if the call ever returns); the next call gets a fresh thread.
Daemon threads never hold up the exit of their process. With no step
timeout, ``step`` and ``reset`` run in the caller's thread (no hop).
"""

from __future__ import annotations

import math
import queue
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "BoundedCaller",
    "EnvErrorPolicy",
    "EnvFailed",
    "EnvFault",
    "EnvGuard",
    "Late",
    "check_finite",
    "env_name",
]


class EnvFault(Exception):
    """An env raised, hung or returned a non-finite value; the message is one line,
    ``env '<id>' <detail>``."""

    def __init__(self, env_id: str, detail: str) -> None:
        super().__init__(f"env {env_id!r} {detail}")
        self.env_id, self.detail = env_id, detail


class EnvFailed(RuntimeError):
    """An env error the run does not survive (restarts off, or over the cap); one line.

    ``warnings``: lines the worker's process warned before it (they travel with it)."""

    def __init__(self, message: str, warnings: tuple[str, ...] = ()) -> None:
        super().__init__(message, tuple(warnings))
        self.message, self.warnings = message, tuple(warnings)

    def __str__(self) -> str:
        return self.message


def env_name(factory: Any) -> str:
    """The env id a factory makes (its ``env_id``), else its repr."""
    return str(getattr(factory, "env_id", None) or repr(factory))


def _short(exc: BaseException, n: int = 120) -> str:
    text = " ".join(str(exc).split()) or "(no message)"
    text = text if len(text) <= n else text[: n - 3] + "..."
    return f"{type(exc).__name__}: {text}"


class Late(Exception):
    """A bounded call did not return in time (its thread is abandoned)."""


class _Job:
    __slots__ = ("done", "error", "fn", "result")

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn, self.done = fn, threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None


def _serve(jobs: queue.SimpleQueue) -> None:
    while (job := jobs.get()) is not None:
        try:
            job.result = job.fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            job.error = exc
        job.done.set()


class BoundedCaller:
    """Runs calls one at a time on a daemon thread, waiting at most ``timeout_s`` each."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.abandoned = 0
        self._last: queue.SimpleQueue | None = None
        self._jobs: queue.SimpleQueue | None = None

    def _queue(self) -> queue.SimpleQueue:
        if self._jobs is None:
            self._jobs = queue.SimpleQueue()
            threading.Thread(target=_serve, args=(self._jobs,), name=self.name, daemon=True).start()
        return self._jobs

    def call(self, fn: Callable[[], Any], timeout_s: float) -> Any:
        """``fn()``; :class:`Late` if it has not returned after ``timeout_s`` (the thread
        is then abandoned; see :meth:`after_abandoned`)."""
        job = _Job(fn)
        jobs = self._queue()
        jobs.put(job)
        if not job.done.wait(timeout_s):
            self._jobs = None  # the next call gets a fresh thread
            self.abandoned += 1
            self._last = jobs
            raise Late(f"did not return within {timeout_s:g} s")
        if job.error is not None:
            raise job.error
        return job.result

    @property
    def pending_abandoned(self) -> bool:
        """Whether a call was abandoned and :meth:`after_abandoned` not yet called."""
        return self._last is not None

    def after_abandoned(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the last abandoned thread if its call ever returns, then end it."""
        jobs = self._last
        if jobs is not None:
            jobs.put(_Job(fn))
            jobs.put(None)
            self._last = None

    def close(self) -> None:
        if self._jobs is not None:
            self._jobs.put(None)
            self._jobs = None


def _close(env: Any) -> None:
    try:
        env.close()
    except Exception:  # a failed env's close must not fail the worker
        pass


class EnvGuard:
    """Bounded ``make`` / ``step`` / ``reset`` of one env id (see the module docstring)."""

    def __init__(
        self, env_id: str, *, make_timeout_s: float = 60.0, step_timeout_s: float | None = None
    ) -> None:
        self.env_id = env_id
        self.make_timeout_s = float(make_timeout_s)
        self.step_timeout_s = None if step_timeout_s is None else float(step_timeout_s)
        self._maker = BoundedCaller(f"apex-make-{env_id}")
        self._stepper = BoundedCaller(f"apex-step-{env_id}")

    def make(self, factory: Callable[[], Any]) -> Any:
        """A new env from ``factory``; :class:`EnvFault` naming the env if it raises or
        does not return within ``make_timeout_s`` (``env.make_timeout_s``)."""
        made: list[Any] = []
        try:
            return self._maker.call(lambda: made.append(factory()) or made[0], self.make_timeout_s)
        except Late:  # if the constructor ever returns, its thread closes the env and ends
            self._maker.after_abandoned(lambda: [_close(env) for env in made])
            raise EnvFault(
                self.env_id,
                f"was not made within env.make_timeout_s="
                f"{self.make_timeout_s:g} s (its constructor did not return)",
            ) from None
        except Exception as exc:
            raise EnvFault(self.env_id, f"could not be made: {_short(exc)}") from None

    def call(self, what: str, fn: Callable[[], Any], step: int) -> Any:
        """``fn()`` (an env's ``step`` or ``reset``, named ``what``); :class:`EnvFault` if
        it raises, or does not return within ``step_timeout_s``."""
        try:
            if self.step_timeout_s is None:
                return fn()
            return self._stepper.call(fn, self.step_timeout_s)
        except Late:
            raise EnvFault(
                self.env_id,
                f"{what} did not return within env.step_timeout_s="
                f"{self.step_timeout_s:g} s at env step {step}",
            ) from None
        except Exception as exc:
            raise EnvFault(
                self.env_id, f"{what} raised at env step {step}: {_short(exc)}"
            ) from None

    def discard(self, env: Any) -> None:
        """Close ``env`` (a failed one): now if its thread is free, else on the abandoned
        thread once the hung call returns. A close that raises is ignored."""
        if self._stepper.pending_abandoned:
            self._stepper.after_abandoned(lambda: _close(env))
        else:
            _close(env)

    def close(self) -> None:
        self._maker.close()
        self._stepper.close()


def check_finite(obs: np.ndarray, reward: Any, env_id: str, step: int, what: str = "step") -> None:
    """:class:`EnvFault` naming the env, the value and the step if the reward, or a float
    observation, holds NaN or inf."""
    try:
        r = float(reward)
    except (TypeError, ValueError):
        r = math.nan
    if not math.isfinite(r):
        raise EnvFault(env_id, f"returned a non-finite reward {r!r} at env step {step}")
    if obs.dtype.kind == "f" and not np.isfinite(obs).all():
        bad = np.flatnonzero(~np.isfinite(obs.ravel()))
        value = float(obs.ravel()[bad[0]])
        source = "" if what == "step" else f" from {what}"
        raise EnvFault(
            env_id,
            f"returned a non-finite observation ({value!r} at flat index "
            f"{int(bad[0])}, {len(bad)} of {obs.size} values){source} at env step {step}",
        )


class EnvErrorPolicy:
    """What an env error does to the run: count and go on, or stop.

    ``restart=False``: the first error raises :class:`EnvFailed`. Else each
    error is counted, and the run ends (:class:`EnvFailed`, one line naming the
    env, the count, the key and the last error) when

    - more than ``max_per_1k_steps`` errors fall within the last 1,000 env steps
      this worker made (its envs' steps together; the caller reports them with
      :meth:`completed`): a cap relative to the work done, so an env that fails
      once every few thousand steps is survived at any step rate, and one that
      fails every few steps is not, however slow; or
    - one env (``slot``) fails ``max_consecutive`` times in a row without
      completing a step (each time made again): a broken env ends the run after
      a few errors, whatever its speed.
    """

    WINDOW = 1000
    """The env steps the rate cap looks back over."""

    def __init__(
        self,
        env_id: str,
        *,
        restart: bool = True,
        max_per_1k_steps: int = 10,
        max_consecutive: int = 5,
    ) -> None:
        self.env_id = env_id
        self.restart = bool(restart)
        self.max_per_1k_steps = int(max_per_1k_steps)
        self.max_consecutive = int(max_consecutive)
        self.count = 0
        self.steps = 0
        """Env steps completed (all of this worker's envs)."""
        self.streaks: dict[Any, int] = {}
        """Errors in a row of each env slot that has not completed a step since."""
        self._recent: deque[int] = deque()  # self.steps at each recent error

    def completed(self, steps: int, slot: Any = None) -> None:
        """``steps`` env steps were made: by env ``slot`` (its errors in a row end), or,
        with None, by every env."""
        self.steps += int(steps)
        if self.streaks:
            if slot is None:
                self.streaks.clear()
            else:
                self.streaks.pop(slot, None)

    def record(self, fault: BaseException, where: str = "", slot: Any = 0) -> None:
        """Count ``fault`` of env ``slot``; raise :class:`EnvFailed` if the run must end."""
        self.count += 1
        at = f" ({where})" if where else ""
        last = getattr(fault, "detail", fault)
        if not self.restart:
            raise EnvFailed(
                f"{fault}{at}; set workers.restart_failed_envs=true to restart failed envs"
            )
        streak = self.streaks[slot] = self.streaks.get(slot, 0) + 1
        if streak >= self.max_consecutive:
            raise EnvFailed(
                f"env {self.env_id!r} failed {streak} times in a row without completing a "
                f"step{at}, workers.max_consecutive_env_errors={self.max_consecutive}; "
                f"last: {last}"
            )
        recent = self._recent
        recent.append(self.steps)
        while recent[0] <= self.steps - self.WINDOW:
            recent.popleft()
        if len(recent) > self.max_per_1k_steps:
            raise EnvFailed(
                f"env {self.env_id!r} failed {len(recent)} times within {self.WINDOW:,} env "
                f"steps{at}, over workers.max_env_errors_per_1k_steps={self.max_per_1k_steps}; "
                f"last: {last}"
            )
