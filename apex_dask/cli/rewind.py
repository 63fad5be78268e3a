"""``results.jsonl`` rewound to the checkpoint a run resumes from.

A run killed some rows after its newest checkpoint (SIGKILL, a node lost, a
job past its walltime) left rows the resumed run will write again: it
continues from the checkpoint's ``iteration`` and ``timesteps_total``.
Appending to them would make both go backwards. So before the resumed run
writes its first row::

    moved = rewind_results(out, iteration=12, timesteps_total=24_000, checkpoint="ckpt-000003")
    moved.line()   # "... moved 4 rows of results.jsonl past checkpoint ckpt-000003 to
                   #  results.rewound-1.jsonl"

Rows with ``iteration`` above the checkpoint's, or ``timesteps_total`` above
its, and a line that is not a whole JSON object (a write cut by the kill),
move to ``results.rewound-<n>.jsonl`` (the first ``n`` not taken), in their
order; the rest stay. Both files are written whole (temporary file, fsync,
rename), the side file first: a crash in between leaves the rows in both
places, never in neither.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apex_dask.cli.outdir import write_bytes

__all__ = ["Rewound", "rewind_results"]


@dataclass(frozen=True)
class Rewound:
    """What :func:`rewind_results` did: rows kept, rows moved and where."""

    kept: int
    moved: int
    side_file: Path | None
    checkpoint: str

    def line(self) -> str | None:
        """One line for the console (None when nothing moved)."""
        if not self.moved or self.side_file is None:
            return None
        rows = f"{self.moved} row{'s' if self.moved != 1 else ''}"
        return (
            f"moved {rows} of results.jsonl past checkpoint {self.checkpoint} (written after "
            f"it by the attempt that was cut short) to {self.side_file.name}"
        )


def _number(row: dict[str, Any], key: str) -> float | None:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)


def _past(line: str, iteration: float, timesteps: float) -> bool:
    try:
        row = json.loads(line)
    except ValueError:
        return True  # a line cut by the kill
    if not isinstance(row, dict):
        return True
    it, steps = _number(row, "iteration"), _number(row, "timesteps_total")
    return (it is not None and it > iteration) or (steps is not None and steps > timesteps)


def _side_file(out: Path) -> Path:
    n = 1
    while (out / f"results.rewound-{n}.jsonl").exists():
        n += 1
    return out / f"results.rewound-{n}.jsonl"


def rewind_results(
    out: Path, *, iteration: float, timesteps_total: float, checkpoint: str
) -> Rewound:
    """Move the rows of ``out/results.jsonl`` past the checkpoint to a side file."""
    path = out / "results.jsonl"
    try:
        text = path.read_text()
    except FileNotFoundError:
        return Rewound(0, 0, None, checkpoint)
    lines = [x for x in text.splitlines() if x.strip()]
    past = [x for x in lines if _past(x, iteration, timesteps_total)]
    if not past:
        return Rewound(len(lines), 0, None, checkpoint)
    kept = [x for x in lines if not _past(x, iteration, timesteps_total)]
    side = _side_file(out)
    write_bytes(side, "".join(x + "\n" for x in past).encode())
    write_bytes(path, "".join(x + "\n" for x in kept).encode())
    return Rewound(len(kept), len(past), side, checkpoint)
