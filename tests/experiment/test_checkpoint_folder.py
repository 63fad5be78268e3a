"""Checkpoint folders clean themselves: leftovers removed, the newest good checkpoint picked.

Leftovers of a write killed half-way are removed (the bytes freed said once); the
newest checkpoint that verifies is picked, each one skipped named with its reason.
Hostile manifests and npz headers: ``test_checkpoint_hostile.py``.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from apex_dask.experiment.checkpoints.folder import (
    checkpoints_in,
    pick_checkpoint,
    remove_leftovers,
    resume_candidates,
)
from apex_dask.experiment.checkpoints.store import (
    CheckpointError,
    DamagedCheckpoint,
    StagedCheckpoint,
    load_checkpoint,
    save_checkpoint,
    verify_checkpoint,
)


# -- leftovers --------------------------------------------------------------------
def _killed_write(root, name: str, nbytes: int):
    """What a checkpoint write killed before its commit leaves: a hidden staging folder."""
    staged = StagedCheckpoint(root / name)
    (staged.path / "shard_0.npz").write_bytes(b"\0" * nbytes)
    return staged.path


def test_leftovers_of_killed_writes_are_removed_and_the_bytes_freed_said(tmp_path):
    root = tmp_path / "checkpoints"
    save_checkpoint(root / "ckpt-000001", {"a": np.ones(10)})
    a = _killed_write(root, "ckpt-000002", 300_000)
    b = _killed_write(root, "ckpt-000003", 200_000)
    other = root / ".keep-me"  # not a checkpoint write: not ours to remove
    other.mkdir()
    freed = remove_leftovers(root)
    assert not a.exists() and not b.exists() and other.exists()
    assert freed.bytes == 500_000 and len(freed.removed) == 2
    line = freed.line(root)
    assert line == f"removed 2 unfinished checkpoint writes from {root} (500.0 kB freed)"
    assert [p.name for p in checkpoints_in(root)] == ["ckpt-000001"]
    assert load_checkpoint(root / "ckpt-000001")[0]["a"].sum() == 10
    assert remove_leftovers(root).line(root) is None  # nothing left: nothing said


def test_a_replace_killed_between_its_renames_puts_the_old_checkpoint_back(tmp_path):
    dest = save_checkpoint(tmp_path / "good", {"a": np.arange(4)})
    os.replace(dest, tmp_path / f".good.old-{os.getpid()}")  # the kill came here
    freed = remove_leftovers(tmp_path, "good")
    assert freed.restored == [dest] and "put back good" in freed.line(tmp_path)
    assert load_checkpoint(dest)[0]["a"].tolist() == [0, 1, 2, 3]


# -- fallback ---------------------------------------------------------------------
def _three(root):
    for n in (1, 2, 3):
        save_checkpoint(root / f"ckpt-00000{n}", {"learner": {"w": np.full(1000, float(n))}})
    return [root / f"ckpt-00000{n}" for n in (1, 2, 3)]


def test_the_newest_checkpoint_that_verifies_is_picked_naming_each_skipped(tmp_path):
    one, two, three = _three(tmp_path)
    part = three / "learner.npz"
    part.write_bytes(part.read_bytes()[:200])  # the newest cut short
    (two / "manifest.json").write_text("{not json")  # the next one's manifest garbled
    picked = pick_checkpoint(tmp_path)
    assert picked.path == one
    assert len(picked.skipped) == 2
    assert picked.skipped[0].startswith("skipped checkpoint ckpt-000003, it does not verify: ")
    assert "learner.npz" in picked.skipped[0] and "the manifest says" in picked.skipped[0]
    assert "ckpt-000002" in picked.skipped[1] and "unreadable" in picked.skipped[1]
    assert all("\n" not in line for line in picked.skipped)


def test_the_cheap_check_reads_no_data_and_the_full_one_finds_a_flipped_byte(tmp_path):
    *_, three = _three(tmp_path)
    part = three / "learner.npz"
    data = bytearray(part.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the array's data: headers and size still fit
    part.write_bytes(bytes(data))
    verify_checkpoint(three, checksums=False)
    with pytest.raises(DamagedCheckpoint, match="checksum mismatch"):
        verify_checkpoint(three)
    assert pick_checkpoint(tmp_path, checksums=True).path.name == "ckpt-000002"


def test_no_checkpoint_that_verifies_is_one_line_naming_the_newest_problem(tmp_path):
    for ckpt in _three(tmp_path):
        (ckpt / "learner.npz").unlink()
    with pytest.raises(CheckpointError) as info:
        pick_checkpoint(tmp_path)
    text = str(info.value)
    assert "\n" not in text and text.startswith("none of the 3 checkpoints verifies; ")
    assert "ckpt-000003" in text and "missing" in text
    assert pick_checkpoint(tmp_path / "nothing-here") is None
    assert resume_candidates(tmp_path)[0].name == "ckpt-000003"
