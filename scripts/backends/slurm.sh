#!/usr/bin/env bash
# A real two-node Slurm cluster (Debian's slurm-wlm 22.05) on loopback, for atoll's tests.
#
#   slurm.sh up       install the packages if missing, start munged, MariaDB, slurmdbd, slurmctld
#                     and two slurmd (n1, n2); a no-op when the cluster already answers
#   slurm.sh status   exit 0 when sinfo shows both nodes up (idle, mixed or allocated)
#   slurm.sh down     cancel every job, stop every daemon, remove all state
#   slurm.sh env      print the env file (source it: it sets SLURM_CONF)
#
# The cluster: partitions `debug` (default), `gpu`, and `held` (down: its jobs stay PENDING);
# accounts `fl` and `other`; QoS `normal` and `high`; 2 CPUs, 2 fake GPUs (gres) and
# $ATOLL_SLURM_NODE_MEM MB per node, memory enforced by cgroup v1. Every daemon listens on
# 127.0.0.1 or a unix socket; slurmdbd, which always binds 0.0.0.0, runs with a bind() shim
# (slurm/bind_loopback.c). Settings (environment):
#   ATOLL_SLURM_BASE        all state, logs, configs, env file     (default /tmp/atoll-slurm)
#   ATOLL_SLURM_PORTS       slurmctld slurmdbd n1 n2 ports    (default "16817 16819 17001 17002")
#   ATOLL_SLURM_NODE_MEM    RealMemory of each node in MB           (default 4000)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TEMPLATES=$HERE/slurm
BASE=${ATOLL_SLURM_BASE:-/tmp/atoll-slurm}
read -r CTLD_PORT DBD_PORT N1_PORT N2_PORT <<<"${ATOLL_SLURM_PORTS:-16817 16819 17001 17002}"
NODE_MEM=${ATOLL_SLURM_NODE_MEM:-4000}
HOST=$(hostname -s)
NODES=(n1 n2)
# gcc and libc6-dev build the slurmdbd bind() shim (a few lines of C).
PACKAGES=(slurm-wlm munge slurmdbd mariadb-server gcc libc6-dev)

ETC=$BASE/etc
RUN=$BASE/run
LOGS=$BASE/log
MUNGE=$BASE/munge
MYSQL=$BASE/mysql
MUNGE_SOCKET=$MUNGE/munge.socket
MYSQL_SOCKET=$MYSQL/mysqld.sock
export SLURM_CONF=$ETC/slurm.conf

log() { printf '[slurm.sh] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

install_packages() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  ((${#missing[@]} == 0)) && return 0
  [[ $(id -u) == 0 ]] || die "missing ${missing[*]}: run as root or apt-get install them"
  log "installing ${missing[*]}"
  apt-get update -qq -o DPkg::Lock::Timeout=600
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 \
    "${missing[@]}" >/dev/null
}

# Fill @NAME@ placeholders of a template in scripts/backends/slurm/.
render() {
  sed -e "s|@BASE@|$BASE|g" -e "s|@HOST@|$HOST|g" -e "s|@CTLD_PORT@|$CTLD_PORT|g" \
    -e "s|@DBD_PORT@|$DBD_PORT|g" -e "s|@N1_PORT@|$N1_PORT|g" -e "s|@N2_PORT@|$N2_PORT|g" \
    -e "s|@NODE_MEM@|$NODE_MEM|g" -e "s|@DB_PASS@|$DB_PASS|g" "$TEMPLATES/$1.in" >"$2"
}

# Retry the command in the remaining arguments every 0.1 s until it succeeds, for up to $1 seconds.
wait_for() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}

pid_alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

nodes_up() {
  [[ -f $SLURM_CONF ]] || return 1 # without it sinfo retries for a minute
  local states
  states=$(timeout 10 sinfo -h -N -o '%N %T' 2>/dev/null | sort -u) || return 1
  local node
  for node in "${NODES[@]}"; do
    grep -Eq "^$node (idle|mixed|allocated|completing)$" <<<"$states" || return 1
  done
}

write_configs() {
  mkdir -p "$ETC" "$RUN" "$LOGS" "$BASE/spool/ctld" "$BASE/dev" "$MYSQL"
  chmod 0755 "$BASE"
  DB_PASS=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
  render slurm.conf "$ETC/slurm.conf"
  render cgroup.conf "$ETC/cgroup.conf"
  render gres.conf "$ETC/gres.conf"
  render slurmdbd.conf "$ETC/slurmdbd.conf"
  chmod 0600 "$ETC/slurmdbd.conf"
  local node
  for node in "${NODES[@]}"; do mkdir -p "$BASE/spool/$node"; done
  # Fake GPUs must be character devices: slurmd refuses regular files.
  local i
  for i in 0 1 2 3; do mknod "$BASE/dev/nvidia$i" c 195 "$i"; done
  nice gcc -shared -fPIC -O2 -o "$BASE/bind_loopback.so" "$TEMPLATES/bind_loopback.c" -ldl
  printf 'export SLURM_CONF=%q\n' "$SLURM_CONF" >"$BASE/env.sh"
}

start_munge() {
  # munged wants its socket folder open to all (clients connect) and its key folder private.
  install -d -o munge -g munge -m 0755 "$MUNGE"
  install -d -o munge -g munge -m 0700 "$MUNGE/key"
  mungekey --create --keyfile="$MUNGE/key/munge.key" --force
  chown munge:munge "$MUNGE/key/munge.key"
  chmod 0400 "$MUNGE/key/munge.key"
  runuser -u munge -- munged --key-file="$MUNGE/key/munge.key" --socket="$MUNGE_SOCKET" \
    --pid-file="$MUNGE/munged.pid" --log-file="$MUNGE/munged.log" --seed-file="$MUNGE/munged.seed"
  wait_for 5 test -S "$MUNGE_SOCKET" || die "munged did not start: see $MUNGE/munged.log"
  cp "$MUNGE/munged.pid" "$RUN/munged.pid"
}

start_mariadb() {
  install -d -o mysql -g mysql -m 0700 "$MYSQL/data"
  mariadb-install-db --no-defaults --user=mysql --datadir="$MYSQL/data" \
    --auth-root-authentication-method=socket --skip-test-db >"$LOGS/mariadb-install.log" 2>&1 ||
    die "mariadb-install-db failed: see $LOGS/mariadb-install.log"
  chown mysql:mysql "$MYSQL"
  # mariadbd runs as mysql: its pid file and log live in its own folder.
  setsid mariadbd --no-defaults --user=mysql --datadir="$MYSQL/data" --socket="$MYSQL_SOCKET" \
    --skip-networking --innodb-buffer-pool-size=256M --innodb-lock-wait-timeout=900 \
    --innodb-flush-log-at-trx-commit=0 --innodb-doublewrite=0 \
    --pid-file="$MYSQL/mariadbd.pid" --log-error="$MYSQL/mariadbd.log" \
    </dev/null >/dev/null 2>&1 &
  wait_for 30 mariadb-admin --no-defaults --socket="$MYSQL_SOCKET" ping ||
    die "mariadbd did not start: see $MYSQL/mariadbd.log"
  cp "$MYSQL/mariadbd.pid" "$RUN/mariadbd.pid"
  mariadb --no-defaults --socket="$MYSQL_SOCKET" -u root <<SQL
CREATE USER 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
SQL
}

start_slurmdbd() {
  # MYSQL_UNIX_PORT points slurmdbd's MariaDB client at our socket (it reads no my.cnf).
  MYSQL_UNIX_PORT=$MYSQL_SOCKET LD_PRELOAD=$BASE/bind_loopback.so slurmdbd
  wait_for 30 timeout 5 sacctmgr -n list cluster ||
    die "slurmdbd did not answer: see $LOGS/slurmdbd.log"
  sacctmgr -i add cluster atoll >/dev/null
  sacctmgr -i add qos high Priority=100 >/dev/null
  sacctmgr -i add account fl,other Cluster=atoll Description=atoll-tests Organization=atoll \
    >/dev/null
  sacctmgr -i add user root Account=fl,other DefaultAccount=fl QOS=normal,high DefaultQOS=normal \
    >/dev/null
}

start_slurm() {
  slurmctld -c
  wait_for 30 timeout 5 scontrol ping || die "slurmctld did not answer: see $LOGS/slurmctld.log"
  local node
  for node in "${NODES[@]}"; do slurmd -N "$node"; done
  wait_for 30 nodes_up || die "nodes not idle: $(sinfo -N 2>&1); see $LOGS/slurmd-*.log"
}

up() {
  if nodes_up; then
    log "already up ($BASE)"
    return 0
  fi
  install_packages
  [[ -d $BASE ]] && { log "stale state in $BASE: cleaning up first"; down; }
  write_configs
  start_munge
  start_mariadb
  start_slurmdbd
  start_slurm
  log "up: $(sinfo -h -o '%P %D %T' | tr '\n' ';') source $BASE/env.sh"
}

# Stop the processes of the given pid files together: TERM, then KILL what is left after 10 s.
# A pid counts only if it still runs the daemon the file is named after (slurmd-n1.pid: slurmd).
stop_pid_files() {
  local pids=() file pid name
  for file in "$@"; do
    name=$(basename "$file" .pid)
    pid=$(cat "$file" 2>/dev/null) || pid=""
    if [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == "${name%%-*}" ]]; then
      kill "$pid" 2>/dev/null && pids+=("$pid")
    fi
    rm -f "$file"
  done
  ((${#pids[@]})) || return 0
  any_alive() { local p; for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
  local deadline=$((SECONDS + 10))
  while any_alive "${pids[@]}" && ((SECONDS < deadline)); do sleep 0.1; done
  kill -9 "${pids[@]}" 2>/dev/null || true
}

# Job step daemons of this cluster only: they carry our SLURM_CONF in their environment.
stop_stepds() {
  local pid
  for pid in $(pgrep -x slurmstepd || true); do
    if tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "SLURM_CONF=$SLURM_CONF"; then
      kill -9 "$pid" 2>/dev/null || true
    fi
  done
}

# slurmd's cgroup v1 folders (slurm_n1, slurm_n2) outlive it: remove them, deepest first.
remove_cgroups() {
  local node dir
  for node in "${NODES[@]}"; do
    for dir in /sys/fs/cgroup/*/"slurm_$node"; do
      [[ -d $dir ]] && find "$dir" -depth -type d -exec rmdir {} + 2>/dev/null || true
    done
  done
}

down() {
  if [[ -f $ETC/slurm.conf ]] && pid_alive "$RUN/slurmctld.pid"; then
    scancel --full --quiet --user=root 2>/dev/null || true
  fi
  stop_pid_files "$RUN/slurmd-n1.pid" "$RUN/slurmd-n2.pid" "$RUN/slurmctld.pid" "$RUN/slurmdbd.pid"
  stop_stepds
  stop_pid_files "$RUN/mariadbd.pid" "$RUN/munged.pid"
  remove_cgroups
  rm -rf "$BASE"
  log "down"
}

status() {
  if nodes_up; then
    sinfo -N -o '%N %P %T %G'
    return 0
  fi
  [[ -f $SLURM_CONF ]] || { log "not up: no $SLURM_CONF (run: $0 up)"; return 1; }
  log "not up: $(timeout 10 sinfo -h -N -o '%N=%T' 2>&1 | tr '\n' ' ')"
  return 1
}

main() {
  local cmd=${1:-}
  case $cmd in
    up | down)
      # One caller at a time. The lock lives beside the base folder (which `down` removes) and
      # is held by flock itself (-o), so the daemons started here do not inherit it.
      if [[ ${_ATOLL_SLURM_LOCKED:-} != "$BASE" ]]; then
        _ATOLL_SLURM_LOCKED=$BASE exec flock -o "$BASE.lock" "$0" "$cmd"
      fi
      "$cmd"
      ;;
    status) status ;;
    env) cat "$BASE/env.sh" ;;
    *) die "usage: $0 up|down|status|env" ;;
  esac
}

main "$@"
