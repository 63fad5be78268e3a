"""The compact form of frame-stacked batches: exact round trips, each frame once."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from frame_rollouts import StackedEpisodes

from apex_dask.algo.replay import codec as frame_codec
from apex_dask.algo.replay.codec import (
    decode_batch,
    encode_batch,
    encode_stacks,
    is_compact,
    split_compact,
)


def assert_same_batch(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)


@pytest.mark.parametrize("padding", ["reset", "zero"])
@pytest.mark.parametrize(("k", "n_step"), [(4, 3), (4, 1), (2, 5), (1, 3)])
def test_rollouts_round_trip_exactly(padding, k, n_step):
    rng = np.random.default_rng(k * 10 + n_step)
    env = StackedEpisodes(rng, k=k, n_step=n_step, lengths=(1, 30), padding=padding)
    for _ in range(30):
        batch = env.fragment(int(rng.integers(1, 70)))
        compact = encode_batch(batch, k)
        assert is_compact(compact) and not is_compact(batch)
        assert list(compact) == [
            "frames",
            "obs_refs",
            "action",
            "reward",
            "next_obs_refs",
            "done",
            "discount",
        ]
        assert compact["obs_refs"].dtype == np.int32
        assert_same_batch(decode_batch(compact), batch)


@pytest.mark.parametrize("padding", ["reset", "zero"])
def test_fragment_of_one_long_episode_holds_each_frame_once(padding):
    # L env steps of one episode, n-step 3, k = 4: the L + 2 transitions' stacks
    # use the frames f_{t0-3} .. f_{t0+L+1}: L + n + k - 1 frames (+1 zero frame).
    rng = np.random.default_rng(0)
    env = StackedEpisodes(rng, lengths=(10_000, 10_000), repeat_p=0.0, padding=padding)
    env.fragment(20)  # leave the episode start behind
    batch = env.fragment(50)
    frames, orefs, nrefs = encode_stacks(batch["obs"], batch["next_obs"])
    assert len(batch["obs"]) == 50
    assert len(frames) == 50 + 3 + 4 - 1
    # the n-step next_obs is the obs n steps later: same frames, same refs
    np.testing.assert_array_equal(nrefs[:-3], orefs[3:])


def test_episode_start_padding_is_one_frame():
    rng = np.random.default_rng(1)
    env = StackedEpisodes(rng, lengths=(10_000, 10_000), repeat_p=0.0)
    batch = env.fragment(1)  # s_0 = [f0, f0, f0, f0] is still pending: nothing emitted
    assert len(batch["obs"]) == 0
    batch = env.fragment(3)  # 4 steps: s_0 -> s_3 and s_1 -> s_4 complete
    frames, orefs, _ = encode_stacks(batch["obs"], batch["next_obs"])
    assert orefs[0].tolist() == [0, 0, 0, 0]
    assert len(frames) == 5  # f0 .. f4


def test_fragments_stay_under_1_3_frames_per_transition_at_length_50():
    rng = np.random.default_rng(2)
    env = StackedEpisodes(rng, lengths=(100, 2000), truncate_p=0.5)
    frames = transitions = 0
    for _ in range(60):
        compact = encode_batch(env.fragment(50), 4)
        frames += len(compact["frames"])
        transitions += len(compact["action"])
    assert 1.0 < frames / transitions <= 1.3


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [((2, 3), np.uint8), ((3, 5), np.uint8), ((7,), np.float32), ((2, 2), np.bool_)],
)
def test_data_that_is_not_a_frame_stack_is_stored_whole_and_exact(shape, dtype):
    rng = np.random.default_rng(3)
    obs = rng.integers(0, 2, (40, 4, *shape)).astype(dtype)
    nxt = rng.integers(0, 2, (40, 4, *shape)).astype(dtype)
    frames, orefs, nrefs = encode_stacks(obs, nxt)
    assert frames.dtype == np.dtype(dtype) and frames.shape[1:] == shape
    np.testing.assert_array_equal(frames[orefs], obs)
    np.testing.assert_array_equal(frames[nrefs], nxt)
    assert len(frames) <= 2 * 40 * 4


def test_equal_frames_everywhere_are_one_frame():
    obs = np.zeros((10, 4, 3, 3), np.uint8)
    frames, orefs, nrefs = encode_stacks(obs, obs.copy())
    assert len(frames) == 1 and orefs.max() == 0 and nrefs.max() == 0


def test_float_frames_compare_bits_not_values():
    # -0.0 == 0.0 as floats, but the stacks must come back bit for bit
    obs = np.zeros((2, 2, 4), np.float32)
    obs[1, 1] = -0.0
    frames, orefs, nrefs = encode_stacks(obs, obs)
    np.testing.assert_array_equal(frames[orefs].view(np.uint32), obs.view(np.uint32))


def test_python_path_makes_the_same_encoding_as_the_kernel():
    rng = np.random.default_rng(4)
    batch = StackedEpisodes(rng, lengths=(1, 12)).fragment(60)
    ow, xw = frame_codec._words(batch["obs"]), frame_codec._words(batch["next_obs"])
    outs = []
    for fn in (frame_codec._encode, frame_codec._encode_py):
        n, k = batch["obs"].shape[:2]
        src = np.empty((2 * n * k, 2), np.int64)
        refs = np.empty((n, k), np.int64), np.empty((n, k), np.int64)
        m = fn(ow, xw, frame_codec.SEARCH, src, *refs, np.full(2 * n * k, -1, np.int64))
        outs.append((src[:m].copy(), refs[0].copy(), refs[1].copy()))
    for a, b in zip(*outs, strict=True):
        np.testing.assert_array_equal(a, b)


def test_empty_batch_encodes_to_no_frames():
    obs = np.zeros((0, 4, 5, 5), np.uint8)
    frames, orefs, nrefs = encode_stacks(obs, obs)
    assert frames.shape == (0, 5, 5) and orefs.shape == (0, 4) == nrefs.shape


def test_bad_input_raises():
    obs = np.zeros((3, 4, 2, 2), np.uint8)
    with pytest.raises(ValueError, match="one shape and dtype"):
        encode_stacks(obs, obs[:, :3])
    with pytest.raises(ValueError, match=r"frame_stack=2 needs obs items \[2"):
        encode_batch({"obs": obs, "next_obs": obs}, 2)
    good = encode_batch({"obs": obs, "next_obs": obs, "action": np.zeros(3)}, 4)
    for key, value, match in [
        ("obs_refs", good["obs_refs"] + 5, "outside"),
        ("obs_refs", good["obs_refs"] - 1, "outside"),
        ("next_obs_refs", good["next_obs_refs"][:, :3], "frames per stack"),
        ("obs_refs", good["obs_refs"].astype(np.float32), "integer"),
        ("next_obs_refs", good["next_obs_refs"][:2], "differ"),
    ]:
        with pytest.raises(ValueError, match=match):
            split_compact({**good, key: value}, 4)
    with pytest.raises(ValueError, match="lacks"):
        split_compact({"frames": good["frames"], "obs_refs": good["obs_refs"]})


def test_without_numba_the_numpy_path_encodes_the_same(tmp_path):
    rng = np.random.default_rng(5)
    batch = StackedEpisodes(rng, lengths=(1, 15)).fragment(40)
    np.savez(tmp_path / "batch.npz", obs=batch["obs"], next_obs=batch["next_obs"])
    code = (
        "import sys; sys.modules['numba'] = None\n"  # numba cannot be imported
        "import numpy as np\n"
        "from apex_dask.algo.replay import codec as frame_codec\n"
        "assert not frame_codec.HAVE_NUMBA\n"
        f"b = np.load({str(tmp_path / 'batch.npz')!r})\n"
        "out = frame_codec.encode_stacks(b['obs'], b['next_obs'])\n"
        f"np.savez({str(tmp_path / 'out.npz')!r}, *out)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    with np.load(tmp_path / "out.npz") as out:
        want = encode_stacks(batch["obs"], batch["next_obs"])
        for i in range(3):
            np.testing.assert_array_equal(out[f"arr_{i}"], want[i])
