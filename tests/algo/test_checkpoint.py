import numpy as np
import pytest
from gymnasium import spaces

from apex_dask.algo.checkpoint import load_checkpoint, save_checkpoint
from apex_dask.algo.learner import Learner


def test_round_trip_of_learner_state_and_metadata(tmp_path):
    learner = Learner(
        spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2), hiddens=(8,), device="cpu"
    )
    rng = np.random.default_rng(0)
    data = {
        "obs": rng.normal(size=(16, 3)).astype(np.float32),
        "action": rng.integers(0, 2, 16),
        "reward": np.ones(16, np.float32),
        "next_obs": rng.normal(size=(16, 3)).astype(np.float32),
        "discount": np.full(16, 0.9, np.float32),
    }
    learner.update(data, np.ones(16, np.float32))
    path = save_checkpoint(
        tmp_path / "ckpt", {"learner": learner.state_dict()}, metadata={"timesteps": 7}
    )
    parts, meta = load_checkpoint(path)
    assert meta["timesteps"] == 7 and meta["parts"] == ["learner"]
    restored = Learner(
        spaces.Box(-1, 1, (3,), np.float32), spaces.Discrete(2), hiddens=(8,), device="cpu", seed=5
    )
    restored.load_state_dict(parts["learner"])
    assert restored.version == 1
    td_a, _ = learner.update(data, np.ones(16, np.float32))
    td_b, _ = restored.update(data, np.ones(16, np.float32))
    np.testing.assert_array_equal(td_a, td_b)


def test_overwrite_replaces_whole_directory_and_leaves_no_temp(tmp_path):
    dest = tmp_path / "ckpt"
    save_checkpoint(dest, {"a": 1, "b": 2})
    save_checkpoint(dest, {"c": 3})
    parts, _ = load_checkpoint(dest)
    assert parts == {"c": 3}
    assert sorted(p.name for p in dest.iterdir()) == ["c.pkl", "metadata.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_failed_write_keeps_previous_checkpoint(tmp_path):
    dest = tmp_path / "ckpt"
    save_checkpoint(dest, {"a": 1})

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        save_checkpoint(dest, {"a": 2, "bad": Unpicklable()})
    assert load_checkpoint(dest)[0] == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "metadata"])
def test_bad_part_names_raise(tmp_path, name):
    with pytest.raises(ValueError):
        save_checkpoint(tmp_path / "c", {name: 1})


def test_missing_checkpoint_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_checkpoint(tmp_path / "nowhere")
