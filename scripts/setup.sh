#!/usr/bin/env bash
# Set up apex_dask for development or a first run.
#
#   bash scripts/setup.sh [EXTRAS]      (default EXTRAS: test)
#
# Installs into the active virtual/conda environment if there is one,
# otherwise into ./.venv (created with the first python3 >= 3.10 found).
# torch: an existing torch (e.g. a CUDA build) is kept as it is; only when
# no torch is importable does this install the CPU-friendly pin below.
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-test}"
TORCH_PIN="${APEX_TORCH_PIN:-torch==2.13.0}"

if [[ -n "${VIRTUAL_ENV:-}" ]]; then
  PY="$VIRTUAL_ENV/bin/python"
elif [[ -n "${CONDA_PREFIX:-}" && "${CONDA_DEFAULT_ENV:-base}" != "base" && -x "${CONDA_PREFIX}/bin/python" ]]; then
  PY="$CONDA_PREFIX/bin/python"
else
  if [[ ! -x .venv/bin/python ]]; then
    BASE_PY="${PYTHON:-python3}"
    "$BASE_PY" -c 'import sys; assert sys.version_info >= (3, 10), "apex_dask needs Python >= 3.10"' \
      || { echo "setup: $BASE_PY is older than 3.10; set PYTHON=/path/to/python3.10+" >&2; exit 2; }
    echo "setup: creating .venv with $("$BASE_PY" --version)"
    "$BASE_PY" -m venv .venv
  fi
  PY="$PWD/.venv/bin/python"
fi

"$PY" -m pip install --quiet --disable-pip-version-check --upgrade pip >/dev/null 2>&1 || true
if "$PY" -c 'import torch' >/dev/null 2>&1; then
  echo "setup: keeping installed torch $("$PY" -c 'import torch; print(torch.__version__)')"
else
  echo "setup: no torch found, installing $TORCH_PIN"
  "$PY" -m pip install --quiet --disable-pip-version-check "$TORCH_PIN"
fi
echo "setup: installing apex_dask[$EXTRAS]"
"$PY" -m pip install --quiet --disable-pip-version-check -e ".[$EXTRAS]"
echo "setup: done ($PY)"
