#!/usr/bin/env bash
# A real multi-node Slurm cluster on one machine, for the rlsched demo and tests.
#
#   scripts/local-cluster.sh up     [--nodes 4] [--gpus 8] [--dir DIR] [--port 6900]
#                                   [--policy greedy] [--interval 5] [--no-controller] [--no-agents]
#   scripts/local-cluster.sh status [--dir DIR]
#   scripts/local-cluster.sh down   [--dir DIR]
#
# What `up` does (idempotent: with the cluster running, a second `up` starts
# only what is missing, e.g. a killed slurmd or agent; controller.toml is
# rewritten from the options each time):
#   * apt-get installs slurmctld, slurmd, slurm-client, munge and lua5.3 if
#     missing (Debian 12 ships Slurm 22.05);
#   * writes everything under DIR (default $RLSCHED_CLUSTER_DIR or
#     /tmp/rlsched-cluster): slurm.conf, gres.conf, job_submit.lua (from
#     slurm_conf/), a private munge key and socket, state/spool/log dirs, fake
#     GPU device files (GRES File= points at plain files), controller.toml and
#     env.sh (`source DIR/env.sh` points sbatch/squeue at this cluster);
#   * starts a private munged, slurmctld and N slurmd (`slurmd -N nodeK`, one
#     port each), waits until every node is idle;
#   * starts one `rlsched agent` per node (when the agent command exists) and
#     `rlsched controller run` beside slurmctld.
# Ports: slurmctld PORT, slurmd of nodeK PORT+K, its agent PORT+50+K, the
# controller's Prometheus metrics PORT+100 (--metrics-port).
# `down` stops exactly the processes whose pids it recorded under DIR/run.
# Nothing here touches /etc/slurm or the system munged.
set -euo pipefail

cmd="${1:-}"
[[ -n "$cmd" ]] && shift || true
if [[ "$cmd" == "-h" || "$cmd" == "--help" ]]; then sed -n '2,26p' "$0"; exit 0; fi

DIR="${RLSCHED_CLUSTER_DIR:-/tmp/rlsched-cluster}"
NODES=4
GPUS=8
PORT=6900
POLICY="greedy"
INTERVAL=5
WITH_CONTROLLER=1
WITH_AGENTS=1
PARTITION="gpu"
CPUS=32
METRICS_PORT=""
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

die() { echo "local-cluster: error: $*" >&2; exit 2; }
log() { echo "local-cluster: $*" >&2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) NODES="$2"; shift 2 ;;
    --gpus) GPUS="$2"; shift 2 ;;
    --dir) DIR="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --policy) POLICY="$2"; shift 2 ;;
    --interval) INTERVAL="$2"; shift 2 ;;
    --metrics-port) METRICS_PORT="$2"; shift 2 ;;
    --no-controller) WITH_CONTROLLER=0; shift ;;
    --no-agents) WITH_AGENTS=0; shift ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ "$NODES" =~ ^[1-9][0-9]*$ ]] || die "--nodes must be a positive integer, got '$NODES'"
[[ "$GPUS" =~ ^[1-9][0-9]*$ ]] || die "--gpus must be a positive integer, got '$GPUS'"
[[ "$PORT" =~ ^[1-9][0-9]*$ ]] || die "--port must be a port number, got '$PORT'"
[[ -n "$METRICS_PORT" ]] || METRICS_PORT=$((PORT + 100))

CONF="$DIR/etc/slurm.conf"
RUN="$DIR/run"
export SLURM_CONF="$CONF"

pid_alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pidfiles() {  # stop exactly the processes whose pids we recorded (TERM together, then KILL after 5 s)
  local f pid pids=()
  for f in "$@"; do
    [[ -f "$f" ]] || continue
    pid="$(cat "$f")"
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
      kill "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  for _ in $(seq 50); do
    local alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [[ "$alive" -eq 0 ]] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null; done
  rm -f "$@"
}

ensure_packages() {
  local missing=()
  command -v slurmctld >/dev/null || missing+=(slurmctld)
  command -v slurmd >/dev/null || missing+=(slurmd)
  command -v sbatch >/dev/null || missing+=(slurm-client)
  command -v munged >/dev/null || missing+=(munge)
  # slurmctld's job_submit/lua plugin needs liblua5.3 at run time
  ldconfig -p 2>/dev/null | grep -q 'liblua5\.3\.so\.0 ' || missing+=(liblua5.3-0)
  if [[ ${#missing[@]} -gt 0 ]]; then
    [[ $EUID -eq 0 ]] || die "missing ${missing[*]} and not root: install them (apt-get install slurm-wlm munge liblua5.3-0)"
    log "installing ${missing[*]} from Debian"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge liblua5.3-0 lua5.3 >/dev/null
  fi
}

write_config() {
  mkdir -p "$DIR"/{etc,state,log,run,munge,gres,jobs}
  chmod 755 "$DIR" "$DIR/etc" "$DIR/log" "$DIR/run" "$DIR/gres"
  chmod 1777 "$DIR/jobs"   # job output for any user
  chmod 700 "$DIR/state"
  local host; host="$(hostname -s)"
  local nodelist="node[1-$NODES]"
  [[ "$NODES" -eq 1 ]] && nodelist="node1"
  {
    echo "# Written by scripts/local-cluster.sh: $NODES nodes x $GPUS fake GPUs on one host."
    echo "ClusterName=rlsched"
    echo "SlurmctldHost=$host(127.0.0.1)"
    echo "SlurmctldPort=$PORT"
    echo "SlurmUser=root"
    echo "SlurmdUser=root"
    echo "AuthType=auth/munge"
    echo "CredType=cred/munge"
    echo "AuthInfo=socket=$DIR/munge/munge.socket"
    echo "StateSaveLocation=$DIR/state"
    echo "SlurmdSpoolDir=$DIR/spool/%n"
    echo "SlurmctldPidFile=$RUN/slurmctld.pid"
    echo "SlurmdPidFile=$RUN/slurmd-%n.pid"
    echo "SlurmctldLogFile=$DIR/log/slurmctld.log"
    echo "SlurmdLogFile=$DIR/log/slurmd-%n.log"
    echo "SlurmctldDebug=info"
    echo "SlurmdDebug=info"
    echo "SlurmdParameters=config_overrides"
    echo "ProctrackType=proctrack/linuxproc"
    echo "TaskPlugin=task/none"
    echo "MpiDefault=none"
    echo "SwitchType=switch/none"
    echo "SchedulerType=sched/backfill"
    echo "SchedulerParameters=sched_interval=2,defer_batch"
    echo "SelectType=select/cons_tres"
    echo "SelectTypeParameters=CR_Core"
    echo "GresTypes=gpu"
    echo "ReturnToService=2"
    echo "JobRequeue=1"
    echo "RequeueExitHold=75"
    echo "MinJobAge=300"
    echo "KillWait=5"
    echo "SlurmctldTimeout=30"
    echo "SlurmdTimeout=60"
    echo "InactiveLimit=0"
    echo "JobSubmitPlugins=lua"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "JobCompType=jobcomp/none"
    for i in $(seq 1 "$NODES"); do
      echo "NodeName=node$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$((PORT + i)) CPUs=$CPUS RealMemory=64000 Gres=gpu:$GPUS State=UNKNOWN"
    done
    echo "PartitionName=$PARTITION Nodes=$nodelist Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
  } >"$CONF.tmp"
  mv "$CONF.tmp" "$CONF"
  : >"$DIR/etc/gres.conf.tmp"
  for i in $(seq 1 "$NODES"); do
    mkdir -p "$DIR/gres/node$i" "$DIR/spool/node$i"
    for g in $(seq 0 $((GPUS - 1))); do : >"$DIR/gres/node$i/gpu$g"; done
    echo "NodeName=node$i Name=gpu File=$DIR/gres/node$i/gpu[0-$((GPUS - 1))]" >>"$DIR/etc/gres.conf.tmp"
  done
  mv "$DIR/etc/gres.conf.tmp" "$DIR/etc/gres.conf"
  # The managed partition is this cluster's default partition.
  sed -e "s/^local MANAGED_PARTITION = .*/local MANAGED_PARTITION = \"$PARTITION\"/" \
    "$REPO/slurm_conf/job_submit.lua" >"$DIR/etc/job_submit.lua"
  chmod 644 "$DIR"/etc/*
  if [[ ! -s "$DIR/munge/munge.key" ]]; then
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  fi
  chmod 700 "$DIR/munge"; chmod 600 "$DIR/munge/munge.key"
}

write_controller_config() {
  cat >"$DIR/etc/controller.toml" <<EOF
# rlsched controller for the local cluster (see slurm_conf/controller.toml.example)
[slurm]
conf = "$CONF"
partition = "$PARTITION"
command_timeout_s = 20

[controller]
policy = "$POLICY"
interval_s = $INTERVAL
state_dir = "$DIR/controller"
log_file = "$DIR/log/controller.log"

[metrics]
port = $METRICS_PORT

[agents]
enabled = $([[ "$WITH_AGENTS" -eq 1 ]] && echo true || echo false)
port_base = $((PORT + 50))
timeout_s = 10
auth = "munge:$DIR/munge/munge.socket"
EOF
  mkdir -p "$DIR/checkpoints"; chmod 1777 "$DIR/checkpoints"
  cat >"$DIR/env.sh" <<EOF
# source this file to use the local rlsched cluster
export SLURM_CONF="$CONF"
export RLSCHED_CLUSTER_DIR="$DIR"
export RLSCHED_CONTROLLER_CONFIG="$DIR/etc/controller.toml"
# for jobs: where each node's agent listens, how to authenticate, where checkpoints go
export RLSCHED_AGENT="$(for i in $(seq 1 "$NODES"); do printf 'node%d=127.0.0.1:%d,' "$i" $((PORT + 50 + i)); done | sed 's/,$//')"
export RLSCHED_AUTH="munge:$DIR/munge/munge.socket"
export RLSCHED_STORE="$DIR/checkpoints"
# the example jobs (scripts/examples/*.sbatch) find the repository here
export RLSCHED_REPO="$REPO"
EOF
  chmod 644 "$DIR/env.sh"
}

start_munge() {
  pid_alive "$RUN/munged.pid" && return 0
  # The socket lives in its own dir so users (sbatch) can reach it.
  munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
    --pid-file="$RUN/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/seed" \
    2>>"$DIR/log/munged.log" || die "munged failed to start (see $DIR/log/munged.log)"
  chmod 755 "$DIR/munge"
}

start_slurm() {
  if ! pid_alive "$RUN/slurmctld.pid"; then
    slurmctld -f "$CONF" || die "slurmctld failed (see $DIR/log/slurmctld.log)"
  fi
  for i in $(seq 1 "$NODES"); do
    pid_alive "$RUN/slurmd-node$i.pid" || slurmd -f "$CONF" -N "node$i" || die "slurmd node$i failed (see $DIR/log/slurmd-node$i.log)"
  done
  log "waiting for $NODES idle nodes"
  for _ in $(seq 120); do
    local n
    n="$(sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 ~ /^(idle|mix|alloc)/' | wc -l)" || n=0
    [[ "$n" -ge "$NODES" ]] && return 0
    # nodes left DOWN from an earlier run come back via ReturnToService=2; nudge them
    sinfo -h -N -o '%N %t' 2>/dev/null | awk '$2 ~ /down|drain/ {print $1}' | while read -r nd; do
      scontrol update NodeName="$nd" State=RESUME 2>/dev/null || true
    done
    sleep 0.5
  done
  die "nodes did not come up idle (see $DIR/log/)"
}

have_rlsched_cmd() {  # have_rlsched_cmd agent -> true when `rlsched agent` exists
  command -v rlsched >/dev/null && rlsched "$1" --help >/dev/null 2>&1
}

start_agents() {
  [[ "$WITH_AGENTS" -eq 1 ]] || return 0
  if ! have_rlsched_cmd agent; then
    log "no 'rlsched agent' command: node agents not started (preemption falls back to plain requeue)"
    return 0
  fi
  for i in $(seq 1 "$NODES"); do
    pid_alive "$RUN/agent-node$i.pid" && continue
    nohup rlsched agent --node "node$i" --listen "127.0.0.1:$((PORT + 50 + i))" \
      --store "$DIR/checkpoints" --auth "munge:$DIR/munge/munge.socket" --slurm-conf "$CONF" \
      >>"$DIR/log/agent-node$i.log" 2>&1 &
    echo $! >"$RUN/agent-node$i.pid"
  done
}

start_controller() {
  [[ "$WITH_CONTROLLER" -eq 1 ]] || return 0
  pid_alive "$RUN/controller.pid" && return 0
  have_rlsched_cmd controller || die "'rlsched controller' not available (pip install -e $REPO)"
  nohup rlsched controller run --config "$DIR/etc/controller.toml" >>"$DIR/log/controller.out" 2>&1 &
  echo $! >"$RUN/controller.pid"
}

status() {
  [[ -f "$CONF" ]] || { echo "no cluster at $DIR"; return 1; }
  local p
  for p in "$RUN"/*.pid; do
    [[ -f "$p" ]] || continue
    if pid_alive "$p"; then echo "$(basename "$p" .pid): running (pid $(cat "$p"))"; else echo "$(basename "$p" .pid): stopped"; fi
  done
  sinfo -N -o '%N %t %G' 2>/dev/null || echo "slurmctld not answering"
  squeue -O 'JobID:7,UserName:10,Name:14,State:10,NumNodes:6,tres-per-job:14,tres-per-node:14,ReasonList:20,Comment:40' 2>/dev/null || true
}

down() {
  [[ -d "$RUN" ]] || { log "nothing running at $DIR"; return 0; }
  shopt -s nullglob
  stop_pidfiles "$RUN/controller.pid" "$RUN"/agent-*.pid "$RUN"/slurmd-*.pid
  stop_pidfiles "$RUN/slurmctld.pid"
  stop_pidfiles "$RUN/munged.pid"
  log "stopped cluster at $DIR"
}

case "$cmd" in
  up)
    [[ $EUID -eq 0 ]] || die "must run as root (it starts slurmd/slurmctld)"
    ensure_packages
    if pid_alive "$RUN/slurmctld.pid" 2>/dev/null && [[ -f "$CONF" ]]; then
      log "cluster already running at $DIR: starting only what is missing"
    else
      write_config
    fi
    start_munge
    start_slurm
    write_controller_config
    start_agents
    start_controller
    log "up: source $DIR/env.sh, then sbatch --gpus=N --comment rlsched:model=MoE,samples=... your_job.sh"
    ;;
  down) down ;;
  status) status ;;
  *) die "usage: $0 up|down|status [--nodes N] [--gpus G] [--dir DIR] (see --help)" ;;
esac
