#!/usr/bin/env bash
# A three-node SLURM site on this machine, to try cluster/slurm/apex.sbatch and
# `apex-dask-submit --cluster slurm` against the real scheduler. The hosts are
# Linux network namespaces, as in cluster/netns.sh: one bridge (198.19.N.0/24,
# inside 198.18.0.0/15, which no real network uses), and on it
#   - the controller (this machine's own namespace, 198.19.N.1): munged and
#     slurmctld; sbatch/squeue/scancel run here, and so does the Dask scheduler
#     of `apex-dask-submit --cluster slurm`;
#   - gpu1 (198.19.N.11): partition `gpu`, 2 CPUs, one GRES `gpu` (a placeholder
#     device file: schedulable, not a GPU);
#   - cpu1, cpu2 (198.19.N.21-22): partition `cpu`, 2 CPUs each (both partitions:
#     4000 MB per node, a 12-hour limit);
# each node a namespace (network and host name) running its own slurmd. Every
# node sees this machine's files, so the run folder is shared. Config, key,
# spool, state, logs and sockets live in the workdir; slurmctld listens on a
# free port of its own; /etc/slurm and any SLURM or munge daemon already here
# are left alone. On exit (and on Ctrl-C or SIGTERM) every job is cancelled and
# everything the script made is removed. Needs root and slurm-wlm + munge
# (apt-get install slurm-wlm munge).
#
#   cluster/slurm_site.sh [options] [-- command...]
#
#   cluster/slurm_site.sh -- sbatch --wait cluster/slurm/apex.sbatch   # a command, then teardown
#   cluster/slurm_site.sh                    # serve: `source WORKDIR/env` in another shell
#
# Options
#   --workdir DIR   config, state, logs, env (default: new under $TMPDIR, printed)
#   --net N         third octet of the site's /24 in 198.19.0.0/16 (default: random 2..250)
# Outputs in the workdir: env (SLURM_CONF=...; source it to use the site),
# site.json (node -> namespace, address), slurm.conf, gres.conf, log/.
set -euo pipefail

usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "slurm_site.sh: $*" >&2; exit 2; }

WORKDIR=""
NET=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --workdir) [[ $# -ge 2 ]] || die "--workdir needs a folder"; WORKDIR=$2; shift 2 ;;
    --net) [[ $# -ge 2 ]] || die "--net needs a number 2..250"; NET=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    *) die "unknown option '$1' (a command goes after --)" ;;
  esac
done
[[ $EUID -eq 0 ]] || die "needs root (network namespaces, slurmd); run it with sudo"
for tool in ip nsenter unshare munged slurmctld slurmd sinfo scancel; do
  command -v "$tool" >/dev/null || die "$tool not found; install slurm-wlm and munge (apt-get install slurm-wlm munge)"
done
NET=${NET:-$((2 + RANDOM % 249))}
[[ "$NET" =~ ^[0-9]+$ && $NET -ge 2 && $NET -le 250 ]] || die "--net must be 2..250, got '$NET'"
PREFIX=sl$(printf '%02x' "$NET")$(od -An -N1 -tx1 /dev/urandom | tr -d ' \n')
if [[ -z "$WORKDIR" ]]; then WORKDIR=$(mktemp -d "${TMPDIR:-/tmp}/apex-slurm.XXXXXX"); fi
mkdir -p "$WORKDIR"
W=$(cd "$WORKDIR" && pwd)
SUBNET=198.19.$NET
CTL_ADDR=$SUBNET.1
NODES=(gpu1 cpu1 cpu2)
ADDRS=("$SUBNET.11" "$SUBNET.21" "$SUBNET.22")
BR=${PREFIX}br
export SLURM_CONF=$W/slurm.conf

free_port() {  # a TCP port nothing listens on, in 20000..39999
  local p i
  for ((i = 0; i < 200; i++)); do
    p=$((20000 + RANDOM % 20000))
    ss -Htln "sport = :$p" 2>/dev/null | grep -q . || { echo "$p"; return 0; }
  done
  die "no free port found"
}

pids=()     # munged, slurmctld: stopped last, in reverse order
made_ns=()
made_br=0
in_namespaces() { local ns; for ns in ${made_ns[@]+"${made_ns[@]}"}; do ip netns pids "$ns" 2>/dev/null; done; }
stop_all() {  # stop_all WHAT: SIGTERM, up to 10 s, then SIGKILL; WHAT lists the pids
  local what=$1 p i
  for p in $($what); do kill -TERM "$p" 2>/dev/null || true; done
  for ((i = 0; i < 50; i++)); do
    [[ -z "$(for p in $($what); do kill -0 "$p" 2>/dev/null && echo "$p"; done)" ]] && return 0
    sleep 0.2
  done
  for p in $($what); do kill -KILL "$p" 2>/dev/null || true; done
}
cleanup() {
  local status=$? ns i k
  trap - EXIT INT TERM
  if [[ -S "$W/munge/munge.sock" ]] && ((${#pids[@]} > 1)); then  # slurmctld is up: cancel every job
    timeout 10 scancel --full --quiet --user=root 2>/dev/null || true
    for ((i = 0; i < 75; i++)); do  # until the nodes have reported every job ended
      [[ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ]] && break
      sleep 0.2
    done
  fi
  stop_all in_namespaces  # slurmd, slurmstepd, whatever a job left; then the controller, munged
  for ns in ${made_ns[@]+"${made_ns[@]}"}; do ip netns del "$ns" 2>/dev/null || true; done
  for ((k = ${#pids[@]} - 1; k >= 0; k--)); do stop_all "echo ${pids[k]}"; done
  ((made_br)) && ip link del "$BR" 2>/dev/null
  if ((${#made_ns[@]} > 0)); then echo "slurm_site.sh: site $PREFIX removed; logs in $W/log" >&2; fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- network: a bridge with the controller's address, a namespace per node ----
ip link add "$BR" type bridge || die "cannot create bridge $BR"
made_br=1
[[ -e /proc/sys/net/ipv6/conf/$BR/disable_ipv6 ]] && echo 1 >"/proc/sys/net/ipv6/conf/$BR/disable_ipv6"
ip addr add "$CTL_ADDR/24" dev "$BR"
ip link set "$BR" up
for i in "${!NODES[@]}"; do
  ns="$PREFIX-${NODES[i]}"
  ip netns add "$ns" || die "cannot create namespace $ns"
  made_ns+=("$ns")
  ip -n "$ns" link set lo up
  ip link add "${PREFIX}n$i" type veth peer name "${PREFIX}n${i}p"
  ip link set "${PREFIX}n${i}p" netns "$ns"
  ip -n "$ns" link set "${PREFIX}n${i}p" name eth0
  ip -n "$ns" addr add "${ADDRS[i]}/24" dev eth0
  ip -n "$ns" link set eth0 up
  # A default route, as a real node has (Dask finds its own address through it); it ends
  # at the controller, which forwards nothing unless this machine already does.
  ip -n "$ns" route add default via "$CTL_ADDR"
  ip link set "${PREFIX}n$i" master "$BR" up
done

# ---- munge: a key and a socket of this site's own ------------------------------
rm -rf "$W/munge" "$W/state" "$W/spool" "$W/dev" "$W/env"  # a fresh site, even in an old workdir
mkdir -p "$W/munge" "$W/log" "$W/state" "$W/spool" "$W/dev"
chmod 0700 "$W/munge"
dd if=/dev/urandom of="$W/munge/munge.key" bs=1024 count=1 status=none
chmod 0400 "$W/munge/munge.key"
# Every daemon in a session of its own: Ctrl-C or a signal to this script's process group
# reaches the script only, whose cleanup stops them in order (jobs, slurmd, slurmctld, munged).
setsid munged --foreground --force --socket="$W/munge/munge.sock" --key-file="$W/munge/munge.key" \
  --pid-file="$W/munge/munged.pid" --log-file="$W/log/munged.log" \
  --seed-file="$W/munge/munged.seed" >"$W/log/munged.out" 2>&1 &
pids+=("$!")
for ((i = 0; i < 100; i++)); do [[ -S "$W/munge/munge.sock" ]] && break; sleep 0.1; done
[[ -S "$W/munge/munge.sock" ]] || { cat "$W/log/munged.out" >&2; die "munged did not start"; }

# ---- SLURM configuration ---------------------------------------------------------
PORT=$(free_port)
mknod "$W/dev/gpu0" c 1 3  # the GRES file: a character device (the one /dev/null is)
: >"$W/plugstack.conf"
cat >"$W/slurm.conf" <<EOF
ClusterName=apex$NET
SlurmctldHost=$(hostname -s)($CTL_ADDR)
SlurmctldPort=$PORT
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
# cred_expire (seconds, >= 5) also sets how long a requeued job is held
# (Reason=BeginTime, cred_expire + 1 s); SLURM's default is 120.
AuthInfo=socket=$W/munge/munge.sock,cred_expire=5
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$W/state
SlurmdSpoolDir=$W/spool/%n
SlurmctldPidFile=$W/slurmctld.pid
SlurmdPidFile=$W/spool/slurmd-%n.pid
SlurmctldLogFile=$W/log/slurmctld.log
PlugStackConfig=$W/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=200
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=2
ReturnToService=2
KillWait=10
MinJobAge=600
GresTypes=gpu
NodeName=gpu1 NodeAddr=${ADDRS[0]} CPUs=2 RealMemory=4000 Gres=gpu:1 State=UNKNOWN
NodeName=cpu1 NodeAddr=${ADDRS[1]} CPUs=2 RealMemory=4000 State=UNKNOWN
NodeName=cpu2 NodeAddr=${ADDRS[2]} CPUs=2 RealMemory=4000 State=UNKNOWN
PartitionName=gpu Nodes=gpu1 Default=YES MaxTime=12:00:00 State=UP
PartitionName=cpu Nodes=cpu1,cpu2 MaxTime=12:00:00 State=UP
EOF
echo "NodeName=gpu1 Name=gpu File=$W/dev/gpu0" >"$W/gres.conf"

# ---- daemons ----------------------------------------------------------------------
setsid slurmctld -D -i -f "$SLURM_CONF" >"$W/log/slurmctld.out" 2>&1 &
pids+=("$!")
for i in "${!NODES[@]}"; do  # its own host name too (a UTS namespace), so jobs see it
  ns="$PREFIX-${NODES[i]}"
  mkdir -p "$W/spool/${NODES[i]}"
  # nsenter, not `ip netns exec`: that remounts /sys, hiding the cgroup mounts slurmd reads.
  setsid nsenter --net="/run/netns/$ns" unshare --uts sh -c \
    "hostname ${NODES[i]} && exec slurmd -D -N ${NODES[i]} -f '$SLURM_CONF' -L '$W/log/slurmd-${NODES[i]}.log'" \
    >"$W/log/slurmd-${NODES[i]}.out" 2>&1 &
done
ready=""
for ((i = 0; i < 300; i++)); do  # every node idle (answering, configured, not INVAL)
  ready=$(sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 == "idle" {print $1}' | sort -u | wc -l)
  [[ "$ready" == "${#NODES[@]}" ]] && break
  kill -0 "${pids[1]}" 2>/dev/null || { tail -n 20 "$W/log/slurmctld.log" >&2; die "slurmctld exited"; }
  sleep 0.2
done
if [[ "$ready" != "${#NODES[@]}" ]]; then
  sinfo -N >&2 || true
  die "the nodes did not become idle within 60 s; see $W/log/"
fi
{
  echo "{"
  for i in "${!NODES[@]}"; do
    sep=","; ((i == ${#NODES[@]} - 1)) && sep=""
    printf '  "%s": {"ns": "%s", "address": "%s"}%s\n' "${NODES[i]}" "$PREFIX-${NODES[i]}" "${ADDRS[i]}" "$sep"
  done
  echo "}"
} >"$W/site.json"
echo "export SLURM_CONF=$SLURM_CONF" >"$W/env.tmp" && mv "$W/env.tmp" "$W/env"  # whole or absent
echo "slurm_site.sh: site $PREFIX ready: controller $CTL_ADDR:$PORT, nodes ${NODES[*]}; SLURM_CONF=$SLURM_CONF" >&2

if [[ $# -gt 0 ]]; then
  rc=0
  "$@" || rc=$?
  exit "$rc"
fi
echo "slurm_site.sh: serving; in another shell: source $W/env; Ctrl-C removes the site" >&2
while kill -0 "${pids[1]}" 2>/dev/null; do sleep 0.5; done
die "slurmctld exited; see $W/log/slurmctld.log"
