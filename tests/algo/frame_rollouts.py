"""Rollouts of frame-stacked observations, as an env worker makes them (test helper).

A fake env emits one random frame per step; observations are the last ``k``
frames, first axis ``k``, padded at an episode start like gymnasium's
``FrameStackObservation`` (``"reset"``: copies of the first frame; ``"zero"``:
zero frames). Steps go through the real :class:`NStepAdder`, so batches hold
exactly the n-step transitions an env worker would send.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from apex_dask.algo.rollout.nstep import NStepAdder, stack_transitions


class StackedEpisodes:
    """Produces fragments of n-step transitions over frame-stacked episodes.

    ``lengths``: (low, high) episode lengths, drawn uniformly; an episode ends
    by termination or, with probability ``truncate_p``, truncation.
    ``repeat_p``: probability that a frame repeats the previous one (a still
    screen), so equal frames also occur inside and across stacks.
    """

    def __init__(
        self,
        rng: np.random.Generator,
        *,
        k: int = 4,
        n_step: int = 3,
        frame_shape: tuple[int, ...] = (6, 5),
        lengths: tuple[int, int] = (1, 40),
        truncate_p: float = 0.3,
        repeat_p: float = 0.05,
        padding: str = "reset",
        dtype=np.uint8,
    ) -> None:
        self.rng, self.k, self.frame_shape, self.dtype = rng, k, frame_shape, dtype
        self.lengths, self.truncate_p, self.repeat_p, self.padding = (
            lengths,
            truncate_p,
            repeat_p,
            padding,
        )
        self.adder = NStepAdder(n_step, 0.9)
        self.frames_made = 0
        self._reset()

    def _frame(self) -> np.ndarray:
        self.frames_made += 1
        if self._last is not None and self.rng.random() < self.repeat_p:
            return self._last.copy()
        self._last = self.rng.integers(0, 256, self.frame_shape).astype(self.dtype)
        return self._last

    def _reset(self) -> None:
        self._last = None
        first = self._frame()
        pad = first if self.padding == "reset" else np.zeros_like(first)
        self.window = deque([pad] * (self.k - 1) + [first], maxlen=self.k)
        self.obs = np.stack(self.window)
        self.left = int(self.rng.integers(self.lengths[0], self.lengths[1] + 1))

    def fragment(self, steps: int) -> dict[str, np.ndarray]:
        """The transitions completed during ``steps`` env steps (full stacks)."""
        out = []
        for _ in range(steps):
            self.window.append(self._frame())
            nxt = np.stack(self.window)
            self.left -= 1
            end = self.left <= 0
            truncated = end and self.rng.random() < self.truncate_p
            action = int(self.rng.integers(4))
            reward = float(self.rng.standard_normal())
            out += self.adder.add(self.obs, action, reward, nxt, end and not truncated, truncated)
            if end:
                self._reset()
            else:
                self.obs = nxt
        shape = (self.k, *self.frame_shape)
        return stack_transitions(out, shape, np.dtype(self.dtype))


def naive_sample_check(shard, naive: dict[int, dict[str, np.ndarray]], batch_size: int) -> int:
    """Sample ``shard``; every item must equal the one ``naive`` holds at its slot.

    Returns the number of items checked.
    """
    s = shard.sample(batch_size, beta=0.4)
    for key, got in s.data.items():
        want = np.stack([naive[int(slot)][key] for slot in s.indices])
        assert got.dtype == want.dtype, key
        np.testing.assert_array_equal(got, want, err_msg=key)
    assert set(s.data) == set(naive[int(s.indices[0])])
    return len(s.indices)
