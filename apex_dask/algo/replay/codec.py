"""Frame-stacked observations sent and stored as frames plus references.

An Atari observation is a stack of the last ``k`` frames, first axis ``k``
(gymnasium's ``FrameStackObservation``: ``(4, 84, 84)`` uint8). Consecutive
stacks of an episode share ``k - 1`` frames, and the n-step ``next_obs`` of a
transition is the stack ``n`` steps later, so a batch of full stacks repeats
almost every frame ``2k`` times. The **compact form** of a batch keeps each
frame once::

    frames         [M, *frame_shape]   each distinct frame once (dtype of obs)
    obs_refs       int32 [N, k]        obs[i]      == frames[obs_refs[i]]
    next_obs_refs  int32 [N, k]        next_obs[i] == frames[next_obs_refs[i]]

and every other key of the batch (``action, reward, done, discount``, ...)
unchanged, ``N`` items each. It is a plain dict of numpy arrays: an env worker
sends it to a replay shard as it is (so a rollout crosses the wire with each
frame once), and :meth:`ReplayShard.add <apex_dask.algo.replay.shard.ReplayShard.add>`
takes it as well as full stacks. ``decode_batch(encode_batch(b, k))`` equals
``b`` bit for bit, whatever the data.

How :func:`encode_stacks` finds shared frames (every match is an exact
comparison of the frames' bytes, so a wrong reference is never made):

* ``obs[i]`` that continues ``obs[i - 1]`` (``obs[i][:-1] == obs[i - 1][1:]``)
  adds one frame, its last (none if it equals the last of ``obs[i - 1]``: a
  still screen); any other stack (an episode start, data that is
  not a frame stack) adds its frames, equal adjacent frames once (the padding
  of an episode start: ``[f0, f0, f0, f0]`` is one frame);
* ``next_obs[i]`` is looked up, in this order: as ``obs[i + d]`` with the
  offset ``d`` that matched last (``n`` for n-step transitions), as
  ``next_obs[i - 1]`` (the same final observation at an episode end), as the
  stack after ``next_obs[i - 1]`` (a final observation, or the last ``n``
  transitions of the batch), as ``obs[i + d]`` for ``d = 0 .. 64``, as the
  stack ``s = 1 .. k-1`` steps after ``obs[i]`` (episodes or fragments
  shorter than ``n``), else stored like a new stack. A continuation reuses
  the frame stored after the one it continues, or that frame itself, when
  equal, and stores a new frame otherwise.

A fragment of ``L`` env steps with n-step ``n`` thus holds about
``L + n + k - 1`` frames, plus one frame per episode start.

Comparisons run in a numba kernel (one pass, early exit on the first
differing word); without numba the same code runs in Python with numpy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from apex_dask.algo.replay.sumtree_kernels import HAVE_NUMBA, numba

__all__ = [
    "COMPACT_KEYS",
    "decode_batch",
    "encode_batch",
    "encode_stacks",
    "is_compact",
    "split_compact",
]

COMPACT_KEYS: tuple[str, ...] = ("frames", "obs_refs", "next_obs_refs")
"""Keys of the compact form that replace ``obs`` and ``next_obs``."""

SEARCH = 64
"""How far ahead ``next_obs[i]`` is looked for among ``obs[i + d]``."""


def is_compact(batch: Mapping[str, object]) -> bool:
    """Whether ``batch`` is in the compact form (has ``frames``)."""
    return "frames" in batch


# --------------------------------------------------------------------------
# The encoder. Stacks are (n, k, w) arrays of machine words (each frame's
# bytes viewed as w words); src[m] = (0 for obs / 1 for next_obs, i * k + j)
# says where stored frame m comes from.
# --------------------------------------------------------------------------
def _frames_equal_py(a, b):  # pragma: no cover - compiled (or the numpy twin)
    for t in range(a.shape[0]):
        if a[t] != b[t]:
            return False
    return True


def _stacks_equal_py(a, i, b, j, shift):  # pragma: no cover - compiled
    # a[i][f] == b[j][f + shift] for every f with f + shift < k
    for f in range(a.shape[1] - shift):
        if not _frames_equal(a[i, f], b[j, f + shift]):
            return False
    return True


def _frames_equal_np(a, b):
    return np.array_equal(a, b)


def _stacks_equal_np(a, i, b, j, shift):
    k = a.shape[1]
    return np.array_equal(a[i, : k - shift], b[j, shift:])


def _frame_of(obs, nxt, src, m):
    k = obs.shape[1]
    row = src[m, 1]
    if src[m, 0] == 0:
        return obs[row // k, row % k]
    return nxt[row // k, row % k]


def _store_whole(a, which, i, refs, src, m):
    """Store stack a[i] from frame m on; equal adjacent frames once. Returns the new m."""
    k = a.shape[1]
    src[m, 0], src[m, 1] = which, i * k
    refs[i, 0] = m
    m += 1
    for j in range(1, k):
        if _frames_equal(a[i, j], a[i, j - 1]):
            refs[i, j] = refs[i, j - 1]
        else:
            src[m, 0], src[m, 1] = which, i * k + j
            refs[i, j] = m
            m += 1
    return m


def _continue(obs, nxt, i, base, s, src, nrefs, succ, m):
    """next_obs[i] as the stack ``s`` steps after the one whose refs are ``base``.

    Its first ``k - s`` frames are base's last; each later frame is the one
    stored after the previous (``succ``) or the previous itself when equal,
    else stored now.
    Returns the new m.
    """
    k = nxt.shape[1]
    for j in range(k - s):
        nrefs[i, j] = base[j + s]
    prev = base[k - 1]
    for j in range(k - s, k):
        after = succ[prev]
        if after >= 0 and _frames_equal(nxt[i, j], _frame_of(obs, nxt, src, after)):
            nrefs[i, j] = after
        elif _frames_equal(nxt[i, j], _frame_of(obs, nxt, src, prev)):  # a still screen
            nrefs[i, j] = prev
        else:
            src[m, 0], src[m, 1] = 1, i * k + j
            nrefs[i, j] = m
            if after < 0:
                succ[prev] = m
            m += 1
        prev = nrefs[i, j]
    return m


def _encode_py(obs, nxt, search, src, orefs, nrefs, succ):
    """Fill src, orefs, nrefs (see the module docstring); returns the number of frames."""
    n, k = obs.shape[0], obs.shape[1]
    m = 0
    for i in range(n):
        if i > 0 and _stacks_equal(obs, i, obs, i - 1, 1):
            for j in range(k - 1):
                orefs[i, j] = orefs[i - 1, j + 1]
            if _frames_equal(obs[i, k - 1], obs[i - 1, k - 1]):  # a still screen
                orefs[i, k - 1] = orefs[i - 1, k - 1]
            else:
                succ[orefs[i - 1, k - 1]] = m
                src[m, 0], src[m, 1] = 0, i * k + k - 1
                orefs[i, k - 1] = m
                m += 1
        else:
            m = _store_whole(obs, 0, i, orefs, src, m)
    d = -1
    for i in range(n):
        if d >= 0 and i + d < n and _stacks_equal(nxt, i, obs, i + d, 0):
            nrefs[i, :] = orefs[i + d, :]
        elif i > 0 and _stacks_equal(nxt, i, nxt, i - 1, 0):
            nrefs[i, :] = nrefs[i - 1, :]
        elif i > 0 and _stacks_equal(nxt, i, nxt, i - 1, 1):
            m = _continue(obs, nxt, i, nrefs[i - 1], 1, src, nrefs, succ, m)
        else:
            found = False
            for dd in range(min(search, n - 1 - i) + 1):
                if _stacks_equal(nxt, i, obs, i + dd, 0):
                    nrefs[i, :] = orefs[i + dd, :]
                    d, found = dd, True
                    break
            for s in range(1, k):  # its own obs, s steps later
                if found:
                    break
                if _stacks_equal(nxt, i, obs, i, s):
                    m = _continue(obs, nxt, i, orefs[i], s, src, nrefs, succ, m)
                    found = True
            if not found:
                m = _store_whole(nxt, 1, i, nrefs, src, m)
    return m


def _gather_py(obs, nxt, src, out):
    """out[m] = the frame src[m] names, for every m."""
    for m in range(out.shape[0]):
        out[m, :] = _frame_of(obs, nxt, src, m)


if HAVE_NUMBA:
    _KW = {"cache": True, "nogil": True}
    _frames_equal = numba.njit(**_KW)(_frames_equal_py)
    _stacks_equal = numba.njit(**_KW)(_stacks_equal_py)
    _frame_of = numba.njit(**_KW)(_frame_of)
    _store_whole = numba.njit(**_KW)(_store_whole)
    _continue = numba.njit(**_KW)(_continue)
    _encode = numba.njit(**_KW)(_encode_py)
    _gather = numba.njit(**_KW)(_gather_py)
else:  # pragma: no cover - exercised only where numba is absent
    _frames_equal, _stacks_equal = _frames_equal_np, _stacks_equal_np
    _encode = _encode_py

    def _gather(obs, nxt, src, out):
        k = obs.shape[1]
        which, row = src[:, 0] == 0, src[:, 1]
        out[which] = obs[row[which] // k, row[which] % k]
        out[~which] = nxt[row[~which] // k, row[~which] % k]


def _words(stacks: np.ndarray) -> np.ndarray:
    """(n, k, w) view of the stacks' frames as the widest words that divide a frame."""
    n, k = stacks.shape[:2]
    raw = np.ascontiguousarray(stacks).reshape(n, k, math.prod(stacks.shape[2:])).view(np.uint8)
    nbytes = raw.shape[2]
    for word in (np.uint64, np.uint32, np.uint16):
        if nbytes % np.dtype(word).itemsize == 0:
            return raw.view(word)
    return raw


def encode_stacks(obs: np.ndarray, next_obs: np.ndarray) -> tuple[np.ndarray, ...]:
    """``(frames, obs_refs, next_obs_refs)`` for stacks ``[N, k, *frame_shape]``.

    ``frames[obs_refs[i]] == obs[i]`` and ``frames[next_obs_refs[i]] ==
    next_obs[i]`` bit for bit; refs are int32.
    """
    obs, next_obs = np.asarray(obs), np.asarray(next_obs)
    if obs.shape != next_obs.shape or obs.dtype != next_obs.dtype or obs.ndim < 2:
        raise ValueError(
            f"obs and next_obs must be stacks [N, k, ...] of one shape and dtype, got "
            f"{obs.dtype}{list(obs.shape)} and {next_obs.dtype}{list(next_obs.shape)}"
        )
    n, k = obs.shape[:2]
    frame_shape = obs.shape[2:]
    ow, xw = _words(obs), _words(next_obs)
    src = np.empty((2 * n * k, 2), np.int64)
    orefs = np.empty((n, k), np.int64)
    nrefs = np.empty((n, k), np.int64)
    succ = np.full(2 * n * k, -1, np.int64)
    m = int(_encode(ow, xw, SEARCH, src, orefs, nrefs, succ)) if n else 0
    frames = np.empty((m, *frame_shape), obs.dtype)
    if m:
        _gather(ow, xw, src[:m], frames.reshape(m, -1).view(np.uint8).view(ow.dtype))
    return frames, orefs.astype(np.int32), nrefs.astype(np.int32)


def encode_batch(batch: Mapping[str, np.ndarray], frame_stack: int) -> dict[str, np.ndarray]:
    """The compact form of a batch of full stacks (``obs`` items ``[k, *frame_shape]``).

    Other keys are passed through (not copied); the order of keys is kept,
    ``obs`` becoming ``frames, obs_refs`` and ``next_obs`` ``next_obs_refs``.
    """
    obs, nxt = np.asarray(batch["obs"]), np.asarray(batch["next_obs"])
    if obs.ndim < 2 or obs.shape[1] != frame_stack:
        raise ValueError(
            f"frame_stack={frame_stack} needs obs items [{frame_stack}, ...] "
            f"(first axis the stack), got {obs.dtype}{list(obs.shape[1:])}"
        )
    frames, orefs, nrefs = encode_stacks(obs, nxt)
    out: dict[str, np.ndarray] = {}
    for key, value in batch.items():
        if key == "obs":
            out["frames"], out["obs_refs"] = frames, orefs
        elif key == "next_obs":
            out["next_obs_refs"] = nrefs
        else:
            out[key] = value
    return out


def split_compact(
    batch: Mapping[str, np.ndarray], frame_stack: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(frames, obs_refs, next_obs_refs)`` of a compact batch, checked.

    Refs must be integer ``[N, k]`` (``k == frame_stack`` when given) within
    ``[0, len(frames))``; otherwise ``ValueError`` naming the key.
    """
    missing = [key for key in COMPACT_KEYS if key not in batch]
    if missing:
        raise ValueError(f"compact batch lacks {missing}; it has {sorted(batch)}")
    frames = np.asarray(batch["frames"])
    if frames.ndim < 1:
        raise ValueError("batch['frames'] must have a first (frame) dimension")
    refs = []
    for key in ("obs_refs", "next_obs_refs"):
        r = np.asarray(batch[key])
        if r.ndim != 2 or not (r.dtype.kind in "iu" or r.size == 0):
            raise ValueError(f"batch[{key!r}] must be an integer array [N, k], got {r.dtype}")
        if frame_stack is not None and r.shape[1] != frame_stack:
            raise ValueError(f"batch[{key!r}] has {r.shape[1]} frames per stack, not {frame_stack}")
        if r.size and (r.min() < 0 or r.max() >= frames.shape[0]):
            raise ValueError(f"batch[{key!r}] refers outside the {frames.shape[0]} frames")
        refs.append(r)
    if refs[0].shape != refs[1].shape:
        raise ValueError(f"obs_refs {refs[0].shape} and next_obs_refs {refs[1].shape} differ")
    return frames, refs[0], refs[1]


def decode_batch(batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Full stacks from a compact batch (the inverse of :func:`encode_batch`)."""
    frames, orefs, nrefs = split_compact(batch)
    out: dict[str, np.ndarray] = {}
    for key, value in batch.items():
        if key == "obs_refs":
            out["obs"] = frames[orefs]
        elif key == "next_obs_refs":
            out["next_obs"] = frames[nrefs]
        elif key != "frames":
            out[key] = value
    return out
