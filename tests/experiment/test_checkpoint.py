import numpy as np
import pytest
from agent_parts import configs
from gymnasium import spaces

from apex_dask.algo.agents.dqn.learner import Learner
from apex_dask.experiment.checkpoints.store import (
    CheckpointError,
    StagedCheckpoint,
    load_checkpoint,
    save_checkpoint,
    write_part,
)


def test_round_trip_of_learner_state_and_metadata(tmp_path):
    learner = Learner(
        spaces.Box(-1, 1, (3,), np.float32),
        spaces.Discrete(2),
        *configs("dqn", hiddens=(8,)),
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
    assert meta == {"timesteps": 7}
    restored = Learner(
        spaces.Box(-1, 1, (3,), np.float32),
        spaces.Discrete(2),
        *configs("dqn", hiddens=(8,)),
        seed=5,
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
    assert sorted(p.name for p in dest.iterdir()) == ["c.npz", "manifest.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


def test_nested_trees_keep_their_types(tmp_path):
    tree = {
        "x": np.arange(6, dtype=np.int16).reshape(2, 3),
        "s": np.float64(2.5),
        3: {"lr": 1e-3, "betas": (0.9, 0.999), "params": [0, 1]},
        "none": None,
        "big": 2**100,
        "nan": float("nan"),
        "name": "CartPole-v1",
    }
    parts, _ = load_checkpoint(save_checkpoint(tmp_path / "c", {"t": tree}))
    t = parts["t"]
    np.testing.assert_array_equal(t["x"], tree["x"])
    assert t["x"].dtype == np.int16 and float(t["s"]) == 2.5
    assert t[3] == {"lr": 1e-3, "betas": (0.9, 0.999), "params": [0, 1]}
    assert t["none"] is None and t["big"] == 2**100 and np.isnan(t["nan"])
    assert t["name"] == "CartPole-v1"


def test_failed_write_keeps_previous_checkpoint(tmp_path):
    dest = tmp_path / "ckpt"
    save_checkpoint(dest, {"a": 1})
    with pytest.raises(CheckpointError, match="object"):
        save_checkpoint(dest, {"a": 2, "bad": np.array([object()], dtype=object)})
    assert load_checkpoint(dest)[0] == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]


@pytest.mark.parametrize("name", ["", "../x", "a/b", ".hidden", "manifest"])
def test_bad_part_names_raise(tmp_path, name):
    with pytest.raises(ValueError):
        save_checkpoint(tmp_path / "c", {name: 1})


def test_missing_checkpoint_names_the_path(tmp_path):
    with pytest.raises(CheckpointError, match="nowhere.*not a checkpoint"):
        load_checkpoint(tmp_path / "nowhere")


def _flip_a_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage,needle",
    [
        (_flip_a_byte, "checksum mismatch"),
        (lambda p: p.write_bytes(p.read_bytes()[:100]), "bytes, the manifest says"),
        (lambda p: p.unlink(), "missing"),
    ],
)
def test_a_damaged_part_is_one_line_naming_the_file(tmp_path, damage, needle):
    path = save_checkpoint(tmp_path / "c", {"big": {"w": np.ones(5000, np.float32)}})
    damage(path / "big.npz")
    with pytest.raises(CheckpointError, match=needle) as info:
        load_checkpoint(path)
    assert "big.npz" in str(info.value) and "\n" not in str(info.value)


def test_a_foreign_or_garbled_manifest_is_refused(tmp_path):
    path = save_checkpoint(tmp_path / "c", {"a": 1})
    (path / "manifest.json").write_text('{"format": "something-else/9", "parts": {}}')
    with pytest.raises(CheckpointError, match="format 'something-else/9'"):
        load_checkpoint(path)
    (path / "manifest.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="manifest.json: unreadable"):
        load_checkpoint(path)


def test_a_pickle_inside_a_part_is_never_loaded(tmp_path):
    """Even with a matching checksum, an object array in the npz is refused, not unpickled."""
    import hashlib
    import json

    path = save_checkpoint(tmp_path / "c", {"a": {"x": np.ones(3)}})
    evil = path / "a.npz"
    np.savez(
        evil,
        a0=np.array([{"x": 1}], dtype=object),
        __tree__=np.frombuffer(json.dumps({"x": {"__array__": "a0"}}).encode(), np.uint8),
    )
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["parts"]["a"].update(
        sha256=hashlib.sha256(evil.read_bytes()).hexdigest(), bytes=evil.stat().st_size
    )
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="unreadable"):
        load_checkpoint(path)


def test_parts_written_elsewhere_join_a_staged_checkpoint(tmp_path):
    staged = StagedCheckpoint(tmp_path / "ckpt")
    entry = write_part(staged.path, "shard_0", {"data": np.arange(10)})  # e.g. by an actor
    staged.add_entry("shard_0", entry)
    staged.add_part("learner", {"w": np.zeros(2)})
    assert not (tmp_path / "ckpt").exists()  # nothing visible before the commit
    staged.commit({"timesteps": 5})
    parts, meta = load_checkpoint(tmp_path / "ckpt")
    assert meta == {"timesteps": 5} and parts["shard_0"]["data"].tolist() == list(range(10))
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
