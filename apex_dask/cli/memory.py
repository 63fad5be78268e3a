"""The memory a config asks for, per Dask worker, estimated before anything starts.

::

    holdings = plan_holdings(cfg, spaces, placement)   # address -> [Part, ...]
    check_memory(cfg, holdings, limits, where)         # UsageError: the biggest part, its key

Every large allocation is counted on the worker that will hold it
(:func:`~apex_dask.runtime.orchestration.placement.plan_placement`, the same
placement the driver makes), by arithmetic on the config and the env's spaces
only; nothing is allocated to find out:

- the replay shards: ``replay.capacity`` items (:func:`replay_bytes`),
  shard by shard where they live;
- the learner's networks: online and target parameters, their gradients, Adam's
  two moments and one serialized weights blob (6 float32 copies);
- replayed batches: those in the learner's inqueue and in flight
  (``learner.inqueue_size + learner.prefetch_per_shard * replay.num_shards``),
  and one batch's activations, roughly (float observations and next
  observations, three forward passes kept for the backward pass);
- each env worker (and the evaluator): its network (torch, a numpy copy, the
  weights blob), a fragment of transitions per env and an allowance of
  :data:`ENV_BYTES` per env for the env's own state (an ALE emulator ~ 5 MiB).

A worker whose parts exceed 80% of its memory limit refuses the run in one
line naming the biggest part, its estimate and the key to lower.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from apex_dask.config import ApexConfig

__all__ = ["ENV_BYTES", "NETWORKS", "Part", "check_memory", "plan_holdings", "replay_bytes"]

NETWORKS = "networks"
"""The key of the learner's networks' part: the agent's keys that shape them."""

ENV_BYTES = 8 * 2**20
"""Allowance for one env's own state (its simulator), which cannot be known without
making it."""

_BUDGET = 0.8
"""Share of a worker's memory limit the estimate may take (the rest: Python, torch,
Dask, buffers the estimate does not see)."""


@dataclass(frozen=True)
class Part:
    """One large allocation on one worker: what it is, its bytes, the key that sizes it."""

    what: str
    nbytes: int
    key: str


_ITEM_OVERHEAD = 48
"""Bytes per replay item besides the observations: action, reward, discount,
sum- and min-tree nodes and the priority."""


def replay_bytes(cfg: ApexConfig, spaces_: Any) -> tuple[int, int]:
    """``(total, per_item)``: an estimate of the bytes all replay shards hold when full.

    Without frame stacking an item stores ``obs`` and ``next_obs``; with
    ``replay.frame_stack=k`` (when the config has it) each frame is stored
    about once (1.2 frames per item). An agent whose items are not transitions
    (``r2d2``: sequences) gives its own bytes per item.
    """
    import numpy as np

    from apex_dask.experiment.builder import agent_of

    obs = spaces_.observation_space
    own = agent_of(cfg).item_bytes(cfg, obs)
    if own is not None:
        return cfg.replay.capacity * own, own
    obs_bytes = int(np.prod(obs.shape)) * np.dtype(obs.dtype).itemsize
    stack = getattr(cfg.replay, "frame_stack", None)
    if stack:
        per_item = int(1.2 * obs_bytes / int(stack)) + 16 + _ITEM_OVERHEAD
    else:
        per_item = 2 * obs_bytes + _ITEM_OVERHEAD
    return cfg.replay.capacity * per_item, per_item


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**28 else f"{n / 2**20:.0f} MiB"


def _shapes(spaces_: Any) -> tuple[tuple[int, ...], int, int]:
    import numpy as np

    obs = spaces_.observation_space
    shape = tuple(int(d) for d in obs.shape)
    return shape, int(np.prod(shape)), int(np.dtype(obs.dtype).itemsize)


def plan_holdings(
    cfg: ApexConfig, spaces_: Any, placement: Any, networks: bool = True
) -> dict[str, list[Part]]:
    """``address -> parts`` for the placement the driver will make (see the module docstring);
    without the ``networks`` (their size needs torch), a lower bound."""
    shape, elems, itemsize = _shapes(spaces_)
    lc, w, r = cfg.learner, cfg.workers, cfg.replay
    from apex_dask.experiment.builder import agent_of

    agent = agent_of(cfg)
    obs_space, act_space = spaces_.observation_space, spaces_.action_space
    params, acts = agent.network_size(cfg.agent, obs_space, act_space) if networks else (0, 0)
    held: dict[str, list[Part]] = {}

    def add(address: str, part: Part) -> None:
        held.setdefault(address, []).append(part)

    total, per_item = replay_bytes(cfg, spaces_)
    for shard in placement.shards:
        add(shard.address, Part("the replay", total // r.num_shards, "replay.capacity"))
    learner = placement.learner.address
    nets = "the learner's networks (online, target, gradients, Adam state, weights blob)"
    if networks:
        add(learner, Part(nets, 6 * 4 * params, NETWORKS))
    own = agent.item_bytes(cfg, obs_space)  # sequence items (r2d2)
    item = 2 * elems * itemsize + 32 if own is None else per_item
    queued = lc.inqueue_size + lc.prefetch_per_shard * r.num_shards
    activations = lc.batch_size * 4 * (2 * elems + 3 * 2 * acts)
    batches = "replayed batches (inqueue, in flight) and one batch's activations"
    add(learner, Part(batches, lc.batch_size * item * queued + activations, "learner.batch_size"))
    per_worker = 3 * 4 * params + w.envs_per_worker * (
        ENV_BYTES + 2 * w.rollout_fragment_length * item
    )
    env_holders = [w for w in placement.env_workers if w is not None]  # elastic: empty slots
    if cfg.eval.episodes > 0:
        env_holders.append(placement.evaluator)
    counts: dict[str, int] = {}
    for where in env_holders:
        counts[where.address] = counts.get(where.address, 0) + 1
    for address, n in counts.items():
        what = f"{n:,} env worker(s) (their envs, networks, rollout buffers)"
        add(address, Part(what, n * per_worker, "workers.num_workers"))
    return held


def _lower(cfg: ApexConfig, part: Part, room: float, spaces_: Any) -> str:
    """A value of ``part.key`` that would fit ``room`` more bytes, as ``--set`` advice."""
    r = cfg.replay
    if part.key == "replay.capacity":
        per_item = replay_bytes(cfg, spaces_)[1]
        share = 1 if r.colocate_with_learner else r.num_shards
        fits = max(int(room // per_item) * share, r.num_shards)
        return f"--set replay.capacity={fits}"
    current = {
        "learner.batch_size": cfg.learner.batch_size,
        "workers.num_workers": cfg.workers.num_workers,
    }.get(part.key)
    if current is None:  # the networks
        return f"smaller networks ({_value(cfg, part.key)})"
    scaled = max(1, math.floor(0.9 * current * max(0.0, room) / max(1, part.nbytes)))
    return f"--set {part.key}={scaled}"


def check_memory(
    cfg: ApexConfig,
    spaces_: Any,
    holdings: Mapping[str, list[Part]],
    limits: Mapping[str, float],
    describe_worker: Mapping[str, str],
) -> None:
    """:class:`~apex_dask.cli.checks.UsageError` for the first worker whose parts exceed
    80% of its memory limit (a limit of 0 or None: not checked)."""
    from apex_dask.cli.checks import UsageError

    for address, parts in holdings.items():
        limit = limits.get(address) or 0
        need = sum(p.nbytes for p in parts)
        if not limit or need <= _BUDGET * limit:
            continue
        big = max(parts, key=lambda p: p.nbytes)
        merged = sum(p.nbytes for p in parts if p.what == big.what)
        room = _BUDGET * limit - (need - merged)
        where = describe_worker.get(address, address)
        obs = spaces_.observation_space
        if big.key == "replay.capacity":
            head = f"replay.capacity={cfg.replay.capacity:,}"
            head += f" (observations {tuple(obs.shape)} {obs.dtype})"
        else:
            shown = _value(cfg, big.key)
            head = f"{big.what} ({shown if big.key == NETWORKS else f'{big.key}={shown}'})"
        advice = _lower(cfg, Part(big.what, merged, big.key), room, spaces_)
        raise UsageError(
            f"{head} needs about {_gib(merged)} of the {_gib(need)} estimated for {where}, "
            f"which has {_gib(limit)}; lower it, e.g. {advice}"
        )


def _value(cfg: ApexConfig, key: str) -> Any:
    if key == NETWORKS:  # the keys that shape them
        from apex_dask.experiment.builder import agent_of

        return agent_of(cfg).network_keys(cfg)
    section, _, name = key.partition(".")
    return getattr(getattr(cfg, section), name)
