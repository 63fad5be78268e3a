#!/usr/bin/env bash
# Set up apex_dask for development or a first run.
#
#   bash scripts/setup.sh                 # runtime only
#   bash scripts/setup.sh test            # + test tools, and the example agent package
#                                         #   tests/ext_agent (an agent from outside apex_dask)
#   bash scripts/setup.sh test,bench
#   bash scripts/setup.sh --system-torch test   # reuse the base Python's own (e.g. CUDA) torch
#
# Installs into ./.venv, created from $PYTHON (default python3, >= 3.10) WITHOUT the
# base interpreter's site-packages: only what apex_dask declares (and what that pulls
# in) is importable there, so a missing dependency fails here rather than on a user's
# machine. torch comes from the pin below (APEX_TORCH_PIN, default torch==2.13.0)
# unless .venv already has one.
#
# --system-torch (or APEX_SYSTEM_TORCH=1) is for a torch installed for $PYTHON that you
# want to keep, e.g. a CUDA build from conda or pip: .venv then also sees the base
# interpreter's site-packages (Python's --system-site-packages), that torch is used and
# nothing else is installed for torch. Packages the project does not declare may then
# be importable too; the tests are meant to run without this flag.
# Rerunning with or without the flag switches an existing .venv in place.
set -euo pipefail
cd "$(dirname "$0")/.."
SYSTEM_TORCH=${APEX_SYSTEM_TORCH:-0}
EXTRAS=""
for arg in "$@"; do
  case "$arg" in
    --system-torch) SYSTEM_TORCH=1 ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "setup: unknown option $arg (see bash scripts/setup.sh --help)" >&2; exit 2 ;;
    *) [[ -z "$EXTRAS" ]] || { echo "setup: give the extras once, comma separated (got '$EXTRAS' and '$arg')" >&2; exit 2; }
       EXTRAS=$arg ;;
  esac
done
[[ "$SYSTEM_TORCH" == 0 || "$SYSTEM_TORCH" == 1 ]] \
  || { echo "setup: APEX_SYSTEM_TORCH must be 0 or 1, got '$SYSTEM_TORCH'" >&2; exit 2; }
TORCH_PIN="${APEX_TORCH_PIN:-torch==2.13.0}"
want=false
((SYSTEM_TORCH)) && want=true

if [[ ! -x .venv/bin/python ]]; then
  BASE_PY="${PYTHON:-python3}"
  "$BASE_PY" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
    || { echo "setup: $BASE_PY is older than 3.10; rerun with PYTHON=/path/to/python3.10+" >&2; exit 2; }
  if ((SYSTEM_TORCH)); then
    "$BASE_PY" -c 'import torch' >/dev/null 2>&1 \
      || { echo "setup: --system-torch, but $BASE_PY cannot import torch; install it there or drop the flag" >&2; exit 2; }
  fi
  echo "setup: creating .venv from $("$BASE_PY" --version 2>&1)"
  if ((SYSTEM_TORCH)); then
    "$BASE_PY" -m venv --system-site-packages .venv
  else
    "$BASE_PY" -m venv .venv
  fi
fi
PY="$PWD/.venv/bin/python"

# An existing .venv follows the flag: Python reads this line of pyvenv.cfg at start-up.
cfg=.venv/pyvenv.cfg
set_system_site() {  # set_system_site true|false
  if grep -q '^include-system-site-packages' "$cfg"; then
    sed -i.bak "s/^include-system-site-packages *=.*/include-system-site-packages = $1/" "$cfg"
    rm -f "$cfg.bak"
  else
    echo "include-system-site-packages = $1" >>"$cfg"
  fi
}
have=$(sed -n 's/^include-system-site-packages *= *//p' "$cfg" | tr -d '[:space:]')
[[ -n "$have" ]] || have=false
if [[ "$have" != "$want" ]]; then
  set_system_site "$want"
  if ((SYSTEM_TORCH)) && ! "$PY" -c 'import torch' >/dev/null 2>&1; then
    set_system_site "$have"  # leave .venv as it was
    echo "setup: --system-torch, but .venv's base interpreter cannot import torch; install it there or drop the flag" >&2
    exit 2
  fi
  echo "setup: .venv now $([[ $want == true ]] && echo sees || echo no longer sees) the base interpreter's site-packages"
fi

if ((SYSTEM_TORCH)); then
  "$PY" -c 'import torch' >/dev/null 2>&1 \
    || { echo "setup: --system-torch, but .venv's base interpreter cannot import torch; install it there or drop the flag" >&2; exit 2; }
  echo "setup: using torch $("$PY" -c 'import torch; print(torch.__version__, "from", torch.__file__)' 2>/dev/null)"
  echo "setup: note: .venv also sees the base interpreter's other packages (--system-torch)"
elif "$PY" -c 'import torch' >/dev/null 2>&1; then
  echo "setup: keeping .venv's torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
else
  echo "setup: no torch in .venv, installing $TORCH_PIN"
  "$PY" -m pip install --quiet --disable-pip-version-check "$TORCH_PIN"
fi
TARGET="."
[[ -n "$EXTRAS" ]] && TARGET=".[$EXTRAS]"
echo "setup: installing apex_dask${EXTRAS:+[$EXTRAS]} into .venv"
"$PY" -m pip install --quiet --disable-pip-version-check -e "$TARGET"
if [[ ",$EXTRAS," == *",test,"* ]]; then  # an agent from outside apex_dask, for the tests
  echo "setup: installing the example agent package tests/ext_agent (algo: linq)"
  "$PY" -m pip install --quiet --disable-pip-version-check --no-deps -e tests/ext_agent
fi
echo "setup: done ($PY)"
