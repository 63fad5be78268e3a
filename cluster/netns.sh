#!/usr/bin/env bash
# A multi-host Ape-X site on this machine: Linux network namespaces as hosts.
# Each host is a namespace with two interfaces, eth0 on one bridge
# (198.18.0.0/24) and ib0 on another (198.18.1.0/24, the "fast network" of an
# HPC node); nothing else is connected, so no packet leaves the machine. It
# starts a `dask scheduler` (with the Ape-X preload) on host `sched`, a
# `--resources GPU=1` learner worker on host `learner`, CPU workers on hosts
# `env1..envN`, then runs apex-dask-submit on host `driver`. Everything it
# made (processes, namespaces, links) is removed on exit, Ctrl-C or SIGTERM;
# the exit status is the driver command's. Needs root (ip netns).
#
#   cluster/netns.sh [options] [--] [apex-dask-submit args...]
#
#   cluster/netns.sh -- --preset cartpole --stop-eval-return 475 --out runs/cp
#   cluster/netns.sh --tls-generate --interface ib0 -- --preset minatar --stop-time 90
#   cluster/netns.sh --serve            # build the site; `ip netns exec <prefix>-driver ...`
#
# Options
#   --env-hosts N         env-worker hosts (default 2)
#   --workers-per-host K  dask worker processes per env-worker host (default 1)
#   --learner-processes P extra CPU worker processes on the learner's host, for
#                         replay.placement=learner_host (default 0)
#   --interface IF        interface Dask listens on and talks over: eth0 | ib0 (default eth0)
#   --tls-dir DIR         TLS with your files: DIR/ca.pem, DIR/cert.pem, DIR/key.pem (one
#                         certificate for every role)
#   --tls-generate        TLS with a CA and certificate made for this run in WORKDIR/tls
#                         (the default; APEX_TLS=off: plain TCP, with a warning)
#   --workdir DIR         scheduler file, logs, hosts.json, bytes.json (default: new under $TMPDIR)
#   --command             the arguments are a command to run on the driver host instead
#                         of apex-dask-submit ($APEX_SCHEDULER_FILE, $APEX_NETNS_WORKDIR set)
#   --serve               build the site, start Dask, wait for Ctrl-C
# Environment
#   APEX_NETNS_PREFIX     name prefix of namespaces and links (default: ax + 4 random hex
#                         digits, so concurrent sites never collide)
#   APEX_WAIT_WORKERS_S   seconds to wait for the workers to join (default 180)
#   APEX_TLS              on (default): tls:// and require-encryption everywhere | off
# Outputs in the workdir: hosts.json (each host's namespace, addresses and the
# bridge-side link of each interface), bytes.json (bytes each host received and
# sent on each interface while the driver command ran), one log per process.
# The Python environment with apex_dask must be active (dask, apex-dask-submit on PATH).
set -euo pipefail

usage() { sed -n '2,38p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "netns.sh: $*" >&2; exit 2; }

ENV_HOSTS=2
PER_HOST=1
LEARNER_PROCS=0
IFACE=eth0
TLS_DIR=""
TLS_GEN=0
WORKDIR=""
COMMAND=0
SERVE=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --env-hosts) [[ $# -ge 2 ]] || die "--env-hosts needs a number"; ENV_HOSTS=$2; shift 2 ;;
    --workers-per-host) [[ $# -ge 2 ]] || die "--workers-per-host needs a number"; PER_HOST=$2; shift 2 ;;
    --learner-processes) [[ $# -ge 2 ]] || die "--learner-processes needs a number"; LEARNER_PROCS=$2; shift 2 ;;
    --interface) [[ $# -ge 2 ]] || die "--interface needs eth0 or ib0"; IFACE=$2; shift 2 ;;
    --tls-dir) [[ $# -ge 2 ]] || die "--tls-dir needs a folder"; TLS_DIR=$2; shift 2 ;;
    --tls-generate) TLS_GEN=1; shift ;;
    --workdir) [[ $# -ge 2 ]] || die "--workdir needs a folder"; WORKDIR=$2; shift 2 ;;
    --command) COMMAND=1; shift ;;
    --serve) SERVE=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) break ;;
  esac
done
[[ "$ENV_HOSTS" =~ ^[1-9][0-9]?$ && $ENV_HOSTS -le 16 ]] || die "--env-hosts must be 1..16, got '$ENV_HOSTS'"
[[ "$PER_HOST" =~ ^[1-9][0-9]*$ ]] || die "--workers-per-host must be a positive integer, got '$PER_HOST'"
[[ "$LEARNER_PROCS" =~ ^[0-9]+$ ]] || die "--learner-processes must be an integer >= 0, got '$LEARNER_PROCS'"
[[ "$IFACE" == eth0 || "$IFACE" == ib0 ]] || die "--interface must be eth0 or ib0, got '$IFACE'"
[[ -z "$TLS_DIR" || $TLS_GEN -eq 0 ]] || die "give --tls-dir or --tls-generate, not both"
TLS=${APEX_TLS:-on}
[[ "$TLS" == on || "$TLS" == off ]] || die "APEX_TLS must be on or off, got '$TLS'"
[[ "$TLS" == on || ( -z "$TLS_DIR" && $TLS_GEN -eq 0 ) ]] || die "APEX_TLS=off and a --tls-* option given: drop one of them"
if [[ $COMMAND -eq 1 && $# -eq 0 ]]; then die "--command needs a command"; fi
PREFIX=${APEX_NETNS_PREFIX:-ax$(od -An -N2 -tx1 /dev/urandom | tr -d ' \n')}
[[ "$PREFIX" =~ ^[a-z][a-z0-9]{1,5}$ ]] || die "APEX_NETNS_PREFIX must be 2-6 lowercase letters/digits, got '$PREFIX'"
[[ $EUID -eq 0 ]] || die "needs root to create network namespaces (ip netns); run it with sudo"
command -v ip >/dev/null || die "ip (iproute2) not found"
DASK=$(command -v dask) || die "dask not found on PATH; activate the environment with apex_dask installed"
PYTHON=$(command -v python3 || command -v python) || die "python not found on PATH"
if [[ $SERVE -eq 0 && $COMMAND -eq 0 ]]; then
  SUBMIT=$(command -v apex-dask-submit) || die "apex-dask-submit not found on PATH"
fi
WAIT_S=${APEX_WAIT_WORKERS_S:-180}
if [[ -z "$WORKDIR" ]]; then WORKDIR=$(mktemp -d "${TMPDIR:-/tmp}/apex-netns.XXXXXX"); fi
mkdir -p "$WORKDIR"
WORKDIR=$(cd "$WORKDIR" && pwd)
SCHED_FILE="$WORKDIR/scheduler.json"
rm -f "$SCHED_FILE"

# Hosts: name, short code (for link names), host number in both /24s.
HOSTS=(sched driver learner)
CODES=(s d l)
NUMS=(1 2 3)
for ((i = 1; i <= ENV_HOSTS; i++)); do HOSTS+=("env$i"); CODES+=("e$i"); NUMS+=($((10 + i))); done
NETS=(eth0 ib0)
ns_of() { echo "$PREFIX-$1"; }
link_of() { echo "$PREFIX${CODES[$1]}n$2"; }  # bridge side of host index $1, network $2
addr_of() { echo "198.18.$2.${NUMS[$1]}"; }

pids=()     # process groups we started
made_ns=()  # namespaces we created
made_br=()  # bridges we created
cleanup() {
  local status=$? p ns br i
  trap - EXIT INT TERM
  if ((${#pids[@]} > 0)); then
    for p in "${pids[@]}"; do kill -TERM -- "-$p" 2>/dev/null || true; done
    for ((i = 0; i < 100; i++)); do
      local left=0
      for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && left=1; done
      ((left)) || break
      sleep 0.2
    done
    for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
  fi
  for ns in ${made_ns[@]+"${made_ns[@]}"}; do  # anything still inside one of our namespaces
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  for br in ${made_br[@]+"${made_br[@]}"}; do ip link del "$br" 2>/dev/null || true; done
  if ((${#made_ns[@]} > 0)); then echo "netns.sh: site $PREFIX removed; logs in $WORKDIR" >&2; fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

no_ipv6() { [[ -e /proc/sys/net/ipv6/conf/$1/disable_ipv6 ]] && echo 1 >"/proc/sys/net/ipv6/conf/$1/disable_ipv6" || true; }

# ---- the site ----------------------------------------------------------------
for n in 0 1; do
  br="${PREFIX}br$n"
  ip link add "$br" type bridge || die "cannot create bridge $br (is another site using prefix $PREFIX?)"
  made_br+=("$br")
  no_ipv6 "$br"
  ip link set "$br" up
done
for h in "${!HOSTS[@]}"; do
  ns=$(ns_of "${HOSTS[h]}")
  ip netns add "$ns" || die "cannot create namespace $ns"
  made_ns+=("$ns")
  ip netns exec "$ns" sh -c 'echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6; echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6' 2>/dev/null || true
  ip -n "$ns" link set lo up
  for n in 0 1; do
    outer=$(link_of "$h" "$n")
    inner="${outer}p"
    ip link add "$outer" type veth peer name "$inner"
    no_ipv6 "$outer"
    ip link set "$inner" netns "$ns"
    ip -n "$ns" link set "$inner" name "${NETS[n]}"
    ip -n "$ns" addr add "$(addr_of "$h" "$n")/24" dev "${NETS[n]}"
    ip -n "$ns" link set "${NETS[n]}" up
    ip link set "$outer" master "${PREFIX}br$n" up
  done
done
{
  echo "{"
  for h in "${!HOSTS[@]}"; do
    sep=","; ((h == ${#HOSTS[@]} - 1)) && sep=""
    printf '  "%s": {"ns": "%s", "eth0": "%s", "ib0": "%s", "links": {"eth0": "%s", "ib0": "%s"}}%s\n' \
      "${HOSTS[h]}" "$(ns_of "${HOSTS[h]}")" "$(addr_of "$h" 0)" "$(addr_of "$h" 1)" \
      "$(link_of "$h" 0)" "$(link_of "$h" 1)" "$sep"
  done
  echo "}"
} >"$WORKDIR/hosts.json.tmp"
mv "$WORKDIR/hosts.json.tmp" "$WORKDIR/hosts.json"  # whole or absent for readers
echo "netns.sh: site $PREFIX: ${#HOSTS[@]} hosts (${HOSTS[*]}), Dask on $IFACE; workdir $WORKDIR" >&2

# ---- TLS ---------------------------------------------------------------------
PROTO=tcp
if [[ "$TLS" == on && -z "$TLS_DIR" ]]; then  # a CA and one certificate for this run only
  TLS_DIR="$WORKDIR/tls"
  "$PYTHON" -m apex_dask.runtime.credentials "$TLS_DIR" || die "cannot make TLS credentials in $TLS_DIR"
  echo "netns.sh: TLS required; this run's credentials are in $TLS_DIR (mode 0600)" >&2
elif [[ "$TLS" == off ]]; then
  echo "netns.sh: WARNING: APEX_TLS=off: plain TCP; the cluster is open to anyone who can reach its hosts, and they can run any code as you" >&2
fi
if [[ -n "$TLS_DIR" ]]; then
  TLS_DIR=$(cd "$TLS_DIR" && pwd)
  for f in ca.pem cert.pem key.pem; do [[ -r "$TLS_DIR/$f" ]] || die "TLS file $TLS_DIR/$f missing"; done
  PROTO=tls
  export DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION=True
  export DASK_DISTRIBUTED__COMM__TLS__CA_FILE="$TLS_DIR/ca.pem"
  for role in SCHEDULER WORKER CLIENT; do
    export "DASK_DISTRIBUTED__COMM__TLS__${role}__CERT=$TLS_DIR/cert.pem"
    export "DASK_DISTRIBUTED__COMM__TLS__${role}__KEY=$TLS_DIR/key.pem"
  done
fi

# ---- Dask --------------------------------------------------------------------
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
launch() {  # launch HOST LOG CMD...: in HOST's namespace, in a session of its own
  local ns log=$2; ns=$(ns_of "$1"); shift 2
  setsid ip netns exec "$ns" "$@" >"$log" 2>&1 </dev/null &
  pids+=("$!")
}
launch sched "$WORKDIR/scheduler.log" "$DASK" scheduler --interface "$IFACE" --protocol "$PROTO" \
  --port 8786 --dashboard-address :8787 --scheduler-file "$SCHED_FILE" \
  --preload apex_dask.runtime.preload
for ((i = 0; i < 1200; i++)); do
  [[ -s "$SCHED_FILE" ]] && break
  kill -0 "${pids[0]}" 2>/dev/null || { tail -n 20 "$WORKDIR/scheduler.log" >&2; die "the scheduler exited"; }
  sleep 0.1
done
[[ -s "$SCHED_FILE" ]] || die "no scheduler file after 120 s; see $WORKDIR/scheduler.log"

common=(--scheduler-file "$SCHED_FILE" --interface "$IFACE" --protocol "$PROTO" --nthreads 1
  --death-timeout 60 --no-dashboard)
launch learner "$WORKDIR/learner.log" "$DASK" worker "${common[@]}" --name learner --resources GPU=1
EXPECTED=1
if ((LEARNER_PROCS > 0)); then
  launch learner "$WORKDIR/learner-host.log" "$DASK" worker "${common[@]}" --name lhost \
    --nworkers "$LEARNER_PROCS"
  EXPECTED=$((EXPECTED + LEARNER_PROCS))
fi
for ((i = 1; i <= ENV_HOSTS; i++)); do
  launch "env$i" "$WORKDIR/env$i.log" "$DASK" worker "${common[@]}" --name "env$i" --nworkers "$PER_HOST"
  EXPECTED=$((EXPECTED + PER_HOST))
done

# Wait from the driver's host, which also proves it reaches the scheduler.
ip netns exec "$(ns_of driver)" "$PYTHON" - "$SCHED_FILE" "$EXPECTED" "$WAIT_S" <<'PY' || die "workers did not join; see $WORKDIR/*.log"
import sys
from distributed import Client

sched_file, n, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
with Client(scheduler_file=sched_file, timeout=60) as client:
    client.wait_for_workers(n, timeout=timeout)
    info = client.scheduler_info(n_workers=-1)
    print(f"netns.sh: {len(info['workers'])} workers at {info['address']}", file=sys.stderr)
PY

counters() {  # one JSON object: host -> interface -> [received, sent] (bridge side, reversed)
  local h n sep="" link
  printf '{'
  for h in "${!HOSTS[@]}"; do
    printf '%s"%s": {' "$sep" "${HOSTS[h]}"; sep=", "
    for n in 0 1; do
      link=$(link_of "$h" "$n")
      printf '"%s": [%s, %s]' "${NETS[n]}" "$(<"/sys/class/net/$link/statistics/tx_bytes")" \
        "$(<"/sys/class/net/$link/statistics/rx_bytes")"
      ((n == 0)) && printf ', '
    done
    printf '}'
  done
  printf '}'
}

export APEX_SCHEDULER_FILE="$SCHED_FILE" APEX_NETNS_WORKDIR="$WORKDIR" APEX_NETNS_PREFIX="$PREFIX"
if [[ $SERVE -eq 1 ]]; then
  echo "netns.sh: ready; run things on the driver host with" >&2
  echo "netns.sh:   ip netns exec $(ns_of driver) apex-dask-submit --scheduler-file $SCHED_FILE ..." >&2
  echo "netns.sh: Ctrl-C removes the site" >&2
  while kill -0 "${pids[0]}" 2>/dev/null; do sleep 0.5; done
  die "the scheduler exited; see $WORKDIR/scheduler.log"
fi

before=$(counters)
t0=$(date +%s.%N)
rc=0
if [[ $COMMAND -eq 1 ]]; then
  ip netns exec "$(ns_of driver)" "$@" || rc=$?
else
  ip netns exec "$(ns_of driver)" "$SUBMIT" --scheduler-file "$SCHED_FILE" "$@" || rc=$?
fi
after=$(counters)
t1=$(date +%s.%N)
"$PYTHON" - "$before" "$after" "$t0" "$t1" "$IFACE" >"$WORKDIR/bytes.json" <<'PY' || true
import json
import sys

before, after = json.loads(sys.argv[1]), json.loads(sys.argv[2])
out = {"seconds": float(sys.argv[4]) - float(sys.argv[3]), "interface": sys.argv[5], "hosts": {}}
for host, nets in after.items():
    out["hosts"][host] = {
        net: {"rx": rx - before[host][net][0], "tx": tx - before[host][net][1]}
        for net, (rx, tx) in nets.items()
    }
print(json.dumps(out, indent=1))
PY
exit "$rc"
