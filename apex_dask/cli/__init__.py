"""The command line: ``apex-dask-submit`` and the batch-system launchers it uses.

- :mod:`.main`: argument parsing, input checks, running and exit codes;
- :mod:`.output`: progress lines, the summary and the files of ``--out``;
- :mod:`.jobqueue`: workers as SLURM / PBS jobs through dask-jobqueue.
"""

from apex_dask.cli.main import build_parser, main, run
from apex_dask.cli.output import format_progress, format_summary, merge_final

__all__ = ["build_parser", "format_progress", "format_summary", "main", "merge_final", "run"]
