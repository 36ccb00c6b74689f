#!/usr/bin/env bash
# A one-machine Slurm cluster to try the course's sbatch templates on: munge + slurmctld + slurmd.
#
#   sudo apt-get install -y slurm-wlm munge          # Debian/Ubuntu: Slurm 22.05 on Debian 12
#   sudo ddp_scripts/slurm/local_cluster.sh up       # prints the SLURM_CONF line to export
#   export SLURM_CONF=/tmp/ddp_lessons_slurm/slurm.conf
#   sbatch ...; squeue; sinfo
#   sudo ddp_scripts/slurm/local_cluster.sh down     # cancels its jobs, stops what `up` started, by pid
#
# Everything lives in one directory (CLUSTER_DIR, default /tmp/ddp_lessons_slurm): the config, the
# daemons' pids, logs and spool. Nothing under /etc is changed; a munged already running is left alone.
# The one node stands for a whole cluster: NodeAddr=127.0.0.1, as many CPUs as this machine has.
set -euo pipefail

CLUSTER_DIR=${CLUSTER_DIR:-/tmp/ddp_lessons_slurm}
CONF=$CLUSTER_DIR/slurm.conf
MUNGE_SOCKET=$CLUSTER_DIR/munge/munge.socket
export SLURM_CONF=$CONF

die() { echo "local_cluster.sh: $*" >&2; exit 1; }

up() {
    [ "$(id -u)" = 0 ] || die "needs root (the daemons run as root here); try: sudo $0 up"
    for tool in munged slurmctld slurmd sinfo; do
        command -v "$tool" >/dev/null || die "$tool not found: apt-get install -y slurm-wlm munge"
    done
    [ -e "$CLUSTER_DIR/slurmctld.pid" ] && die "already up ($CLUSTER_DIR); run '$0 down' first"
    mkdir -p "$CLUSTER_DIR"/{spool/ctld,spool/d,munge,logs}

    # munge authenticates every Slurm message; its own socket in our directory, owned by the munge user.
    [ -s /etc/munge/munge.key ] || mungekey --create --keyfile=/etc/munge/munge.key
    chown munge: "$CLUSTER_DIR/munge"; chmod 755 "$CLUSTER_DIR/munge"  # clients need to reach the socket
    runuser -u munge -- munged --socket="$MUNGE_SOCKET" --pid-file="$CLUSTER_DIR/munge/munged.pid" \
        --log-file="$CLUSTER_DIR/munge/munged.log" --seed-file="$CLUSTER_DIR/munge/munged.seed"

    local host cpus memory_mb
    host=$(hostname -s)
    cpus=$(nproc)
    memory_mb=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
    cat > "$CONF" <<CONFIG
ClusterName=lessons
SlurmctldHost=$host(127.0.0.1)
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
# No cgroups in a container: track a job's processes by parent pid, bind no CPUs.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$CLUSTER_DIR/spool/ctld
SlurmdSpoolDir=$CLUSTER_DIR/spool/d
SlurmctldPidFile=$CLUSTER_DIR/slurmctld.pid
SlurmdPidFile=$CLUSTER_DIR/slurmd.pid
SlurmctldLogFile=$CLUSTER_DIR/logs/slurmctld.log
SlurmdLogFile=$CLUSTER_DIR/logs/slurmd.log
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONFIG

    slurmctld -f "$CONF"   # each daemon writes its pid file; `down` stops them by those pids
    slurmd -f "$CONF"
    for _ in $(seq 50); do  # up to 10 s for the node to report idle
        sinfo --noheader --format=%t 2>/dev/null | grep -q idle && break
        sleep 0.2
    done
    sinfo --noheader --format=%t | grep -q idle || die "the node did not come up; see $CLUSTER_DIR/logs"
    echo "export SLURM_CONF=$CONF"
}

stop_pid_file() {  # SIGTERM, wait up to 5 s, then SIGKILL: by pid, never by name
    local file=$1 pid
    [ -s "$file" ] || return 0
    pid=$(cat "$file")
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
    fi
    rm -f "$file"
}

down() {
    [ -d "$CLUSTER_DIR" ] || { echo "local_cluster.sh: nothing to stop ($CLUSTER_DIR does not exist)"; return 0; }
    if [ -s "$CLUSTER_DIR/slurmctld.pid" ] && kill -0 "$(cat "$CLUSTER_DIR/slurmctld.pid")" 2>/dev/null; then
        scancel --full --quiet --user=root 2>/dev/null || true  # every job of this cluster, and its steps
        for _ in $(seq 50); do [ -z "$(squeue --noheader 2>/dev/null)" ] && break; sleep 0.2; done
    fi
    stop_pid_file "$CLUSTER_DIR/slurmd.pid"
    stop_pid_file "$CLUSTER_DIR/slurmctld.pid"
    stop_pid_file "$CLUSTER_DIR/munge/munged.pid"
    rm -rf "$CLUSTER_DIR"
    echo "local_cluster.sh: down"
}

case "${1:-}" in
    up) up ;;
    down) down ;;
    *) die "usage: $0 up|down" ;;
esac
