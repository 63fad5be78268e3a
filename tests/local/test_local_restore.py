"""``LocalApex.restore`` refuses, in one line naming the file, what it cannot continue from."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from apex_dask.config import ApexConfig
from apex_dask.experiment.checkpoints.stateful import Stateful
from apex_dask.experiment.checkpoints.store import CheckpointError, load_checkpoint, save_checkpoint
from apex_dask.local import LocalApex

SMALL = {
    "dqn.hiddens": [16],
    "learner.batch_size": 16,
    "replay.capacity": 1000,
    "replay.num_shards": 1,
    "replay.learning_starts": 64,
    "workers.num_workers": 1,
    "workers.rollout_fragment_length": 16,
    "eval.episodes": 0,
    "seed": 5,
}


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A checkpoint of a runner that trained a few updates."""
    with LocalApex(ApexConfig.preset("cartpole").override(SMALL)) as apex:
        for _ in range(8):
            apex.step()
        assert apex.learner.num_updates > 0
        return apex.save(tmp_path_factory.mktemp("ckpt") / "good")


def _rewrite(src, dest, edit):
    parts, meta = load_checkpoint(src)
    edit(parts, meta)
    return save_checkpoint(dest, parts, metadata=meta)


def _same(a, b, where="") -> list[str]:
    """Where two nested states differ (arrays bit for bit)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{where}: keys {sorted(set(a) ^ set(b))}"]
        return [d for k in a for d in _same(a[k], b[k], f"{where}/{k}")]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            return [f"{where}: {len(a)} != {len(b)} items"]
        return [
            d
            for k, (x, y) in enumerate(zip(a, b, strict=True))
            for d in _same(x, y, f"{where}/{k}")
        ]
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        x, y = np.asarray(a), np.asarray(b)
        ok = x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes()
        return [] if ok else [f"{where}: arrays differ"]
    return [] if a == b else [f"{where}: {a!r} != {b!r}"]


def test_the_runner_its_learner_and_its_shards_save_and_restore_through_one_interface():
    cfg = ApexConfig.preset("cartpole").override(SMALL)
    with LocalApex(cfg) as apex:
        for _ in range(8):
            apex.step()
        assert all(isinstance(x, Stateful) for x in (apex, apex.learner, *apex.shards))
        parts = apex.state_dict()
        assert set(parts) == {"learner", "runner", "shard_0"}
        assert _same(parts["learner"], apex.learner.state_dict()) == []
        assert _same(parts["shard_0"], apex.shards[0].state_dict()) == []
        with LocalApex(cfg.override({"seed": 6})) as fresh:
            assert _same(fresh.state_dict(), parts) != []  # a different run, to begin with
            fresh.load_state_dict(parts)
            back = fresh.state_dict()
            # all of it, but a restored shard's write clock, which moves past the saved one
            # (so no item read before the restore passes for one written after it)
            assert _same(back, parts) == [
                f"/shard_0/clock: {back['shard_0']['clock']!r} != {parts['shard_0']['clock']!r}"
            ]
            assert back["shard_0"]["clock"] > parts["shard_0"]["clock"]


def test_the_good_checkpoint_restores(good):
    with LocalApex.restore(good) as back:
        assert back.learner.num_updates > 0


@pytest.mark.parametrize("net", ["online", "target"])
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_weights_are_refused_naming_the_file(good, tmp_path, net, bad):
    def poison(parts, meta):
        arrays = parts["learner"][net]
        name = sorted(arrays)[-1]
        arrays[name] = np.array(arrays[name], copy=True)
        arrays[name].flat[0] = bad

    path = _rewrite(good, tmp_path / "bad", poison)
    with pytest.raises(CheckpointError) as info:
        LocalApex.restore(path)
    text = str(info.value)
    assert "\n" not in text
    assert str(path / "learner.npz") in text and net in text and "NaN or inf" in text


def test_a_dask_runs_checkpoint_is_refused_naming_the_folder(good, tmp_path):
    def drop_runner(parts, meta):
        parts["driver"] = parts.pop("runner")

    path = _rewrite(good, tmp_path / "dask", drop_runner)
    with pytest.raises(CheckpointError, match="not a checkpoint of the in-process runner") as info:
        LocalApex.restore(path)
    assert str(path) in str(info.value) and "--resume" in str(info.value)


def test_a_truncated_part_is_refused_naming_the_file(good, tmp_path):
    path = tmp_path / "cut"
    shutil.copytree(good, path)
    learner = path / "learner.npz"
    learner.write_bytes(learner.read_bytes()[:100])
    with pytest.raises(CheckpointError) as info:
        LocalApex.restore(path)
    assert str(learner) in str(info.value) and "\n" not in str(info.value)


def test_a_folder_of_checkpoints_resumes_from_the_newest_that_verifies(good, tmp_path, caplog):
    # ckpt-000002 cut short, ckpt-000003 holds NaN weights, a write of ckpt-000004 killed
    root = tmp_path / "checkpoints"
    for n in (1, 2):
        shutil.copytree(good, root / f"ckpt-00000{n}")
    cut = root / "ckpt-000002" / "shard_0.npz"
    cut.write_bytes(cut.read_bytes()[:1000])

    def poison(parts, meta):
        w = parts["learner"]["online"]
        name = sorted(w)[0]
        w[name] = np.full_like(w[name], np.nan)

    _rewrite(good, root / "ckpt-000003", poison)
    killed = root / ".ckpt-000004.tmp-x1"
    killed.mkdir()
    (killed / "shard_0.npz").write_bytes(b"\0" * 4096)
    with caplog.at_level("WARNING", logger="apex_dask.checkpoints"):
        with LocalApex.restore(root) as back:
            assert back.learner.num_updates > 0
            assert back.steps_sampled == load_checkpoint(good)[0]["runner"]["steps_sampled"]
    lines = [r.getMessage() for r in caplog.records]
    assert not killed.exists()
    assert lines[0] == f"removed 1 unfinished checkpoint write from {root} (4.1 kB freed)"
    assert lines[1].startswith("skipped checkpoint ckpt-000003, it does not verify: ")
    assert "NaN or inf" in lines[1]
    assert lines[2].startswith("skipped checkpoint ckpt-000002, it does not verify: ")
    assert str(cut) in lines[2]
    assert len(lines) == 3 and all("\n" not in x for x in lines)


def test_a_save_first_removes_what_an_interrupted_save_of_it_left(good, tmp_path, caplog):
    with LocalApex.restore(good) as apex:
        left = tmp_path / ".mine.tmp-abc"  # a save of tmp_path/mine killed before its commit
        left.mkdir()
        (left / "learner.npz").write_bytes(b"\0" * 2000)
        other = tmp_path / ".theirs.tmp-abc"  # another checkpoint's: left alone
        other.mkdir()
        with caplog.at_level("WARNING", logger="apex_dask.checkpoints"):
            apex.save(tmp_path / "mine")
    assert not left.exists() and other.exists()
    assert [r.getMessage() for r in caplog.records] == [
        f"removed 1 unfinished checkpoint write from {tmp_path} (2.0 kB freed)"
    ]
