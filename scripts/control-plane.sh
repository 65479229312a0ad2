#!/usr/bin/env bash
# A real Kubernetes control plane on loopback, for kart's tests and for trying the operator
# without a cluster: etcd, kube-apiserver, kube-controller-manager and kube-scheduler, built from
# their Go modules (scripts/control-plane/go.mod: k8s.io/kubernetes with its staging modules
# replaced by their published releases, and etcd at the version Kubernetes pins).
#
#   scripts/control-plane.sh build       build the binaries once (cached, see below); print their folder
#   scripts/control-plane.sh build-node  the same for the real node's own (control-plane/node.sh)
#   scripts/control-plane.sh build-kueue the same for Kueue's manager (control-plane/kueue.sh)
#   scripts/control-plane.sh build-kwok  the same for KWOK (control-plane/kwok.sh)
#   scripts/control-plane.sh up DIR [--etcd-in-memory] [--node kubelet|none] [--kueue] [--kwok N]
#                                        start the control plane with its state in DIR; write
#                                        DIR/kubeconfig (cluster admin) and wait until the API answers
#                                        and, with a node (`kubelet`, the default: see
#                                        control-plane/node.sh; it needs root), until its Node is
#                                        Ready; `none` starts no node (Pods stay Pending: the API
#                                        machinery alone, which needs no root); `--kueue` installs
#                                        Kueue and runs its manager (control-plane/kueue.sh);
#                                        `--kwok N` adds N simulated GPU nodes (control-plane/kwok.sh)
#   scripts/control-plane.sh down DIR    stop exactly what `up DIR` started
#
# The binaries are cached outside the clone, in $KART_CONTROL_PLANE_CACHE (default
# ~/.cache/kart/control-plane), under a hash of the module files: a cold build takes minutes, a
# warm one nothing. The API server authenticates with static tokens (DIR/tokens.csv: the admin in
# system:masters, the controller manager and the scheduler as their system users), authorises
# with Node and RBAC, runs the default admission plugins plus NodeRestriction, and signs service
# account tokens with a key of its own; its serving certificate is self-signed (DIR/pki).
# DIR/operator.kubeconfig is user `kart-operator` (bound to cluster-admin), whose every request
# the API server writes to its audit log, DIR/logs/audit.log (JSON lines at level Metadata), so
# the requests an operator run with it makes can be counted (`kart bench operator`).
#
# The node (`--node kubelet`) registers Node `kart-node` as system:node:kart-node; rancher's
# local-path-provisioner provisions the volumes of StorageClass `kart-local` (the default class)
# as user kart-node-provisioner, bound to Kubernetes' own ClusterRole
# system:persistent-volume-provisioner.
#
# `KART_CONTROL_PLANE_OWNER` (a pid): `up` leaves a watcher that runs `down DIR` when that process
# ends, so a test killed by a signal leaves nothing running.
#
# etcd keeps its data in DIR/etcd and syncs it to disk, as a cluster's does. `--etcd-in-memory`
# (the tests) keeps it in a folder of /dev/shm (a tmpfs, removed by `down`) with etcd's
# `--unsafe-no-fsync`: a test cluster's data need not outlive it, and an fsync on a disk busy with
# a build's writes can wait tens of seconds (one waited 45 s in CI), long enough for etcd's
# requests, and with them the API server's, to time out. `KART_CONTROL_PLANE_PORTS` ("ETCD PEER
# API", three free loopback ports) lets a caller that reserves ports hand them in; else `up`
# picks them.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
module="$here/control-plane"
cache="${KART_CONTROL_PLANE_CACHE:-$HOME/.cache/kart/control-plane}"
version="v1.37.2"
tools=(k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager
  k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
  go.etcd.io/etcd/server/v3 ./coredns)
binaries=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy etcd coredns)

die() { echo "control-plane: $*" >&2; exit 1; }

# Builds the binaries unless the cache has them; prints their folder.
build() {
  command -v go >/dev/null || die "the Go toolchain is required to build the control plane"
  local key bin ld="-s -w"
  # The version the binaries report (kubectl and Helm read it), as Kubernetes' release build sets it.
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=37 -X $pkg.gitTreeState=clean"
  done
  key="$( (cat "$module/go.mod" "$module/go.sum" "$module/coredns/main.go"; echo "$ld") | sha256sum | cut -c1-16)"
  bin="$cache/$key"
  if [ ! -x "$bin/etcd" ]; then
    echo "control-plane: building Kubernetes $version and etcd into $bin (minutes, once)" >&2
    local tmp="$bin.partial"
    rm -rf "$tmp" && mkdir -p "$tmp"
    (cd "$module" && go build -trimpath -buildvcs=false -ldflags "$ld" -o "$tmp/" "${tools[@]}")
    mv "$tmp/server" "$tmp/etcd"
    for b in "${binaries[@]}"; do [ -x "$tmp/$b" ] || die "the build left no $b"; done
    rm -rf "$bin" && mv "$tmp" "$bin"
  fi
  echo "$bin"
}

# Three distinct free TCP ports on loopback (etcd's client and peer ports, the API server's): the
# sockets are held until all three are chosen, so no two are the same.
free_ports() {
  python3 -c 'import socket
held = [socket.socket() for _ in range(3)]
for s in held:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in held))'
}

# Starts `name` (a binary of the build) in the background, in its own session, logging to
# DIR/logs/name.log; records its pid.
start() {
  local dir="$1" name="$2"; shift 2
  setsid "$bin/$name" "$@" >"$dir/logs/$name.log" 2>&1 < /dev/null &
  echo "$! $name" >>"$dir/pids"
}

# A kubeconfig for `user` with `token` against the API server at port `port` of `host` (default
# loopback).
kubeconfig() {
  local dir="$1" port="$2" user="$3" token="$4" host="${5:-127.0.0.1}"
  cat <<EOF
apiVersion: v1
kind: Config
clusters:
- name: kart
  cluster:
    server: https://$host:$port
    certificate-authority: $dir/pki/apiserver.crt
users:
- name: $user
  user:
    token: $token
contexts:
- name: kart
  context: {cluster: kart, user: $user, namespace: default}
current-context: kart
EOF
}

# Where the API server is reached: loopback, or with a real node the host's end of its veth (the
# address its certificate names).
api_host=127.0.0.1

# How long `up` waits for each stage on a busy machine: a deadline, never a count of tries.
STAGE_SECONDS=600

# Fails naming `what`, with the end of every component's log.
fail_with_logs() {
  local dir="$1" what="$2" log
  for log in "$dir"/logs/*.log; do
    [ -f "$log" ] && { echo "--- the end of $log:"; tail -n 20 "$log"; } >&2
  done
  die "$what"
}

# Fails (with the logs) if a component started so far has exited.
check_alive() {
  local dir="$1" pid name
  while read -r pid name; do
    kill -0 "$pid" 2>/dev/null || fail_with_logs "$dir" "$name exited; its log: $dir/logs/$name.log"
  done <"$dir/pids"
}

# Waits until `url` answers 200 with `token` (and, given `text`, a body holding it once blanks are
# removed), polling until the stage's deadline; fails naming `what`.
wait_ready() {
  local url="$1" token="$2" what="$3" dir="$4" text="${5:-}" deadline=$((SECONDS + STAGE_SECONDS)) body
  while :; do
    if body="$(curl -fsS --cacert "$dir/pki/apiserver.crt" -H "Authorization: Bearer $token" "$url" 2>&1)" \
      && { [ -z "$text" ] || tr -d ' \n' <<<"$body" | grep -qF -- "$text"; }; then
      return 0
    fi
    [ $SECONDS -lt $deadline ] || fail_with_logs "$dir" "$what: not within ${STAGE_SECONDS}s; the last answer: $body"
    check_alive "$dir"
    sleep 0.2
  done
}

# Creates the object `body` (JSON) at API path `path` as the admin, trying again until the stage's
# deadline while the API server fails; one that exists already (an earlier try that got through
# unanswered) counts as created.
create() {
  local dir="$1" port="$2" token="$3" path="$4" body="$5" deadline=$((SECONDS + STAGE_SECONDS)) code
  while :; do
    code="$(curl -sS -o "$dir/logs/create.out" -w '%{http_code}' --cacert "$dir/pki/apiserver.crt" \
      -H "Authorization: Bearer $token" -H 'Content-Type: application/json' -X POST --data "$body" \
      "https://$api_host:$port$path" 2>>"$dir/logs/create.out")" || code=000
    case "$code" in
      201|200|409) return 0 ;;
      # An object the API server refuses is a mistake of this script's, not a transient failure.
      400|403|404|422) fail_with_logs "$dir" "creating $path: HTTP $code: $(cat "$dir/logs/create.out")" ;;
    esac
    [ $SECONDS -lt $deadline ] || fail_with_logs "$dir" "creating $path: HTTP $code: $(cat "$dir/logs/create.out")"
    check_alive "$dir"
    sleep 0.5
  done
}

up() {
  local dir="$1" etcd_in_memory="" etcd_data etcd_flags=() node=kubelet kueue="" kwok=0
  shift
  while [ $# -gt 0 ]; do
    case "$1" in
      --etcd-in-memory) etcd_in_memory=1 ;;
      --kueue) kueue=1 ;;
      --kwok) kwok="${2:-}"; shift
        [[ "$kwok" =~ ^[1-9][0-9]*$ ]] || die "up: --kwok '$kwok': a number of nodes" ;;
      --node) node="${2:-}"; shift
        case "$node" in kubelet|none) ;; *) die "up: --node '$node': one of kubelet, none" ;; esac ;;
      *) die "up: unknown option '$1' (--etcd-in-memory, --node kubelet|none, --kueue, --kwok N)" ;;
    esac
    shift
  done
  [ ! -s "$dir/pids" ] || die "$dir already holds a running control plane (down it first)"
  bin="$(build)"
  mkdir -p "$dir/logs" "$dir/pki"
  dir="$(cd "$dir" && pwd)"
  : >"$dir/pids"
  # A failed start stops what it started.
  # shellcheck disable=SC2064 # $dir as it is now: the trap may run outside this function.
  trap "down '$dir'" EXIT
  if [ -n "$etcd_in_memory" ]; then
    [ "$(stat -f -c %T /dev/shm 2>/dev/null)" = tmpfs ] || die "--etcd-in-memory: /dev/shm is not a tmpfs"
    etcd_data="$(mktemp -d /dev/shm/kart-etcd.XXXXXX)"
    echo "$etcd_data" >"$dir/etcd-in-memory"
    etcd_flags=(--unsafe-no-fsync)
  else
    etcd_data="$dir/etcd"
  fi
  chmod 700 "$etcd_data"
  command -v openssl >/dev/null || die "openssl is required (service account keys)"
  [ -f "$dir/pki/sa.key" ] || openssl genrsa -out "$dir/pki/sa.key" 2048 2>/dev/null
  openssl rsa -in "$dir/pki/sa.key" -pubout -out "$dir/pki/sa.pub" 2>/dev/null
  local admin cm scheduler node_token provisioner proxy coredns operator
  admin="$(openssl rand -hex 16)"; cm="$(openssl rand -hex 16)"; scheduler="$(openssl rand -hex 16)"
  node_token="$(openssl rand -hex 16)"; provisioner="$(openssl rand -hex 16)"
  proxy="$(openssl rand -hex 16)"; coredns="$(openssl rand -hex 16)"; operator="$(openssl rand -hex 16)"
  cat >"$dir/tokens.csv" <<EOF
$admin,kart-admin,kart-admin,"system:masters"
$cm,system:kube-controller-manager,system:kube-controller-manager
$scheduler,system:kube-scheduler,system:kube-scheduler
$node_token,system:node:kart-node,system:node:kart-node,"system:nodes"
$provisioner,kart-node-provisioner,kart-node-provisioner
$proxy,system:kube-proxy,system:kube-proxy
$coredns,system:coredns,system:coredns
$operator,kart-operator,kart-operator
EOF
  cat >"$dir/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: [kart-operator]
- level: None
EOF
  # The API server's address: loopback without a node, the host's end of the node's veth with
  # the kubelet (which the Pods reach through the `kubernetes` Service). The kubelet's serving
  # certificate and the API server's client certificate to it come from a CA of the cluster's.
  local n="" api_flags=(--bind-address 127.0.0.1 --advertise-address 127.0.0.1
    --endpoint-reconciler-type none)
  if [ "$node" = kubelet ]; then
    node_build
    n="$(node_claim)"
    mkdir -p "$dir/node" && echo "$n" >"$dir/node/n"
    node_network "$n"
    api_host="10.123.$n.1"
    [ -f "$dir/pki/ca.key" ] || openssl req -x509 -newkey rsa:2048 -nodes -keyout "$dir/pki/ca.key" \
      -out "$dir/pki/ca.crt" -days 30 -subj /CN=kart-cluster-ca 2>/dev/null
    node_cert "$dir" kubelet /CN=kart-node "IP:10.123.$n.2,DNS:kart-node"
    node_cert "$dir" apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
    api_flags=(--bind-address 0.0.0.0 --advertise-address "$api_host"
      --kubelet-client-certificate "$dir/pki/apiserver-kubelet-client.crt"
      --kubelet-client-key "$dir/pki/apiserver-kubelet-client.key"
      --kubelet-certificate-authority "$dir/pki/ca.crt" --kubelet-preferred-address-types InternalIP)
  fi
  echo "$api_host" >"$dir/api-host"
  local etcd_port peer_port api_port
  read -r etcd_port peer_port api_port <<<"${KART_CONTROL_PLANE_PORTS:-$(free_ports)}"
  [ -n "$api_port" ] || die "KART_CONTROL_PLANE_PORTS: three ports are needed, got '$KART_CONTROL_PLANE_PORTS'"

  start "$dir" etcd --name kart --data-dir "$etcd_data" "${etcd_flags[@]}" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$peer_port" --initial-advertise-peer-urls "http://127.0.0.1:$peer_port" \
    --initial-cluster "kart=http://127.0.0.1:$peer_port" --listen-metrics-urls "" --log-level warn

  start "$dir" kube-apiserver --etcd-servers "http://127.0.0.1:$etcd_port" \
    "${api_flags[@]}" --secure-port "$api_port" --cert-dir "$dir/pki" \
    --token-auth-file "$dir/tokens.csv" --authorization-mode Node,RBAC \
    --enable-admission-plugins NodeRestriction \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$dir/pki/sa.pub" --service-account-signing-key-file "$dir/pki/sa.key" \
    --service-cluster-ip-range 10.96.0.0/16 --allow-privileged=false \
    --audit-policy-file "$dir/audit-policy.yaml" --audit-log-path "$dir/logs/audit.log" \
    --audit-log-format json --audit-log-mode blocking --audit-log-maxsize 1024
  # The API server writes its self-signed certificate (and its CA) before it listens.
  local deadline=$((SECONDS + STAGE_SECONDS))
  until [ -s "$dir/pki/apiserver.crt" ]; do
    [ $SECONDS -lt $deadline ] || fail_with_logs "$dir" "kube-apiserver wrote no certificate within ${STAGE_SECONDS}s"
    check_alive "$dir"
    sleep 0.2
  done
  wait_ready "https://$api_host:$api_port/readyz" "$admin" "kube-apiserver ready" "$dir"

  kubeconfig "$dir" "$api_port" kart-admin "$admin" "$api_host" >"$dir/kubeconfig"
  kubeconfig "$dir" "$api_port" system:kube-controller-manager "$cm" "$api_host" >"$dir/controller-manager.kubeconfig"
  kubeconfig "$dir" "$api_port" system:kube-scheduler "$scheduler" "$api_host" >"$dir/scheduler.kubeconfig"
  kubeconfig "$dir" "$api_port" system:node:kart-node "$node_token" "$api_host" >"$dir/node.kubeconfig"
  kubeconfig "$dir" "$api_port" kart-node-provisioner "$provisioner" "$api_host" >"$dir/provisioner.kubeconfig"
  kubeconfig "$dir" "$api_port" system:kube-proxy "$proxy" "$api_host" >"$dir/proxy.kubeconfig"
  kubeconfig "$dir" "$api_port" system:coredns "$coredns" "$api_host" >"$dir/coredns.kubeconfig"
  kubeconfig "$dir" "$api_port" kart-operator "$operator" "$api_host" >"$dir/operator.kubeconfig"

  start "$dir" kube-controller-manager --kubeconfig "$dir/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$dir/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$dir/controller-manager.kubeconfig" \
    --service-account-private-key-file "$dir/pki/sa.key" --root-ca-file "$dir/pki/apiserver.crt" \
    --use-service-account-credentials --leader-elect=false --secure-port 0 \
    --controllers '*,-nodeipam'
  # Neither serves HTTPS (`--secure-port 0`): nothing here reads their health or metrics.
  start "$dir" kube-scheduler --kubeconfig "$dir/scheduler.kubeconfig" \
    --authentication-kubeconfig "$dir/scheduler.kubeconfig" --authorization-kubeconfig "$dir/scheduler.kubeconfig" \
    --leader-elect=false --secure-port 0

  # Named apart from the chart's own `kart-operator` binding (of its ServiceAccount), which a Helm
  # install into this cluster creates.
  create "$dir" "$api_port" "$admin" /apis/rbac.authorization.k8s.io/v1/clusterrolebindings '{
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "kart-operator-user"},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kart-operator"}]}'
  if [ "$node" = kubelet ]; then
    # CoreDNS reads Services, EndpointSlices, Pods and Namespaces (as CoreDNS's own manifests grant).
    create "$dir" "$api_port" "$admin" /apis/rbac.authorization.k8s.io/v1/clusterroles '{
      "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "system:coredns"},
      "rules": [{"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"], "verbs": ["list", "watch"]},
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]}]}'
    create "$dir" "$api_port" "$admin" /apis/rbac.authorization.k8s.io/v1/clusterrolebindings '{
      "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "system:coredns"},
      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:coredns"},
      "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "system:coredns"}]}'
    node_up "$dir" "$n" "$api_port" "$admin"
  fi

  # Ready when the controller manager has made the default namespace's service account (and the
  # Node reports Ready).
  wait_ready "https://$api_host:$api_port/api/v1/namespaces/default/serviceaccounts/default" "$admin" \
    "kube-controller-manager (the default service account)" "$dir"
  if [ "$node" = kubelet ]; then
    node_ready "$dir" "$n" "$api_port" "$admin"
  fi
  [ -z "$kueue" ] || kueue_up "$dir"
  [ "$kwok" -eq 0 ] || kwok_up "$dir" "$api_port" "$admin" "$kwok"
  trap - EXIT
  if [ -n "${KART_CONTROL_PLANE_OWNER:-}" ]; then
    # The owner's end, however it comes (a test killed by a signal never runs its clean-up), takes
    # the cluster down with it.
    setsid bash -c 'tail --pid="$1" -f /dev/null; exec bash "$2" down "$3"' watcher \
      "$KART_CONTROL_PLANE_OWNER" "$here/control-plane.sh" "$dir" >"$dir/logs/watcher.log" 2>&1 </dev/null &
    echo "$!" >"$dir/watcher"
  fi
  echo "control-plane: up; export KUBECONFIG=$dir/kubeconfig" >&2
}

down() {
  local dir="$1" watcher
  [ -f "$dir/pids" ] || { echo "control-plane: nothing started in $dir" >&2; return 0; }
  # The owner's watcher, unless this is it.
  if watcher="$(cat "$dir/watcher" 2>/dev/null)" && [ "$watcher" != $$ ]; then
    kill -TERM -- "-$watcher" 2>/dev/null || true
  fi
  rm -f "$dir/watcher"
  local pids=()
  while read -r pid name; do
    kill -TERM -- "-$pid" 2>/dev/null && pids+=("$pid")
  done < <(tac "$dir/pids")
  # etcd stops in about 2 s; the API server drains for a minute (its request time-out) while its
  # clients stop beside it, and holds nothing worth the wait; the node's containers go with its
  # cgroups below.
  local deadline=$((SECONDS + 10))
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null; do
      if [ $SECONDS -ge $deadline ]; then kill -KILL -- "-$pid" 2>/dev/null || true; fi
      sleep 0.1
    done
  done
  : >"$dir/pids"
  if [ -f "$dir/node/n" ]; then
    node_down "$dir" "$(cat "$dir/node/n")"
    rm -f "$dir/node/n"
  fi
  if [ -f "$dir/etcd-in-memory" ]; then
    rm -rf -- "$(cat "$dir/etcd-in-memory")"
    rm -f "$dir/etcd-in-memory"
  fi
}

# Builds binary `name` of Go package `package` at `version` (`go install`) unless the cache has
# it, one build at a time; sets tool_bin to its folder (keyed by the version and the Go toolchain).
go_tool_build() {
  local name="$1" package="$2" version="$3"
  command -v go >/dev/null || die "the Go toolchain is required to build $name"
  tool_bin="$cache/$name-$(echo "$version $(go version)" | sha256sum | cut -c1-16)"
  mkdir -p "$cache"
  (
    flock 8
    [ -x "$tool_bin/$name" ] && exit 0
    echo "control-plane: building $name $version (minutes, once)" >&2
    rm -rf "$tool_bin.partial" && mkdir -p "$tool_bin.partial"
    GOBIN="$tool_bin.partial" go install -trimpath -ldflags "-s -w" "$package@$version"
    rm -rf "$tool_bin" && mv "$tool_bin.partial" "$tool_bin"
  ) 8>"$cache/$name.lock"
}

# shellcheck source=control-plane/node.sh
source "$module/node.sh"
# shellcheck source=control-plane/kueue.sh
source "$module/kueue.sh"
# shellcheck source=control-plane/kwok.sh
source "$module/kwok.sh"

case "${1:-}" in
  build) build ;;
  build-node) node_build; echo "$node_bin" ;;
  build-kueue) kueue_build; echo "$kueue_bin" ;;
  build-kwok) kwok_build; echo "$kwok_bin" ;;
  up) [ -n "${2:-}" ] || die "usage: $0 up DIR [--etcd-in-memory] [--node kubelet|none] [--kueue] [--kwok N]"; shift; up "$@" ;;
  down) [ -n "${2:-}" ] || die "usage: $0 down DIR"; down "$2" ;;
  *) die "usage: $0 build | build-node | build-kueue | build-kwok | up DIR [--etcd-in-memory] [--node kubelet|none] [--kueue] [--kwok N] | down DIR" ;;
esac
