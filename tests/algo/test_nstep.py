"""Table-driven n-step adder cases, every expected value computed by hand.

A step is (obs, action, reward, next_obs, terminated, truncated); observations
are integer labels so next_obs is easy to check. An expected transition is
(obs, action, n-step return, next_obs, done, discount).
"""

import numpy as np
import pytest

from apex_dask.algo.rollout.nstep import TRANSITION_KEYS, NStepAdder, stack_transitions

F, T = False, True

CASES = {
    # n=3, gamma=0.5, no episode end: one full transition per step once 3 are pending.
    "full_returns_mid_episode": dict(
        n=3,
        gamma=0.5,
        steps=[(0, 0, 1, 1, F, F), (1, 1, 2, 2, F, F), (2, 0, 3, 3, F, F), (3, 1, 4, 4, F, F)],
        # R0 = 1 + .5*2 + .25*3 = 2.75 ; R1 = 2 + .5*3 + .25*4 = 4.5
        expected=[[], [], [(0, 0, 2.75, 3, F, 0.125)], [(1, 1, 4.5, 4, F, 0.125)]],
    ),
    # An episode of 2 steps with n=3 terminates: both flushed short, no bootstrap.
    "episode_shorter_than_n_terminates": dict(
        n=3,
        gamma=0.5,
        steps=[(0, 1, 1, 1, F, F), (1, 0, 2, 2, T, F)],
        # R0 = 1 + .5*2 = 2 ; R1 = 2
        expected=[[], [(0, 1, 2.0, 2, T, 0.0), (1, 0, 2.0, 2, T, 0.0)]],
    ),
    # Termination after more than n steps: the last n transitions come out at the end.
    "termination_flushes_shorter_returns": dict(
        n=2,
        gamma=0.5,
        steps=[(0, 0, 1, 1, F, F), (1, 0, 1, 2, F, F), (2, 1, 1, 3, T, F)],
        # R0 = 1 + .5 = 1.5 (full, bootstraps with .25) ; R1 = 1.5 ; R2 = 1
        expected=[
            [],
            [(0, 0, 1.5, 2, F, 0.25)],
            [(1, 0, 1.5, 3, T, 0.0), (2, 1, 1.0, 3, T, 0.0)],
        ],
    ),
    # A time limit is not a terminal state: flushed transitions still bootstrap.
    "truncation_still_bootstraps": dict(
        n=3,
        gamma=0.5,
        steps=[(0, 0, 1, 1, F, F), (1, 1, 2, 2, F, T)],
        # R0 = 1 + .5*2 = 2 with gamma^2 ; R1 = 2 with gamma^1
        expected=[[], [(0, 0, 2.0, 2, F, 0.25), (1, 1, 2.0, 2, F, 0.5)]],
    ),
    # terminated and truncated together: termination wins (no bootstrap).
    "terminated_and_truncated_is_terminal": dict(
        n=2,
        gamma=0.9,
        steps=[(0, 0, 1, 1, T, T)],
        expected=[[(0, 0, 1.0, 1, T, 0.0)]],
    ),
    # An episode ends mid-fragment, the env resets (obs 10), the next episode
    # starts with an empty window: no return crosses the episode boundary.
    "reset_in_the_middle": dict(
        n=2,
        gamma=0.5,
        steps=[
            (0, 0, 1, 1, F, F),
            (1, 1, 2, 2, T, F),
            (10, 0, 4, 11, F, F),
            (11, 1, 8, 12, F, F),
            (12, 0, 16, 13, F, F),
        ],
        # R0 = 1 + .5*2 = 2 (terminal) ; R1 = 2 ; R10 = 4 + .5*8 = 8 ; R11 = 8 + .5*16 = 16
        expected=[
            [],
            [(0, 0, 2.0, 2, T, 0.0), (1, 1, 2.0, 2, T, 0.0)],
            [],
            [(10, 0, 8.0, 12, F, 0.25)],
            [(11, 1, 16.0, 13, F, 0.25)],
        ],
    ),
    # n = 1 is ordinary one-step Q-learning.
    "one_step": dict(
        n=1,
        gamma=0.99,
        steps=[(0, 1, 3, 1, F, F), (1, 0, -1, 2, T, F)],
        expected=[[(0, 1, 3.0, 1, F, 0.99)], [(1, 0, -1.0, 2, T, 0.0)]],
    ),
    # gamma = 1: plain sums.
    "undiscounted": dict(
        n=3,
        gamma=1.0,
        steps=[(0, 0, 1, 1, F, F), (1, 0, 1, 2, F, F), (2, 0, 1, 3, F, F)],
        expected=[[], [], [(0, 0, 3.0, 3, F, 1.0)]],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_adder_emits_hand_computed_transitions(name):
    case = CASES[name]
    adder = NStepAdder(case["n"], case["gamma"])
    for step, expected in zip(case["steps"], case["expected"], strict=True):
        out = adder.add(*step)
        got = [
            (t["obs"], t["action"], t["reward"], t["next_obs"], t["done"], t["discount"])
            for t in out
        ]
        assert len(got) == len(expected), (step, got)
        for g, e in zip(got, expected, strict=True):
            assert g[:2] == e[:2] and g[3:5] == e[3:5], (g, e)
            assert g[2] == pytest.approx(e[2]) and g[5] == pytest.approx(e[5]), (g, e)


def test_fragment_boundary_does_not_flush_pending_steps():
    """Cut a stream into fragments of 2 steps: pending steps carry over intact."""
    adder = NStepAdder(3, 0.5)
    fragment_1 = [(0, 0, 1, 1, F, F), (1, 0, 2, 2, F, F)]
    fragment_2 = [(2, 0, 4, 3, F, F), (3, 0, 8, 4, F, F)]
    out_1 = [t for s in fragment_1 for t in adder.add(*s)]
    assert out_1 == [] and adder.num_pending == 2
    out_2 = [t for s in fragment_2 for t in adder.add(*s)]
    # R0 = 1 + .5*2 + .25*4 = 3 ; R1 = 2 + .5*4 + .25*8 = 6: full 3-step returns
    assert [t["obs"] for t in out_2] == [0, 1]
    assert [t["reward"] for t in out_2] == pytest.approx([3.0, 6.0])
    assert [t["discount"] for t in out_2] == pytest.approx([0.125, 0.125])
    assert adder.num_pending == 2


def test_reset_drops_pending_steps():
    adder = NStepAdder(3, 0.9)
    adder.add(0, 0, 1.0, 1, False, False)
    adder.reset()
    assert adder.num_pending == 0
    assert adder.add(5, 0, 1.0, 6, True, False)[0]["obs"] == 5


def test_every_step_is_emitted_exactly_once_over_random_episodes():
    rng = np.random.default_rng(3)
    adder = NStepAdder(4, 0.9)
    emitted, seen = [], 0
    for _ in range(50):
        length = int(rng.integers(1, 12))
        for t in range(length):
            end = t == length - 1
            term = end and rng.random() < 0.5
            trunc = end and not term
            emitted += [x["obs"] for x in adder.add(seen, 0, 1.0, seen + 1, term, trunc)]
            seen += 1
    assert emitted == list(range(seen))


@pytest.mark.parametrize("bad", [dict(n_step=0, gamma=0.9), dict(n_step=3, gamma=0.0)])
def test_bad_arguments_raise(bad):
    with pytest.raises(ValueError):
        NStepAdder(**bad)


def test_stack_transitions_dtypes_and_shapes():
    adder = NStepAdder(1, 0.5)
    obs = [np.full(4, i, dtype=np.float32) for i in range(4)]
    trs = [t for i in range(3) for t in adder.add(obs[i], i % 2, 1.0, obs[i + 1], i == 2, False)]
    batch = stack_transitions(trs)
    assert set(batch) == set(TRANSITION_KEYS)
    assert batch["obs"].shape == (3, 4) and batch["obs"].dtype == np.float32
    assert batch["next_obs"][2, 0] == 3.0
    assert batch["action"].dtype == np.int64 and batch["action"].tolist() == [0, 1, 0]
    assert batch["reward"].dtype == np.float32
    assert batch["done"].tolist() == [False, False, True]
    assert batch["discount"].tolist() == pytest.approx([0.5, 0.5, 0.0])


def test_stack_zero_transitions_needs_shape():
    with pytest.raises(ValueError):
        stack_transitions([])
    batch = stack_transitions([], obs_shape=(84, 84, 4), obs_dtype=np.uint8)
    assert batch["obs"].shape == (0, 84, 84, 4) and batch["obs"].dtype == np.uint8
    assert batch["discount"].shape == (0,)
