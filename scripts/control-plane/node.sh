# The real node of scripts/control-plane.sh (sourced by it): containerd with its CRI plugin, runc,
# a CNI bridge network (host-local IPAM, portmap), the kubelet, kube-proxy and CoreDNS as the
# cluster DNS, in a network namespace of its own so that several clusters run side by side.
#
# Network: node N (the first free of 1..250) is the network namespace kart-nN, joined to the host
# by a veth pair: the host's end 10.123.N.1 (where the API server is reached), the node's
# 10.123.N.2 (the Node's InternalIP), Pods in 10.124.N.0/24 (a host route leads there), Services
# in 10.96.0.0/16 (kube-proxy's iptables rules, inside the namespace), cluster DNS at 10.96.0.10.
# The node's processes run in that namespace; its cgroups are under /kart-nN of each cgroup v1
# hierarchy (the kubelet's cgroupRoot), its files under DIR/node.
#
# Built from Go modules (cached beside the control plane's binaries): the kubelet, kube-proxy and
# CoreDNS (control-plane/coredns: the plugins its Corefile uses) with the control plane;
# containerd, its runc shim and ctr at $containerd_version, runc at $runc_version (with libseccomp,
# for the RuntimeDefault profile; Debian 12's runc 1.1 fails to start containerd 2's sandboxes) and
# rancher's local-path-provisioner at $local_path_version. From Debian: libseccomp, the CNI plugins
# (containernetworking-plugins), iptables and conntrack (scripts/setup.sh installs them).

containerd_version="v2.4.2"
local_path_version="v0.0.30"
runc_version="v1.5.3"
node_tools=(github.com/containerd/containerd/v2/cmd/containerd
  github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2
  github.com/containerd/containerd/v2/cmd/ctr)
cni_bin=/usr/lib/cni
# The GPUs the Node reports (an extended resource the scheduler plans with; no device here).
node_gpus=4
# The Pod sandbox's image (Kubernetes' own pause program) and the Debian base (the storage
# provisioner's helper Pods), both built by scripts/images.sh.
pause_image="registry.k8s.io/pause:3.10"
base_image="localhost/kart-base:bookworm"

# Builds containerd (with its runc shim and ctr), runc (with libseccomp: the RuntimeDefault
# profile) and rancher's local-path-provisioner, each from its own module at its version (their
# dependencies conflict with Kubernetes' and with each other's), unless the cache has them; sets
# node_bin to their folder (one build at a time: tests start clusters side by side).
node_build() {
  local key
  key="$(echo "$containerd_version $runc_version $local_path_version $(go version)" | sha256sum | cut -c1-16)"
  node_bin="$cache/node-$key"
  mkdir -p "$cache"
  (
    flock 8
    [ -x "$node_bin/local-path-provisioner" ] && exit 0
    echo "control-plane: building containerd $containerd_version, runc $runc_version and local-path-provisioner $local_path_version (minutes, once)" >&2
    local tmp="$node_bin.partial" tool pkgs=()
    rm -rf "$tmp" && mkdir -p "$tmp"
    for tool in "${node_tools[@]}"; do pkgs+=("$tool@$containerd_version"); done
    GOBIN="$tmp" go install -trimpath -ldflags "-s -w" -tags no_btrfs "${pkgs[@]}"
    GOBIN="$tmp" go install -trimpath -ldflags "-s -w" -tags seccomp "github.com/opencontainers/runc@$runc_version"
    GOBIN="$tmp" go install -trimpath -ldflags "-s -w" "github.com/rancher/local-path-provisioner@$local_path_version"
    rm -rf "$node_bin" && mv "$tmp" "$node_bin"
  ) 8>"$cache/node.lock"
}

# The node's images: the archives of scripts/images.sh (in the folder it prints; the pause image
# and the Debian base at least, built here when missing), imported once into a containerd root
# kept beside them (a seed, keyed on the archives), which each node's containerd starts from
# as a copy of hard links: kart's worker image unpacks to gigabytes (a hundred seconds to import),
# and nothing in a committed layer or a blob is ever written. The databases are copied.
node_images() {
  local root="$1" images archive k seed
  images="$(bash "$here/images.sh" node)"
  local archives=("$images"/*.oci.tar)
  [ -f "$images/pause.oci.tar" ] && [ -f "$images/kart-base.oci.tar" ] \
    || die "no pause.oci.tar and kart-base.oci.tar in $images (scripts/images.sh node)"
  k="$(cat "${archives[@]/%/.key}" | sha256sum | cut -c1-16)"
  seed="$images/../containerd-seed-$k"
  (
    flock 8
    if [ ! -d "$seed" ]; then
      echo "control-plane: importing ${archives[*]##*/} into a containerd seed (once)" >&2
      local tmp="$seed.partial" pid old
      rm -rf "$tmp" && mkdir -p "$tmp"
      cat >"$tmp/config.toml" <<EOF
version = 3
root = "$tmp/root"
state = "$tmp/state"
disabled_plugins = ["io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime", "io.containerd.cri.v1.images"]
[grpc]
  address = "$tmp/containerd.sock"
EOF
      "$node_bin/containerd" --config "$tmp/config.toml" >"$tmp/containerd.log" 2>&1 &
      pid=$!
      local deadline=$((SECONDS + STAGE_SECONDS))
      until "$node_bin/ctr" --address "$tmp/containerd.sock" version >/dev/null 2>&1; do
        kill -0 "$pid" 2>/dev/null || die "the seed's containerd exited: $(tail -5 "$tmp/containerd.log")"
        [ $SECONDS -lt $deadline ] || die "the seed's containerd did not answer within ${STAGE_SECONDS}s"
        sleep 0.2
      done
      for archive in "${archives[@]}"; do
        "$node_bin/ctr" --address "$tmp/containerd.sock" -n k8s.io images import "$archive" >/dev/null 2>&1 \
          || { kill "$pid"; die "importing $archive into the containerd seed"; }
      done
      kill "$pid" && wait "$pid" || true
      rm -rf "$tmp/state" "$tmp/containerd.sock"
      # Seeds of archives built before these (nodes started from them hold their own links).
      for old in "$images"/../containerd-seed-*; do
        [ "$old" = "$tmp" ] || rm -rf "$old"
      done
      mv "$tmp" "$seed"
    fi
  ) 8>"$images/../containerd-seed.lock"
  mkdir -p "$(dirname "$root")"
  cp -al "$seed/root" "$root"
  local db
  while read -r db; do
    cp --remove-destination "$seed/root/${db#"$root"/}" "$db"
  done < <(find "$root" -name '*.db')
}

# Claims the first free node number: its network namespace's creation is the claim.
node_claim() {
  local n
  [ "$(id -u)" -eq 0 ] || die "--node kubelet needs root (network namespaces, cgroups and mounts)"
  for n in $(seq 1 250); do
    if ip netns add "kart-n$n" 2>/dev/null; then echo "$n"; return 0; fi
  done
  die "no free node network (kart-n1..kart-n250 all exist: ip netns list)"
}

# Runs `name` (of the control plane's build, or else of the node's) inside the node's network
# namespace, as `start` does on the host. nsenter, not `ip
# netns exec`: that also gives the process a mount namespace with a sysfs of its own, without the
# cgroup file systems the kubelet needs, and keeps the containers' mounts from the host.
node_start() {
  local dir="$1" name="$2"; shift 2
  local program="$bin/$name"
  [ -x "$program" ] || program="$node_bin/$name"
  setsid nsenter --net="/run/netns/kart-n$(cat "$dir/node/n")" env PATH="$node_bin:$PATH" "$program" "$@" \
    >"$dir/logs/$name.log" 2>&1 </dev/null &
  echo "$! $name" >>"$dir/pids"
}

# A certificate signed by the cluster's CA: node_cert DIR NAME SUBJECT [SAN].
node_cert() {
  local pki="$1/pki" name="$2" subject="$3" san="${4:-}"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$pki/$name.key" -subj "$subject" -out "$pki/$name.csr" 2>/dev/null
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 30 \
    -out "$pki/$name.crt" ${san:+-extfile <(printf 'subjectAltName=%s' "$san")} 2>/dev/null
}

# The node's network: the namespace's veth to the host, and the host's route to its Pods.
node_network() {
  local n="$1" ns="kart-n$1"
  ip link add "kart-h$n" type veth peer name eth0 netns "$ns"
  ip addr add "10.123.$n.1/24" dev "kart-h$n"
  ip link set "kart-h$n" up
  ip -n "$ns" addr add "10.123.$n.2/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
  ip -n "$ns" route add default via "10.123.$n.1"
  ip route add "10.124.$n.0/24" via "10.123.$n.2"
  ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1
  # Bridged Pod traffic goes through iptables (kube-proxy's Service rules), as on any node.
  modprobe br_netfilter 2>/dev/null || true
  ip netns exec "$ns" sysctl -qw net.bridge.bridge-nf-call-iptables=1 2>/dev/null || true
}

# The node's cgroup root in each cgroup v1 hierarchy (cpuset's needs its CPUs and memory nodes).
node_cgroups() {
  local n="$1" hierarchy
  for hierarchy in /sys/fs/cgroup/*/; do
    [ -d "$hierarchy" ] || continue
    mkdir -p "$hierarchy/kart-n$n"
  done
  if [ -d /sys/fs/cgroup/cpuset ]; then
    cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset/kart-n$n/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/kart-n$n/cpuset.mems"
  fi
}

node_up() {
  local dir="$1" n="$2" api_port="$3" admin="$4" nd="$1/node"
  local node_ip="10.123.$n.2"
  mkdir -p "$nd"/{cni,kubelet,pod-logs}
  node_cgroups "$n"

  cat >"$nd/containerd.toml" <<EOF
version = 3
root = "$nd/containerd/root"
state = "$nd/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$nd/containerd.sock"
[debug]
  level = "warn"
[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  # Pod network namespaces under the node's state, not /run/netns: \`down\` unmounts them all.
  netns_mounts_under_state_dir = true
  # No process here may lower its OOM score (this machine's root lacks CAP_SYS_RESOURCE), so the
  # kubelet's scores for sandboxes and Guaranteed Pods are raised to containerd's own, as rootless
  # containerd does.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$node_bin/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["$cni_bin"]
    conf_dir = "$nd/cni"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$pause_image"
EOF
  cat >"$nd/cni/10-kart.conflist" <<EOF
{"cniVersion": "1.0.0", "name": "kart", "plugins": [
  {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
   "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.124.$n.0/24"}]],
            "routes": [{"dst": "0.0.0.0/0"}], "dataDir": "$nd/cni-ipam"}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
  node_images "$nd/containerd/root"
  node_start "$dir" containerd --config "$nd/containerd.toml"
  local deadline=$((SECONDS + STAGE_SECONDS))
  until [ -S "$nd/containerd.sock" ] && "$node_bin/ctr" --address "$nd/containerd.sock" version >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail_with_logs "$dir" "containerd did not answer within ${STAGE_SECONDS}s"
    check_alive "$dir"
    sleep 0.2
  done
  cat >"$nd/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine boots with cgroup v1, which the kubelet refuses since 1.35 unless told otherwise.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /kart-n$n
containerRuntimeEndpoint: unix://$nd/containerd.sock
address: $node_ip
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
clusterDNS: [10.96.0.10]
clusterDomain: cluster.local
# Pods see the cluster DNS only: no host resolver is reachable from the node.
resolvConf: ""
podLogsDir: $nd/pod-logs
tlsCertFile: $dir/pki/kubelet.crt
tlsPrivateKeyFile: $dir/pki/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $dir/pki/ca.crt}
authorization: {mode: Webhook}
failSwapOn: false
# A test machine's disk and memory run full during a build: the kubelet evicts nothing, and
# collects no image (the images were imported, not pulled: none could be pulled again).
evictionHard: {memory.available: "0%", nodefs.available: "0%", imagefs.available: "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
EOF
  node_start "$dir" kubelet --config "$nd/kubelet.yaml" --kubeconfig "$dir/node.kubeconfig" \
    --root-dir "$nd/kubelet" --hostname-override kart-node --node-ip "$node_ip"

  cat >"$nd/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $dir/proxy.kubeconfig}
mode: iptables
hostnameOverride: kart-node
bindAddress: $node_ip
clusterCIDR: 10.124.$n.0/24
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
# The conntrack table's size is the host's, not the node's to change.
conntrack: {maxPerCore: 0}
EOF
  node_start "$dir" kube-proxy --config "$nd/kube-proxy.yaml"

  cat >"$nd/Corefile" <<EOF
.:53 {
    bind $node_ip
    errors
    ready 127.0.0.1:8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $dir/coredns.kubeconfig kart
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 5
}
EOF
  node_start "$dir" coredns -conf "$nd/Corefile"
  node_storage "$dir" "$api_port" "$admin"
}

# rancher's local-path-provisioner, outside the cluster as user kart-node-provisioner: the volumes
# of StorageClasses kart-local and kart-shared are folders of DIR/node/volumes/{local,shared},
# made (mode 0777) and removed by its helper Pods (of the Debian base image) in namespace
# local-path-storage, as its own manifests deploy it.
node_storage() {
  local dir="$1" api_port="$2" admin="$3" ns=local-path-storage
  mkdir -p "$dir/node/volumes/local" "$dir/node/volumes/shared"
  # The default StorageClass, kart-local: a claim is bound when its first Pod is scheduled (the
  # folder is made on that Pod's node; ReadWriteOnce). kart-shared: folders of a file system every
  # node mounts (here, the host's disk; on a cluster, NFS or CephFS), for ReadWriteMany claims.
  # The provisioner's user may manage PersistentVolumes.
  create "$dir" "$api_port" "$admin" /apis/storage.k8s.io/v1/storageclasses '{"apiVersion": "storage.k8s.io/v1",
    "kind": "StorageClass", "metadata": {"name": "kart-local",
    "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
    "provisioner": "rancher.io/local-path", "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer"}'
  create "$dir" "$api_port" "$admin" /apis/storage.k8s.io/v1/storageclasses '{"apiVersion": "storage.k8s.io/v1",
    "kind": "StorageClass", "metadata": {"name": "kart-shared"},
    "provisioner": "rancher.io/local-path", "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer"}'
  create "$dir" "$api_port" "$admin" /apis/rbac.authorization.k8s.io/v1/clusterrolebindings '{
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
    "metadata": {"name": "kart-node-provisioner"},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                "name": "system:persistent-volume-provisioner"},
    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kart-node-provisioner"}]}'
  create "$dir" "$api_port" "$admin" /api/v1/namespaces '{"apiVersion": "v1", "kind": "Namespace",
    "metadata": {"name": "'"$ns"'"}}'
  create "$dir" "$api_port" "$admin" "/api/v1/namespaces/$ns/serviceaccounts" '{"apiVersion": "v1",
    "kind": "ServiceAccount", "metadata": {"name": "local-path-provisioner-service-account"}}'
  create "$dir" "$api_port" "$admin" "/api/v1/namespaces/$ns/configmaps" "$(python3 -c '
import json, sys
helper = """apiVersion: v1
kind: Pod
metadata: {name: helper-pod}
spec:
  priorityClassName: system-node-critical
  containers:
  - {name: helper-pod, image: "%s", imagePullPolicy: Never}
""" % sys.argv[2]
print(json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "local-path-config"}, "data": {
    "config.json": json.dumps({"storageClassConfigs": {
        "kart-local": {"nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": [sys.argv[1] + "/local"]}]},
        "kart-shared": {"sharedFileSystemPath": sys.argv[1] + "/shared"}}}),
    "setup": "#!/bin/sh\nset -eu\nmkdir -m 0777 -p \"$VOL_DIR\"\n",
    "teardown": "#!/bin/sh\nset -eu\nrm -rf \"$VOL_DIR\"\n",
    "helperPod.yaml": helper}}))' "$dir/node/volumes" "$base_image")"
  # Its ClusterRole in its own manifests, less what system:persistent-volume-provisioner (bound to
  # the user already) grants.
  create "$dir" "$api_port" "$admin" /apis/rbac.authorization.k8s.io/v1/clusterroles '{
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "kart-local-path"},
    "rules": [{"apiGroups": [""], "resources": ["nodes", "configmaps", "pods", "pods/log"], "verbs": ["get", "list", "watch"]},
              {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "delete"]}]}'
  create "$dir" "$api_port" "$admin" /apis/rbac.authorization.k8s.io/v1/clusterrolebindings '{
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "kart-local-path"},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kart-local-path"},
    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kart-node-provisioner"}]}'
  node_start "$dir" local-path-provisioner start --kubeconfig "$dir/provisioner.kubeconfig" --namespace "$ns" \
    --provisioner-name rancher.io/local-path --configmap-name local-path-config \
    --service-account-name local-path-provisioner-service-account --helper-image "$base_image"
}

# The node's Service and DNS objects, its GPUs and its Ready condition (after the control plane is
# up): the kube-dns Service at 10.96.0.10 with CoreDNS's address as its endpoint, and
# `nvidia.com/gpu` in the Node's capacity (an extended resource, as a device plugin would report;
# this machine has no GPU, the count is what the scheduler plans with).
node_ready() {
  local dir="$1" n="$2" api_port="$3" admin="$4"
  create "$dir" "$api_port" "$admin" /api/v1/namespaces/kube-system/services '{"apiVersion": "v1",
    "kind": "Service", "metadata": {"name": "kube-dns", "labels": {"k8s-app": "kube-dns"}},
    "spec": {"clusterIP": "10.96.0.10", "ports": [{"name": "dns", "port": 53, "protocol": "UDP"},
      {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]}}'
  create "$dir" "$api_port" "$admin" /apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices '{
    "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
    "metadata": {"name": "kube-dns-node", "labels": {"kubernetes.io/service-name": "kube-dns",
      "endpointslice.kubernetes.io/managed-by": "kart-control-plane"}},
    "addressType": "IPv4", "endpoints": [{"addresses": ["10.123.'"$n"'.2"], "conditions": {"ready": true}}],
    "ports": [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]}'
  wait_ready "https://$api_host:$api_port/api/v1/nodes/kart-node" "$admin" "kubelet (Node kart-node Ready)" "$dir" \
    '"type":"Ready","status":"True"'
  local deadline=$((SECONDS + STAGE_SECONDS))
  until curl -fsS -o /dev/null --cacert "$dir/pki/apiserver.crt" -H "Authorization: Bearer $admin" \
      -H 'Content-Type: application/strategic-merge-patch+json' -X PATCH \
      --data "{\"status\": {\"capacity\": {\"nvidia.com/gpu\": \"$node_gpus\"}}}" \
      "https://$api_host:$api_port/api/v1/nodes/kart-node/status"; do
    [ $SECONDS -lt $deadline ] || fail_with_logs "$dir" "patching Node kart-node's GPUs"
    check_alive "$dir"
    sleep 0.5
  done
  # CoreDNS answers once it has listed the cluster's Services.
  deadline=$((SECONDS + STAGE_SECONDS))
  until nsenter --net="/run/netns/kart-n$n" curl -fsS -o /dev/null http://127.0.0.1:8181/ready; do
    [ $SECONDS -lt $deadline ] || fail_with_logs "$dir" "CoreDNS not ready within ${STAGE_SECONDS}s"
    check_alive "$dir"
    sleep 0.2
  done
}

# Stops what is left of node N once its processes are stopped: its containers (every process in
# its cgroups), the mounts under DIR (containers' root file systems, volumes, Pod network
# namespaces), its cgroups and its network namespace.
node_down() {
  local dir="$1" n="$2" hierarchy pids mount
  local procs=/sys/fs/cgroup/pids/kart-n$n
  if [ -d "$procs" ]; then
    local deadline=$((SECONDS + 30))
    while pids="$(find "$procs" -name cgroup.procs -exec cat {} + 2>/dev/null)" && [ -n "$pids" ]; do
      # shellcheck disable=SC2086
      kill -KILL $pids 2>/dev/null || true
      [ $SECONDS -lt $deadline ] || { echo "control-plane: processes left in $procs: $pids" >&2; break; }
      sleep 0.1
    done
  fi
  # shellcheck disable=SC2086
  pids="$(ip netns pids "kart-n$n" 2>/dev/null)" && [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
  while read -r mount; do
    umount -l "$mount" 2>/dev/null || true
  done < <(awk -v d="$dir/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r)
  for hierarchy in /sys/fs/cgroup/*/kart-n"$n"; do
    [ -d "$hierarchy" ] && find "$hierarchy" -depth -type d -exec rmdir {} + 2>/dev/null
  done
  ip netns delete "kart-n$n" 2>/dev/null || true
}
