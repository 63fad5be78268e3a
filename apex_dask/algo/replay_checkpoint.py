"""Checkpoints of a :class:`~apex_dask.algo.replay.ReplayShard`: ``state_dict`` and its inverse.

The state is a flat dict of numpy arrays and numbers (suitable for
``np.savez``; nothing in it needs unpickling). A frame-stacked shard saves its
frames de-duplicated, as it holds them: also ``frame_stack``, ``filled`` (the
slots ever written: ``priority``, ``mass`` and ``data/<key>`` have this many
items, ``size`` of them stored), the frame store's ``frame_capacity`` and
``frames/*`` (the frames in use, each once), and ``data/obs_refs``,
``data/next_obs_refs`` (each item's ring slots) in place of ``data/obs``,
``data/next_obs``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from apex_dask.algo.frame_storage import FrameStore, stacked_schema
from apex_dask.algo.replay_storage import ItemStorage, schema_of

if TYPE_CHECKING:
    from apex_dask.algo.replay import ReplayShard

__all__ = ["load_shard_state", "shard_state"]

_COUNTERS = ("added", "sampled", "updated")
_TIMERS = ("add_s", "sample_s", "update_s")
_MASK64 = (1 << 64) - 1


def shard_state(shard: ReplayShard) -> dict[str, np.ndarray | int | float]:
    """:meth:`ReplayShard.state_dict <apex_dask.algo.replay.ReplayShard.state_dict>`."""
    filled = shard._filled
    state: dict[str, np.ndarray | int | float] = {
        "capacity": shard.capacity,
        "alpha": shard.alpha,
        "eps": shard.eps,
        "size": shard._size,
        "pos": shard._pos,
        "max_priority": shard._max_priority,
        **shard._counts,
        **shard._times,
        "priority": shard._priority[:filled].copy(),
        "mass": shard._tree.masses(np.arange(filled)),
        "rng_state": _pcg64_to_array(shard._rng.bit_generator.state),
    }
    if shard._frames is not None:
        state.update(frame_stack=shard.frame_stack, filled=filled, **shard._frames.state_dict())
    if shard._store is not None:
        for k, v in shard._store.export(filled).items():
            state[f"data/{k}"] = v
    return state


def load_shard_state(shard: ReplayShard, state: Mapping[str, object]) -> None:
    """:meth:`ReplayShard.load_state_dict <apex_dask.algo.replay.ReplayShard.load_state_dict>`."""
    for key, mine in (
        ("capacity", shard.capacity),
        ("alpha", shard.alpha),
        ("eps", shard.eps),
        ("frame_stack", shard.frame_stack),
    ):
        theirs = np.asarray(state[key]).item() if key in state else None
        if theirs != mine:
            raise ValueError(f"state has {key}={theirs}, this shard has {key}={mine}")
    size = int(np.asarray(state["size"]).item())
    pos = int(np.asarray(state["pos"]).item())
    filled = int(np.asarray(state.get("filled", size)).item())
    if not (0 <= size <= filled <= shard.capacity and 0 <= pos < shard.capacity):
        raise ValueError(f"state has size={size}, pos={pos} for capacity {shard.capacity}")
    priority = np.asarray(state["priority"], dtype=np.float64)
    mass = np.asarray(state["mass"], dtype=np.float64)
    if priority.shape != (filled,) or mass.shape != (filled,):
        raise ValueError(f"state priority/mass arrays do not have {filled} items")
    data = {k[len("data/") :]: np.asarray(v) for k, v in state.items() if k.startswith("data/")}
    for k, v in data.items():
        if v.ndim == 0 or v.shape[0] != filled:
            raise ValueError(f"state data/{k} does not have {filled} items")
    if filled and not data:
        raise ValueError("state has items but no data/<key> arrays")
    if shard._frames is not None:
        shard._frames = FrameStore(shard.capacity, shard.frame_stack)
        shard._frames.load_state_dict(state)
    shard._store, shard._schema = None, {}
    if data:
        shard._store = ItemStorage(shard.capacity, schema_of(data))
        shard._store.load(data, filled)
        shard._schema = dict(shard._store.schema)
        if shard._frames is not None:
            f = shard._frames.frames
            stacked = (f.dtype, (shard.frame_stack, *f.shape[1:]))
            shard._schema = stacked_schema(shard._store.schema, stacked)
    shard._priority[:] = 0.0
    shard._priority[:filled] = priority
    shard._tree.load_masses(mass)
    shard._size, shard._pos, shard._filled = size, pos, filled
    if filled > size:  # slots evicted early stay empty
        shard._clear((pos - filled) % shard.capacity, filled - size)
    shard._max_priority = float(np.asarray(state["max_priority"]).item())
    shard._max_mass = shard._mass(np.array([shard._max_priority]))[0]
    for k in _COUNTERS:
        shard._counts[k] = int(np.asarray(state[k]).item())
    for k in _TIMERS:
        shard._times[k] = float(np.asarray(state[k]).item())
    shard._rng.bit_generator.state = _pcg64_from_array(np.asarray(state["rng_state"]))


def _pcg64_to_array(state: dict) -> np.ndarray:
    if state["bit_generator"] != "PCG64":
        raise ValueError(f"only PCG64 generators are supported, got {state['bit_generator']}")
    s, inc = state["state"]["state"], state["state"]["inc"]
    return np.array(
        [s >> 64, s & _MASK64, inc >> 64, inc & _MASK64, state["has_uint32"], state["uinteger"]],
        dtype=np.uint64,
    )


def _pcg64_from_array(a: np.ndarray) -> dict:
    v = [int(x) for x in a]
    return {
        "bit_generator": "PCG64",
        "state": {"state": (v[0] << 64) | v[1], "inc": (v[2] << 64) | v[3]},
        "has_uint32": v[4],
        "uinteger": v[5],
    }
