#!/usr/bin/env bash
# A real single-node Kubernetes (v1.20.2) for atoll's tests, built from Debian's source package.
#
#   k8s.sh build    build kube-apiserver, -controller-manager, -scheduler, kubelet (~6 min once;
#                   cached in $ATOLL_K8S_CACHE, default ~/.cache/atoll/k8s-bin)
#   k8s.sh up       start a private dockerd, etcd, the control plane and a kubelet; wait for Ready
#   k8s.sh status   exit 0 when every component runs and the node is Ready
#   k8s.sh down     stop everything and remove $ATOLL_K8S_BASE (keeps the build cache)
#   k8s.sh images   (re)build the local test images into the kubelet's dockerd
#   k8s.sh env      print the env file (KUBECONFIG, the image names)
#
# Everything listens on 127.0.0.1 or a unix socket; nothing is pulled from a registry. After `up`,
# $ATOLL_K8S_BASE/kubeconfig is a cluster-admin kubeconfig and $ATOLL_K8S_BASE/env holds
# KUBECONFIG and the test image names. Settings (environment):
#   ATOLL_K8S_BASE     state, logs, sockets (default /tmp/atoll-k8s)
#   ATOLL_K8S_CACHE    built binaries (default ~/.cache/atoll/k8s-bin)
#   ATOLL_K8S_IMAGES   test images (default "busybox job parent"; "job" = Debian's Python + atoll's wheel,
#                      built offline by scripts/backends/docker.sh's recipe; "parent" = docker/parent.Dockerfile)
#   ATOLL_K8S_APISERVER_PORT (16443), ATOLL_K8S_ETCD_PORT (12379, +1 for peers),
#   ATOLL_K8S_KUBELET_PORT (10250), ATOLL_K8S_NODE (127.0.0.1: the node name)
# Why each setting is there: docs/launchers/kubernetes.md, "The test cluster".
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${ATOLL_K8S_CACHE:-$HOME/.cache/atoll/k8s-bin}
BASE=${ATOLL_K8S_BASE:-/tmp/atoll-k8s}
BIN=$CACHE/bin
APISERVER_PORT=${ATOLL_K8S_APISERVER_PORT:-16443}
ETCD_PORT=${ATOLL_K8S_ETCD_PORT:-12379}
KUBELET_PORT=${ATOLL_K8S_KUBELET_PORT:-10250}
# The node's name is its address: the kubelet takes an IP given as its hostname as the node's
# InternalIP without the loopback check it applies to --node-ip, so the API server reaches the
# kubelet (logs) on 127.0.0.1, where it listens.
NODE=${ATOLL_K8S_NODE:-127.0.0.1}
IMAGES=${ATOLL_K8S_IMAGES:-busybox job parent}
DEBIAN_PACKAGES=(dpkg-dev golang-go golang-github-modern-go-reflect2-dev etcd-server docker.io rsync
  openssl curl)
COMPONENTS=(kube-apiserver kube-controller-manager kube-scheduler kubelet)
DAEMONS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet)
PKI=$BASE/pki
URL=https://127.0.0.1:$APISERVER_PORT
DOCKER_BASE=$BASE/docker
DOCKER_SOCK=$DOCKER_BASE/docker.sock
PAUSE_IMAGE=k8s.gcr.io/pause:3.2
PYTHON_BIN=$(command -v /usr/bin/python3 || command -v python3)

log() { printf '[k8s.sh] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

install_packages() {
  local missing=() p
  for p in "${DEBIAN_PACKAGES[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  ((${#missing[@]} == 0)) && return 0
  [[ $(id -u) == 0 ]] || die "missing ${missing[*]}: run as root or apt-get install them"
  log "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq -o DPkg::Lock::Timeout=900 \
    "${missing[@]}" >/dev/null
}

# The machine's own Debian mirror, read from its apt sources (deb822 or one-line format).
debian_mirror() {
  {
    grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
      awk '$3 == "bookworm" {print $2}'
    awk '/^URIs:/ {u = $2} /^Suites:/ {for (i = 2; i <= NF; i++) if ($i == "bookworm") print u}' \
      /etc/apt/sources.list.d/*.sources 2>/dev/null
  } | head -1
}

# --- build -------------------------------------------------------------------------------------
built() { for c in "${COMPONENTS[@]}" pause; do [[ -x $BIN/$c ]] || return 1; done; }

cmd_build() {
  if built; then log "binaries present in $BIN"; return 0; fi
  install_packages
  local work=$CACHE/work mirror src t0=$SECONDS
  mirror=$(debian_mirror)
  [[ -n $mirror ]] || die "no bookworm mirror found in /etc/apt/sources*: add one"
  rm -rf "$work" && mkdir -p "$work/apt/lists/partial" "$work/apt/archives/partial" "$BIN"
  # A private deb-src list: the machine's apt configuration is left untouched.
  echo "deb-src $mirror bookworm main" >"$work/apt/sources.list"
  local apt=(-o Dir::Etc::SourceList="$work/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o Dir::State::Lists="$work/apt/lists" -o Dir::Cache::Archives="$work/apt/archives")
  apt-get "${apt[@]}" update -qq 2>/dev/null
  (cd "$work" && apt-get "${apt[@]}" source -qq kubernetes 2>/dev/null)
  src=$(find "$work" -maxdepth 1 -type d -name 'kubernetes-*' | head -1)
  [[ -d $src ]] || die "apt-get source kubernetes produced no source tree in $work"
  # The vendored reflect2 1.0.1 crashes the API server under Go >= 1.18: use Debian's.
  rm -rf "$src/vendor/github.com/modern-go/reflect2"
  cp -r /usr/share/gocode/src/github.com/modern-go/reflect2 "$src/vendor/github.com/modern-go/"
  log "compiling ${COMPONENTS[*]} (about 6 minutes)"
  # GOPATH mode, as debian/rules does it.
  mkdir -p "$src/.go/src/k8s.io"
  ln -sfn ../../.. "$src/.go/src/k8s.io/kubernetes"
  (cd "$src" && env GOPATH="$src/.go" CGO_ENABLED=0 HOME="$work/home" PATH="/usr/lib/go/bin:$PATH" \
    nice -n 19 make WHAT="${COMPONENTS[*]/#/cmd/}" >"$work/make.log" 2>&1) ||
    die "make failed: see $work/make.log"
  for c in "${COMPONENTS[@]}"; do cp "$src/_output/bin/$c" "$BIN/$c"; done
  # The pod sandbox ("pause") program, from the same source tree.
  gcc -Os -static -DVERSION=v3.2-atoll -o "$BIN/pause" "$src/build/pause/linux/pause.c"
  rm -rf "$work"
  log "built into $BIN in $((SECONDS - t0))s"
}

# --- helpers -----------------------------------------------------------------------------------
api() { curl -sf --max-time 5 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$@"; }
pid_of() { cat "$BASE/run/$1.pid" 2>/dev/null; }
running() { local pid; pid=$(pid_of "$1") && kill -0 "$pid" 2>/dev/null; }

start() {  # start NAME CMD...: a daemon in its own session, logged to $BASE/logs/NAME.log
  local name=$1
  shift
  running "$name" && return 0
  setsid "$@" >"$BASE/logs/$name.log" 2>&1 </dev/null &
  echo $! >"$BASE/run/$name.pid"
}

wait_for() {  # wait_for NAME SECONDS CMD...: until CMD succeeds, NAME exits or time is up
  local name=$1 secs=$2 i
  shift 2
  for ((i = 0; i < secs * 5; i++)); do
    "$@" >/dev/null 2>&1 && return 0
    running "$name" || die "$name exited: see $BASE/logs/$name.log"
    sleep 0.2
  done
  die "$name not ready after ${secs}s: see $BASE/logs/$name.log"
}

stop() {
  local pid
  pid=$(pid_of "$1") || return 0
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; fi
  fi
  rm -f "$BASE/run/$1.pid"
}

# --- configuration -----------------------------------------------------------------------------
issue_cert() {  # issue_cert NAME SUBJECT [SUBJECT_ALT_NAMES]: a CA-signed key pair in $PKI
  local ext="extendedKeyUsage=serverAuth,clientAuth"
  [[ -n ${3:-} ]] && ext+=$'\n'"subjectAltName=$3"
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj "$2" \
    -keyout "$PKI/$1.key" -out "$PKI/$1.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 30 -extfile <(printf '%s\n' "$ext") -out "$PKI/$1.crt" 2>/dev/null
}

make_pki() {
  [[ -f $PKI/admin.crt ]] && return 0
  mkdir -p "$PKI" && chmod 700 "$PKI"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 30 \
    -subj /CN=atoll-test-ca -keyout "$PKI/ca.key" -out "$PKI/ca.crt" 2>/dev/null
  issue_cert apiserver /CN=kube-apiserver \
    "DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,IP:127.0.0.1,IP:10.0.0.1"
  # One cluster-admin identity (system:masters) for the components and the tests' admin client.
  issue_cert admin "/O=system:masters/CN=atoll-admin"
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
}

write_kubeconfig() {
  cat >"$BASE/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: atoll-test
  cluster: {server: "$URL", certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")}
users:
- name: atoll-admin
  user:
    client-certificate-data: $(base64 -w0 "$PKI/admin.crt")
    client-key-data: $(base64 -w0 "$PKI/admin.key")
contexts:
- name: atoll-test
  context: {cluster: atoll-test, user: atoll-admin}
current-context: atoll-test
EOF
  chmod 600 "$BASE/kubeconfig"
}

# This sandbox refuses a negative oom_score_adj even to root, and the kubelet asks for -998 for
# pod sandboxes: the engine's default runtime is runc behind this clamp.
write_runc_clamp() {
  cat >"$BASE/runc-clamp" <<'EOF'
#!/bin/bash
args=("$@")
for ((i = 0; i < ${#args[@]} - 1; i++)); do
  if [[ ${args[i]} == --bundle || ${args[i]} == -b ]]; then
    sed -i -E 's/"oomScoreAdj":-[0-9]+/"oomScoreAdj":0/' "${args[i + 1]}/config.json"
  fi
done
exec runc "$@"
EOF
  chmod 755 "$BASE/runc-clamp"
}

write_kubelet_config() {
  cat >"$BASE/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: "$PKI/ca.crt"}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
failSwapOn: false
oomScoreAdj: 0
hairpinMode: none
makeIPTablesUtilChains: false
# Test images are built into the engine and never pulled: no image garbage collection, and
# evictions only when the machine is really out of room.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 1Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
EOF
}

# --- the kubelet's Docker Engine and images ----------------------------------------------------
docker_sh() {
  ATOLL_DOCKER_BASE=$DOCKER_BASE ATOLL_DOCKER_SOCK=$DOCKER_SOCK ATOLL_DOCKER_IMAGES=$IMAGES \
    ATOLL_DOCKERD_ARGS="--add-runtime atoll-runc=$BASE/runc-clamp --default-runtime atoll-runc" \
    bash "$HERE/docker.sh" "$@"
}

docker_cli() { DOCKER_HOST=unix://$DOCKER_SOCK /usr/bin/docker "$@"; }

build_pause_image() {
  docker_cli image inspect "$PAUSE_IMAGE" >/dev/null 2>&1 && return 0
  local root
  root=$(mktemp -d)
  cp "$BIN/pause" "$root/pause"
  tar -C "$root" -c . | docker_cli import -c 'ENTRYPOINT ["/pause"]' - "$PAUSE_IMAGE" >/dev/null
  rm -rf "$root"
}

write_env() {
  {
    echo "KUBECONFIG=$BASE/kubeconfig"
    echo "ATOLL_K8S_BASE=$BASE"
    echo "ATOLL_K8S_NODE=$NODE"
    echo "ATOLL_K8S_DOCKER_HOST=unix://$DOCKER_SOCK"
    local name
    for name in $IMAGES; do  # only the images built into the kubelet's engine
      docker_sh env | sed -n "s/^ATOLL_TEST_\(${name^^}\)_IMAGE=/ATOLL_K8S_\1_IMAGE=/p"
    done
  } >"$BASE/env"
}

# --- the node ----------------------------------------------------------------------------------
node_json() { api "$URL/api/v1/nodes/$NODE"; }

node_ready() {
  node_json | "$PYTHON_BIN" -c '
import json, sys
node = json.load(sys.stdin)
ready = [c for c in node["status"].get("conditions", []) if c["type"] == "Ready"]
sys.exit(0 if ready and ready[0]["status"] == "True" else 1)'
}

# Two fake GPUs for scheduling tests (the kubelet keeps extended resources it did not set).
patch_node() {
  api -X PATCH -H 'Content-Type: application/merge-patch+json' "$URL/api/v1/nodes/$NODE/status" \
    -d '{"status": {"capacity": {"nvidia.com/gpu": "2"}}}' >/dev/null
}

# --- commands ----------------------------------------------------------------------------------
cmd_up() {
  local t0=$SECONDS
  built || cmd_build
  install_packages
  mkdir -p "$BASE"/{logs,run,etcd} "$BASE"/kubelet/{root,pki,dockershim,plugins}
  make_pki
  write_kubeconfig
  write_runc_clamp
  docker_sh up
  build_pause_image

  start etcd etcd --name atoll --data-dir "$BASE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
    --initial-cluster "atoll=http://127.0.0.1:$((ETCD_PORT + 1))"
  wait_for etcd 30 curl -sf "http://127.0.0.1:$ETCD_PORT/health"

  start kube-apiserver "$BIN/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
    --insecure-port 0 --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" --authorization-mode Node,RBAC \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range 10.0.0.0/24 --endpoint-reconciler-type none \
    --kubelet-client-certificate "$PKI/admin.crt" --kubelet-client-key "$PKI/admin.key"
  wait_for kube-apiserver 60 api "$URL/readyz"

  start kube-controller-manager "$BIN/kube-controller-manager" --kubeconfig "$BASE/kubeconfig" \
    --bind-address 127.0.0.1 --port 0 --secure-port 0 --leader-elect=false \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --flex-volume-plugin-dir "$BASE/kubelet/plugins" \
    --pvclaimbinder-sync-period 2s  # a claim created just before its volume binds in seconds
  start kube-scheduler "$BIN/kube-scheduler" --kubeconfig "$BASE/kubeconfig" \
    --bind-address 127.0.0.1 --port 0 --secure-port 0 --leader-elect=false

  write_kubelet_config
  start kubelet "$BIN/kubelet" --kubeconfig "$BASE/kubeconfig" --config "$BASE/kubelet/config.yaml" \
    --container-runtime docker --docker-endpoint "unix://$DOCKER_SOCK" \
    --pod-infra-container-image "$PAUSE_IMAGE" --hostname-override "$NODE" \
    --root-dir "$BASE/kubelet/root" --cert-dir "$BASE/kubelet/pki" \
    --experimental-dockershim-root-directory "$BASE/kubelet/dockershim" \
    --volume-plugin-dir "$BASE/kubelet/plugins"
  wait_for kubelet 60 node_json
  patch_node
  wait_for kubelet 60 node_ready
  write_env
  log "ready in $((SECONDS - t0))s: node $NODE; source $BASE/env (KUBECONFIG=$BASE/kubeconfig)"
}

cmd_status() {
  [[ -f $BASE/kubeconfig ]] || { log "not up (no $BASE/kubeconfig): run $0 up"; return 1; }
  local c
  for c in "${DAEMONS[@]}"; do
    running "$c" || { log "$c is not running: run $0 up"; return 1; }
  done
  node_ready || { log "node $NODE is not Ready: see $BASE/logs/kubelet.log"; return 1; }
  local name tag why
  for name in $IMAGES; do
    tag=$(docker_sh env | sed -n "s/^ATOLL_TEST_${name^^}_IMAGE=//p")
    docker_cli image inspect "$tag" >/dev/null 2>&1 ||
      { log "test image $tag missing: run $0 images"; return 1; }
  done
  # An image built from an older working tree still runs; `images` (or `up`) rebuilds it.
  if ! why=$(docker_sh status 2>&1 >/dev/null); then
    why=${why##*] }
    log "warning: ${why%% (run:*}; rebuild them: $0 images"
  fi
  log "node $NODE Ready, images: $IMAGES; KUBECONFIG=$BASE/kubeconfig"
}

# The kubelet writes a few fixed host paths: pod log folders (links into our engine's data) and
# its device-plugin socket. Remove what points into $BASE; leave anything another kubelet owns.
clean_host_paths() {
  local d
  for d in /var/log/pods/*/; do
    [[ -d $d ]] || continue
    if [[ -n $(find "$d" -type l -lname "$BASE/*" -print -quit) ]]; then rm -rf "$d"; fi
  done
  find /var/log/pods -mindepth 1 -type d -empty -delete 2>/dev/null || true
  find /var/log/containers -maxdepth 1 -xtype l -lname '/var/log/pods/*' -delete 2>/dev/null || true
  if ! pgrep -x kubelet >/dev/null; then
    rm -f /var/lib/kubelet/device-plugins/{kubelet.sock,DEPRECATION}
    rmdir /var/lib/kubelet/device-plugins /var/lib/kubelet 2>/dev/null || true
  fi
}

cmd_down() {
  [[ -d $BASE ]] || { log "nothing to stop ($BASE absent)"; return 0; }
  stop kubelet
  if [[ -S $DOCKER_SOCK ]]; then
    local ids
    ids=$(docker_cli ps -aq 2>/dev/null || true)
    # shellcheck disable=SC2086  # a list of container ids
    [[ -z $ids ]] || docker_cli rm -f $ids >/dev/null 2>&1 || true
  fi
  docker_sh down || true  # also when the socket is gone: it stops any engine left on it
  local c
  for c in kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$c"; done
  # Volumes the kubelet mounted (Secret volumes are tmpfs) must go before the files.
  awk -v base="$BASE/" 'index($2, base) == 1 {print $2}' /proc/mounts | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null || true; done
  clean_host_paths
  rm -rf "$BASE"
  log "down ($BASE removed; binaries kept in $BIN)"
}

cmd_images() {
  write_runc_clamp
  docker_sh up
  build_pause_image
  if [[ -f $BASE/kubeconfig ]]; then write_env; fi
}

case "${1:-}" in
  build) cmd_build ;;
  up) cmd_up ;;
  status) cmd_status ;;
  down) cmd_down ;;
  images) cmd_images ;;
  env) cat "$BASE/env" ;;
  *) echo "usage: $0 build|up|down|status|images|env" >&2; exit 2 ;;
esac
