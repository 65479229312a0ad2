# Kueue in the control plane of scripts/control-plane.sh (sourced by it; `up DIR --kueue`): the
# Kubernetes project's job queue, whose manager (its controllers, scheduler and webhooks) is built
# from its Go module at $kueue_version and run as a process of the control plane, installed from
# its own release manifests (CRDs, webhook configurations, RBAC) as control-plane/kueue.py adapts
# them: the API server reaches its webhooks on loopback through an ExternalName Service, with the
# certificate Kueue's internal certificate management issues (into its Secret, which this script
# copies into the manager's certificate folder as the kubelet's Secret volume would).

kueue_version="v0.17.0"

# Builds Kueue's manager unless the cache has it; sets kueue_bin to its folder.
kueue_build() {
  go_tool_build kueue sigs.k8s.io/kueue/cmd/kueue "$kueue_version"
  kueue_bin="$tool_bin"
}

# Installs Kueue into the running control plane of DIR and starts its manager; returns once its
# webhooks answer the API server. `KART_KUEUE_PORTS` ("WEBHOOK HEALTH", free loopback ports) lets
# a caller that reserves ports hand them in.
kueue_up() {
  local dir="$1" venv="${KART_VENV:-$here/../.venv}" module webhook_port health_port
  kueue_build
  module="$(cd / && go mod download -json "sigs.k8s.io/kueue@$kueue_version" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["Dir"])')"
  read -r webhook_port health_port _ <<<"${KART_KUEUE_PORTS:-$(free_ports)}"
  [ -n "$health_port" ] || die "KART_KUEUE_PORTS: two ports are needed, got '$KART_KUEUE_PORTS'"
  mkdir -p "$dir/kueue/certs"
  "$venv/bin/kubectl" kustomize "$module/config/default" >"$dir/kueue/rendered.yaml" \
    || die "kubectl kustomize of Kueue's config/default failed"
  "$venv/bin/python" "$here/control-plane/kueue.py" "$dir/kueue/rendered.yaml" "$dir/kueue" \
    "$webhook_port" "$health_port"
  local deadline=$((SECONDS + STAGE_SECONDS))
  until KUBECONFIG="$dir/kubeconfig" "$venv/bin/kubectl" apply --server-side --force-conflicts \
    -f "$dir/kueue/manifests.json" >"$dir/logs/kueue-apply.log" 2>&1; do
    [ $SECONDS -lt $deadline ] || fail_with_logs "$dir" "applying Kueue's manifests: $(tail -n 5 "$dir/logs/kueue-apply.log")"
    check_alive "$dir"
    sleep 0.5
  done
  local bin="$kueue_bin"
  KUBECONFIG="$dir/kubeconfig" start "$dir" kueue --config "$dir/kueue/config.yaml" --zap-log-level=2
  # In a pod the kubelet mounts the certificate's Secret, which the manager fills, into its
  # certificate folder, and the manager waits for the files: here they are copied out once there.
  deadline=$((SECONDS + STAGE_SECONDS))
  until KUBECONFIG="$dir/kubeconfig" "$venv/bin/kubectl" get secret -n kueue-system kueue-webhook-server-cert \
    -o json 2>/dev/null | python3 -c '
import base64, json, pathlib, sys
data = json.load(sys.stdin).get("data") or {}
if not {"tls.crt", "tls.key"} <= data.keys():
    sys.exit(1)
for name in ("tls.key", "ca.crt", "tls.crt"):
    if name in data:
        path = pathlib.Path(sys.argv[1], name)
        path.with_suffix(".part").write_bytes(base64.b64decode(data[name]))
        path.with_suffix(".part").rename(path)' "$dir/kueue/certs"; do
    [ $SECONDS -lt $deadline ] || fail_with_logs "$dir" "Kueue wrote no webhook certificate within ${STAGE_SECONDS}s"
    check_alive "$dir"
    sleep 0.5
  done
  deadline=$((SECONDS + STAGE_SECONDS))
  until curl -fsS "http://127.0.0.1:$health_port/readyz" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || fail_with_logs "$dir" "Kueue's manager not ready within ${STAGE_SECONDS}s"
    check_alive "$dir"
    sleep 0.2
  done
  # Ready when the API server's call to a webhook (a dry run of a ResourceFlavor) is answered:
  # the CA bundle is injected and the certificate is served.
  local probe='{"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": "kart-probe"}}'
  deadline=$((SECONDS + STAGE_SECONDS))
  until KUBECONFIG="$dir/kubeconfig" "$venv/bin/kubectl" create --dry-run=server -f - <<<"$probe" \
    >"$dir/logs/kueue-probe.log" 2>&1; do
    [ $SECONDS -lt $deadline ] || fail_with_logs "$dir" "Kueue's webhooks unanswered: $(tail -n 3 "$dir/logs/kueue-probe.log")"
    check_alive "$dir"
    sleep 0.5
  done
}
