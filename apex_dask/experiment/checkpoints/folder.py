"""A folder of checkpoints: which are complete, what an interrupted write left, which to resume.

::

    root/                          e.g. <--out DIR>/checkpoints
      ckpt-000007/                 complete: it has a manifest.json
      ckpt-000008/                 complete, but a part was damaged since
      .ckpt-000009.tmp-k2j4/       a write killed half-way (never loaded)

    freed = remove_leftovers(root)            # at the next start or resume
    print(freed.line(root))                   # "removed 1 unfinished checkpoint write ... freed"
    picked = pick_checkpoint(root)            # newest first, the first that verifies
    picked.path, picked.manifest, picked.skipped   # ckpt-000007, its manifest, ["ckpt-000008: ..."]

A checkpoint is written into a hidden ``.<name>.tmp-*`` folder and renamed
into place (:class:`~apex_dask.experiment.checkpoints.store.StagedCheckpoint`); replacing
one of the same name first moves the old one to ``.<name>.old-<pid>``. A
process killed in between leaves those folders behind, often a whole replay
copy: :func:`remove_leftovers` removes them (and, should the kill have come
between the two renames, puts the old checkpoint back first).

:func:`pick_checkpoint` verifies each candidate's manifest, part names, sizes
and array headers (``checksums=True`` also every SHA-256) and skips, naming
each, those that do not verify, so ``checkpoint.keep`` older checkpoints
are a real fallback.
"""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from apex_dask.experiment.checkpoints.store import MANIFEST, CheckpointError, verify_checkpoint

__all__ = [
    "CKPT_NAME",
    "Leftovers",
    "Picked",
    "checkpoints_in",
    "latest_checkpoint",
    "pick_checkpoint",
    "remove_leftovers",
    "resume_candidates",
]

CKPT_NAME = re.compile(r"^ckpt-(\d{6,})$")
"""The name of a run's checkpoint folder: ``ckpt-`` and its number."""

_HIDDEN = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-[^/]+$")


def checkpoints_in(root: str | os.PathLike[str]) -> list[Path]:
    """Complete checkpoints under ``root`` (with a manifest), oldest first."""
    return [p for p in _numbered(root) if (p / MANIFEST).is_file()]


def _numbered(root: str | os.PathLike[str]) -> list[Path]:
    """Every ``ckpt-N`` folder under ``root``, complete or not, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := CKPT_NAME.match(p.name))]
    return [p for _, p in sorted(found) if p.is_dir()]


def latest_checkpoint(path: str | os.PathLike[str]) -> Path | None:
    """``path`` itself if it is a checkpoint, else the newest one under it (or ``path/checkpoints``)."""
    path = Path(path)
    if (path / MANIFEST).is_file():
        return path
    for root in (path, path / "checkpoints"):
        found = checkpoints_in(root)
        if found:
            return found[-1]
    return None


def resume_candidates(path: str | os.PathLike[str]) -> list[Path]:
    """What a resume from ``path`` may use, newest first: ``[path]`` if it is a checkpoint,
    else every ``ckpt-N`` folder under ``path`` (or ``path/checkpoints``), a damaged one too."""
    path = Path(path)
    if (path / MANIFEST).is_file():
        return [path]
    for root in (path, path / "checkpoints"):
        found = _numbered(root)
        if found:
            return found[::-1]
    return []


@dataclass
class Picked:
    """The checkpoint a resume continues from, and the newer ones it skipped (one line each)."""

    path: Path
    manifest: dict[str, Any]
    skipped: list[str] = field(default_factory=list)


def skip_line(path: Path, exc: BaseException) -> str:
    """One line naming a checkpoint that a resume passed over, and why."""
    return f"skipped checkpoint {path.name}, it does not verify: {exc}"


def pick_checkpoint(
    candidates: str | os.PathLike[str] | list[Path], *, checksums: bool = False
) -> Picked | None:
    """The newest of ``candidates`` (a list, or a path for :func:`resume_candidates`) that
    verifies; None if there is no candidate. :class:`CheckpointError` (one line, naming the
    newest one's problem) if none verifies."""
    if not isinstance(candidates, list):
        candidates = resume_candidates(candidates)
    if not candidates:
        return None
    skipped: list[str] = []
    first: BaseException | None = None
    for path in candidates:
        try:
            manifest = verify_checkpoint(path, checksums=checksums)
        except CheckpointError as exc:
            first = first or exc
            skipped.append(skip_line(path, exc))
            continue
        return Picked(path, manifest, skipped)
    many = f"none of the {len(candidates)} checkpoints verifies; " if len(candidates) > 1 else ""
    raise CheckpointError(f"{many}{first}")


@dataclass
class Leftovers:
    """What :func:`remove_leftovers` removed, and what it put back."""

    removed: list[Path] = field(default_factory=list)
    bytes: int = 0
    restored: list[Path] = field(default_factory=list)

    def line(self, root: str | os.PathLike[str]) -> str | None:
        """One line for the log (None when there was nothing to do)."""
        if not self.removed and not self.restored:
            return None
        n = len(self.removed)
        text = (
            f"removed {n} unfinished checkpoint write{'s' if n != 1 else ''} from {root} "
            f"({_size(self.bytes)} freed)"
        )
        if self.restored:
            names = ", ".join(p.name for p in self.restored)
            text += f"; put back {names}, whose replacement had not been committed"
        return text


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def _bytes_under(path: Path) -> int:
    total = 0
    for base, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(base, name)).st_size
            except OSError:
                pass
    return total


def remove_leftovers(root: str | os.PathLike[str], name: str | None = None) -> Leftovers:
    """Remove the hidden folders interrupted writes left under ``root`` (only those of the
    checkpoint ``name``, if given; else of every ``ckpt-N``). A ``.<name>.old-*`` whose
    ``<name>`` is missing is the last complete checkpoint of that name: it is put back."""
    root, out = Path(root), Leftovers()
    if not root.is_dir():
        return out
    hidden = []
    for p in sorted(root.iterdir()):
        m = _HIDDEN.match(p.name)
        if m is None or not p.is_dir() or p.is_symlink():
            continue
        if (m["name"] == name) if name is not None else bool(CKPT_NAME.match(m["name"])):
            hidden.append((m["name"], m["kind"], p))
    for ckpt, kind, p in hidden:
        dest = root / ckpt
        if kind == "old" and not dest.exists() and (p / MANIFEST).is_file():
            os.replace(p, dest)
            out.restored.append(dest)
            continue
        size = _bytes_under(p)
        shutil.rmtree(p, ignore_errors=True)
        if not p.exists():
            out.removed.append(p)
            out.bytes += size
    return out
