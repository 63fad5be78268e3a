"""A hostile or damaged checkpoint manifest or npz is the one-line checkpoint error.

A manifest entry naming a file outside its checkpoint folder (``../``, an
absolute path, a symlink) is refused before the file is read; a declared size
larger than the file, a malformed entry, and an ``.npz`` member header declaring
more data than the file holds are :class:`CheckpointError` (one line), never a
read outside the folder or a ``MemoryError``. In each case the manifest's size
and SHA-256 match the hostile file, so only these checks stand in the way.
"""

from __future__ import annotations

import hashlib
import io
import json
import zipfile

import numpy as np
import pytest

from apex_dask.experiment.checkpoints.store import (
    CheckpointError,
    load_checkpoint,
    read_part,
    save_checkpoint,
)


def _reseal(ckpt, part: str) -> None:
    """Make the manifest's size and checksum of ``part`` match its file again."""
    manifest = json.loads((ckpt / "manifest.json").read_text())
    entry = manifest["parts"][part]
    data = (ckpt / entry["file"]).read_bytes()
    entry.update(sha256=hashlib.sha256(data).hexdigest(), bytes=len(data))
    (ckpt / "manifest.json").write_text(json.dumps(manifest))


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text, text
    return text


def test_a_manifest_entry_outside_the_folder_is_refused_before_it_is_read(tmp_path):
    outside = save_checkpoint(tmp_path / "elsewhere", {"learner": {"w": np.ones(3)}})
    ckpt = save_checkpoint(tmp_path / "run" / "ckpt-000001", {"learner": {"w": np.zeros(3)}})
    manifest = json.loads((ckpt / "manifest.json").read_text())
    real = json.loads((outside / "manifest.json").read_text())["parts"]["learner"]
    manifest["parts"]["learner"] = {**real, "file": "../../elsewhere/learner.npz"}
    (ckpt / "manifest.json").write_text(json.dumps(manifest))  # size and sha256 match that file
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(ckpt)
    text = _one_line(info.value)
    assert "'../../elsewhere/learner.npz' is outside the checkpoint folder" in text
    with pytest.raises(CheckpointError, match="outside the checkpoint folder"):
        read_part(ckpt, {**real, "file": str(outside / "learner.npz")})  # an absolute path


def test_a_part_that_is_a_symlink_out_of_the_folder_is_refused(tmp_path):
    outside = save_checkpoint(tmp_path / "elsewhere", {"learner": {"w": np.ones(3)}})
    ckpt = save_checkpoint(tmp_path / "ckpt-000001", {"learner": {"w": np.ones(3)}})
    (ckpt / "learner.npz").unlink()
    (ckpt / "learner.npz").symlink_to(outside / "learner.npz")  # same bytes, same sha256
    with pytest.raises(CheckpointError, match="outside the checkpoint folder"):
        load_checkpoint(ckpt)


@pytest.mark.parametrize("bad", [{"bytes": "12"}, {"bytes": -1}, {"sha256": None}, "x"])
def test_a_malformed_manifest_entry_is_one_line(tmp_path, bad):
    ckpt = save_checkpoint(tmp_path / "c", {"a": np.ones(3)})
    manifest = json.loads((ckpt / "manifest.json").read_text())
    entry = manifest["parts"]["a"]
    manifest["parts"]["a"] = {**entry, **bad} if isinstance(bad, dict) else bad
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(ckpt)
    assert "manifest.json" in _one_line(info.value)


def test_a_declared_size_larger_than_its_file_is_one_line(tmp_path):
    ckpt = save_checkpoint(tmp_path / "c", {"a": np.ones(300)})
    manifest = json.loads((ckpt / "manifest.json").read_text())
    manifest["parts"]["a"]["bytes"] += 10**12
    (ckpt / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(ckpt)
    assert "a.npz" in _one_line(info.value) and "the manifest says" in str(info.value)


def _npy_header_only(shape, dtype="<f8", data: bytes = b"\0" * 24) -> bytes:
    buf = io.BytesIO()
    header = {"descr": dtype, "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_1_0(buf, header)
    return buf.getvalue() + data


def _hostile_part(ckpt, members: dict[str, bytes], compress: int = zipfile.ZIP_STORED) -> None:
    tree = io.BytesIO()
    np.save(tree, np.frombuffer(json.dumps({"__array__": "a0"}).encode(), np.uint8))
    with zipfile.ZipFile(ckpt / "a.npz", "w", compression=compress) as z:
        for name, data in {**members, "__tree__.npy": tree.getvalue()}.items():
            z.writestr(name, data)
    _reseal(ckpt, "a")


@pytest.mark.parametrize(
    ("members", "needle"),
    [
        ({"a0.npy": _npy_header_only((10**6, 10**6))}, "declares shape (1000000, 1000000)"),
        ({"a0.npy": _npy_header_only((2**40,), "|u1")}, "1,099,511,627,776 bytes"),
        ({"a0.npy": _npy_header_only((5,), "|O")}, "Python objects"),
        ({"a0.npy": b"not an npy file at all"}, "bad .npy header"),
        ({"a0.txt": b"hello"}, "is not an .npy array"),
    ],
)
def test_an_npz_whose_header_does_not_fit_its_file_is_one_line_not_a_memory_error(
    tmp_path, members, needle
):
    ckpt = save_checkpoint(tmp_path / "c", {"a": np.ones(3)})
    _hostile_part(ckpt, members)  # the manifest's size and sha256 match the hostile file
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(ckpt)
    text = _one_line(info.value)
    assert "a.npz: unreadable" in text and needle in text


def test_a_compressed_member_that_could_claim_any_size_is_refused(tmp_path):
    ckpt = save_checkpoint(tmp_path / "c", {"a": np.ones(3)})
    body = _npy_header_only((10**5,), data=b"\0" * 8 * 10**5)  # deflates to a few kB
    _hostile_part(ckpt, {"a0.npy": body}, compress=zipfile.ZIP_DEFLATED)
    with pytest.raises(CheckpointError, match="is compressed"):
        load_checkpoint(ckpt)
