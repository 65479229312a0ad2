# Simulated nodes in the control plane of scripts/control-plane.sh (sourced by it; `up DIR --kwok
# N`): KWOK, the tool Kubernetes itself tests control planes at scale with, built from its Go
# module at $kwok_version and run as a process of the control plane. It keeps N Nodes
# (`kart-kwok-0` … with 8 GPUs each, annotated `kwok.x-k8s.io/node=fake`) Ready, and plays the
# Pods the scheduler binds to them through KWOK's own stages: created, then Running and Ready,
# then gone when deleted. No Pod completes by itself: trainers run until they are stopped, as
# long runs do.

kwok_version="v0.8.0"
# What each simulated node offers.
KWOK_NODE_GPUS=8
KWOK_NODE_CPUS=96
KWOK_NODE_MEMORY=1Ti

# Builds KWOK unless the cache has it; sets kwok_bin to its folder.
kwok_build() {
  go_tool_build kwok sigs.k8s.io/kwok/cmd/kwok "$kwok_version"
  kwok_bin="$tool_bin"
}

# Starts KWOK in the running control plane of DIR (API port `port`, admin token `token`) with
# `count` simulated nodes; returns once every one is Ready.
kwok_up() {
  local dir="$1" port="$2" token="$3" count="$4" module stages
  kwok_build
  module="$(cd / && go mod download -json "sigs.k8s.io/kwok@$kwok_version" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
  mkdir -p "$dir/kwok"
  stages="$dir/kwok/stages.yaml"
  : >"$stages"
  for stage in node/fast/node-initialize node/heartbeat/node-heartbeat pod/fast/pod-ready pod/fast/pod-delete; do
    { cat "$module/kustomize/stage/$stage.yaml"; echo "---"; } >>"$stages"
  done
  local bin="$kwok_bin"
  start "$dir" kwok --kubeconfig "$dir/kubeconfig" --config "$stages" \
    --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake --cidr 10.124.0.0/16 --node-ip 10.123.255.1
  local i
  for ((i = 0; i < count; i++)); do
    create "$dir" "$port" "$token" /api/v1/nodes "{
      \"apiVersion\": \"v1\", \"kind\": \"Node\",
      \"metadata\": {\"name\": \"kart-kwok-$i\", \"annotations\": {\"kwok.x-k8s.io/node\": \"fake\", \"node.alpha.kubernetes.io/ttl\": \"0\"},
                   \"labels\": {\"kubernetes.io/hostname\": \"kart-kwok-$i\", \"kubernetes.io/os\": \"linux\", \"kubernetes.io/arch\": \"amd64\", \"type\": \"kwok\"}},
      \"status\": {\"capacity\": {\"cpu\": \"$KWOK_NODE_CPUS\", \"memory\": \"$KWOK_NODE_MEMORY\", \"pods\": \"110\", \"nvidia.com/gpu\": \"$KWOK_NODE_GPUS\"},
                 \"allocatable\": {\"cpu\": \"$KWOK_NODE_CPUS\", \"memory\": \"$KWOK_NODE_MEMORY\", \"pods\": \"110\", \"nvidia.com/gpu\": \"$KWOK_NODE_GPUS\"}}}"
  done
  local deadline=$((SECONDS + STAGE_SECONDS)) ready
  while :; do
    ready="$(curl -fsS --cacert "$dir/pki/apiserver.crt" -H "Authorization: Bearer $token" \
      "https://$api_host:$port/api/v1/nodes?labelSelector=type%3Dkwok" 2>/dev/null | python3 -c '
import json, sys
nodes = json.load(sys.stdin)["items"]
print(sum(any(c["type"] == "Ready" and c["status"] == "True" for c in n.get("status", {}).get("conditions", [])) for n in nodes))' 2>/dev/null || echo 0)"
    [ "$ready" -ge "$count" ] && return 0
    [ $SECONDS -lt $deadline ] || fail_with_logs "$dir" "KWOK: $ready of $count nodes Ready within ${STAGE_SECONDS}s"
    check_alive "$dir"
    sleep 0.5
  done
}
