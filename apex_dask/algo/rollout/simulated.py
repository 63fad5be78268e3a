"""A simulated env worker: prebuilt rollouts of an env's spaces at a set rate.

For measuring what the runtime costs per rollout with hundreds of env workers
on one machine (``simulate.env_steps_per_s``; ``benchmarks/scale.py``): no env
is stepped and no network runs, everything around the worker (its actor, the
shards, the weight syncs, the learner, the driver) is the real one::

    w = SimulatedWorker(factory, rollout_spec, index=3, exploration=0.1, seed=3, steps_per_s=35)
    out = w.sample()        # sleeps until the rollout is due, then a Rollout
    index, number, place = read_stamps(out.batch)   # per item

A rollout is ``fragment_length * num_envs`` transitions with the keys and dtypes
an agent's worker sends: ``obs, action, reward, next_obs, done, discount``, or
with ``frame_stack`` the compact form of :mod:`apex_dask.algo.replay.codec`
(``frames`` each once, ``obs_refs``, ``next_obs_refs``): a fragment of ``L``
steps with n-step ``n`` and stacks of ``k`` holds ``L + n + k - 1`` frames, as a
real one without episode starts does. Each rollout is a fresh copy of one
template, stamped with the worker's index, the rollout's number and each item's
place in it (:func:`read_stamps`), so a test can check that the shards hold
exactly what was offered.

Rate: rollout ``j`` is due ``j * period`` after a random start within the first
period (``period = L / steps_per_s``); a worker that falls behind catches up by
at most one rollout, so a starved process offers less instead of a burst.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces

from apex_dask.algo.envs.probe import probe_spaces
from apex_dask.algo.rollout.spec import Rollout, RolloutSpec

__all__ = ["SimulatedWorker", "read_stamps"]

_SPACES: dict[str, tuple[Any, Any]] = {}
"""The probed spaces per env, once per process (hundreds of workers share one)."""


def _spaces_of(env_factory: Callable[[], Any], timeout_s: float) -> tuple[Any, Any]:
    key = repr(env_factory)
    if key not in _SPACES:
        _SPACES[key] = probe_spaces(env_factory, timeout_s)
    return _SPACES[key]


def _random(space: Any, n: int, rng: np.random.Generator) -> np.ndarray:
    if isinstance(space, spaces.Discrete):
        return rng.integers(space.n, size=n).astype(np.int64)
    shape, dtype = (n, *space.shape), np.dtype(space.dtype)
    if dtype.kind in "ui":
        return rng.integers(0, 256 if dtype == np.uint8 else 100, size=shape).astype(dtype)
    if dtype.kind == "b":
        return rng.random(shape) < 0.5
    low = np.broadcast_to(np.nan_to_num(space.low, neginf=-1.0), space.shape)
    high = np.broadcast_to(np.nan_to_num(space.high, posinf=1.0), space.shape)
    low, high = np.maximum(low, -1.0), np.minimum(high, 1.0)
    return rng.uniform(low, high, size=shape).astype(dtype)


def _template(
    obs_space: Any, act_space: Any, r: RolloutSpec, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """One rollout's arrays, as an agent's worker sends them (no episode ends)."""
    n = int(r.fragment_length) * int(r.num_envs)
    nstep = int(r.n_step)
    batch: dict[str, np.ndarray] = {}
    if r.frame_stack:
        k = int(r.frame_stack)
        frame_space = spaces.Box(0, 255, obs_space.shape[1:], obs_space.dtype)
        batch["frames"] = _random(frame_space, n + nstep + k - 1, rng)
        rows = np.arange(n, dtype=np.int32)[:, None] + np.arange(k, dtype=np.int32)
        batch["obs_refs"], batch["next_obs_refs"] = rows, rows + np.int32(nstep)
    else:
        obs = _random(obs_space, n + nstep, rng)
        batch["obs"], batch["next_obs"] = obs[:n].copy(), obs[nstep:].copy()
    batch["action"] = _random(act_space, n, rng)
    batch["reward"] = rng.standard_normal(n).astype(np.float32)
    batch["done"] = np.zeros(n, bool)
    batch["discount"] = np.full(n, float(r.gamma) ** nstep, np.float32)
    return batch


def _stamp(batch: dict[str, np.ndarray], index: int, number: int) -> None:
    """Write (index, number, place) into each item's observation, in place."""
    if "frames" in batch:  # the first three pixels of each frame, as 16-bit words
        f = batch["frames"].reshape(len(batch["frames"]), -1)
        words = np.zeros((len(f), 3), np.uint16)
        words[:, 0], words[:, 1] = index, number
        words[:, 2] = np.arange(len(f))
        f[:, :6] = words.view(np.uint8).reshape(len(f), 6)
        return
    for key in ("obs", "next_obs"):
        o = batch[key].reshape(len(batch[key]), -1)
        o[:, 0], o[:, 1] = index, number
        if o.shape[1] > 2:
            o[:, 2] = np.arange(len(o))


def read_stamps(batch: dict[str, np.ndarray]) -> np.ndarray:
    """``int64 [N, 3]``: each item's (worker index, rollout number, place) from its
    ``obs`` (whole observations) or its first frame (``frames`` + ``obs_refs``)."""
    if "frames" in batch:
        f = batch["frames"].reshape(len(batch["frames"]), -1)[:, :6].copy()
        words = f.view(np.uint16).astype(np.int64)[batch["obs_refs"][:, 0]]
        return words
    o = batch["obs"].reshape(len(batch["obs"]), -1)
    out = np.zeros((len(o), 3), np.int64)
    out[:, : min(3, o.shape[1])] = np.rint(o[:, :3]).astype(np.int64)
    return out


class SimulatedWorker:
    """The acting worker's interface (``sample``, ``set_weights``, ``weights_version``,
    ``env_errors``) over prebuilt rollouts; see the module docstring."""

    def __init__(
        self,
        env_factory: Callable[[], Any],
        rollout: RolloutSpec,
        *,
        index: int,
        exploration: float,
        seed: int,
        steps_per_s: float,
    ) -> None:
        if not steps_per_s > 0:
            raise ValueError(f"steps_per_s must be > 0, got {steps_per_s!r}")
        self.env_factory = env_factory
        self.env: Any = None
        self._eval_env: Any = None
        self.index, self.exploration = int(index), float(exploration)
        self.observation_space, self.action_space = _spaces_of(env_factory, rollout.make_timeout_s)
        rng = np.random.default_rng(seed)
        self._template = _template(self.observation_space, self.action_space, rollout, rng)
        self.steps = int(rollout.fragment_length) * int(rollout.num_envs)
        self._priorities = rng.uniform(0.1, 1.0, self.steps).astype(np.float32)
        self.period = self.steps / float(steps_per_s)
        self._due = time.monotonic() + float(rng.uniform(0.0, self.period))
        self.weights_version = -1
        self.env_errors = 0
        self.steps_sampled = 0
        self.rollouts = 0
        self.late_s = 0.0
        """Seconds rollouts were made after they were due (the process was busy)."""

    def sample(self) -> Rollout:
        """The next rollout, once it is due."""
        now = time.monotonic()
        if self._due > now:
            time.sleep(self._due - now)
        else:
            self.late_s += now - self._due
        self._due = max(self._due + self.period, time.monotonic() - self.period)
        batch = {key: value.copy() for key, value in self._template.items()}
        _stamp(batch, self.index, self.rollouts)
        self.rollouts += 1
        self.steps_sampled += self.steps
        return Rollout(
            batch, self._priorities.copy(), self.steps, self.weights_version, self.exploration
        )

    def set_weights(self, version: int, weights: Any) -> None:
        """Only the version is kept (the simulated worker acts with no network)."""
        self.weights_version = int(version)

    def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise RuntimeError("a simulated env worker plays no episodes (set eval.episodes=0)")
