"""The n-step adder over the env axis emits what one scalar adder per env emits."""

import numpy as np
import pytest
from test_nstep import CASES

from apex_dask.algo.nstep import NStepAdder
from apex_dask.algo.vector_nstep import PriorityFragment, VectorNStepAdder


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


@pytest.mark.parametrize("name", sorted(CASES))
def test_hand_computed_cases_on_two_envs_at_once(name):
    case = CASES[name]
    adder = VectorNStepAdder(2, case["n"], case["gamma"], (), np.float32)
    for step, expected in zip(case["steps"], case["expected"], strict=True):
        shifted = (step[0] + 100, *step[1:3], step[3] + 100, *step[4:])
        out = adder.add(*_arrays([step, shifted]))
        want = [(0, *e) for e in expected] + [
            (1, e[0] + 100, *e[1:3], e[3] + 100, *e[4:]) for e in expected
        ]
        if not want:
            assert out is None
            continue
        got = list(
            zip(
                *(
                    out[k].tolist()
                    for k in ("env", "obs", "action", "reward", "next_obs", "done", "discount")
                ),
                strict=True,
            )
        )
        assert len(got) == len(want)
        for g, e in zip(got, want, strict=True):
            assert g[:3] == e[:3] and g[4:6] == e[4:6], (g, e)
            assert g[3] == pytest.approx(e[3]) and g[6] == pytest.approx(e[6]), (g, e)


def _scalar_block(adders, steps, active):
    rows = []
    for j, (adder, step) in enumerate(zip(adders, steps, strict=True)):
        if not active[j]:
            adder.reset()
            continue
        for t in adder.add(*step):
            rows.append(
                (
                    j,
                    t["obs"],
                    t["action"],
                    np.float32(t["reward"]),
                    t["next_obs"],
                    t["done"],
                    np.float32(t["discount"]),
                )
            )
    return rows


@pytest.mark.parametrize("n_step", [1, 3, 5])
def test_random_episodes_match_one_scalar_adder_per_env_bit_for_bit(n_step):
    rng = np.random.default_rng(n_step)
    num_envs, gamma = 6, 0.97
    vec = VectorNStepAdder(num_envs, n_step, gamma, (), np.float32)
    adders = [NStepAdder(n_step, gamma) for _ in range(num_envs)]
    label = 0
    for _ in range(400):
        term = rng.random(num_envs) < 0.08
        trunc = rng.random(num_envs) < 0.05  # both at once: termination wins
        active = rng.random(num_envs) > 0.03  # an env error drops the step and the pending
        reward = rng.normal(size=num_envs)
        obs = np.arange(label, label + num_envs, dtype=np.float32)
        steps = [
            (obs[j], int(j % 3), float(reward[j]), obs[j] + 0.5, bool(term[j]), bool(trunc[j]))
            for j in range(num_envs)
        ]
        label += num_envs
        want = _scalar_block(adders, steps, active)
        out = vec.add(*_arrays(steps), q_taken=obs * 2, active=active)
        for j in np.flatnonzero(~active):
            vec.reset(int(j))
        if out is None:
            assert want == []
            continue
        got = list(
            zip(
                out["env"].tolist(),
                out["obs"],
                out["action"].tolist(),
                out["reward"],
                out["next_obs"],
                out["done"].tolist(),
                out["discount"],
                strict=True,
            )
        )
        assert got == want  # rewards and discounts equal as float32, not only close
        np.testing.assert_array_equal(out["q_taken"], out["obs"] * 2)  # kept with its step
        assert vec.pending().tolist() == [a.num_pending for a in adders]


def test_priority_fragment_uses_the_bootstrap_rows_and_orders_env_major():
    frag = PriorityFragment()
    block = {
        "env": np.array([1, 0]),
        "reward": np.array([1.0, 2.0], np.float32),
        "discount": np.array([0.5, 0.0], np.float32),
        "q_taken": np.array([3.0, 1.0], np.float32),
        "action": np.array([7, 8]),
    }
    frag.add(block, np.array([2, -1]))
    with pytest.raises(RuntimeError):
        frag.take(("action",))
    frag.resolve(np.array([[0.0, 0.0], [9.0, 9.0], [4.0, -1.0]], np.float32))
    batch, prios = frag.take(("action",))
    assert batch["action"].tolist() == [8, 7]  # env 0 first
    # env 0: terminal, |2 - 1| ; env 1: |1 + 0.5 * max(4, -1) - 3| = 0
    np.testing.assert_allclose(prios, [1.0, 0.0])
    assert frag.take(("action",)) is None
