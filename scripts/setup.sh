#!/usr/bin/env bash
# Set up apex_dask for development or a first run.
#
#   bash scripts/setup.sh          # runtime only
#   bash scripts/setup.sh test     # + test tools
#   bash scripts/setup.sh test,bench
#
# Installs into ./.venv, created from $PYTHON (default python3, >= 3.10) with
# --system-site-packages: a torch already installed for that Python (e.g. a
# CUDA build from conda or pip) is seen and kept. Only when no torch is
# importable does this install the CPU-friendly pin below (APEX_TORCH_PIN).
set -euo pipefail
cd "$(dirname "$0")/.."
EXTRAS="${1:-}"
TORCH_PIN="${APEX_TORCH_PIN:-torch==2.13.0}"

if [[ ! -x .venv/bin/python ]]; then
  BASE_PY="${PYTHON:-python3}"
  "$BASE_PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || { echo "setup: $BASE_PY is older than 3.10; rerun with PYTHON=/path/to/python3.10+" >&2; exit 2; }
  echo "setup: creating .venv from $("$BASE_PY" --version 2>&1)"
  "$BASE_PY" -m venv --system-site-packages .venv
fi
PY="$PWD/.venv/bin/python"

if "$PY" -c 'import torch' >/dev/null 2>&1; then
  echo "setup: keeping installed torch $("$PY" -c 'import torch; print(torch.__version__)')"
else
  echo "setup: no torch found, installing $TORCH_PIN"
  "$PY" -m pip install --quiet --disable-pip-version-check "$TORCH_PIN"
fi
TARGET="."
[[ -n "$EXTRAS" ]] && TARGET=".[$EXTRAS]"
echo "setup: installing apex_dask${EXTRAS:+[$EXTRAS]} into .venv"
"$PY" -m pip install --quiet --disable-pip-version-check -e "$TARGET"
echo "setup: done ($PY)"
