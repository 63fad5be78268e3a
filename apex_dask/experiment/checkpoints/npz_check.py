"""An ``.npz`` file checked against its own size before numpy allocates anything.

``np.load`` trusts each member's ``.npy`` header: a header that declares a
shape of 10^12 floats makes it allocate 8 TB (``MemoryError``) before it
reads a byte. :func:`check_npz` reads only the zip directory and each
member's header and refuses, with one line, a file whose declarations do not
fit in it::

    check_npz(path)                      # NpzProblem (a ValueError): one line
    with np.load(path, allow_pickle=False) as npz: ...

Checked for every member: it is a ``.npy`` stored uncompressed (``np.savez``
writes nothing else; a compressed member may claim any size), its stored
size fits in the file, its header parses (numpy's own bounded parser), its
dtype holds no Python objects, and ``prod(shape) * itemsize`` fits in the
member's data after the header.
"""

from __future__ import annotations

import math
import os
import zipfile
from pathlib import Path

import numpy as np

__all__ = ["NpzProblem", "check_npz"]


class NpzProblem(ValueError):
    """An ``.npz`` whose declarations do not fit in it; the message is one line."""


def check_npz(path: str | os.PathLike[str]) -> None:
    """Raise :class:`NpzProblem` unless every member of ``path`` fits in the file."""
    path = Path(path)
    size = path.stat().st_size
    try:
        with zipfile.ZipFile(path) as archive:
            infos = archive.infolist()
            stored = sum(info.compress_size for info in infos)
            if stored > size:
                raise NpzProblem(f"its members claim {stored} bytes, the file has {size}")
            for info in infos:
                _check_member(archive, info, size)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise NpzProblem(f"not a readable npz ({type(exc).__name__}: {exc})") from None


def _check_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, size: int) -> None:
    name = info.filename
    if not name.endswith(".npy"):
        raise NpzProblem(f"member {name!r} is not an .npy array")
    if info.compress_type != zipfile.ZIP_STORED:
        raise NpzProblem(f"member {name!r} is compressed (only np.savez's stored members are read)")
    if info.file_size != info.compress_size or info.file_size > size:
        raise NpzProblem(
            f"member {name!r} declares {info.file_size} bytes, more than the file holds ({size})"
        )
    with archive.open(info) as f:
        try:
            version = np.lib.format.read_magic(f)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(f)
            elif version in ((2, 0), (3, 0)):
                shape, _, dtype = np.lib.format.read_array_header_2_0(f)
            else:
                raise NpzProblem(f"member {name!r}: unknown .npy version {version}")
        except (ValueError, SyntaxError, TypeError) as exc:
            if isinstance(exc, NpzProblem):
                raise
            first = " ".join(str(exc).split())[:120]
            raise NpzProblem(f"member {name!r}: bad .npy header ({first})") from None
        header = f.tell()
    if dtype.hasobject:
        raise NpzProblem(f"member {name!r} holds Python objects (never unpickled)")
    if any(n < 0 for n in shape):
        raise NpzProblem(f"member {name!r} declares a negative shape {shape}")
    need = math.prod(shape) * dtype.itemsize
    have = info.file_size - header
    if need > have:
        raise NpzProblem(
            f"member {name!r} declares shape {tuple(shape)} of {dtype} ({need:,} bytes), "
            f"it holds {have:,}"
        )
