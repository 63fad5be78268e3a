"""The checkpoint format of a :class:`~apex_dask.algo.replay.shard.ReplayShard`, and its helpers.

A shard's state is a flat dict of numpy arrays and numbers (suitable for
``np.savez``; nothing in it needs unpickling). Each component writes and
reads its own keys:

- the shard (:mod:`apex_dask.algo.replay.shard`): ``capacity, alpha, eps``, the
  counters ``added, sampled, updated, stale_priority_updates``, the timers ``add_s, sample_s,
  update_s`` and ``rng_state`` (uint64 [6], the PCG64 state);
- its priorities (:class:`~apex_dask.algo.replay.priorities.Priorities`):
  ``max_priority``, ``priority`` and ``mass`` (float64, one per slot ever
  written);
- its item storage (:class:`~apex_dask.algo.replay.storage.ItemStorage`):
  ``size, pos``, ``clock`` and ``generation`` (the write clock and each
  slot's write stamp; absent in checkpoints written before they existed) and
  ``data/<key>`` (copies of the slots ever written);
- with ``frame_stack``, its frame store
  (:class:`~apex_dask.algo.replay.frames.FrameStore`): ``frame_stack``,
  ``frame_capacity`` and ``frames/*`` (the frames in use, each once); the
  item storage then also saves ``filled`` (the slots ever written:
  ``priority``, ``mass`` and ``data/<key>`` have this many items, ``size``
  of them stored), and the items keep ``data/obs_refs``,
  ``data/next_obs_refs`` (each item's ring slots) in place of ``data/obs``,
  ``data/next_obs``.

These keys are the format since checkpoints were first written
(``tests/algo/test_replay_checkpoint_format.py`` loads such checkpoints).

**Newest items.** ``ReplayShard.state_dict(max_items=m)`` writes, in this same
format, the state of a shard that held only its newest ``m`` items (a
checkpoint that must fit in a stop's grace): they go, oldest first, to slots
``0 .. m-1`` with their priorities, masses and generations (``pos`` follows
them; ``filled = size = m``); with ``frame_stack`` the frames they use come
along, with the frame ids unchanged (``frames/written`` is the shard's) and
the log's newest batches holding them, the oldest counted with the items of
it kept. The counters, timers, rng, ``clock`` and ``max_priority`` are the
whole shard's, so the items left out count as evicted. Loading needs nothing
special: the state is one of a smaller shard.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = [
    "COUNTERS",
    "TIMERS",
    "check_same",
    "pcg64_from_array",
    "pcg64_to_array",
]

COUNTERS = ("added", "sampled", "updated", "stale_priority_updates")
"""The shard's cumulative counters, saved under their names (``stale_priority_updates``: 0 when
a checkpoint written before it existed lacks it)."""

TIMERS = ("add_s", "sample_s", "update_s")
"""The shard's cumulative seconds per operation, saved under their names."""

_MASK64 = (1 << 64) - 1


def check_same(state: Mapping[str, object], mine: Mapping[str, object]) -> None:
    """``ValueError`` unless ``state`` holds each ``key: value`` of ``mine`` (None: absent)."""
    for key, value in mine.items():
        theirs = np.asarray(state[key]).item() if key in state else None
        if theirs != value:
            raise ValueError(f"state has {key}={theirs}, this shard has {key}={value}")


def pcg64_to_array(state: dict) -> np.ndarray:
    """A PCG64 ``bit_generator.state`` as uint64 [6] (``ValueError`` for another generator)."""
    if state["bit_generator"] != "PCG64":
        raise ValueError(f"only PCG64 generators are supported, got {state['bit_generator']}")
    s, inc = state["state"]["state"], state["state"]["inc"]
    return np.array(
        [s >> 64, s & _MASK64, inc >> 64, inc & _MASK64, state["has_uint32"], state["uinteger"]],
        dtype=np.uint64,
    )


def pcg64_from_array(a: np.ndarray) -> dict:
    """The inverse of :func:`pcg64_to_array`."""
    v = [int(x) for x in a]
    return {
        "bit_generator": "PCG64",
        "state": {"state": (v[0] << 64) | v[1], "inc": (v[2] << 64) | v[3]},
        "has_uint32": v[4],
        "uinteger": v[5],
    }
