#!/usr/bin/env bash
# Ape-X on this machine with real Dask processes: a `dask scheduler` (with the
# Ape-X dashboard preloaded), one learner worker advertising GPU=1, N CPU
# workers, then `apex-dask-submit --scheduler-file ...`. Ctrl-C and SIGTERM go on
# to apex-dask-submit, which stops and saves within checkpoint.grace_s; then every
# process it started is stopped. The exit status is apex-dask-submit's (130 after
# Ctrl-C, 75 after SIGTERM with a checkpoint written).
#
#   cluster/local.sh [--workers N] [--workdir DIR] [--serve] [--no-tls] [--] [apex-dask-submit args...]
#
#   cluster/local.sh --workers 3 -- --preset cartpole --stop-eval-return 475 --out runs/cp
#   cluster/local.sh --serve        # start the cluster only; connect a notebook to it
#
# Options
#   --workers N    CPU worker processes for env workers (default: CPUs - 1, at least 1)
#   --workdir DIR  scheduler file and logs (default: a new folder under $TMPDIR)
#   --serve        start the cluster, print how to connect, wait for Ctrl-C
#   --interface IF listen on network interface IF (e.g. ib0) instead of APEX_HOST
#   --dashboard-address HOST:PORT
#                  where the dashboard listens (default 127.0.0.1:8787: this machine
#                  only, whatever --interface says; from elsewhere use an SSH tunnel)
#   --tls-ca-file F, --tls-cert F, --tls-key F
#                  TLS with your files: this CA, certificate and key for the
#                  scheduler, the workers and the driver
#   --no-tls       plain TCP (warns): anyone who reaches the ports can run code as you
# TLS is on by default, loopback included (other users of this machine are kept out
# too), with credentials made for this run in WORKDIR/tls (mode 0600).
# Environment
#   APEX_HOST            address to listen on (default 127.0.0.1; 0.0.0.0 to serve others)
#   APEX_INTERFACE       as --interface
#   APEX_TLS_CA_FILE, APEX_TLS_CERT, APEX_TLS_KEY  as the --tls-* flags
#   APEX_TLS             on (default) | off: as --no-tls
#   APEX_SCHEDULER_PORT  scheduler port (default 0: any free port, see the scheduler file)
#   APEX_DASHBOARD       as --dashboard-address
#   APEX_WAIT_WORKERS_S  seconds to wait for the workers to join (default 120)
# The Python environment with apex_dask must be active (dask and
# apex-dask-submit on PATH).
set -euo pipefail

usage() { sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "local.sh: $*" >&2; exit 2; }

ncpu=$( (command -v nproc >/dev/null && nproc) || getconf _NPROCESSORS_ONLN 2>/dev/null || echo 2)
WORKERS=$((ncpu > 1 ? ncpu - 1 : 1))
WORKDIR=""
SERVE=0
IFACE=${APEX_INTERFACE:-}
TLS_CA=${APEX_TLS_CA_FILE:-}
TLS_CERT=${APEX_TLS_CERT:-}
TLS_KEY=${APEX_TLS_KEY:-}
TLS=${APEX_TLS:-on}
DASHBOARD=${APEX_DASHBOARD:-127.0.0.1:8787}
while [[ $# -gt 0 ]]; do
  case "$1" in
    --workers) [[ $# -ge 2 ]] || die "--workers needs a number"; WORKERS=$2; shift 2 ;;
    --workers=*) WORKERS=${1#*=}; shift ;;
    --workdir) [[ $# -ge 2 ]] || die "--workdir needs a folder"; WORKDIR=$2; shift 2 ;;
    --workdir=*) WORKDIR=${1#*=}; shift ;;
    --serve) SERVE=1; shift ;;
    --interface) [[ $# -ge 2 ]] || die "--interface needs a name"; IFACE=$2; shift 2 ;;
    --interface=*) IFACE=${1#*=}; shift ;;
    --tls-ca-file) [[ $# -ge 2 ]] || die "--tls-ca-file needs a file"; TLS_CA=$2; shift 2 ;;
    --tls-cert) [[ $# -ge 2 ]] || die "--tls-cert needs a file"; TLS_CERT=$2; shift 2 ;;
    --tls-key) [[ $# -ge 2 ]] || die "--tls-key needs a file"; TLS_KEY=$2; shift 2 ;;
    --no-tls) TLS=off; shift ;;
    --dashboard-address) [[ $# -ge 2 ]] || die "--dashboard-address needs HOST:PORT"; DASHBOARD=$2; shift 2 ;;
    --dashboard-address=*) DASHBOARD=${1#*=}; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) break ;;  # everything else goes to apex-dask-submit
  esac
done
[[ "$WORKERS" =~ ^[1-9][0-9]*$ ]] || die "--workers must be a positive integer, got '$WORKERS'"
net_args=(--host "${APEX_HOST:-127.0.0.1}")
WHO="any user of this machine"  # who can reach the ports
case "${APEX_HOST:-127.0.0.1}" in 127.*|localhost|::1|\[::1\]) ;; *) WHO="anyone who can reach this machine" ;; esac
if [[ -n "$IFACE" ]]; then
  [[ -e "/sys/class/net/$IFACE" || ! -d /sys/class/net ]] || die "no network interface '$IFACE' here"
  net_args=(--interface "$IFACE")
  if [[ "$IFACE" != lo ]]; then WHO="anyone who can reach this machine"; fi
fi
[[ "$DASHBOARD" == *:* ]] || die "--dashboard-address must be HOST:PORT, got '$DASHBOARD'"
[[ "$TLS" == on || "$TLS" == off ]] || die "APEX_TLS must be on or off, got '$TLS'"
tls_args=()
if [[ -n "$TLS_CA$TLS_CERT$TLS_KEY" ]]; then
  [[ "$TLS" == on ]] || die "--no-tls (or APEX_TLS=off) and TLS files given: drop one of them"
  for f in "$TLS_CA" "$TLS_CERT" "$TLS_KEY"; do
    [[ -n "$f" && -r "$f" ]] || die "TLS needs --tls-ca-file, --tls-cert and --tls-key, all readable (got '$f')"
  done
  TLS_CA=$(cd "$(dirname "$TLS_CA")" && pwd)/$(basename "$TLS_CA")
  TLS_CERT=$(cd "$(dirname "$TLS_CERT")" && pwd)/$(basename "$TLS_CERT")
  TLS_KEY=$(cd "$(dirname "$TLS_KEY")" && pwd)/$(basename "$TLS_KEY")
elif [[ "$TLS" == off ]]; then
  echo "local.sh: WARNING: TLS off (--no-tls or APEX_TLS=off): plain TCP; the cluster is open to $WHO, who can run any code as you" >&2
fi

DASK=$(command -v dask) || die "dask not found on PATH; activate the environment with apex_dask installed"
PYTHON=$(command -v python3 || command -v python) || die "python not found on PATH"
SUBMIT=""
if [[ $SERVE -eq 0 ]]; then
  SUBMIT=$(command -v apex-dask-submit) || die "apex-dask-submit not found on PATH; pip install -e . first"
fi
WAIT_S=${APEX_WAIT_WORKERS_S:-120}
if [[ -z "$WORKDIR" ]]; then
  WORKDIR=$(mktemp -d "${TMPDIR:-/tmp}/apex-local.XXXXXX")
fi
mkdir -p "$WORKDIR"
WORKDIR=$(cd "$WORKDIR" && pwd)
SCHED_FILE="$WORKDIR/scheduler.json"
rm -f "$SCHED_FILE"
if [[ -z "$TLS_CA" && "$TLS" == on ]]; then  # a CA and one certificate for this run only
  "$PYTHON" -m apex_dask.runtime.credentials "$WORKDIR/tls" || die "cannot make TLS credentials in $WORKDIR/tls"
  TLS_CA=$WORKDIR/tls/ca.pem TLS_CERT=$WORKDIR/tls/cert.pem TLS_KEY=$WORKDIR/tls/key.pem
  echo "local.sh: TLS required; this run's credentials are in $WORKDIR/tls (mode 0600)" >&2
fi
if [[ -n "$TLS_CA" ]]; then
  # Dask configuration, read by every process (`dask scheduler --tls-*` rejects --interface)
  tls_args=(--protocol tls)
  export DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION=True
  export DASK_DISTRIBUTED__COMM__TLS__CA_FILE="$TLS_CA"
  export DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT="$TLS_CERT" DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY="$TLS_KEY"
  export DASK_DISTRIBUTED__COMM__TLS__SCHEDULER__CERT="$TLS_CERT" DASK_DISTRIBUTED__COMM__TLS__SCHEDULER__KEY="$TLS_KEY"
  export DASK_DISTRIBUTED__COMM__TLS__WORKER__CERT="$TLS_CERT" DASK_DISTRIBUTED__COMM__TLS__WORKER__KEY="$TLS_KEY"
fi

pids=()  # every process (group) we started, in start order
launch() {  # launch LOG CMD...: in its own session, so Ctrl-C reaches only apex-dask-submit
  local log=$1; shift
  if command -v setsid >/dev/null; then
    setsid "$@" >"$log" 2>&1 </dev/null &
  else
    "$@" >"$log" 2>&1 </dev/null &
  fi
  pids+=("$!")
}
alive() { local p; for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
stop() {  # stop SIGNAL PID...: signal each process group (or process), wait up to 20 s
  local sig=$1 p i; shift
  for p in "$@"; do kill "-$sig" -- "-$p" 2>/dev/null || kill "-$sig" "$p" 2>/dev/null || true; done
  for ((i = 0; i < 100; i++)); do alive "$@" || return 0; sleep 0.2; done
  return 1
}
cleanup() {
  local status=$? n=${#pids[@]}
  trap - EXIT INT TERM
  if ((n > 0)); then
    echo "local.sh: stopping ${n} process(es); logs in $WORKDIR" >&2
    # Workers first (newest first), then the scheduler; SIGKILL what ignores SIGTERM.
    if ((n > 1)); then
      stop TERM "${pids[@]:1}" || stop KILL "${pids[@]:1}" || true
    fi
    stop TERM "${pids[0]}" || stop KILL "${pids[0]}" || true
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "local.sh: scheduler + learner worker + $WORKERS CPU worker(s); logs in $WORKDIR" >&2
launch "$WORKDIR/scheduler.log" "$DASK" scheduler "${net_args[@]}" ${tls_args[@]+"${tls_args[@]}"} \
  --port "${APEX_SCHEDULER_PORT:-0}" --dashboard-address "$DASHBOARD" \
  --scheduler-file "$SCHED_FILE" --preload apex_dask.runtime.preload
for ((i = 0; i < 600; i++)); do
  [[ -s "$SCHED_FILE" ]] && break
  alive "${pids[0]}" || { tail -n 20 "$WORKDIR/scheduler.log" >&2; die "the scheduler exited"; }
  sleep 0.1
done
[[ -s "$SCHED_FILE" ]] || die "no scheduler file after 60 s; see $WORKDIR/scheduler.log"

common=(--scheduler-file "$SCHED_FILE" "${net_args[@]}" ${tls_args[@]+"${tls_args[@]}"} --nthreads 1 --death-timeout 60)
launch "$WORKDIR/learner.log" "$DASK" worker "${common[@]}" --name learner --resources GPU=1
launch "$WORKDIR/cpu.log" "$DASK" worker "${common[@]}" --name cpu --nworkers "$WORKERS"

# Wait until all 1 + N workers joined (the learner is placed at start-up).
"$PYTHON" - "$SCHED_FILE" "$((WORKERS + 1))" "$WAIT_S" "$DASHBOARD" <<'PY' || die "workers did not join; see $WORKDIR/*.log"
import socket
import sys
from urllib.parse import urlsplit

from distributed import Client

sched_file, n, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
bind = sys.argv[4].rpartition(":")[0].strip("[]")  # where the dashboard listens ("": everywhere)
with Client(scheduler_file=sched_file, timeout=timeout) as client:
    client.wait_for_workers(n, timeout=timeout)
    info = client.scheduler_info(n_workers=-1)
    url = urlsplit(client.dashboard_link or "")  # Dask names the scheduler's host in it
    loopback = bind.startswith("127.") or bind in ("localhost", "::1")
    host = "127.0.0.1" if loopback else bind if bind not in ("", "0.0.0.0", "::") else url.hostname
    link = f"http://{host}:{url.port}/status" if url.port else "none"
    print(f"local.sh: {len(info['workers'])} workers at {info['address']}, dashboard {link}",
          file=sys.stderr)
    if loopback and url.port:
        print(f"local.sh: dashboard from another machine: ssh -N -L {url.port}:127.0.0.1:"
              f"{url.port} {socket.gethostname()}, then open http://localhost:{url.port}/apex",
              file=sys.stderr)
PY

if [[ $SERVE -eq 1 ]]; then
  if [[ -n "$TLS_CA" ]]; then  # connect() finds the run's credentials in tls/ beside the file
    echo "local.sh: ready (TLS required); connect with apex_dask.runtime.orchestration.cluster.connect(scheduler_file='$SCHED_FILE') or" >&2
  else
    echo "local.sh: ready; connect with Client(scheduler_file='$SCHED_FILE') or" >&2
  fi
  echo "local.sh:   apex-dask-submit --scheduler-file $SCHED_FILE --preset cartpole" >&2
  echo "local.sh: Ctrl-C stops the cluster" >&2
  while alive "${pids[0]}"; do sleep 0.5; done
  die "the scheduler exited; see $WORKDIR/scheduler.log"
fi

# The driver in its own session too: Ctrl-C (the whole process group) and SIGTERM reach
# this script, which passes each on once and waits until the driver has saved and ended.
rc=0
setsid "$SUBMIT" --scheduler-file "$SCHED_FILE" "$@" &
DRIVER_PID=$!
pass_on() { kill "-$1" "$DRIVER_PID" 2>/dev/null || true; }
trap 'pass_on INT' INT
trap 'pass_on TERM' TERM
while kill -0 "$DRIVER_PID" 2>/dev/null; do
  sleep 0.5 &
  wait $! || true  # a trapped signal ends the wait at once
done
wait "$DRIVER_PID" || rc=$?
exit "$rc"
