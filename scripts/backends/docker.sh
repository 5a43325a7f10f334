#!/usr/bin/env bash
# A private Docker Engine (Debian's docker.io) for atoll's tests, with locally built images.
#
#   docker.sh up       install docker.io if missing, start dockerd, build the test images
#   docker.sh status   exit 0 when the engine answers and every test image is present and was
#                      built from the current working tree (else: run up, seconds when cached)
#   docker.sh down     remove every container and image labelled atoll.test=1, stop dockerd
#   docker.sh env      print the env file (DOCKER_HOST and the image names)
#
# Nothing is pulled from a registry: the images come from Debian packages, the project and
# wheels built by the host's pip. Nothing listens on TCP: the engine has a unix socket, no
# bridge, no iptables rules and its own containerd namespace, so another dockerd on the machine
# (e.g. a kubelet's) is left alone. Settings (environment):
#   ATOLL_DOCKER_BASE     data root, sockets, logs, env file     (default /tmp/atoll-docker)
#   ATOLL_DOCKER_SOCK     the engine's socket                    (default $ATOLL_DOCKER_BASE/docker.sock)
#   ATOLL_DOCKER_IMAGES   images to build: busybox python job parent  (default: all four)
#   ATOLL_DOCKERD_ARGS    extra dockerd flags (e.g. --default-runtime for a kubelet's engine)
#   ATOLL_CACHE_DIR       cached root filesystem and wheels      (default ~/.cache/atoll)
#   ATOLL_DEBIAN_MIRROR   mirror for debootstrap                 (default: read from apt sources)
#   ATOLL_PYTHON          the Python that builds the wheels      (default .venv/bin/python)
#   ATOLL_DOCKER_TAG      the job and parent images' tag          (default latest; give each
#                         working tree sharing one engine its own, with its own ATOLL_DOCKER_BASE)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BASE=${ATOLL_DOCKER_BASE:-/tmp/atoll-docker}
SOCK=${ATOLL_DOCKER_SOCK:-$BASE/docker.sock}
IMAGES=${ATOLL_DOCKER_IMAGES:-busybox python job parent}
CACHE=${ATOLL_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/atoll}
PYTHON=${ATOLL_PYTHON:-$REPO/.venv/bin/python}
SUITE=bookworm # the job image's Python (3.11) must match the wheels built by $PYTHON
PACKAGES=(docker.io debootstrap)
LABEL=atoll.test=1

BUSYBOX_IMAGE=atoll-test/busybox:latest
PYTHON_IMAGE=atoll-test/python-base:$SUITE
JOB_IMAGE=atoll-test/job:${ATOLL_DOCKER_TAG:-latest}
PARENT_IMAGE=atoll-test/parent:${ATOLL_DOCKER_TAG:-latest}

export DOCKER_HOST=unix://$SOCK
# Debian's CLI matches the engine (20.10); a newer CLI elsewhere on PATH may want BuildKit.
DOCKER=/usr/bin/docker
[[ -x $DOCKER ]] || DOCKER=docker

log() { printf '[docker.sh] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
wants() { [[ " $IMAGES " == *" $1 "* ]]; }

apt_updated=0
apt_install() {
  ((apt_updated)) || { apt-get update -qq -o DPkg::Lock::Timeout=600; apt_updated=1; }
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=600 "$@" >/dev/null
}

install_packages() {
  local missing=() p
  for p in "${PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  ((${#missing[@]} == 0)) && return 0
  [[ $(id -u) == 0 ]] || die "missing ${missing[*]}: run as root or apt-get install them"
  log "installing ${missing[*]}"
  apt_install "${missing[@]}"
}

engine_up() { [[ -S $SOCK ]] && "$DOCKER" version --format '{{.Server.Version}}' >/dev/null 2>&1; }

start_engine() {
  if engine_up; then log "engine already answering on $SOCK"; return 0; fi
  mkdir -p "$BASE/data" "$BASE/exec" "$(dirname "$SOCK")"
  local pid
  if [[ -f $BASE/dockerd.pid ]] && pid=$(cat "$BASE/dockerd.pid") && kill -0 "$pid" 2>/dev/null; then
    die "dockerd (pid $pid) runs for $BASE but does not answer: see $BASE/dockerd.log"
  fi
  rm -f "$BASE/dockerd.pid" "$SOCK"
  # Own containerd namespaces: a dockerd sharing a system containerd never sees our containers.
  local ns
  ns=atoll-$(printf '%s' "$BASE" | md5sum | cut -c1-8)
  # shellcheck disable=SC2086  # ATOLL_DOCKERD_ARGS is a list of flags
  setsid dockerd -H "unix://$SOCK" --data-root "$BASE/data" --exec-root "$BASE/exec" \
    --pidfile "$BASE/dockerd.pid" --iptables=false --ip6tables=false --ip-forward=false \
    --ip-masq=false --bridge=none --storage-driver=overlay2 \
    --containerd-namespace "$ns" --containerd-plugins-namespace "$ns-plugins" \
    ${ATOLL_DOCKERD_ARGS:-} >"$BASE/dockerd.log" 2>&1 </dev/null &
  local i
  for i in $(seq 1 150); do
    engine_up && { log "engine up on $SOCK"; return 0; }
    kill -0 $! 2>/dev/null || die "dockerd exited: see $BASE/dockerd.log"
    sleep 0.2
  done
  die "dockerd did not answer within 30 s: see $BASE/dockerd.log"
}

have_image() { "$DOCKER" image inspect "$1" >/dev/null 2>&1; }

# The machine's own Debian mirror, from its apt sources (deb822 or one-line format).
debian_mirror() {
  if [[ -n ${ATOLL_DEBIAN_MIRROR:-} ]]; then echo "$ATOLL_DEBIAN_MIRROR"; return; fi
  {
    grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
      awk -v s="$SUITE" '$3 == s {print $2}'
    awk -v s="$SUITE" '/^URIs:/ {u = $2} /^Suites:/ {for (i = 2; i <= NF; i++) if ($i == s) print u}' \
      /etc/apt/sources.list.d/*.sources 2>/dev/null
  } | head -1
}

# busybox-static's binary, extracted from its .deb (installing it would replace `busybox`).
busybox_binary() {
  local out=$CACHE/busybox-static/bin/busybox
  if [[ ! -x $out ]]; then
    local tmp
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download -qq busybox-static 2>/dev/null) ||
      { apt-get update -qq; (cd "$tmp" && apt-get download -qq busybox-static); }
    dpkg-deb -x "$tmp"/busybox-static_*.deb "$tmp/x"
    mkdir -p "$(dirname "$out")" && cp "$tmp/x/bin/busybox" "$out"
    rm -rf "$tmp"
  fi
  echo "$out"
}

build_busybox() {
  have_image "$BUSYBOX_IMAGE" && return 0
  local bin root
  bin=$(busybox_binary)
  root=$(mktemp -d)
  mkdir -p "$root/bin" "$root/tmp" && chmod 1777 "$root/tmp"
  cp "$bin" "$root/bin/busybox"
  for applet in $("$bin" --list); do [[ $applet == busybox ]] || ln -s busybox "$root/bin/$applet"; done
  tar -C "$root" -c . | "$DOCKER" import -c "LABEL $LABEL" -c 'ENV PATH=/bin' \
    -c 'CMD ["sh"]' - "$BUSYBOX_IMAGE" >/dev/null
  rm -rf "$root"
  log "built $BUSYBOX_IMAGE"
}

# A minimal Debian with python3 and python3-venv, cached as a tarball (debootstrap takes ~1 min).
build_python_base() {
  have_image "$PYTHON_IMAGE" && return 0
  local tarball=$CACHE/rootfs-$SUITE-python3.tar
  if [[ ! -f $tarball ]]; then
    local mirror root
    mirror=$(debian_mirror)
    [[ -n $mirror ]] || die "no $SUITE mirror in /etc/apt/sources*: set ATOLL_DEBIAN_MIRROR"
    root=$(mktemp -d "$CACHE/rootfs.XXXX")
    log "debootstrap $SUITE from $mirror (about a minute, cached in $tarball)"
    nice debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
      "$SUITE" "$root" "$mirror" >"$CACHE/debootstrap.log" 2>&1 ||
      die "debootstrap failed: see $CACHE/debootstrap.log"
    rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
    tar -C "$root" -cf "$tarball.part" . && mv "$tarball.part" "$tarball"
    rm -rf "$root"
  fi
  "$DOCKER" import -c "LABEL $LABEL" -c 'CMD ["python3"]' \
    -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    "$tarball" "$PYTHON_IMAGE" >/dev/null
  log "built $PYTHON_IMAGE"
}

# Wheels of atoll's dependencies (and of its build backend), built once by the host's pip
# (its cache, its CA bundle), so that image builds run without a network.
dependency_wheels() {
  local extras=$1 reqs key dir
  reqs=$("$PYTHON" - "$REPO/pyproject.toml" "$extras" <<'EOF'
import sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))
reqs = list(project["project"]["dependencies"]) + list(project["build-system"]["requires"])
for extra in filter(None, sys.argv[2].split(",")):
    reqs += project["project"]["optional-dependencies"][extra]
print("\n".join(sorted(set(reqs))))
EOF
)
  key=$(printf '%s' "$reqs" | md5sum | cut -c1-12)
  dir=$CACHE/wheels/$key
  if [[ ! -f $dir/.complete ]]; then
    log "building dependency wheels into $dir"
    mkdir -p "$dir"
    printf '%s\n' "$reqs" >"$dir/requirements.txt"
    # (grep: drop pip's noise about find-links folders of this machine that do not exist)
    if ! nice "$PYTHON" -m pip wheel -q -w "$dir" -r "$dir/requirements.txt" 2>&1 |
      { grep -v 'is ignored: it is neither a file nor a directory' || true; } >&2; then
      die "pip wheel failed for the requirements in $dir/requirements.txt"
    fi
    touch "$dir/.complete"
  fi
  echo "$dir"
}

# What the project's images are built from: a change means the image is stale.
source_hash() {
  (cd "$REPO" && git ls-files -co --exclude-standard -- src pyproject.toml .dockerignore \
    docker/job.Dockerfile docker/parent.Dockerfile | sort | xargs -d '\n' sha256sum |
    sha256sum | cut -c1-16)
}

image_hash() { "$DOCKER" image inspect -f '{{index .Config.Labels "atoll.source_hash"}}' "$1" 2>/dev/null; }

# Build docker/<name>.Dockerfile as the user would, from a staged context holding the project's
# files and prebuilt wheels (docker/wheels/), offline.
build_from_dockerfile() {
  local dockerfile=$1 tag=$2 extras=$3 wheels ctx hash
  hash=$(source_hash)
  if [[ $(image_hash "$tag") == "$hash" ]]; then log "$tag is up to date"; return 0; fi
  wheels=$(dependency_wheels "$extras")
  ctx=$BASE/build/$(basename "$dockerfile" .Dockerfile)
  rm -rf "$ctx" && mkdir -p "$ctx/docker/wheels"
  (cd "$REPO" && git ls-files -co --exclude-standard -- src pyproject.toml README.md LICENSE \
    .dockerignore "docker/$dockerfile" | tar -cf - -T - | tar -C "$ctx" -xf -)
  cp -l "$wheels"/*.whl "$ctx/docker/wheels/" 2>/dev/null || cp "$wheels"/*.whl "$ctx/docker/wheels/"
  nice "$DOCKER" build -q --network none -f "$ctx/docker/$dockerfile" -t "$tag" \
    --label "$LABEL" --label "atoll.source_hash=$hash" --build-arg BASE_IMAGE="$PYTHON_IMAGE" --build-arg TORCH_REQUIREMENT= \
    --build-arg PIP_NO_INDEX=1 --build-arg PIP_FIND_LINKS=/tmp/atoll-src/docker/wheels \
    "$ctx" >/dev/null || die "docker build of docker/$dockerfile failed (rerun without -q to see why)"
  rm -rf "$ctx"
  # The previous build of this tag, now untagged, is of no use.
  "$DOCKER" image prune -f --filter "label=$LABEL" >/dev/null
  log "built $tag from docker/$dockerfile"
}

write_env() {
  cat >"$BASE/env" <<EOF
DOCKER_HOST=unix://$SOCK
ATOLL_DOCKER_BASE=$BASE
ATOLL_TEST_BUSYBOX_IMAGE=$BUSYBOX_IMAGE
ATOLL_TEST_PYTHON_IMAGE=$PYTHON_IMAGE
ATOLL_TEST_JOB_IMAGE=$JOB_IMAGE
ATOLL_TEST_PARENT_IMAGE=$PARENT_IMAGE
EOF
}

cmd_up() {
  install_packages
  mkdir -p "$BASE" "$CACHE"
  start_engine
  wants busybox && build_busybox
  if wants python || wants job || wants parent; then build_python_base; fi
  wants job && build_from_dockerfile job.Dockerfile "$JOB_IMAGE" ""
  wants parent && build_from_dockerfile parent.Dockerfile "$PARENT_IMAGE" docker,k8s
  write_env
  log "ready: source $BASE/env (or: export DOCKER_HOST=unix://$SOCK)"
}

cmd_status() {
  engine_up || { log "no engine answering on $SOCK"; return 1; }
  local missing=() name tag
  for name in $IMAGES; do
    case $name in
      busybox) tag=$BUSYBOX_IMAGE ;; python) tag=$PYTHON_IMAGE ;;
      job) tag=$JOB_IMAGE ;; parent) tag=$PARENT_IMAGE ;; *) die "unknown image '$name'" ;;
    esac
    have_image "$tag" || missing+=("$tag")
  done
  ((${#missing[@]} == 0)) || { log "engine up, images missing: ${missing[*]} (run: $0 up)"; return 1; }
  local hash stale=()
  hash=$(source_hash)
  for tag in $JOB_IMAGE $PARENT_IMAGE; do
    if have_image "$tag" && [[ $(image_hash "$tag") != "$hash" ]]; then stale+=("$tag"); fi
  done
  ((${#stale[@]} == 0)) || { log "built from an older working tree: ${stale[*]} (run: $0 up)"; return 1; }
  [[ -f $BASE/env ]] || write_env
  log "engine up on $SOCK with $IMAGES images; env in $BASE/env"
}

remove_labelled() {
  local ids
  ids=$("$DOCKER" ps -aq --filter "label=$LABEL")
  [[ -z $ids ]] || "$DOCKER" rm -f $ids >/dev/null
  ids=$("$DOCKER" images -q --filter "label=$LABEL" | sort -u)
  [[ -z $ids ]] || "$DOCKER" rmi -f $ids >/dev/null
  "$DOCKER" image prune -f >/dev/null
}

cmd_down() {
  # A failed clean-up (an image still in use, say) must not leave the engine running.
  if engine_up && ! remove_labelled; then
    log "some labelled containers or images could not be removed; stopping the engine anyway"
  fi
  # Every dockerd serving this socket, not only the one in the pid file: a pid file lost to an
  # interrupted run must not leave an engine behind.
  local pids pid
  pids=$( { cat "$BASE/dockerd.pid" 2>/dev/null || true; echo; pgrep -f -- "dockerd -H unix://$SOCK( |$)" || true; } | sort -u)
  for pid in $pids; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in $pids; do
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then log "dockerd $pid did not stop in 20 s: killing it"; kill -KILL "$pid"; fi
  done
  rm -f "$BASE/dockerd.pid" "$BASE/env"
  log "down (engine stopped; cached root filesystem and wheels kept in $CACHE)"
}

case "${1:-}" in
  up) cmd_up ;;
  status) cmd_status ;;
  down) cmd_down ;;
  env) cat "$BASE/env" ;;
  *) echo "usage: $0 up|status|down|env" >&2; exit 2 ;;
esac
