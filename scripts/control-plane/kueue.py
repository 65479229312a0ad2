"""Kueue's release manifests (its kustomization `config/default`, as `kubectl kustomize` renders it)
made fit for a manager run outside the cluster by scripts/control-plane.sh (`up --kueue`).

    kueue.py RENDERED DIR WEBHOOK_PORT HEALTH_PORT

Writes DIR/manifests.json (a List for `kubectl apply`) and DIR/config.yaml (the manager's
Configuration). Changed from the release, and nothing else:
- the manager's Deployment, its metrics Service, the visibility API (its APIServices and
  Service) and the manager's ConfigMap are left out: the manager runs as a process, reading
  DIR/config.yaml, with only the `batch/job` integration (kart's trainer is an indexed Job),
  without leader election and without the visibility server;
- the webhook Service is an ExternalName for the loopback address, and every webhook and CRD
  conversion names WEBHOOK_PORT: the API server calls the manager on loopback, checking its
  certificate against the Service's DNS name, for which Kueue's internal certificate management
  issues it (and injects its CA into the webhook configurations and CRDs, as in a cluster);
- the webhooks of the integrations left off (Pods, Deployments, StatefulSets, JobSets, Kubeflow,
  Ray, ...) are left out with them.
"""

import json
import sys
from pathlib import Path

import yaml

NAMESPACE = "kueue-system"
WEBHOOK_SERVICE = "kueue-webhook-service"
DROPPED = {
    ("Deployment", "kueue-controller-manager"),
    ("Service", "kueue-controller-manager-metrics-service"),
    ("Service", "kueue-visibility-server"),
    ("ConfigMap", "kueue-manager-config"),
}


def kept_webhook(webhook: dict) -> bool:
    path = webhook["clientConfig"]["service"]["path"]
    return "-batch-v1-job" in path or "-kueue-x-k8s-io-" in path


def main(rendered: str, out: str, webhook_port: str, health_port: str) -> None:
    out_dir = Path(out)
    port = int(webhook_port)
    items = []
    for doc in yaml.safe_load_all(Path(rendered).read_text()):
        if not doc:
            continue
        kind, name = doc["kind"], doc["metadata"]["name"]
        if (kind, name) in DROPPED or kind == "APIService":
            continue
        if kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            doc["webhooks"] = [w for w in doc["webhooks"] if kept_webhook(w)]
            for w in doc["webhooks"]:
                w["clientConfig"]["service"]["port"] = port
        if kind == "CustomResourceDefinition":
            conversion = doc["spec"].get("conversion", {}).get("webhook")
            if conversion:
                conversion["clientConfig"]["service"]["port"] = port
        if kind == "Service" and name == WEBHOOK_SERVICE:
            doc["spec"] = {"type": "ExternalName", "externalName": "localhost", "ports": [{"name": "webhook", "port": port}]}
        items.append(doc)
    kinds = {d["kind"] for d in items}
    assert {"CustomResourceDefinition", "MutatingWebhookConfiguration", "Secret"} <= kinds, kinds
    (out_dir / "manifests.json").write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}))
    config = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": port, "certDir": str(out_dir / "certs")},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": WEBHOOK_SERVICE,
            "webhookSecretName": "kueue-webhook-server-cert",
        },
        "clientConnection": {"qps": 50, "burst": 100},
        "integrations": {"frameworks": ["batch/job"]},
        "featureGates": {"VisibilityOnDemand": False},
    }
    (out_dir / "config.yaml").write_text(yaml.safe_dump(config))


if __name__ == "__main__":
    main(*sys.argv[1:])
