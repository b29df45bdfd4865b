#!/usr/bin/env bash
# scripts/cluster.sh -- bring a REAL single-host Slurm test cluster up and down.
#
# Runs every daemon of a small Slurm 22.05 (Debian 12) installation on this
# one machine, without systemd:
#
#   munged -> mariadbd -> slurmdbd -> slurmctld -> N x slurmd (node1..nodeN)
#                                                  + 1 slurmd per GPU partition
#
# The slurmd processes are "fake" compute nodes: each is started with
# `slurmd -N nodeX`, listens on its own port and declares its own CPUs and
# memory, so multi-node jobs, preemption, OOM, TIMEOUT and NODE_FAIL can be
# exercised for real by the test-suite. The CPU nodes node1..nodeN form the
# partitions low/high/lowcancel. Each GPU partition (HPC_SLURM_GPU_PARTITIONS)
# gets one more node (numbering goes on: nodeN+1, ...) that advertises typed
# GPU gres backed by placeholder device files: scheduling, --test-only, gres
# parsing and CUDA_VISIBLE_DEVICES are real, the training runs on the CPU.
#
# Usage: scripts/cluster.sh up|down [--purge]|status|env|kill-node N|start-node N
# Run `scripts/cluster.sh --help` for details and environment knobs.

set -euo pipefail
# Close every inherited descriptor above stderr before anything starts a daemon: `flock LOCK cluster.sh up`
# would otherwise hand the lock's descriptor to munged, mariadbd and slurmdbd, which keep it (and the lock)
# for as long as they run.
for _fd in /proc/$$/fd/*; do
    _fd=${_fd##*/}
    if ((_fd > 2)); then eval "exec ${_fd}>&-" 2>/dev/null || true; fi
done
unset _fd

# --------------------------------------------------------------------------
# Knobs (environment)
# --------------------------------------------------------------------------
NODES=${HPC_SLURM_NODES:-2}                   # number of fake nodes
CPUS_PER_NODE=${HPC_SLURM_CPUS_PER_NODE:-2}   # CPUs each node declares
MEM_PER_NODE=${HPC_SLURM_MEM_PER_NODE:-6000}  # MB each node declares
GRACE_TIME=${HPC_SLURM_GRACE_TIME:-30}        # preemption grace (s), partition low
SLURMD_TIMEOUT=${HPC_SLURM_SLURMD_TIMEOUT:-20} # s until a silent node is DOWN
KILL_WAIT=${HPC_SLURM_KILL_WAIT:-30}          # s between SIGTERM and SIGKILL
CLUSTER=${HPC_SLURM_CLUSTER:-localhpc}        # ClusterName (lower case!)
NODE_PORT_BASE=${HPC_SLURM_NODE_PORT_BASE:-6830} # nodeX listens on BASE+X
WAIT_TIMEOUT=${HPC_SLURM_WAIT_TIMEOUT:-60}    # s to wait for each daemon
# GPU partitions, NAME:TYPE:COUNT,...: one node each after the CPU nodes, with
# Gres=gpu:TYPE:COUNT. Empty string: no GPU partitions (note '-', not ':-').
GPU_PARTITIONS=${HPC_SLURM_GPU_PARTITIONS-gpu_small:a10:2,gpu_big:h100:2}

# --------------------------------------------------------------------------
# Fixed locations. /etc/slurm is the path compiled into Debian's Slurm, so
# sbatch/sacct/... find the config without SLURM_CONF.
# --------------------------------------------------------------------------
ETC_DIR=/etc/slurm
SLURM_CONF_FILE=$ETC_DIR/slurm.conf
CGROUP_CONF_FILE=$ETC_DIR/cgroup.conf
GRES_CONF_FILE=$ETC_DIR/gres.conf
DBD_CONF_FILE=$ETC_DIR/slurmdbd.conf
LOG_DIR=/var/log/slurm
STATE_DIR=/var/lib/slurm/slurmctld           # StateSaveLocation (job state)
SPOOL_ROOT=/var/lib/slurm/slurmd             # SlurmdSpoolDir=$SPOOL_ROOT/%n
RUN_DIR=/run/slurm                           # pid files
FAKE_GPU_ROOT=/var/lib/slurm/fake_gpus       # placeholder GPU device files, <node>/nvidiaK
MYSQL_RUN=/run/mysqld
MYSQL_SOCK=$MYSQL_RUN/mysqld.sock
MYSQL_LOG=$LOG_DIR/mariadb.log
MUNGE_KEY=/etc/munge/munge.key
MUNGE_LOG=/var/log/munge/munged.log
DB_NAME=slurm_acct_db
DB_USER=slurm
DB_PASS=slurmdbpass                          # local test DB, socket-only
CTLD_PORT=6817
DBD_PORT=6819

# openssh: the --remote tests run their own sshd on a free localhost port (tests/helpers/sshd.py).
PACKAGES=(slurm-wlm slurmdbd mariadb-server munge openssh-server openssh-client)
REQUIRED_BINS=(slurmctld slurmd slurmdbd sacctmgr sbatch sinfo sacct scontrol
               mariadbd mariadb mariadb-admin munged munge unmunge sshd ssh ssh-keygen)

# --------------------------------------------------------------------------
# Output helpers
# --------------------------------------------------------------------------
say()  { printf '[cluster] %s\n' "$*"; }
warn() { printf '[cluster] WARNING: %s\n' "$*" >&2; }
die()  { printf '[cluster] ERROR: %s\n' "$*" >&2; exit 1; }

# die_log MSG LOGFILE: fail and show the end of the daemon's log.
die_log() {
    local msg=$1 log=$2
    printf '[cluster] ERROR: %s\n' "$msg" >&2
    if [[ -f $log ]]; then
        printf '[cluster] ---- last lines of %s ----\n' "$log" >&2
        tail -n 25 "$log" >&2 || true
        printf '[cluster] ----\n' >&2
    else
        printf '[cluster] (no log file %s)\n' "$log" >&2
    fi
    exit 1
}

usage() {
    cat <<EOF
Usage: $(basename "$0") COMMAND

Brings a real single-host Slurm 22.05 test cluster up and down (needs root).

Commands:
  up                 install packages if missing, start munged, mariadb,
                     slurmdbd, slurmctld and $TOTAL_NODES slurmd "nodes" ($NODES CPU,
                     ${#GPU_PART_NAMES[@]} GPU); wait until all nodes answer and
                     accounting (sacct) works. Idempotent; restarts
                     slurmctld/slurmd if slurm.conf, cgroup.conf or gres.conf
                     changed.
  down [--purge]     stop all daemons (SIGTERM, then SIGKILL after a timeout)
                     and kill job processes left on the fake nodes.
                     --purge also deletes slurmctld job state, slurmd spool
                     dirs and the accounting database, so the next 'up'
                     starts from job id 1 with empty sacct.
  status             show daemons, sinfo and accounting; exit 1 if unhealthy.
  env                print shell exports useful for tests.
  kill-node NODE [--slurmd-only]
                     simulate a node crash: kill -9 the slurmd of NODE and (by
                     default) the slurmstepd and job processes running on it.
                     With --slurmd-only only the daemon dies (jobs keep
                     running). slurmctld marks the node DOWN and its jobs
                     NODE_FAIL (or requeues them) after SlurmdTimeout.
  start-node NODE    (re)start the slurmd of NODE, wait until it answers and
                     RESUME it if it is still DOWN/DRAINED.
  sched fast|default|show
                     switch slurm.conf's SchedulerParameters between the
                     fast test setting (sched_interval=3,bf_interval=3) and
                     Slurm's defaults (the line commented out), then
                     'scontrol reconfigure' (no daemon restart; 'up' still
                     sees an unchanged conf after 'sched fast'). Benchmarks
                     that must run on Slurm's defaults use it, holding
                     /tmp/hpc_slurm.lock.
  -h, --help         this text.

Environment knobs (current value; when HPC_SLURM_NODES or
HPC_SLURM_GPU_PARTITIONS is unset, commands other than 'up' take it from the
running $SLURM_CONF_FILE):
  HPC_SLURM_NODES=$NODES            number of CPU nodes (node1..nodeN)
  HPC_SLURM_GPU_PARTITIONS=$GPU_PARTITIONS
                     GPU partitions as NAME:TYPE:COUNT[,...]; each gets one
                     node (nodeN+1, nodeN+2, ...) with Gres=gpu:TYPE:COUNT,
                     backed by placeholder device files (AutoDetect=off), so
                     scheduling and gres are real while jobs run on the CPU.
                     Default gpu_small:a10:2,gpu_big:h100:2; '' disables.
  HPC_SLURM_CPUS_PER_NODE=$CPUS_PER_NODE     CPUs declared per node
  HPC_SLURM_MEM_PER_NODE=$MEM_PER_NODE     RealMemory (MB) declared per node
  HPC_SLURM_GRACE_TIME=$GRACE_TIME       preemption GraceTime of partition 'low'
  HPC_SLURM_SLURMD_TIMEOUT=$SLURMD_TIMEOUT   seconds until a dead node is DOWN
  HPC_SLURM_KILL_WAIT=$KILL_WAIT        KillWait: SIGTERM -> SIGKILL delay (s)
  HPC_SLURM_CLUSTER=$CLUSTER   ClusterName
  HPC_SLURM_NODE_PORT_BASE=$NODE_PORT_BASE  nodeX's slurmd listens on BASE+X
  HPC_SLURM_WAIT_TIMEOUT=$WAIT_TIMEOUT      seconds to wait for each daemon

Partitions: low (default, PriorityTier=1, PreemptMode=REQUEUE, GraceTime)
            high (PriorityTier=10, PreemptMode=OFF)
            lowcancel (PriorityTier=1, PreemptMode=CANCEL, GraceTime: a
            preempted job is cancelled, never requeued; it must be
            resubmitted from outside); all three span the CPU nodes
            node1..node$NODES only.
            One per HPC_SLURM_GPU_PARTITIONS entry (PriorityTier=1,
            PreemptMode=REQUEUE, GraceTime, not default), on its GPU node.
Configs: $ETC_DIR   Logs: $LOG_DIR (munge: $MUNGE_LOG)
State: $STATE_DIR   Spool: $SPOOL_ROOT/<node>   Pids: $RUN_DIR
Fake GPU device files: $FAKE_GPU_ROOT/<node>/nvidia<K>
EOF
}

# --------------------------------------------------------------------------
# Process helpers. We find daemons by scanning /proc (comm + argv) instead of
# trusting pid files: this machine is reused across sessions and in CI the
# previous session's processes are killed while their pid files survive.
# --------------------------------------------------------------------------

# find_pids COMM [WORDS...]: print pids of live (non-zombie) processes whose
# comm is COMM and whose argv contains WORDS as consecutive words.
find_pids() {
    local comm=$1; shift
    local want=" $* " d c args st
    for d in /proc/[0-9]*; do
        c=$(cat "$d/comm" 2>/dev/null) || continue
        [[ $c == "$comm" ]] || continue
        st=$(cut -d' ' -f3 "$d/stat" 2>/dev/null) || continue
        [[ $st == Z ]] && continue
        if (($#)); then
            args=" $(tr '\0' ' ' <"$d/cmdline" 2>/dev/null) "
            [[ $args == *"$want"* ]] || continue
        fi
        echo "${d#/proc/}"
    done
}

is_running() { [[ -n $(find_pids "$@") ]]; }

# stop_pids NAME TIMEOUT PIDS...: SIGTERM, wait up to TIMEOUT s, then SIGKILL.
stop_pids() {
    local name=$1 timeout=$2; shift 2
    local pids=("$@") p alive i
    ((${#pids[@]})) || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for ((i = 0; i < timeout * 5; i++)); do
        alive=()
        for p in "${pids[@]}"; do
            [[ -d /proc/$p && $(cut -d' ' -f3 /proc/"$p"/stat 2>/dev/null) != Z ]] && alive+=("$p")
        done
        ((${#alive[@]})) || { say "stopped $name"; return 0; }
        sleep 0.2
    done
    warn "$name did not stop within ${timeout}s, sending SIGKILL"
    kill -KILL "${alive[@]}" 2>/dev/null || true
    sleep 0.5
}

# stop_daemon NAME TIMEOUT COMM [WORDS...]
stop_daemon() {
    local name=$1 timeout=$2; shift 2
    local pids
    mapfile -t pids < <(find_pids "$@")
    if ((${#pids[@]} == 0)); then
        say "$name not running"
        return 0
    fi
    stop_pids "$name" "$timeout" "${pids[@]}"
}

# wait_for DESCRIPTION TIMEOUT LOG CMD...: poll CMD (quietly) until it succeeds.
wait_for() {
    local what=$1 timeout=$2 log=$3; shift 3
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die_log "timed out after ${timeout}s waiting for $what" "$log"
        sleep 0.5
    done
}

# GPU partitions from GPU_PARTITIONS ("NAME:TYPE:COUNT,..."), index k is on
# node$((NODES + 1 + k)). Parsed without judging; check_knobs validates.
GPU_PART_NAMES=() GPU_PART_TYPES=() GPU_PART_COUNTS=()
parse_gpu_partitions() {
    local entry name type count
    GPU_PART_NAMES=() GPU_PART_TYPES=() GPU_PART_COUNTS=()
    local IFS=,
    for entry in $GPU_PARTITIONS; do
        [[ -n $entry ]] || continue
        IFS=: read -r name type count <<<"$entry"
        GPU_PART_NAMES+=("$name") GPU_PART_TYPES+=("$type") GPU_PART_COUNTS+=("$count")
    done
    TOTAL_NODES=$((NODES + ${#GPU_PART_NAMES[@]}))
}
TOTAL_NODES=$NODES

# CPU nodes (partitions low/high/lowcancel), GPU nodes, and all of them.
cpu_node_names() { local i; for ((i = 1; i <= NODES; i++)); do echo "node$i"; done; }
gpu_node_names() { local i; for ((i = NODES + 1; i <= TOTAL_NODES; i++)); do echo "node$i"; done; }
node_names() { local i; for ((i = 1; i <= TOTAL_NODES; i++)); do echo "node$i"; done; }

# The Slurm hostlist of the CPU nodes: node1 or node[1-N].
cpu_nodelist() { if ((NODES == 1)); then echo node1; else echo "node[1-$NODES]"; fi; }

valid_node() {
    [[ $1 =~ ^node([0-9]+)$ ]] && ((BASH_REMATCH[1] >= 1 && BASH_REMATCH[1] <= TOTAL_NODES))
}

# --------------------------------------------------------------------------
# Preconditions
# --------------------------------------------------------------------------
CMD=
require_root() {
    ((EUID == 0)) || die "must run as root (daemons, /etc/slurm, cgroups); try: sudo $0 ${CMD:-up}"
}

check_knobs() {
    [[ $NODES =~ ^[1-9][0-9]*$ ]] || die "HPC_SLURM_NODES must be a positive integer (got '$NODES')"
    [[ $CPUS_PER_NODE =~ ^[1-9][0-9]*$ ]] || die "HPC_SLURM_CPUS_PER_NODE must be a positive integer"
    [[ $MEM_PER_NODE =~ ^[1-9][0-9]*$ ]] || die "HPC_SLURM_MEM_PER_NODE must be a positive integer (MB)"
    [[ $GRACE_TIME =~ ^[0-9]+$ ]] || die "HPC_SLURM_GRACE_TIME must be an integer"
    [[ $SLURMD_TIMEOUT =~ ^[1-9][0-9]*$ ]] || die "HPC_SLURM_SLURMD_TIMEOUT must be a positive integer"
    [[ $KILL_WAIT =~ ^[0-9]+$ ]] || die "HPC_SLURM_KILL_WAIT must be an integer"
    [[ $CLUSTER =~ ^[a-z][a-z0-9_]*$ ]] || die "HPC_SLURM_CLUSTER must be lower case (got '$CLUSTER')"
    local k name seen=" low high lowcancel "
    for ((k = 0; k < ${#GPU_PART_NAMES[@]}; k++)); do
        name=${GPU_PART_NAMES[k]}
        [[ $name =~ ^[a-z][a-z0-9_]*$ && ${GPU_PART_TYPES[k]} =~ ^[a-z0-9][a-z0-9_]*$ &&
            ${GPU_PART_COUNTS[k]} =~ ^[1-9][0-9]?$ ]] ||
            die "HPC_SLURM_GPU_PARTITIONS: '$name:${GPU_PART_TYPES[k]}:${GPU_PART_COUNTS[k]}' is not NAME:TYPE:COUNT (lower-case name and type, 1 <= COUNT <= 99; got '$GPU_PARTITIONS')"
        [[ $seen != *" $name "* ]] || die "HPC_SLURM_GPU_PARTITIONS: partition '$name' is used twice or clashes with low/high/lowcancel"
        seen+="$name "
    done
}

install_packages() {
    local b missing=()
    for b in "${REQUIRED_BINS[@]}"; do
        command -v "$b" >/dev/null 2>&1 || missing+=("$b")
    done
    ((${#missing[@]})) || return 0
    say "installing ${PACKAGES[*]} (missing: ${missing[*]}) ..."
    local out=/tmp/hpc-cluster-apt.log
    # No systemd here; Debian's maintainer scripts may try to start the
    # services through invoke-rc.d. That either is denied by policy-rc.d or
    # starts them with default config, which `up` then detects as running.
    if ! { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q \
            -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold \
            "${PACKAGES[@]}"; } >"$out" 2>&1; then
        tail -n 20 "$out" >&2
        die "package installation failed (full output: $out)"
    fi
    for b in "${REQUIRED_BINS[@]}"; do
        command -v "$b" >/dev/null 2>&1 || die "'$b' still missing after installing ${PACKAGES[*]}"
    done
    say "packages installed"
}

# cgroup v1 is what this machine offers. If the memory/freezer controllers
# are not mounted we fall back to non-cgroup plugins (no memory enforcement,
# so no OUT_OF_MEMORY state) instead of failing.
have_cgroup_v1() {
    [[ -f /sys/fs/cgroup/memory/memory.limit_in_bytes && -d /sys/fs/cgroup/freezer &&
        $(stat -fc %T /sys/fs/cgroup 2>/dev/null) != cgroup2fs ]]
}

# Node names must resolve (torch.distributed uses them as MASTER_ADDR).
# Append only: /etc/hosts is often a bind mount that cannot be replaced
# (sed -i would rename over it).
ensure_hosts() {
    local n
    for n in $(node_names); do
        if ! grep -qE "^[^#]*[[:space:]]$n([[:space:]]|\$)" /etc/hosts; then
            printf '127.0.0.1\t%s\t# hpc_agent scripts/cluster.sh\n' "$n" >>/etc/hosts
        fi
    done
}

# write_if_changed FILE MODE CONTENT: returns 0 if the file was (re)written.
write_if_changed() {
    local file=$1 mode=$2 content=$3
    if [[ -f $file ]] && [[ "$(cat "$file")" == "$content" ]]; then
        chmod "$mode" "$file"
        return 1
    fi
    printf '%s\n' "$content" >"$file.tmp.$$"
    chmod "$mode" "$file.tmp.$$"
    mv -f "$file.tmp.$$" "$file"
    return 0
}

# --------------------------------------------------------------------------
# munge
# --------------------------------------------------------------------------
start_munge() {
    install -d -o munge -g munge -m 0700 /etc/munge /var/log/munge
    install -d -o munge -g munge -m 0711 /var/lib/munge
    install -d -o munge -g munge -m 0755 /run/munge
    if [[ ! -s $MUNGE_KEY ]]; then
        say "creating munge key"
        dd if=/dev/urandom of="$MUNGE_KEY" bs=1 count=1024 status=none
    fi
    # munged refuses keys that are readable by others or owned by another user.
    chown munge:munge "$MUNGE_KEY"
    chmod 0400 "$MUNGE_KEY"
    if is_running munged; then
        say "munged already running"
    else
        # --force: a killed munged leaves its socket + lock file behind, and
        # without --force munged refuses to start next to them.
        rm -f /run/munge/munged.pid
        runuser -u munge -- /usr/sbin/munged --force >/dev/null 2>&1 9>&- ||
            die_log "munged failed to start" "$MUNGE_LOG"
        say "started munged"
    fi
    wait_for "munge to answer" "$WAIT_TIMEOUT" "$MUNGE_LOG" \
        bash -c 'munge -n | unmunge'
}

# --------------------------------------------------------------------------
# MariaDB
# --------------------------------------------------------------------------
mysql_root() { mariadb --socket="$MYSQL_SOCK" -uroot "$@"; }

start_mariadb() {
    install -d -o mysql -g mysql -m 0755 "$MYSQL_RUN"
    install -d -m 0755 "$LOG_DIR"
    touch "$MYSQL_LOG"
    chown mysql:mysql "$MYSQL_LOG"
    if is_running mariadbd || is_running mysqld; then
        say "mariadb already running"
    else
        if [[ ! -d /var/lib/mysql/mysql ]]; then
            say "initialising mariadb data dir"
            mariadb-install-db --user=mysql --datadir=/var/lib/mysql >>"$MYSQL_LOG" 2>&1 ||
                die_log "mariadb-install-db failed" "$MYSQL_LOG"
        fi
        # A killed mariadbd leaves its pid file; the socket lock file it
        # handles itself. We start mariadbd directly (no mysqld_safe, no
        # init script) and detach it with setsid so it survives this shell.
        # skip-networking: slurmdbd talks over the unix socket, so no TCP
        # port 3306 that could clash with anything else on the machine.
        rm -f "$MYSQL_RUN/mysqld.pid"
        setsid /usr/sbin/mariadbd --user=mysql --datadir=/var/lib/mysql \
            --socket="$MYSQL_SOCK" --pid-file="$MYSQL_RUN/mysqld.pid" \
            --skip-networking --log-error="$MYSQL_LOG" \
            --innodb-lock-wait-timeout=900 --innodb-buffer-pool-size=128M \
            </dev/null >>"$MYSQL_LOG" 2>&1 9>&- &
        say "started mariadb"
    fi
    wait_for "mariadb to accept connections" "$WAIT_TIMEOUT" "$MYSQL_LOG" \
        mariadb-admin --socket="$MYSQL_SOCK" -uroot ping
    # Idempotent DB/user creation. root logs in through unix_socket auth
    # (Debian default), slurmdbd through a password over the socket.
    mysql_root <<SQL || die_log "creating accounting database failed" "$MYSQL_LOG"
CREATE DATABASE IF NOT EXISTS $DB_NAME;
CREATE USER IF NOT EXISTS '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
ALTER USER '$DB_USER'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL PRIVILEGES ON $DB_NAME.* TO '$DB_USER'@'localhost';
FLUSH PRIVILEGES;
SQL
}

# --------------------------------------------------------------------------
# Config files
# --------------------------------------------------------------------------
dbd_conf() {
    cat <<EOF
# Generated by scripts/cluster.sh -- edits will be overwritten.
AuthType=auth/munge
# slurmdbd insists that DbdHost is its own hostname or "localhost".
DbdHost=localhost
DbdPort=$DBD_PORT
# Everything runs as root on this test box: no chown dance for state/logs.
SlurmUser=root
DebugLevel=info
LogFile=$LOG_DIR/slurmdbd.log
PidFile=$RUN_DIR/slurmdbd.pid
StorageType=accounting_storage/mysql
# "localhost" makes the MariaDB client library use the unix socket.
StorageHost=localhost
StorageUser=$DB_USER
StoragePass=$DB_PASS
StorageLoc=$DB_NAME
EOF
}

slurm_conf() {
    local host i k cg_lines
    host=$(hostname -s)
    if have_cgroup_v1; then
        cg_lines="# cgroup v1: proctrack/cgroup (freezer) reliably finds and kills every
# process of a job; task/cgroup with ConstrainRAMSpace (cgroup.conf) enforces
# --mem, and the memory controller's OOM events give state OUT_OF_MEMORY.
# No task/affinity: the fake nodes share the host's real cores and may
# declare more CPUs than exist, so CPU binding would fail or be misleading.
ProctrackType=proctrack/cgroup
TaskPlugin=task/cgroup
JobAcctGatherType=jobacct_gather/cgroup"
    else
        cg_lines="# cgroup v1 memory/freezer controllers not found: no cgroup plugins,
# hence no memory enforcement / OUT_OF_MEMORY on this machine.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux"
    fi
    cat <<EOF
# Generated by scripts/cluster.sh -- edits will be overwritten.
ClusterName=$CLUSTER
# slurmctld only starts where gethostname() matches SlurmctldHost; the
# address in parentheses avoids depending on name resolution.
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
SwitchType=switch/none
# No mail on this box; the default /usr/bin/mail does not exist.
MailProg=/bin/true
SlurmctldPort=$CTLD_PORT

StateSaveLocation=$STATE_DIR
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmctldDebug=info
# Several slurmd on one host: Debian builds Slurm with multiple-slurmd
# support, and %n (the name given with 'slurmd -N') keeps the spool dir,
# pid file and log of each fake node apart. Each node also needs its own
# Port (see the NodeName lines).
SlurmdSpoolDir=$SPOOL_ROOT/%n
SlurmdPidFile=$RUN_DIR/slurmd-%n.pid
SlurmdLogFile=$LOG_DIR/slurmd-%n.log
SlurmdDebug=info
# Trust the CPUs/RealMemory written below instead of what slurmd detects:
# the fake nodes split (and over-commit) this host's real resources.
SlurmdParameters=config_overrides

$cg_lines

# Cores and memory are consumable, so jobs share nodes and --mem counts.
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without a default a job lacking --mem would claim the whole node's memory.
DefMemPerCPU=$((MEM_PER_NODE / CPUS_PER_NODE))

# Scheduling: snappy for tests (main loop and backfill every few seconds).
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=3,bf_interval=3
PriorityType=priority/basic

# Preemption by partition PriorityTier: a pending job in 'high' requeues
# jobs of 'low'. On preemption the tasks get SIGCONT+SIGTERM at once and
# the job is killed (SIGTERM, KillWait, SIGKILL) after the partition's
# GraceTime. A requeued job gets BeginTime = now + ~120 s.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
JobRequeue=1
# The immediate SIGTERM goes to step tasks (srun) only, never to the batch
# shell. With this flag a job submitted with --signal=[B:]SIG@SECS gets SIG
# at preemption time instead (B: = to the batch shell only), so a batch
# script without srun steps can be notified too.
SlurmctldParameters=preempt_send_user_signal

# Fail fast, recover automatically:
# - a slurmd silent for SlurmdTimeout seconds -> node DOWN, its jobs
#   NODE_FAIL (or requeued if requeue-able);
# - ReturnToService=2: a DOWN node that registers again is usable again.
SlurmdTimeout=$SLURMD_TIMEOUT
SlurmctldTimeout=30
ReturnToService=2
InactiveLimit=0
KillWait=$KILL_WAIT
MinJobAge=300
WaitTime=0

# Accounting through slurmdbd (sacct, every requeue attempt with sacct -D).
# AccountingStorageEnforce is left unset so root can submit without any
# association set up.
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$DBD_PORT
JobCompType=jobcomp/none
JobAcctGatherFrequency=30
EOF
    if ((${#GPU_PART_NAMES[@]})); then
        # Typed GPU gres. AccountingStorageTRES: 22.05 tracks only cpu, mem,
        # energy, node, billing, fs/disk, vmem and pages by default, so
        # without gres/gpu (and gres/gpu:TYPE for the per-type count) sacct's
        # AllocTRES/ReqTRES would not show GPUs at all.
        local tres=gres/gpu
        for ((k = 0; k < ${#GPU_PART_NAMES[@]}; k++)); do
            [[ ,$tres, == *",gres/gpu:${GPU_PART_TYPES[k]},"* ]] || tres+=",gres/gpu:${GPU_PART_TYPES[k]}"
        done
        cat <<EOF

# GPU partitions: typed gres backed by placeholder device files (gres.conf,
# AutoDetect=off). The jobs still run on the CPU.
GresTypes=gpu
AccountingStorageTRES=$tres
EOF
    fi
    # The "gpu partitions" line is read back by the commands other than 'up'
    # (see main): the GPU partitions this file was written for.
    cat <<EOF

# cluster.sh gpu partitions: $GPU_PARTITIONS
# Fake nodes: all on 127.0.0.1, each slurmd on its own port. CPU nodes first,
# then one node per GPU partition (same CPUs and memory: training runs on the CPU).
EOF
    for ((i = 1; i <= NODES; i++)); do
        echo "NodeName=node$i NodeAddr=127.0.0.1 NodeHostname=$host Port=$((NODE_PORT_BASE + i)) CPUs=$CPUS_PER_NODE RealMemory=$MEM_PER_NODE State=UNKNOWN"
    done
    for ((k = 0; k < ${#GPU_PART_NAMES[@]}; k++)); do
        i=$((NODES + 1 + k))
        echo "NodeName=node$i NodeAddr=127.0.0.1 NodeHostname=$host Port=$((NODE_PORT_BASE + i)) CPUs=$CPUS_PER_NODE RealMemory=$MEM_PER_NODE Gres=gpu:${GPU_PART_TYPES[k]}:${GPU_PART_COUNTS[k]} State=UNKNOWN"
    done
    # low/high/lowcancel hold the CPU nodes only (not Nodes=ALL): tests take
    # "every node of high" with --nodes $NODES and must not land on a GPU node.
    cat <<EOF

PartitionName=low Nodes=$(cpu_nodelist) Default=YES PriorityTier=1 PreemptMode=REQUEUE GraceTime=$GRACE_TIME MaxTime=INFINITE State=UP
PartitionName=high Nodes=$(cpu_nodelist) Default=NO PriorityTier=10 PreemptMode=OFF MaxTime=INFINITE State=UP
PartitionName=lowcancel Nodes=$(cpu_nodelist) Default=NO PriorityTier=1 PreemptMode=CANCEL GraceTime=$GRACE_TIME MaxTime=INFINITE State=UP
EOF
    for ((k = 0; k < ${#GPU_PART_NAMES[@]}; k++)); do
        echo "PartitionName=${GPU_PART_NAMES[k]} Nodes=node$((NODES + 1 + k)) Default=NO PriorityTier=1 PreemptMode=REQUEUE GraceTime=$GRACE_TIME MaxTime=INFINITE State=UP"
    done
}

# gres.conf: each GPU node's GPUs are placeholder files under
# $FAKE_GPU_ROOT/<node>/ (a directory per node: several slurmd share this
# host). AutoDetect=off: no NVML probing, the File= lines are the truth.
# slurmd -N nodeX reads only the lines with NodeName=nodeX.
gres_conf() {
    local k i last
    echo "# Generated by scripts/cluster.sh -- edits will be overwritten."
    echo "AutoDetect=off"
    for ((k = 0; k < ${#GPU_PART_NAMES[@]}; k++)); do
        i=$((NODES + 1 + k)) last=$((GPU_PART_COUNTS[k] - 1))
        if ((last == 0)); then
            echo "NodeName=node$i Name=gpu Type=${GPU_PART_TYPES[k]} File=$FAKE_GPU_ROOT/node$i/nvidia0"
        else
            echo "NodeName=node$i Name=gpu Type=${GPU_PART_TYPES[k]} File=$FAKE_GPU_ROOT/node$i/nvidia[0-$last]"
        fi
    done
}

# gpu_count_of NODE: GPUs of a GPU node (nothing for a CPU node).
gpu_count_of() {
    local k=$((${1#node} - NODES - 1))
    if ((k >= 0 && k < ${#GPU_PART_NAMES[@]})); then echo "${GPU_PART_COUNTS[k]}"; fi
}

# make_fake_gpus NODE: the placeholder device files of a GPU node.
# slurmd (22.05) stat()s every File= at start: a missing file is fatal, a
# regular file works but logs "... is not a valid character or block device,
# fix your gres.conf" for each. So they are character devices with NVIDIA's
# major 195 (minor K for nvidiaK, as on a real node). No nvidia driver is
# loaded here, so opening one fails (ENXIO) and nothing real is reachable;
# /dev/null's 1:3 would also pass, but with ConstrainDevices=yes Slurm would
# then deny /dev/null itself to every job not holding that GPU. Where mknod is
# not permitted (e.g. a nodev mount) we fall back to regular files.
make_fake_gpus() {
    local n=$1 count j dir f
    count=$(gpu_count_of "$n")
    [[ -n $count ]] || return 0
    dir=$FAKE_GPU_ROOT/$n
    install -d -m 0755 "$dir"
    for ((j = 0; j < count; j++)); do
        f=$dir/nvidia$j
        [[ -c $f ]] && continue
        rm -f "$f"
        if ! mknod -m 0666 "$f" c 195 "$j" 2>/dev/null; then
            : >"$f"
            warn "mknod $f failed: a regular file stands in (slurmd logs an error for it, gres still works)"
        fi
    done
}

cgroup_conf() {
    cat <<EOF
# Generated by scripts/cluster.sh -- edits will be overwritten.
# Force v1: this host mounts v1 controllers plus an empty v2 'unified' tree,
# which autodetection must not be allowed to pick.
CgroupPlugin=cgroup/v1
CgroupMountpoint=/sys/fs/cgroup
# Enforce --mem: exceeding it triggers the cgroup OOM killer and the job
# ends as OUT_OF_MEMORY. No swap on this host, so no swap constraint.
ConstrainRAMSpace=yes
AllowedRAMSpace=100
ConstrainSwapSpace=no
# Fake nodes share the real cores: no cpuset confinement.
ConstrainCores=no
ConstrainDevices=no
EOF
}

# --------------------------------------------------------------------------
# slurmdbd / slurmctld / slurmd
# --------------------------------------------------------------------------
start_slurmdbd() {
    local log=$LOG_DIR/slurmdbd.log
    if write_if_changed "$DBD_CONF_FILE" 600 "$(dbd_conf)" && is_running slurmdbd; then
        say "slurmdbd.conf changed, restarting slurmdbd"
        stop_daemon slurmdbd 15 slurmdbd
    fi
    if is_running slurmdbd; then
        say "slurmdbd already running"
    else
        # Stale pid files are dangerous: Slurm daemons SIGTERM whatever pid
        # their old pid file names, which may be an unrelated process now.
        rm -f "$RUN_DIR/slurmdbd.pid"
        slurmdbd >>"$log" 2>&1 9>&- || die_log "slurmdbd failed to start" "$log"
        say "started slurmdbd"
    fi
    # The first start creates all tables, which takes a few seconds.
    wait_for "slurmdbd to answer" "$WAIT_TIMEOUT" "$log" sacctmgr -n list cluster
    if [[ -z $(sacctmgr -n -P list cluster format=cluster where cluster="$CLUSTER" 2>/dev/null) ]]; then
        sacctmgr -i add cluster "$CLUSTER" >/dev/null ||
            die_log "sacctmgr add cluster $CLUSTER failed" "$log"
        say "registered cluster $CLUSTER in accounting"
    fi
}

CTLD_STARTED_AT=  # epoch seconds, set when this invocation started slurmctld
start_slurmctld() {
    local log=$LOG_DIR/slurmctld.log
    if is_running slurmctld; then
        say "slurmctld already running"
    else
        rm -f "$RUN_DIR/slurmctld.pid"
        CTLD_STARTED_AT=$(date +%s)
        slurmctld >>"$log" 2>&1 9>&- || die_log "slurmctld failed to start" "$log"
        say "started slurmctld"
    fi
    local deadline=$((SECONDS + WAIT_TIMEOUT))
    until scontrol ping 2>/dev/null | grep -q 'is UP'; do
        is_running slurmctld || die_log "slurmctld died during start-up" "$log"
        ((SECONDS < deadline)) || die_log "slurmctld did not answer within ${WAIT_TIMEOUT}s" "$log"
        sleep 0.5
    done
}

# start_slurmd NODE: start one fake node's slurmd if not running.
start_slurmd() {
    local n=$1 log=$LOG_DIR/slurmd-$1.log
    if is_running slurmd -N "$n"; then
        say "slurmd $n already running"
        return 0
    fi
    install -d -m 0755 "$SPOOL_ROOT/$n"
    make_fake_gpus "$n"
    rm -f "$RUN_DIR/slurmd-$n.pid"
    slurmd -N "$n" >>"$log" 2>&1 9>&- ||
        die_log "slurmd $n failed to start" "$log"
    say "started slurmd $n"
}

# node_state NODE: compact state from sinfo ("idle", "down*", "drained"...).
node_state() { sinfo -h -n "$1" -N -o '%T' 2>/dev/null | head -n1; }

node_ok_state() {
    # '*' = not responding; anything down/drain/fail/unknown is not usable.
    case $1 in
        "" | *'*' | *down* | *drain* | *fail* | *unk* | *not_responding* | *future* | *inval*) return 1 ;;
        *) return 0 ;;
    esac
}

# wait_nodes NODE...: wait until all NODEs are usable; RESUME nodes that
# registered but stay DOWN/DRAINED (e.g. reason left over in saved state).
wait_nodes() {
    local deadline=$((SECONDS + WAIT_TIMEOUT)) n st pending resumed=" "
    while :; do
        pending=()
        for n in "$@"; do
            is_running slurmd -N "$n" || die_log "slurmd $n died" "$LOG_DIR/slurmd-$n.log"
            st=$(node_state "$n")
            node_ok_state "$st" && continue
            pending+=("$n:$st")
            # Responding (no '*') but down/drained: needs an explicit RESUME.
            if [[ -n $st && $st != *'*' && $resumed != *" $n "* ]] &&
                [[ $st == *down* || $st == *drain* || $st == *fail* ]]; then
                scontrol update NodeName="$n" State=RESUME >/dev/null 2>&1 || true
                resumed+="$n "
                say "resumed $n (was $st)"
            fi
        done
        ((${#pending[@]})) || return 0
        if ((SECONDS >= deadline)); then
            sinfo -N -l >&2 || true
            die_log "nodes not ready after ${WAIT_TIMEOUT}s: ${pending[*]}" "$LOG_DIR/slurmd-${pending[0]%%:*}.log"
        fi
        sleep 0.5
    done
}

# job_has_live_step ID: does any slurmstepd of job ID still exist? Every
# step daemon listens on $SPOOL_ROOT/<node>/<node>_<job>.<step>.
job_has_live_step() {
    awk -v pre="$SPOOL_ROOT/" -v id="$1" '
        index($8, pre) == 1 { n = split($8, p, "/"); f = p[n]; sub(/^[^_]*_/, "", f)
                              if (f ~ ("^" id "\\.")) found = 1 }
        END { exit !found }' /proc/net/unix
}

# reap_ghost_jobs: after slurmctld was (re)started by this 'up', cancel jobs
# it recovered as RUNNING whose processes are gone. This happens when the
# previous session was killed (CI): the saved state still says RUNNING and
# 22.05 only purges such jobs at some later node registration, so they would
# hold the nodes for minutes. (Caveat: an salloc allocation without any
# step, started before the restart, looks the same and is cancelled too.)
reap_ghost_jobs() {
    [[ -n $CTLD_STARTED_AT ]] || return 0
    local id start ghosts=()
    while read -r id start; do
        [[ $id =~ ^[0-9]+$ ]] || continue
        [[ $(date -d "$start" +%s 2>/dev/null || echo 0) -lt $CTLD_STARTED_AT ]] || continue
        job_has_live_step "$id" || ghosts+=("$id")
    done < <(squeue -h -t RUNNING,SUSPENDED -o '%A %S' 2>/dev/null)
    ((${#ghosts[@]})) || return 0
    scancel "${ghosts[@]}" 2>/dev/null || true
    say "cancelled job(s) left RUNNING by a killed previous session: ${ghosts[*]}"
}

# node_job_pids N: slurmstepd and job processes of fake node N.
# - proctrack/cgroup puts each slurmstepd and all its tasks into the
#   freezer cgroup slurm_N/uid_*/job_* (%n-named root: multiple-slurmd build);
# - as a fallback (e.g. a step still starting), a slurmstepd owns a unix
#   socket $SPOOL_ROOT/N/N_<job>.<step>, which /proc/net/unix maps to an inode.
node_job_pids() {
    local n=$1 p fd link
    if [[ -d /sys/fs/cgroup/freezer/slurm_$n ]]; then
        find "/sys/fs/cgroup/freezer/slurm_$n" -name cgroup.procs -exec cat {} + 2>/dev/null
    fi
    local inodes
    inodes=" $(awk -v pre="$SPOOL_ROOT/$n/" 'index($8, pre) == 1 { printf "%s ", $7 }' /proc/net/unix 2>/dev/null) "
    [[ $inodes == "  " ]] && return 0
    for p in $(find_pids slurmstepd); do
        for fd in /proc/"$p"/fd/*; do
            link=$(readlink "$fd" 2>/dev/null) || continue
            if [[ $link == socket:\[*\] && $inodes == *" ${link//[^0-9]/} "* ]]; then
                echo "$p"
                break
            fi
        done
    done
}

# kill_node_jobs N: SIGKILL everything jobs left on node N, like a crash would.
kill_node_jobs() {
    local n=$1 pids=()
    mapfile -t pids < <(node_job_pids "$n" | sort -u)
    ((${#pids[@]})) || return 0
    kill -KILL "${pids[@]}" 2>/dev/null || true
    say "killed ${#pids[@]} job/step process(es) on $n"
}

# --------------------------------------------------------------------------
# Commands
# --------------------------------------------------------------------------
cmd_up() {
    local t0=$SECONDS restart_slurm=0
    require_root
    check_knobs
    install_packages
    install -d -m 0755 "$ETC_DIR" "$LOG_DIR" "$STATE_DIR" "$SPOOL_ROOT" "$RUN_DIR"
    ensure_hosts
    have_cgroup_v1 || warn "cgroup v1 memory/freezer not mounted: no memory enforcement (OUT_OF_MEMORY untestable)"

    # slurm.conf first: even sacctmgr (used to wait for slurmdbd) reads it.
    # If it changed while slurmctld runs (e.g. different HPC_SLURM_NODES),
    # restart controller and nodes below: 'scontrol reconfigure' cannot
    # add/remove nodes in 22.05.
    write_if_changed "$SLURM_CONF_FILE" 644 "$(slurm_conf)" && restart_slurm=1
    write_if_changed "$CGROUP_CONF_FILE" 644 "$(cgroup_conf)" && restart_slurm=1
    write_if_changed "$GRES_CONF_FILE" 644 "$(gres_conf)" && restart_slurm=1

    start_munge
    start_mariadb
    start_slurmdbd

    if ((restart_slurm)) && is_running slurmctld; then
        say "slurm.conf/cgroup.conf/gres.conf changed, restarting slurmctld and slurmd"
        stop_slurmds
        stop_daemon slurmctld 20 slurmctld
    fi

    start_slurmctld
    local n
    for n in $(node_names); do start_slurmd "$n"; done
    # shellcheck disable=SC2046
    wait_nodes $(node_names)
    reap_ghost_jobs
    wait_for "sacct to answer" "$WAIT_TIMEOUT" "$LOG_DIR/slurmdbd.log" sacct -n -X -S now-1minutes
    local gpu= k
    for ((k = 0; k < ${#GPU_PART_NAMES[@]}; k++)); do
        gpu+=" / ${GPU_PART_NAMES[k]} (node$((NODES + 1 + k)), gpu:${GPU_PART_TYPES[k]}:${GPU_PART_COUNTS[k]})"
    done
    say "cluster up in $((SECONDS - t0))s: nodes $(node_names | paste -sd, -), partitions low (default, preemptable) / high / lowcancel (preemption cancels) on $(cpu_nodelist)$gpu"
}

stop_slurmds() {
    local pids
    # Every slurmd started with -N (i.e. ours), also nodes beyond HPC_SLURM_NODES.
    mapfile -t pids < <(find_pids slurmd -N)
    if ((${#pids[@]})); then
        stop_pids "slurmd (${#pids[@]})" 15 "${pids[@]}"
    else
        say "slurmd not running"
    fi
}

cmd_down() {
    local purge=0 a
    for a in "$@"; do
        case $a in
            --purge) purge=1 ;;
            *) die "unknown option for down: $a" ;;
        esac
    done
    require_root
    # Running jobs cannot survive 'down' (their processes are killed below).
    # Cancel them while slurmctld still answers; otherwise the saved state
    # keeps them as RUNNING "ghosts" holding nodes after the next 'up' until
    # slurmctld notices they are gone. Pending jobs are kept. Draining the
    # nodes first stops pending jobs from starting in the freed slots while
    # we shut down; 'up' resumes drained nodes.
    if is_running slurmctld && scontrol ping 2>/dev/null | grep -q 'is UP'; then
        local running
        scontrol update NodeName=ALL State=DRAIN Reason="cluster.sh down" >/dev/null 2>&1 || true
        mapfile -t running < <(squeue -h -t RUNNING,SUSPENDED,CONFIGURING -o %A 2>/dev/null | sort -u)
        if ((${#running[@]})); then
            scancel "${running[@]}" 2>/dev/null || true
            say "cancelled running job(s): ${running[*]}"
        fi
    fi
    stop_slurmds
    # slurmstepd and job processes survive a stopped slurmd; a real node
    # going down would take them along, so do the same.
    local d n
    for n in $({
        node_names
        for d in /sys/fs/cgroup/freezer/slurm_node*; do [[ -d $d ]] && echo "${d##*/slurm_}"; done
    } | sort -u); do
        kill_node_jobs "$n"
    done
    stop_daemon slurmctld 20 slurmctld
    stop_daemon slurmdbd 20 slurmdbd
    if ((purge)); then
        # Drop the accounting DB too: with job ids restarting at 1, old
        # records would otherwise show up in sacct for new jobs.
        if ! is_running mariadbd && [[ -x /usr/sbin/mariadbd ]]; then
            start_mariadb >/dev/null
        fi
        if is_running mariadbd; then
            mysql_root -e "DROP DATABASE IF EXISTS $DB_NAME" && say "dropped accounting database $DB_NAME"
        fi
    fi
    stop_daemon mariadb 60 mariadbd
    stop_daemon munged 15 munged
    rm -f "$RUN_DIR"/*.pid "$MYSQL_RUN/mysqld.pid"
    if ((purge)); then
        rm -rf "${STATE_DIR:?}"/* "${SPOOL_ROOT:?}"/node* "${FAKE_GPU_ROOT:?}"
        say "purged $STATE_DIR, $SPOOL_ROOT/node* and $FAKE_GPU_ROOT"
    fi
    say "cluster down"
}

cmd_status() {
    local rc=0 n p
    printf '%-16s %s\n' DAEMON PID
    for p in munged mariadbd slurmdbd slurmctld; do
        local pids
        pids=$(find_pids "$p" | paste -sd, -)
        printf '%-16s %s\n' "$p" "${pids:-NOT RUNNING}"
        [[ -n $pids ]] || rc=1
    done
    for n in $(node_names); do
        local pids
        pids=$(find_pids slurmd -N "$n" | paste -sd, -)
        printf '%-16s %s\n' "slurmd $n" "${pids:-NOT RUNNING}"
        [[ -n $pids ]] || rc=1
    done
    echo
    if scontrol ping 2>/dev/null | grep -q 'is UP'; then
        sinfo -N -o '%N %P %T %C %m' || rc=1
        for n in $(node_names); do
            node_ok_state "$(node_state "$n")" || { echo "node $n not usable"; rc=1; }
        done
    else
        echo "slurmctld does not answer"
        rc=1
    fi
    echo
    if sacct -n -X -S now-1minutes >/dev/null 2>&1; then
        echo "accounting: OK (sacct answers)"
    else
        echo "accounting: NOT answering"
        rc=1
    fi
    echo
    if ((rc == 0)); then echo "cluster: HEALTHY"; else echo "cluster: NOT HEALTHY"; fi
    return "$rc"
}

cmd_env() {
    cat <<EOF
export SLURM_CONF=$SLURM_CONF_FILE
export HPC_SLURM_NODES=$NODES
export HPC_SLURM_NODELIST=$(cpu_node_names | paste -sd, -)
export HPC_SLURM_PARTITION_LOW=low
export HPC_SLURM_PARTITION_HIGH=high
export HPC_SLURM_GPU_PARTITIONS=$GPU_PARTITIONS
export HPC_SLURM_GPU_NODELIST=$(gpu_node_names | paste -sd, -)
EOF
}

cmd_kill_node() {
    local n=${1:-} only=0
    [[ ${2:-} == --slurmd-only ]] && only=1
    require_root
    [[ -n $n ]] || die "usage: kill-node NODE [--slurmd-only]"
    valid_node "$n" || die "unknown node '$n' (nodes: $(node_names | paste -sd' ' -))"
    local pids
    mapfile -t pids < <(find_pids slurmd -N "$n")
    if ((${#pids[@]})); then
        kill -KILL "${pids[@]}" 2>/dev/null || true
        say "killed slurmd $n (pid ${pids[*]})"
    else
        say "slurmd $n not running"
    fi
    ((only)) || kill_node_jobs "$n"
}

# The fast test setting of SchedulerParameters, as slurm_conf writes it, and the same line commented out
# (Slurm's defaults: sched_interval=60, bf_interval=30).
SCHED_FAST_LINE='SchedulerParameters=sched_interval=3,bf_interval=3'
SCHED_DEFAULT_LINE="#$SCHED_FAST_LINE  # cluster.sh sched default: Slurm's defaults"

cmd_sched() {
    local want=${1:-show} from to
    require_root
    [[ -f $SLURM_CONF_FILE ]] || die "no $SLURM_CONF_FILE: run 'up' first"
    case $want in
        show) scontrol show config | grep -E '^SchedulerParameters' ; return 0 ;;
        fast) from=$SCHED_DEFAULT_LINE to=$SCHED_FAST_LINE ;;
        default) from=$SCHED_FAST_LINE to=$SCHED_DEFAULT_LINE ;;
        *) die "usage: sched fast|default|show" ;;
    esac
    if grep -qxF "$to" "$SLURM_CONF_FILE"; then
        say "SchedulerParameters already $want"
    else
        grep -qxF "$from" "$SLURM_CONF_FILE" || die "no line '$from' in $SLURM_CONF_FILE"
        local tmp
        tmp=$(mktemp "$SLURM_CONF_FILE.XXXXXX")
        awk -v from="$from" -v to="$to" '$0 == from { print to; next } { print }' "$SLURM_CONF_FILE" >"$tmp"
        chmod 644 "$tmp"
        mv "$tmp" "$SLURM_CONF_FILE"
    fi
    scontrol reconfigure
    say "SchedulerParameters: $(scontrol show config | sed -n 's/^SchedulerParameters *= *//p')"
}

cmd_start_node() {
    local n=${1:-}
    require_root
    [[ -n $n ]] || die "usage: start-node NODE"
    valid_node "$n" || die "unknown node '$n' (nodes: $(node_names | paste -sd' ' -))"
    start_slurmd "$n"
    wait_nodes "$n"
    say "$n is $(node_state "$n")"
}

main() {
    local cmd=${1:-}
    CMD=$cmd
    shift || true
    # Commands other than 'up' follow the running configuration, so
    # status/kill-node/down work without repeating HPC_SLURM_NODES or
    # HPC_SLURM_GPU_PARTITIONS. CPU nodes are the NodeName lines without
    # Gres=; a slurm.conf written before GPU partitions existed has no
    # "# cluster.sh gpu partitions:" line, i.e. none.
    if [[ $cmd != up && -f $SLURM_CONF_FILE ]]; then
        if [[ -z ${HPC_SLURM_NODES:-} ]]; then
            local count
            count=$(grep '^NodeName=node' "$SLURM_CONF_FILE" | grep -vc ' Gres=' || true)
            if ((count > 0)); then NODES=$count; fi
        fi
        if [[ -z ${HPC_SLURM_GPU_PARTITIONS+set} ]]; then
            GPU_PARTITIONS=$(sed -n 's/^# cluster\.sh gpu partitions: *//p' "$SLURM_CONF_FILE" | head -n1)
        fi
    fi
    parse_gpu_partitions
    # Serialise commands that start/stop daemons: two concurrent 'up's (e.g.
    # parallel test workers) would otherwise both start a slurmctld.
    case $cmd in
        up | down | kill-node | start-node)
            if ((EUID == 0)) && command -v flock >/dev/null 2>&1; then
                # fd 9 holds the lock; every daemon is started with 9>&-,
                # or it would inherit the fd and hold the lock forever.
                exec 9>/run/hpc-cluster.lock
                flock -w 300 9 || die "another cluster.sh is still running (lock /run/hpc-cluster.lock)"
            fi
            ;;
    esac
    case $cmd in
        up) cmd_up "$@" ;;
        down) cmd_down "$@" ;;
        status) cmd_status "$@" ;;
        env) cmd_env ;;
        kill-node) cmd_kill_node "$@" ;;
        start-node) cmd_start_node "$@" ;;
        sched) cmd_sched "$@" ;;
        -h | --help | help) usage ;;
        "") usage >&2; exit 2 ;;
        *) printf 'unknown command: %s\n\n' "$cmd" >&2; usage >&2; exit 2 ;;
    esac
}

main "$@"
