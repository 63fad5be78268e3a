"""The n-step adder over the env and time axes emits what one scalar adder per env emits."""

import numpy as np
import pytest
from test_nstep import CASES

from apex_dask.algo.rollout.nstep import NStepAdder
from apex_dask.algo.rollout.vector_nstep import VectorNStepAdder

KEYS = ("env", "obs", "action", "reward", "next_obs", "done", "discount")


def _arrays(steps):
    """One vector step from per-env scalar steps (obs, action, reward, next_obs, term, trunc)."""
    cols = list(zip(*steps, strict=True))
    return (
        np.asarray(cols[0], np.float32),
        np.asarray(cols[1], np.int64),
        np.asarray(cols[2], np.float64),
        np.asarray(cols[3], np.float32),
        np.asarray(cols[4], bool),
        np.asarray(cols[5], bool),
    )


def _rows(batch):
    return list(zip(*(batch[k].tolist() for k in KEYS), strict=True))


@pytest.mark.parametrize("name", sorted(CASES))
def test_hand_computed_cases_on_two_envs_at_once(name):
    case = CASES[name]
    adder = VectorNStepAdder(2, case["n"], case["gamma"], (), np.float32, num_actions=16)
    for step, expected in zip(case["steps"], case["expected"], strict=True):
        shifted = (step[0] + 100, *step[1:3], step[3] + 100, *step[4:])
        adder.add(*_arrays([step, shifted]))
        out, _ = adder.take(np.array([step[3], shifted[3]], np.float32))
        want = [(0, *e) for e in expected] + [
            (1, e[0] + 100, *e[1:3], e[3] + 100, *e[4:]) for e in expected
        ]
        got = _rows(out)
        assert len(got) == len(want)
        for g, e in zip(got, want, strict=True):
            assert g[:3] == e[:3] and g[4:6] == e[4:6], (g, e)
            assert g[3] == pytest.approx(e[3]) and g[6] == pytest.approx(e[6]), (g, e)


def _scalar_rows(adders, steps, active):
    """Per env, the scalar adders' transitions of one step (an inactive step: reset)."""
    rows = [[] for _ in adders]
    for j, (adder, step) in enumerate(zip(adders, steps, strict=True)):
        if not active[j]:
            adder.reset()
            continue
        for t in adder.add(*step):
            row = (j, t["obs"], t["action"], np.float32(t["reward"]), t["next_obs"], t["done"])
            rows[j].append((*row, np.float32(t["discount"])))
    return rows


@pytest.mark.parametrize("n_step", [1, 3, 5])
def test_random_fragments_match_one_scalar_adder_per_env_bit_for_bit(n_step):
    rng = np.random.default_rng(n_step)
    num_envs, gamma = 6, 0.97
    vec = VectorNStepAdder(num_envs, n_step, gamma, (), np.float32, 4, num_actions=3)
    adders = [NStepAdder(n_step, gamma) for _ in range(num_envs)]
    seen, label = 0, num_envs
    obs = np.arange(num_envs, dtype=np.float32)
    for _ in range(60):  # fragments of 1-11 steps (the adder grows past 4)
        want = [[] for _ in range(num_envs)]
        for _ in range(int(rng.integers(1, 12))):
            term = rng.random(num_envs) < 0.08
            trunc = rng.random(num_envs) < 0.05  # both at once: termination wins
            active = rng.random(num_envs) > 0.03  # an env error drops the step and the pending
            reward = rng.normal(size=num_envs)
            after = np.arange(label, label + num_envs, dtype=np.float32)
            label += num_envs
            # s_{t+1}: the next step's obs, or a final obs (label + 0.5) where the episode ended
            nxt = np.where(term | trunc, obs + 0.5, after)
            steps = [
                (obs[j], int(j % 3), float(reward[j]), nxt[j], bool(term[j]), bool(trunc[j]))
                for j in range(num_envs)
            ]
            for j, got in enumerate(_scalar_rows(adders, steps, active)):
                want[j] += got
            vec.set_q(obs[:, None] * np.float32([1, 2, 3]))  # Q(s, a) = s * (a + 1)
            vec.add(*_arrays(steps), active=active)
            obs = after
        out, _ = vec.take(obs)
        # rewards and discounts equal as float32, not only close; env-major, oldest first
        assert _rows(out) == [row for env_rows in want for row in env_rows]
        # Q(s_t)[a_t] kept with its step
        np.testing.assert_array_equal(out["q_taken"], out["obs"] * (out["action"] + 1))
        assert vec.pending().tolist() == [a.num_pending for a in adders]
        seen += len(out["env"])
    assert seen > 500


def test_priorities_use_the_values_of_the_bootstrap_states_by_hand():
    """One env, n = 2, gamma = 0.5: a time limit at step 1, a termination at step 3."""
    adder = VectorNStepAdder(1, 2, 0.5, (), np.float32, num_actions=2)
    # step s acts on obs 10 + s worth max Q = v[s], taking action 0 with Q = 0.5 s;
    # the time limit's final obs 99 is worth 7
    v = [1.0, 2.0, 3.0, 4.0]
    ends = {1: (False, True), 3: (True, False)}
    for s in range(4):
        finals = [[7.0, -1.0]] if len(adder.finals()) else None
        adder.set_q(np.array([[0.5 * s, v[s]]], np.float32), finals)
        term, trunc = ends.get(s, (False, False))
        nxt = 99.0 if s in ends else 11.0 + s
        adder.add(
            np.array([10.0 + s], np.float32),
            np.array([0]),
            np.array([1.0]),
            np.array([nxt], np.float32),
            np.array([term]),
            np.array([trunc]),
        )
        assert adder.finals().tolist() == ([0] if s == 1 else [])
    adder.set_q(np.array([[0.0, 9.0]], np.float32))
    batch, prios = adder.take(np.array([20.0], np.float32))
    assert batch["obs"].tolist() == [10, 11, 12, 13]
    assert batch["next_obs"].tolist() == [99, 99, 99, 99]
    # 0: 1 + 0.5 + 0.25 * 7 - 0 ; 1: 1 + 0.5 * 7 - 0.5 ; 2: 1 + 0.5 - 1 (terminal) ; 3: 1 - 1.5
    np.testing.assert_allclose(prios, [3.25, 4.0, 0.5, 0.5])
    assert adder.num_pending == 0
