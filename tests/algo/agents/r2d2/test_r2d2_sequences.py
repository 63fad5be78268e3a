"""Sequence items from env steps (the R2D2 adder) against a brute-force reading of the
episodes: across episode ends (terminated and time limits), fragment boundaries,
front padding, stored states and env errors."""

from __future__ import annotations

import numpy as np
import pytest

from apex_dask.algo.agents.r2d2.sequences import SequenceAdder

B, L, P, H = 3, 4, 2, 2
T = B + L


def expected_items(episode_id, length, terminated, env=0, shape=(B, L, P)):
    """Every item of one whole episode, built from the definition (``shape``: burn-in,
    trace length, period)."""
    b, _, p = shape
    t = sum(shape[:2])
    items = []
    for s in range(0, length, p):
        lo = s - b
        obs = np.zeros((t + 1, 2), np.float32)
        mask, first = np.zeros(t, np.float32), np.zeros(t, np.float32)
        action, reward, done = np.zeros(t, np.int64), np.zeros(t, np.float32), np.zeros(t)
        for q in range(t + 1):
            i = lo + q
            if 0 <= i <= length:
                obs[q] = (episode_id, i)
            if 0 <= i < length and q < t:
                mask[q], action[q], reward[q] = 1.0, i % 2, 10 * episode_id + i
                done[q] = float(terminated and i == length - 1)
        p0 = max(0, -lo)
        first[p0] = 1.0
        state = np.array([[episode_id, lo + p0], [env, -(lo + p0)]], np.float32)
        items.append(
            dict(
                obs=obs[:t],
                next_obs=obs[t],
                action=action,
                reward=reward,
                done=done,
                mask=mask,
                first=first,
                state=state,
            )
        )
    return items


def drive(episodes, take_every, errors=()):
    """One env running ``episodes`` ([(length, terminated)]), taking every ``take_every``
    steps; ``errors``: (episode, step) where the env's step fails."""
    adder = SequenceAdder(1, (2,), np.float32, burn_in=B, trace_length=L, period=P, state_size=H)
    got, clock = [], 0
    for e, (length, terminated) in enumerate(episodes):
        for i in range(length):
            adder.set_states(np.array([[e, i]]), np.array([[0, -i]]), version=clock)
            failed = (e, i) in errors
            adder.add(
                np.array([[e, i]], np.float32),
                np.array([i % 2]),
                np.array([10.0 * e + i]),
                np.array([[e, i + 1]], np.float32),
                np.array([terminated and i == length - 1]),
                np.array([not terminated and i == length - 1]),
                np.array([not failed]),
            )
            clock += 1
            if clock % take_every == 0:
                batch, _ = adder.take()
                got += [{k: v[j] for k, v in batch.items()} for j in range(len(batch["obs"]))]
            if failed:
                break
    batch, _ = adder.take()
    got += [{k: v[j] for k, v in batch.items()} for j in range(len(batch["obs"]))]
    return got, adder


@pytest.mark.parametrize("take_every", [1, 3, 5, 1000])  # fragment boundaries anywhere
@pytest.mark.parametrize("terminated", [True, False])  # termination or time limit
def test_items_match_the_definition_across_episodes_and_fragments(take_every, terminated):
    episodes = [(11, terminated), (2, terminated), (8, not terminated), (1, terminated)]
    got, adder = drive(episodes, take_every)
    want = [it for e, (n, term) in enumerate(episodes) for it in expected_items(e, n, term)]
    assert len(got) == len(want) == sum(-(-n // P) for n, _ in episodes)
    got.sort(key=lambda it: (it["obs"][it["first"].argmax()][0], it["state"][0, 1]))
    for g, w in zip(got, want, strict=True):
        for key, value in w.items():
            np.testing.assert_array_equal(g[key], value, err_msg=key)
    assert adder.num_pending == 0


def test_a_full_trace_is_emitted_before_its_episode_ends():
    adder = SequenceAdder(1, (1,), np.float32, burn_in=2, trace_length=3, period=3, state_size=1)
    for i in range(3):
        adder.set_states(np.zeros((1, 1)), np.zeros((1, 1)), 0)
        adder.add(
            np.array([[i]]),
            np.array([0]),
            np.array([1.0]),
            np.array([[i + 1]]),
            np.array([False]),
            np.array([False]),
        )
    batch, _ = adder.take()
    assert len(batch["obs"]) == 1
    assert batch["next_obs"][0, 0] == 3.0  # the observation after the trace's last step
    assert batch["mask"][0].tolist() == [0, 0, 1, 1, 1]
    assert adder.num_pending == 0


def test_an_env_error_drops_the_partial_episode_only():
    episodes = [(9, True), (6, True), (5, False)]
    got, _ = drive(episodes, take_every=2, errors={(1, 3)})
    # episode 1 failed at step 3: its items emitted before (none: trace 4 not full) are
    # all that remain of it; episodes 0 and 2 are whole
    ids = sorted({int(it["obs"][it["first"].argmax()][0]) for it in got})
    assert ids == [0, 2]
    want = expected_items(0, 9, True) + expected_items(2, 5, False)
    assert len(got) == len(want)


def test_stored_state_and_version_are_those_of_the_first_real_step():
    got, _ = drive([(9, True)], take_every=4)
    for it in got:
        p0 = int(it["first"].argmax())
        step = int(it["obs"][p0][1])
        assert it["state"][0, 1] == step and it["state_version"] == step


def test_period_longer_than_the_trace_is_refused():
    with pytest.raises(ValueError, match="period"):
        SequenceAdder(1, (1,), np.float32, burn_in=1, trace_length=2, period=3, state_size=1)


@pytest.mark.parametrize("take_every", [1, 7, 1000])
@pytest.mark.parametrize("shape", [(B, L, P), (0, 5, 5), (6, 9, 7)])  # burn-in, trace, period
def test_envs_stepped_together_give_each_episode_its_items_through_long_episodes(take_every, shape):
    """Three envs in one vector step: episodes of different lengths (long ones move the
    adder's rows many times), a time limit, an env error, envs that run out of work."""
    plans = {
        0: [(53, True), (4, False), (29, True)],
        1: [(1, True), (70, False)],
        2: [(17, False), (17, True), (40, True)],
    }
    fail = (2, 1, 9)  # env 2's second episode fails at its step 9
    n, (b, l_, p) = len(plans), shape
    adder = SequenceAdder(n, (2,), np.float32, burn_in=b, trace_length=l_, period=p, state_size=H)
    at = {j: [0, 0] for j in range(n)}  # env -> [episode, step]
    got, clock = [], 0

    def collect():
        batch, _ = adder.take()
        got.extend({k: v[i] for k, v in batch.items()} for i in range(len(batch["obs"])))

    while any(at[j][0] < len(plans[j]) for j in range(n)):
        ids, steps, ends, terms, active = [], [], [], [], []
        for j in range(n):
            e, i = at[j]
            if e >= len(plans[j]):
                ids.append(-1), steps.append(0), ends.append(False), terms.append(False)
                active.append(False)  # no work left: reads as a dropped (empty) episode
                continue
            length, terminated = plans[j][e]
            ids.append(100 * j + e), steps.append(i)
            last = i == length - 1
            ends.append(last), terms.append(terminated and last)
            active.append((j, e, i) != fail)
        ids_a, steps_a = np.array(ids, np.float32), np.array(steps, np.float32)
        adder.set_states(
            np.stack([ids_a, steps_a], 1), np.stack([np.arange(n), -steps_a], 1), clock
        )
        terms_a, ends_a = np.array(terms), np.array(ends)
        adder.add(
            np.stack([ids_a, steps_a], 1),
            steps_a.astype(np.int64) % 2,
            10.0 * ids_a + steps_a,
            np.stack([ids_a, steps_a + 1], 1),
            terms_a,
            ends_a & ~terms_a,
            np.array(active),
        )
        for j in range(n):
            if at[j][0] >= len(plans[j]):
                continue
            if ends[j] or not active[j]:
                at[j] = [at[j][0] + 1, 0]
            else:
                at[j][1] += 1
        clock += 1
        if clock % take_every == 0:
            collect()
    collect()
    want = []
    for j, episodes in plans.items():
        for e, (length, terminated) in enumerate(episodes):
            items = expected_items(100 * j + e, length, terminated, env=j, shape=shape)
            if (j, e) == fail[:2]:
                items = [
                    it
                    for s, it in zip(range(0, length, p), items, strict=True)
                    if s + l_ <= fail[2]
                ]
            want += items

    def order(it):
        p0 = int(it["first"].argmax())
        return (int(it["obs"][p0][0]), int(it["state"][0, 1]) - p0)

    got.sort(key=order)
    want.sort(key=order)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        for key, value in w.items():
            np.testing.assert_array_equal(g[key], value, err_msg=f"{key} of {order(w)}")
    assert adder.num_pending == 0
