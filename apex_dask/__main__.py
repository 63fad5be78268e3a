"""``python -m apex_dask`` is ``apex-dask-submit``."""

import sys

from apex_dask.cli import main

sys.exit(main())
