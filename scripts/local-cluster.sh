#!/usr/bin/env bash
# A real multi-node Slurm cluster on one machine, for the rlsched demo and tests.
#
#   scripts/local-cluster.sh up     [--nodes 4] [--gpus 8] [--dir DIR] [--port 6900]
#                                   [--policy greedy] [--interval 5] [--no-controller] [--no-agents]
#                                   [--other-nodes 1] [--no-job-submit] [--gpu-type TYPE|TYPE:K,...]
#                                   [--sched-params sched_interval=2,defer_batch]
#                                   [--ctl-cpus LIST] [--node-cpus LIST]
#   scripts/local-cluster.sh status [--dir DIR]
#   scripts/local-cluster.sh down   [--dir DIR]
#
# What `up` does (idempotent: with the cluster running, a second `up` starts
# only what is missing, e.g. a killed slurmd or agent; controller.toml keeps
# its policy and interval unless --policy / --interval are given, and a
# running controller reloads it when it changed):
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
# Partitions: `gpu` (nodes node1..N, the default, managed by rlsched: job_submit.lua
# holds its GPU jobs) and `other` (--other-nodes K nodes other1..K with the same GPUs,
# not managed: its jobs run as Slurm schedules them; 0: no such partition).
# Fake GPUs: symlinks to /dev/null (slurmd takes only device files in gres.conf's
# File=); Slurm numbers them by the file names' digits and sets CUDA_VISIBLE_DEVICES
# in jobs (no cgroup device constraint here: the global index on the node).
# Logs: each fresh `up` starts a run directory DIR/runs/<UTC time>/ (DIR/log points
# at the newest; the 10 newest are kept); controller.log rotates at 10 MiB x 5.
# --gpu-type: typed GPU GRES (`Gres=gpu:TYPE:G` in slurm.conf, `Name=gpu Type=TYPE` in gres.conf), so
# jobs can ask `--gpus=TYPE:N`: `--gpu-type a100` gives every node A100s; `--gpu-type a100:2,v100:2`
# gives node1-2 A100s and node3-4 V100s (the counts add up to --nodes, in node order); the
# unmanaged nodes get the first type. Without it the GPUs are untyped (`Gres=gpu:G`).
# --sched-params: slurm.conf's SchedulerParameters (default sched_interval=2,defer_batch; letters,
# digits and _=,.: only), e.g. for benchmarks of slurmctld settings (benchmarks/bench_slurm.py).
# --ctl-cpus / --node-cpus: CPU lists as taskset -c takes them (e.g. 0 and 1, or 0-3 and 4-15):
# slurmctld and the controller start on --ctl-cpus, every slurmd and agent on --node-cpus, so
# that each slurmd's slurmstepd and job processes run there too (TaskPlugin=task/none keeps
# the affinity they inherit). The model of a cluster whose controller host runs no jobs, on one
# machine (benchmarks/bench_slurm.py --ctl-cpus/--node-cpus). munged is left on every CPU (both
# sides use it). Daemons already running keep the CPUs they started with.
# --no-job-submit: slurm.conf without JobSubmitPlugins=lua (benchmarks only: nothing is
# held, nothing is managed).
# Ports: slurmctld PORT, slurmd of nodeK PORT+K, of otherK PORT+N+K, the agent of
# nodeK PORT+50+K, the controller's Prometheus metrics PORT+100 (--metrics-port).
# `up` checks that those ports are free (except those of its daemons already
# running) and controller.toml (`rlsched controller check-config`) before it
# starts anything. It waits 90 s at most for the nodes, and stops waiting as soon
# as slurmctld or a slurmd has died (showing the end of its log). If `up` fails
# it says why and where the logs are, and stops what it started (a cluster that
# was already running is left as it was). `up` and `down` need root.
# `down` cancels the cluster's jobs (waits up to 30 s for them to end), then
# stops exactly the processes whose pids it recorded under DIR/run, and kills
# any slurmstepd (with its job's processes) still working for DIR.
# DIR is made absolute; it must not contain whitespace or characters that
# slurm.conf cannot take unquoted. Nothing here touches /etc/slurm or the
# system munged.
set -euo pipefail

usage() { sed -n '2,/^set -euo pipefail/{/^set -euo pipefail/!p}' "$0"; }  # the comment above
cmd="${1:-}"
[[ -n "$cmd" ]] && shift || true
if [[ "$cmd" == "-h" || "$cmd" == "--help" ]]; then usage; exit 0; fi

DIR="${RLSCHED_CLUSTER_DIR:-/tmp/rlsched-cluster}"
NODES=4
GPUS=8
PORT=6900
POLICY="greedy"
INTERVAL=5
POLICY_GIVEN=0
INTERVAL_GIVEN=0
WITH_CONTROLLER=1
WITH_AGENTS=1
PARTITION="gpu"
OTHER_PARTITION="other"
OTHER_NODES=1
JOB_SUBMIT=1
SCHED_PARAMS="sched_interval=2,defer_batch"
CPUS=32
REAL_MEMORY=64000   # MB per node (nothing enforces it: TaskPlugin=task/none)
METRICS_PORT=""
CTL_CPUS=""    # --ctl-cpus: taskset -c list of slurmctld and the controller (empty: every CPU)
NODE_CPUS=""   # --node-cpus: taskset -c list of every slurmd (so its jobs) and agent (empty: every CPU)
GPU_TYPE=""   # --gpu-type as given; NODE_GPU_TYPE[name]: each node's GRES type (none: untyped)
declare -A NODE_GPU_TYPE=()
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# rlsched's Python environment (activates REPO/.venv when setup.sh made one, see there)
source "$REPO/scripts/python-env.sh"

die() { echo "local-cluster: error: $*" >&2; exit 2; }
log() { echo "local-cluster: $*" >&2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes|--gpus|--dir|--port|--policy|--interval|--metrics-port|--other-nodes|--gpu-type|--sched-params|--ctl-cpus|--node-cpus)
      # a missing value, or the next option taken for one ("--nodes --gpus 4"), is an error of its own
      [[ $# -ge 2 && "$2" != --* ]] || die "$1 needs a value (see --help)"
      case "$1" in
        --nodes) NODES="$2" ;;
        --gpus) GPUS="$2" ;;
        --dir) DIR="$2" ;;
        --port) PORT="$2" ;;
        --policy) POLICY="$2"; POLICY_GIVEN=1 ;;
        --interval) INTERVAL="$2"; INTERVAL_GIVEN=1 ;;
        --metrics-port) METRICS_PORT="$2" ;;
        --other-nodes) OTHER_NODES="$2" ;;
        --gpu-type) GPU_TYPE="$2" ;;
        --sched-params) SCHED_PARAMS="$2" ;;
        --ctl-cpus) CTL_CPUS="$2" ;;
        --node-cpus) NODE_CPUS="$2" ;;
      esac
      shift 2 ;;
    --no-controller) WITH_CONTROLLER=0; shift ;;
    --no-agents) WITH_AGENTS=0; shift ;;
    --no-job-submit) JOB_SUBMIT=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done
[[ "$SCHED_PARAMS" =~ ^[A-Za-z0-9_=,.:]+$ ]] || die "--sched-params takes letters, digits and _=,.: only, got '$SCHED_PARAMS'"
for _cpus in "--ctl-cpus:$CTL_CPUS" "--node-cpus:$NODE_CPUS"; do
  [[ -z "${_cpus#*:}" ]] && continue
  [[ "${_cpus#*:}" =~ ^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$ ]] \
    || die "${_cpus%%:*} takes a CPU list as taskset -c does (e.g. 0 or 0-3,8), got '${_cpus#*:}'"
  command -v taskset >/dev/null || die "${_cpus%%:*} needs taskset (util-linux)"
  taskset -c "${_cpus#*:}" true 2>/dev/null \
    || die "${_cpus%%:*} '${_cpus#*:}': not CPUs this process may run on ($(nproc) CPUs: see taskset -cp $$)"
done
# the command prefix of each side (taskset execs the daemon: the pid recorded is the daemon's own)
CTL_ON=(); [[ -n "$CTL_CPUS" ]] && CTL_ON=(taskset -c "$CTL_CPUS")
NODE_ON=(); [[ -n "$NODE_CPUS" ]] && NODE_ON=(taskset -c "$NODE_CPUS")
[[ "$NODES" =~ ^[1-9][0-9]{0,3}$ ]] || die "--nodes must be a positive integer (at most 9999), got '$NODES'"
[[ "$OTHER_NODES" =~ ^[0-9]{1,4}$ ]] || die "--other-nodes must be a number (0: no unmanaged partition), got '$OTHER_NODES'"
[[ "$GPUS" =~ ^[1-9][0-9]{0,3}$ ]] || die "--gpus must be a positive integer (at most 9999), got '$GPUS'"
[[ "$PORT" =~ ^[1-9][0-9]{0,4}$ && "$PORT" -le 65535 ]] || die "--port must be a port number, got '$PORT'"
if [[ -n "$METRICS_PORT" ]]; then
  [[ "$METRICS_PORT" =~ ^[1-9][0-9]{0,4}$ && "$METRICS_PORT" -le 65535 ]] \
    || die "--metrics-port must be a port number, got '$METRICS_PORT'"
else
  METRICS_PORT=$((PORT + 100))
fi
[[ -n "$DIR" ]] || die "--dir must not be empty"
# Daemons chdir to / (and slurm.conf takes absolute paths): make DIR absolute.
DIR="$(realpath -m -- "$DIR")"
# DIR goes unquoted into slurm.conf, gres.conf (File=...[0-7]) and munged's
# options: refuse what they cannot take, before anything is written.
if [[ "$DIR" =~ [[:space:]] ]]; then
  die "--dir must not contain whitespace (it goes unquoted into slurm.conf): '$DIR'"
fi
[[ "$DIR" =~ ^[A-Za-z0-9._/+@-]+$ ]] \
  || die "--dir may contain only letters, digits and . _ / + @ - (it goes unquoted into slurm.conf): '$DIR'"

CONF="$DIR/etc/slurm.conf"
RUN="$DIR/run"
# every slurmd of the cluster: the managed partition's node1..N, then the unmanaged other1..K
ALL_NODES=()
for i in $(seq 1 "$NODES"); do ALL_NODES+=("node$i"); done
for i in $(seq 1 "$OTHER_NODES"); do ALL_NODES+=("other$i"); done
if [[ -n "$GPU_TYPE" ]]; then  # each node's GRES type, in node order
  type_re='^[A-Za-z][A-Za-z0-9_.-]{0,31}$'  # a name Slurm takes as a GRES type (a leading digit reads as a count)
  if [[ "$GPU_TYPE" != *:* ]]; then
    [[ "$GPU_TYPE" =~ $type_re ]] || die "--gpu-type: '$GPU_TYPE' is not a GPU type name (a letter, then letters, digits, . _ -)"
    for nd in "${ALL_NODES[@]}"; do NODE_GPU_TYPE[$nd]="$GPU_TYPE"; done
  else
    k=0; first=""
    IFS=',' read -r -a type_parts <<<"$GPU_TYPE"
    for part in "${type_parts[@]}"; do
      t="${part%%:*}"; c="${part#*:}"
      [[ "$part" == *:* && "$t" =~ $type_re && "$c" =~ ^[1-9][0-9]{0,3}$ ]] \
        || die "--gpu-type: '$part' in '$GPU_TYPE' is not TYPE:COUNT (e.g. a100:2,v100:2)"
      [[ -n "$first" ]] || first="$t"
      for _ in $(seq 1 "$c"); do
        k=$((k + 1))
        [[ "$k" -le "$NODES" ]] && NODE_GPU_TYPE[node$k]="$t"
      done
    done
    [[ "$k" -eq "$NODES" ]] || die "--gpu-type '$GPU_TYPE' types $k nodes; --nodes is $NODES"
    for i in $(seq 1 "$OTHER_NODES"); do NODE_GPU_TYPE[other$i]="$first"; done
  fi
fi
node_gres() {  # node_gres NAME: its GPUs as slurm.conf's Gres= (gpu:TYPE:G or gpu:G)
  local t="${NODE_GPU_TYPE[$1]:-}"
  echo "gpu:${t:+$t:}$GPUS"
}

node_port() {  # node_port NAME: its slurmd's port
  case "$1" in
    node*) echo $((PORT + ${1#node})) ;;
    other*) echo $((PORT + NODES + ${1#other})) ;;
  esac
}
export SLURM_CONF="$CONF"

# A process is alive when ps sees it and it is not a zombie. (Not `kill -0`:
# for a non-root `status` it fails with EPERM on root's daemons.)
alive() {
  local st
  [[ "$1" =~ ^[0-9]+$ ]] || return 1
  st="$(ps -o stat= -p "$1" 2>/dev/null)" || return 1
  st="${st//[[:space:]]/}"
  [[ -n "$st" && "$st" != Z* ]]
}
# The pid recorded in pidfile $1 when it is still the process that recorded it: alive, and started no
# later than the file was written. A daemon that died leaves its pid to be reused (pid_max may be 32768),
# and a later process with that pid is not ours to report or signal.
pidfile_pid() {
  local f="$1" pid et now mt
  [[ -f "$f" ]] || return 1
  pid="$(cat "$f" 2>/dev/null)"
  alive "$pid" || return 1
  et="$(ps -o etimes= -p "$pid" 2>/dev/null)" || return 1
  et="${et//[[:space:]]/}"
  mt="$(stat -c %Y "$f" 2>/dev/null)" || return 1
  [[ "$et" =~ ^[0-9]+$ && "$mt" =~ ^[0-9]+$ ]] || return 1
  now="$(date +%s)"
  (( now - et <= mt + 1 )) || return 1  # (1 s: the clocks' rounding)
  echo "$pid"
}
pid_alive() { pidfile_pid "$1" >/dev/null; }

stop_pidfiles() {  # stop exactly the processes whose pids we recorded (TERM together, then KILL after 5 s)
  local f pid pids=()
  for f in "$@"; do
    [[ -f "$f" ]] || continue
    if pid="$(pidfile_pid "$f")"; then
      kill "$pid" 2>/dev/null || true
      pids+=("$pid")
    fi
  done
  for _ in $(seq 50); do
    local alive=0
    for pid in "${pids[@]}"; do alive "$pid" && alive=1; done
    [[ "$alive" -eq 0 ]] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do alive "$pid" && { kill -9 "$pid" 2>/dev/null || true; }; done
  rm -f "$@"
}

ensure_packages() {
  local missing=()
  command -v slurmctld >/dev/null || missing+=(slurmctld)
  command -v slurmd >/dev/null || missing+=(slurmd)
  command -v sbatch >/dev/null || missing+=(slurm-client)
  command -v munged >/dev/null || missing+=(munge)
  # slurmctld's job_submit/lua plugin needs liblua5.3 at run time
  # (grep reads all of ldconfig's output: `grep -q` would exit at the first match and,
  # under pipefail, a large cache's SIGPIPE in ldconfig would count as "missing")
  ldconfig -p 2>/dev/null | grep 'liblua5\.3\.so\.0 ' >/dev/null || missing+=(liblua5.3-0)
  if [[ ${#missing[@]} -gt 0 ]]; then
    [[ $EUID -eq 0 ]] || die "missing ${missing[*]} and not root: install them (apt-get install slurm-wlm munge liblua5.3-0)"
    log "installing ${missing[*]} from Debian"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge liblua5.3-0 lua5.3 >/dev/null
  fi
}

new_run_dir() {  # a fresh run directory for this `up`'s logs; DIR/log points at it
  local id0 id n=0 r
  id0="$(date -u +%Y%m%dT%H%M%SZ)"
  id="$id0"
  while [[ -e "$DIR/runs/$id" ]]; do n=$((n + 1)); id="$id0.$n"; done
  mkdir -p "$DIR/runs/$id/log"
  chmod 755 "$DIR/runs" "$DIR/runs/$id" "$DIR/runs/$id/log"
  if [[ -d "$DIR/log" && ! -L "$DIR/log" ]]; then  # logs of a cluster from before run directories
    mv "$DIR/log" "$DIR/runs/$id/log.before"
  fi
  ln -sfn "runs/$id/log" "$DIR/log"
  # keep the 10 newest runs
  for r in $(ls -1 "$DIR/runs" | sort | head -n -10); do rm -rf -- "${DIR:?}/runs/$r"; done
  log "run directory $DIR/runs/$id (logs: $DIR/log/)"
}

write_config() {
  mkdir -p "$DIR"/{etc,state,run,munge,gres,jobs}
  new_run_dir
  chmod 755 "$DIR" "$DIR/etc" "$DIR/run" "$DIR/gres"
  chmod 1777 "$DIR/jobs"   # job output for any user
  chmod 700 "$DIR/state"
  local host t; host="$(hostname -s)"
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
    echo "SchedulerParameters=$SCHED_PARAMS"
    echo "SelectType=select/cons_tres"
    # as in slurm_conf/slurm.conf.fragment: memory is consumable, and a job that
    # asks for none gets DefMemPerCPU per CPU (not the whole node), so jobs share nodes
    echo "SelectTypeParameters=CR_Core_Memory"
    echo "DefMemPerCPU=$((REAL_MEMORY / CPUS))"
    echo "GresTypes=gpu"
    echo "ReturnToService=2"
    echo "JobRequeue=1"
    echo "RequeueExitHold=75"
    echo "MinJobAge=300"
    echo "KillWait=5"
    echo "SlurmctldTimeout=30"
    echo "SlurmdTimeout=60"
    echo "InactiveLimit=0"
    [[ "$JOB_SUBMIT" -eq 1 ]] && echo "JobSubmitPlugins=lua"
    echo "AccountingStorageType=accounting_storage/none"
    echo "JobAcctGatherType=jobacct_gather/none"
    echo "JobCompType=jobcomp/none"
    for nd in "${ALL_NODES[@]}"; do
      echo "NodeName=$nd NodeHostname=$host NodeAddr=127.0.0.1 Port=$(node_port "$nd") CPUs=$CPUS RealMemory=$REAL_MEMORY Gres=$(node_gres "$nd") State=UNKNOWN"
    done
    echo "PartitionName=$PARTITION Nodes=$nodelist Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO"
    if [[ "$OTHER_NODES" -gt 0 ]]; then  # not managed: job_submit.lua leaves its jobs alone
      local others="other[1-$OTHER_NODES]"
      [[ "$OTHER_NODES" -eq 1 ]] && others="other1"
      echo "PartitionName=$OTHER_PARTITION Nodes=$others Default=NO MaxTime=INFINITE State=UP OverSubscribe=NO"
    fi
  } >"$CONF.tmp"
  mv "$CONF.tmp" "$CONF"
  : >"$DIR/etc/gres.conf.tmp"
  for nd in "${ALL_NODES[@]}"; do
    mkdir -p "$DIR/gres/$nd" "$DIR/spool/$nd"
    # each fake GPU is a symlink to /dev/null: slurmd accepts only character or block devices in
    # File= (a plain file is dropped with "not a valid character or block device", and the job then
    # gets no CUDA_VISIBLE_DEVICES); Slurm numbers the GPUs by the digits ending the file name
    for g in $(seq 0 $((GPUS - 1))); do ln -sfn /dev/null "$DIR/gres/$nd/gpu$g"; done
    t="${NODE_GPU_TYPE[$nd]:-}"
    echo "NodeName=$nd Name=gpu${t:+ Type=$t} File=$DIR/gres/$nd/gpu[0-$((GPUS - 1))]" >>"$DIR/etc/gres.conf.tmp"
  done
  mv "$DIR/etc/gres.conf.tmp" "$DIR/etc/gres.conf"
  # The managed partition is this cluster's default partition.
  # and its GPUs are in the controller's capacity file (state_dir/capacity)
  sed -e "s/^local MANAGED_PARTITION = .*/local MANAGED_PARTITION = \"$PARTITION\"/" \
    -e "s|^local CAPACITY_FILE = .*|local CAPACITY_FILE = \"$DIR/controller/capacity\"|" \
    "$REPO/slurm_conf/job_submit.lua" >"$DIR/etc/job_submit.lua"
  chmod 644 "$DIR"/etc/*
  if [[ ! -s "$DIR/munge/munge.key" ]]; then
    dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  fi
  chmod 700 "$DIR/munge"; chmod 600 "$DIR/munge/munge.key"
}

# controller.toml of a cluster that has one keeps its policy and interval unless --policy / --interval
# are given (an `up` that restarts a killed daemon must not switch the policy back to the default)
keep_controller_settings() {
  local f="$DIR/etc/controller.toml" v
  [[ -f "$f" ]] || return 0
  if [[ "$POLICY_GIVEN" -eq 0 ]]; then
    v="$(sed -n 's/^policy = "\(.*\)"$/\1/p' "$f" | head -n 1)"
    [[ -n "$v" ]] && POLICY="$v"
  fi
  if [[ "$INTERVAL_GIVEN" -eq 0 ]]; then
    v="$(sed -n 's/^interval_s = \(.*\)$/\1/p' "$f" | head -n 1)"
    [[ -n "$v" ]] && INTERVAL="$v"
  fi
  return 0
}

# the checked controller.toml.new replaces controller.toml; a running controller reloads a changed one
install_controller_config() {
  local f="$DIR/etc/controller.toml"
  if [[ -f "$f" ]] && cmp -s "$f" "$f.new"; then
    rm -f "$f.new"
    return 0
  fi
  local had=0; [[ -f "$f" ]] && had=1
  mv -f "$f.new" "$f"
  if [[ "$had" -eq 1 ]] && pid_alive "$RUN/controller.pid"; then
    kill -HUP "$(cat "$RUN/controller.pid")"
    log "controller.toml changed (policy $POLICY, interval ${INTERVAL} s): the running controller reloads it (SIGHUP)"
  fi
}

write_controller_config() {
  cat >"$DIR/etc/controller.toml.new" <<EOF
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
  if [[ "${VIRTUAL_ENV:-}" == "$RLSCHED_VENV" ]]; then  # rlsched lives in the repository's virtualenv
    echo "export PATH=\"$RLSCHED_VENV/bin:\$PATH\"" >>"$DIR/env.sh"
  fi
  chmod 644 "$DIR/env.sh"
}

start_munge() {
  if ! pid_alive "$RUN/munged.pid"; then
    munged --force --key-file="$DIR/munge/munge.key" --socket="$DIR/munge/munge.socket" \
      --pid-file="$RUN/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/seed" \
      2>>"$DIR/log/munged.log" || die "munged failed to start (see $DIR/log/munged.log)"
  fi
  # The socket lives in its own dir so users (sbatch) can reach it. Always, also when munged was
  # already running: write_config (a re-run `up` after slurmctld died) has just made the dir 0700.
  chmod 755 "$DIR/munge"
}

UP_TIMEOUT=90   # s: how long `up` waits for every node to be idle
SLURM_CMD_TIMEOUT=5   # s per sinfo/squeue/scontrol call (with slurmctld down, sinfo retries for ~10 s)

log_tail() {  # log_tail FILE FROM: the last lines FILE got after byte FROM, to stderr
  local f="$1" from="$2" lines
  lines="$(tail -c +"$((from + 1))" "$f" 2>/dev/null | grep -v '^[[:space:]]*$' | tail -n 5)" || lines=""
  if [[ -n "$lines" ]]; then
    log "last lines of $f:"
    sed 's/^/    /' <<<"$lines" >&2
  else
    log "$f: nothing written since the start"
  fi
}

# daemon_check PIDFILE NAME LOG FROM: die, with the end of its log, once the daemon is gone: its
# pid (written by the daemon after it forked) is dead, or it logged a fatal error, or it has written
# no pid after 10 s. (Stale pid files are removed before a daemon is started.)
daemon_check() {
  local pidfile="$1" name="$2" f="$3" from="$4" pid="" why=""
  if [[ -f "$pidfile" ]]; then pid="$(cat "$pidfile" 2>/dev/null)" || pid=""; fi
  pid="${pid//[[:space:]]/}"
  if [[ -n "$pid" ]] && ! alive "$pid"; then
    why="exited"
  elif tail -c +"$((from + 1))" "$f" 2>/dev/null | grep 'fatal:' >/dev/null; then
    why="failed"
  elif [[ -z "$pid" && $((SECONDS - SLURM_T0)) -ge 10 ]]; then
    why="wrote no pid file ($pidfile) in 10 s"
  fi
  [[ -z "$why" ]] && return 0
  log_tail "$f" "$from"
  die "$name $why during start-up (see $f)"
}

start_slurm() {
  local i n nd states from=()
  from[0]="$(stat -c %s "$DIR/log/slurmctld.log" 2>/dev/null || echo 0)"
  local k nd
  for k in "${!ALL_NODES[@]}"; do from[k + 1]="$(stat -c %s "$DIR/log/slurmd-${ALL_NODES[k]}.log" 2>/dev/null || echo 0)"; done
  SLURM_T0=$SECONDS
  if ! pid_alive "$RUN/slurmctld.pid"; then
    rm -f "$RUN/slurmctld.pid"  # a dead pid in it would read as "slurmctld exited" below
    "${CTL_ON[@]}" slurmctld -f "$CONF" || die "slurmctld failed (see $DIR/log/slurmctld.log)"
  fi
  for nd in "${ALL_NODES[@]}"; do
    pid_alive "$RUN/slurmd-$nd.pid" && continue
    rm -f "$RUN/slurmd-$nd.pid"
    "${NODE_ON[@]}" slurmd -f "$CONF" -N "$nd" || die "slurmd $nd failed (see $DIR/log/slurmd-$nd.log)"
  done
  local want=${#ALL_NODES[@]}
  log "waiting for $want idle nodes (${UP_TIMEOUT} s at most)"
  local deadline=$((SECONDS + UP_TIMEOUT))
  while :; do
    daemon_check "$RUN/slurmctld.pid" slurmctld "$DIR/log/slurmctld.log" "${from[0]}"
    for k in "${!ALL_NODES[@]}"; do
      nd="${ALL_NODES[k]}"
      daemon_check "$RUN/slurmd-$nd.pid" "slurmd of $nd" "$DIR/log/slurmd-$nd.log" "${from[k + 1]}"
    done
    # slurmctld may not answer yet: a failing or timed-out sinfo is "not yet", never the end of the script
    states="$(timeout "$SLURM_CMD_TIMEOUT" sinfo -h -N -o '%N %t' 2>/dev/null)" || states=""
    n="$(awk '$2 ~ /^(idle|mix|alloc)/' <<<"$states" | wc -l)"
    [[ "$n" -ge "$want" ]] && return 0
    # nodes left DOWN from an earlier run come back via ReturnToService=2; nudge them
    for nd in $(awk '$2 ~ /down|drain/ {print $1}' <<<"$states"); do
      timeout "$SLURM_CMD_TIMEOUT" scontrol update NodeName="$nd" State=RESUME >/dev/null 2>&1 || true
    done
    [[ "$SECONDS" -lt "$deadline" ]] \
      || die "nodes did not come up idle in ${UP_TIMEOUT} s ($n of $want idle; see $DIR/log/)"
    sleep 0.5
  done
}

have_rlsched_cmd() {  # have_rlsched_cmd agent -> true when `rlsched agent` exists
  command -v rlsched >/dev/null && rlsched "$1" --help >/dev/null 2>&1
}

HAVE_AGENT_CMD=""
have_agent_cmd() {  # `rlsched agent` exists (asked once: it starts Python)
  if [[ -z "$HAVE_AGENT_CMD" ]]; then
    if have_rlsched_cmd agent; then HAVE_AGENT_CMD=1; else HAVE_AGENT_CMD=0; fi
  fi
  [[ "$HAVE_AGENT_CMD" -eq 1 ]]
}

# port_in_use PORT: true when a TCP socket listens on PORT (prints "NAME (pid N)" when ss can tell).
# ss (iproute2) when it is there, else a test bind as slurmctld does it (all addresses,
# SO_REUSEADDR), else a connection attempt to 127.0.0.1.
port_in_use() {
  local p="$1" out rc=0
  if command -v ss >/dev/null 2>&1 && out="$(ss -Hltnp "sport = :$p" 2>/dev/null)"; then
    [[ -n "$out" ]] || return 1
    sed -n 's/.*users:(("\([^"]*\)",pid=\([0-9]*\).*/\1 (pid \2)/p' <<<"$out" | head -n 1
    return 0
  fi
  "${PY:-python3}" - "$p" 2>/dev/null <<'EOF' || rc=$?
import errno, socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("", int(sys.argv[1])))
except OSError as e:
    sys.exit(0 if e.errno == errno.EADDRINUSE else 3)
sys.exit(1)
EOF
  [[ "$rc" -eq 0 || "$rc" -eq 1 ]] && return "$rc"
  timeout 2 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$p" 2>/dev/null
}

# Every port the cluster uses and who listens on it: PORT_OWNER[port] = "what|pid file".
declare -A PORT_OWNER=()
add_port() {  # add_port PORT WHAT PIDFILE
  [[ -z "${PORT_OWNER[$1]:-}" ]] \
    || die "port $1 would be used by both the ${PORT_OWNER[$1]%%|*} and the $2 (see Ports in --help)"
  PORT_OWNER[$1]="$2|$3"
}
plan_ports() {  # before anything is written: ports in range, no two daemons on one port
  local i nd last=$((PORT + NODES + OTHER_NODES))
  [[ "$WITH_AGENTS" -eq 1 && $((PORT + 50 + NODES)) -gt "$last" ]] && last=$((PORT + 50 + NODES))
  [[ "$last" -le 65535 ]] || die "--port $PORT with --nodes $NODES and --other-nodes $OTHER_NODES need ports up to $last, above 65535"
  if [[ "$WITH_CONTROLLER" -eq 1 && "$METRICS_PORT" -gt 65535 ]]; then
    die "--port $PORT puts the controller's metrics on port $METRICS_PORT, above 65535: give --metrics-port"
  fi
  add_port "$PORT" "slurmctld" "$RUN/slurmctld.pid"
  for nd in "${ALL_NODES[@]}"; do add_port "$(node_port "$nd")" "slurmd of $nd" "$RUN/slurmd-$nd.pid"; done
  if [[ "$WITH_AGENTS" -eq 1 ]]; then
    for i in $(seq 1 "$NODES"); do add_port "$((PORT + 50 + i))" "agent of node$i" "$RUN/agent-node$i.pid"; done
  fi
  if [[ "$WITH_CONTROLLER" -eq 1 ]]; then add_port "$METRICS_PORT" "controller's metrics" "$RUN/controller.pid"; fi
}

check_ports() {  # before anything starts: the ports of the daemons `up` is going to start are free
  local p what pidfile who
  for p in $(printf '%s\n' "${!PORT_OWNER[@]}" | sort -n); do
    what="${PORT_OWNER[$p]%%|*}"
    pidfile="${PORT_OWNER[$p]#*|}"
    pid_alive "$pidfile" && continue  # already running: the port is its own
    if [[ "$what" == agent* ]] && ! have_agent_cmd; then continue; fi  # no agents without the command
    if who="$(port_in_use "$p")"; then
      die "port $p (for the $what) is already in use${who:+ by $who}: stop that, or choose other ports with --port"
    fi
  done
}

check_controller_config() {  # before anything starts: a bad policy (name, checkpoint, shape) stops `up` here
  [[ "$WITH_CONTROLLER" -eq 1 ]] || return 0
  have_rlsched_cmd controller || die "'rlsched controller' not available (bash $REPO/scripts/setup.sh installs it)"
  local out
  out="$(rlsched controller check-config --cluster "${NODES}x${GPUS}" "$DIR/etc/controller.toml.new" 2>&1)" \
    || { rm -f "$DIR/etc/controller.toml.new"; die "bad controller config: ${out##*error: }"; }
}

start_agents() {
  [[ "$WITH_AGENTS" -eq 1 ]] || return 0
  if ! have_agent_cmd; then
    log "no 'rlsched agent' command: node agents not started (preemption falls back to plain requeue)"
    return 0
  fi
  for i in $(seq 1 "$NODES"); do
    pid_alive "$RUN/agent-node$i.pid" && continue
    nohup "${NODE_ON[@]}" rlsched agent --node "node$i" --listen "127.0.0.1:$((PORT + 50 + i))" \
      --store "$DIR/checkpoints" --auth "munge:$DIR/munge/munge.socket" --slurm-conf "$CONF" \
      >>"$DIR/log/agent-node$i.log" 2>&1 &
    echo $! >"$RUN/agent-node$i.pid"
  done
}

start_controller() {
  [[ "$WITH_CONTROLLER" -eq 1 ]] || return 0
  pid_alive "$RUN/controller.pid" && return 0
  local out="$DIR/log/controller.out" from
  from="$(stat -c %s "$out" 2>/dev/null || echo 0)"
  nohup "${CTL_ON[@]}" rlsched controller run --config "$DIR/etc/controller.toml" >>"$out" 2>&1 &
  echo $! >"$RUN/controller.pid"
  # it builds the policy at its first round: wait for that round (or its death), 30 s at most
  local status="$DIR/controller/status.json" t0; t0="$(date +%s)"
  for _ in $(seq 300); do
    if ! pid_alive "$RUN/controller.pid"; then
      die "the controller exited at start-up: $(tail -c +"$((from + 1))" "$out" | grep -v '^\s*$' | tail -n 1) (see $out)"
    fi
    [[ -f "$status" && "$(stat -c %Y "$status" 2>/dev/null || echo 0)" -ge "$t0" ]] && return 0
    sleep 0.1
  done
  log "the controller has not finished a round after 30 s; it keeps running (see $out)"
}

status() {
  [[ -f "$CONF" ]] || { echo "no cluster at $DIR"; return 1; }
  local p
  for p in "$RUN"/*.pid; do
    [[ -f "$p" ]] || continue
    if pid_alive "$p"; then echo "$(basename "$p" .pid): running (pid $(cat "$p"))"; else echo "$(basename "$p" .pid): stopped"; fi
  done
  pid_alive "$RUN/slurmctld.pid" || { echo "slurmctld not running"; return 0; }  # (sinfo would retry ~10 s)
  timeout "$SLURM_CMD_TIMEOUT" sinfo -N -o '%N %t %G' 2>/dev/null || { echo "slurmctld not answering"; return 0; }
  timeout "$SLURM_CMD_TIMEOUT" squeue \
    -O 'JobID:7,UserName:10,Name:14,State:10,NumNodes:6,tres-per-job:14,tres-per-node:14,ReasonList:20,Comment:40' \
    2>/dev/null || true
}

cancel_jobs() {  # scancel every job of this cluster, wait (30 s at most) until squeue shows none
  pid_alive "$RUN/slurmctld.pid" || return 0
  local ids
  ids="$(squeue -h -o '%A' 2>/dev/null | sort -u | tr '\n' ' ')" || return 0
  [[ -n "${ids// /}" ]] || return 0
  log "cancelling jobs: $ids"
  # shellcheck disable=SC2086
  scancel $ids 2>/dev/null || true
  for _ in $(seq 150); do
    ids="$(squeue -h -o '%A' 2>/dev/null)" || return 0
    [[ -z "$ids" ]] && return 0
    sleep 0.2
  done
  log "jobs still listed after 30 s: $(echo $ids); their processes are killed below"
}

stepd_pids() {  # slurmstepd processes working for this cluster: their cwd or an open file is under DIR
  local p link
  for p in $(pgrep -x slurmstepd 2>/dev/null || true); do
    alive "$p" || continue
    for link in "/proc/$p/cwd" "/proc/$p"/fd/*; do
      case "$(readlink "$link" 2>/dev/null)" in
        "$DIR"/*|"$DIR") echo "$p"; break ;;
      esac
    done
  done
}

kill_stray_steps() {  # SIGKILL leftover slurmstepd of DIR and everything in their sessions (the job's processes)
  local p sid pids=() q
  for p in $(stepd_pids); do
    sid="$(ps -o sid= -p "$p" 2>/dev/null | tr -d '[:space:]')" || sid=""
    pids+=("$p")
    if [[ "$sid" =~ ^[0-9]+$ && "$sid" -gt 1 ]]; then
      for q in $(ps -e -o pid=,sid= | awk -v s="$sid" '$2 == s {print $1}'); do pids+=("$q"); done
    fi
  done
  [[ ${#pids[@]} -gt 0 ]] || return 0
  mapfile -t pids < <(printf '%s\n' "${pids[@]}" | sort -un)
  log "killing leftover job steps of $DIR: ${pids[*]}"
  kill -9 "${pids[@]}" 2>/dev/null || true
  for _ in $(seq 50); do
    local left=0
    for p in "${pids[@]}"; do alive "$p" && left=1; done
    [[ "$left" -eq 0 ]] && return 0
    sleep 0.1
  done
  log "still running after SIGKILL: ${pids[*]}"
}

down() {
  [[ -d "$RUN" ]] || { log "nothing running at $DIR"; return 0; }
  [[ $EUID -eq 0 ]] || die "down needs root (it stops the cluster's root-owned daemons)"
  shopt -s nullglob
  # nothing may place or requeue jobs while they are cancelled
  stop_pidfiles "$RUN/controller.pid" "$RUN"/agent-*.pid
  cancel_jobs
  stop_pidfiles "$RUN"/slurmd-*.pid
  kill_stray_steps
  stop_pidfiles "$RUN/slurmctld.pid"
  stop_pidfiles "$RUN/munged.pid"
  log "stopped cluster at $DIR"
}

on_up_exit() {  # EXIT trap of `up`: on failure say so, and stop what this `up` started
  local rc=$1
  trap - EXIT
  [[ "$rc" -eq 0 ]] && return 0
  log "up failed (exit status $rc); logs are in $DIR/log/"
  if [[ "$UP_FRESH" -eq 1 ]]; then
    log "stopping what it started"
    set +e
    down
  else
    log "the cluster that was already running is left as it is: '$0 down --dir $DIR' stops it"
  fi
  exit "$rc"
}

case "$cmd" in
  up)
    plan_ports
    [[ $EUID -eq 0 ]] || die "up needs root (it starts slurmctld, slurmd and munged)"
    check_ports  # before anything is installed, written or started
    ensure_packages
    if pid_alive "$RUN/slurmctld.pid" 2>/dev/null && [[ -f "$CONF" ]]; then
      UP_FRESH=0
    else
      UP_FRESH=1
    fi
    if [[ "$UP_FRESH" -eq 0 ]]; then
      log "cluster already running at $DIR: starting only what is missing"
    else
      write_config
    fi
    trap 'on_up_exit $?' EXIT
    keep_controller_settings
    write_controller_config
    check_controller_config
    install_controller_config
    start_munge
    start_slurm
    start_agents
    start_controller
    trap - EXIT
    log "up: source $DIR/env.sh, then sbatch --gpus=N --comment rlsched:model=MoE,samples=... your_job.sh"
    ;;
  down) down ;;
  status) status ;;
  *) die "usage: $0 up|down|status [--nodes N] [--gpus G] [--dir DIR] (see --help)" ;;
esac
