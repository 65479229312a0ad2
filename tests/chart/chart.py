"""Renders and lints charts/kart with Helm's own library (helm-python-sdk) for the default values and
each documented option, validates the manifests against the Kubernetes OpenAPI schemas
(kubernetes-validate), checks the monitoring objects structurally, and checks that the chart's
dashboards, rules and CRDs are the files of deploy/ and crds/. Prints every failure; exits 1 on any.

Usage: chart.py REPO_ROOT
"""

import contextlib
import functools
import json
import os
import re
import sys
from pathlib import Path

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

# libyaml's parser: the generated CRDs are about a megabyte.
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load(text: str):
    return yaml.load(text, Loader=Loader)


def load_all(text: str):
    return yaml.load_all(text, Loader=Loader)


ROOT = Path(sys.argv[1]).resolve()
CHART = ROOT / "charts/kart"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas at hand.
KUBE_VERSIONS = ("1.29.0", "1.37.0")
NAMESPACE = "kart-system"
failures: list[str] = []


def check(ok: bool, message: str) -> bool:
    if not ok:
        failures.append(message)
    return ok


@contextlib.contextmanager
def quiet():
    """Silences Helm's Go logger, which notes on stderr that the chart's links are followed (they
    are by design: the files of deploy/ and crds/ are the single source); errors still raise."""
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def render(values: dict) -> tuple[list[dict], str]:
    """The objects of a release named `kart` and its NOTES."""
    with quiet(), helm.Chart.load(CHART) as chart:
        out = chart.render(values, name="kart", namespace=NAMESPACE, is_install=True)
    notes = out.pop("kart/templates/NOTES.txt", "")
    objects = [d for text in out.values() for d in load_all(text) if d]
    return objects, notes


def find(objects: list[dict], kind: str, name: str | None = None) -> list[dict]:
    return [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]


@functools.cache
def source_crds() -> list[dict]:
    docs = []
    for path in sorted((ROOT / "crds").glob("*.y*ml")):
        docs += [d for d in load_all(path.read_text()) if d and d.get("kind") == "CustomResourceDefinition"]
    return docs


def dashboards() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((ROOT / "deploy/grafana").glob("*.json"))}


def rules() -> dict:
    return load((ROOT / "deploy/prometheus/rules.yaml").read_text())


# ---- checks every rendering passes

CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"}
validated: set[str] = set()  # objects already validated (the same CRDs render in every scenario)


def validate_kubernetes(objects: list[dict], scenario: str) -> None:
    for o in objects:
        where = f"{scenario}: {o['kind']} {o['metadata'].get('name')}"
        if o["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # checked structurally below; not part of the Kubernetes schemas
        text = json.dumps(o, sort_keys=True)
        if text in validated:
            continue
        validated.add(text)
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(o, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                check(False, f"{where}: Kubernetes {version}: {e.message} at {'.'.join(map(str, e.path))}")
            except kubernetes_validate.SchemaNotFoundError:
                check(False, f"{where}: no Kubernetes {version} schema for {o['apiVersion']}")
        check(o["kind"] in CLUSTER_SCOPED or "namespace" in o["metadata"], f"{where}: no namespace")
        labels = o["metadata"].get("labels", {})
        check(labels.get("app.kubernetes.io/managed-by") == "Helm", f"{where}: no managed-by label")


def check_operator(objects: list[dict], values: dict, scenario: str) -> None:
    [deployment] = find(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    [container] = pod["containers"]
    security = container["securityContext"]
    check(pod["securityContext"]["runAsNonRoot"] is True, f"{scenario}: pod may run as root")
    check(pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault", f"{scenario}: pod seccomp")
    check(security["readOnlyRootFilesystem"] is True, f"{scenario}: writable root filesystem")
    check(security["allowPrivilegeEscalation"] is False, f"{scenario}: privilege escalation allowed")
    check(security["capabilities"]["drop"] == ["ALL"], f"{scenario}: capabilities not all dropped")
    check(security["seccompProfile"]["type"] == "RuntimeDefault", f"{scenario}: container seccomp")
    args = container["args"]
    check("--http-port=8080" in args, f"{scenario}: operator args {args} lack --http-port=8080")
    leader = values.get("leaderElection", {}).get("enabled", True)
    check(f"--leader-election={str(leader).lower()}" in args, f"{scenario}: leader election flag in {args}")
    namespaces = values.get("watchNamespaces")
    check(
        (f"--namespace={','.join(namespaces)}" in args) if namespaces else not any("--namespace" in a for a in args),
        f"{scenario}: --namespace in {args}",
    )
    worker = values.get("workerImage", {})
    image = f"{worker.get('repository', 'ghcr.io/kart-dev/kart')}:{worker.get('tag') or '0.1.0'}"
    check(f"--image={image}" in args, f"{scenario}: the worker image {image} is not in {args}")
    check(container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}], f"{scenario}: operator port")
    check(container["livenessProbe"]["httpGet"]["path"] == "/healthz", f"{scenario}: liveness probe")
    check(container["readinessProbe"]["httpGet"]["path"] == "/readyz", f"{scenario}: readiness probe")
    [service] = find(objects, "Service")
    selector = deployment["spec"]["selector"]["matchLabels"]
    check(service["spec"]["selector"] == selector, f"{scenario}: the Service does not select the operator pods")
    check(selector.items() <= deployment["spec"]["template"]["metadata"]["labels"].items(), f"{scenario}: selector vs pod labels")
    account = pod["serviceAccountName"]
    if values.get("serviceAccount", {}).get("create", True):
        check(bool(find(objects, "ServiceAccount", account)), f"{scenario}: ServiceAccount {account} not rendered")


OPERATOR_NEEDS = {  # (apiGroup, resource): verbs the operator cannot work without
    ("kart.dev", "trainingjobs"): {"get", "list", "watch", "patch"},
    ("kart.dev", "trainingjobs/status"): {"patch"},
    ("kart.dev", "trainingjobs/finalizers"): {"update"},
    ("kart.dev", "retrievers"): {"get", "list", "watch", "patch"},
    ("kart.dev", "retrievers/status"): {"patch"},
    ("kart.dev", "rolloutpools"): {"get", "list", "watch", "patch"},
    ("kart.dev", "rolloutpools/status"): {"patch"},
    ("kart.dev", "rolloutpools/scale"): {"get"},
    ("apps", "deployments"): {"get", "list", "watch", "create", "patch", "delete"},
    ("batch", "jobs"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "services"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "configmaps"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "persistentvolumeclaims"): {"get", "list", "watch", "create", "patch", "delete"},
    ("", "pods"): {"get", "list", "watch"},
    ("", "events"): {"create", "patch"},
}


def granted(role: dict) -> dict[tuple[str, str], set[str]]:
    out: dict[tuple[str, str], set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                out.setdefault((group, resource), set()).update(rule["verbs"])
    return out


def check_rbac(objects: list[dict], values: dict, scenario: str) -> None:
    roles = find(objects, "Role") + find(objects, "ClusterRole")
    for role in roles:
        for rule in role["rules"]:
            check("*" not in rule["verbs"] + rule["resources"] + rule["apiGroups"], f"{scenario}: wildcard in {role['metadata']['name']}")
            # Secrets only to create and read back each RolloutPool's token: never listed or watched.
            if "secrets" in rule["resources"]:
                check(rule["resources"] == ["secrets"] and set(rule["verbs"]) <= {"get", "create", "patch"}, f"{scenario}: {role['metadata']['name']} grants secrets beyond get/create/patch")
    if not values.get("rbac", {}).get("create", True):
        check(not roles and not find(objects, "RoleBinding") and not find(objects, "ClusterRoleBinding"), f"{scenario}: RBAC rendered with rbac.create false")
        return
    account = find(objects, "Deployment")[0]["spec"]["template"]["spec"]["serviceAccountName"]
    bindings = find(objects, "RoleBinding") + find(objects, "ClusterRoleBinding")
    bound = {}  # namespace (None: cluster) -> union of the operator's grants there
    for b in bindings:
        check(b["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}], f"{scenario}: binding {b['metadata']['name']} subjects")
        role_kind = b["roleRef"]["kind"]
        [role] = [r for r in roles if r["kind"] == role_kind and r["metadata"]["name"] == b["roleRef"]["name"] and r["metadata"].get("namespace") == b["metadata"].get("namespace")] or [None]
        if check(role is not None, f"{scenario}: {b['kind']} {b['metadata']['name']} binds a role that is not rendered"):
            ns = b["metadata"].get("namespace") if b["kind"] == "RoleBinding" else None
            for key, verbs in granted(role).items():
                bound.setdefault(ns, {}).setdefault(key, set()).update(verbs)
    namespaces = values.get("watchNamespaces") or [None]
    for ns in namespaces:
        for key, verbs in OPERATOR_NEEDS.items():
            check(verbs <= bound.get(ns, {}).get(key, set()), f"{scenario}: the operator lacks {sorted(verbs)} on {key} in {ns or 'the cluster'}")
    if values.get("watchNamespaces"):
        check(not find(objects, "ClusterRoleBinding"), f"{scenario}: cluster-wide binding despite watchNamespaces")
    lease = bound.get(NAMESPACE, {}).get(("coordination.k8s.io", "leases"), set())
    leader = values.get("leaderElection", {}).get("enabled", True)
    check({"get", "create", "update"} <= lease if leader else not lease, f"{scenario}: lease verbs {sorted(lease)}")
    check(not bound.get(None, {}).get(("coordination.k8s.io", "leases")), f"{scenario}: leases granted cluster-wide")
    kueue = values.get("kueue", {}).get("enabled", False)
    for ns in namespaces:
        workloads = bound.get(ns, {}).get(("kueue.x-k8s.io", "workloads"), set())
        check({"get", "list"} <= workloads if kueue else not workloads, f"{scenario}: Kueue Workload verbs {sorted(workloads)} in {ns or 'the cluster'}")


def check_crds(objects: list[dict], values: dict, scenario: str) -> None:
    rendered = {c["metadata"]["name"]: c for c in find(objects, "CustomResourceDefinition")}
    crds = values.get("crds", {})
    if not crds.get("install", True):
        check(not rendered, f"{scenario}: CRDs rendered with crds.install false")
        return
    source = source_crds()
    names = [c["metadata"]["name"] for c in source]
    check(len(names) == len(set(names)), f"crds/ defines a CRD twice: {sorted(names)} (remove crds/kart.dev.sample.yaml once the generated CRDs are there)")
    check(set(names) >= {"retrievers.kart.dev", "rolloutpools.kart.dev", "trainingjobs.kart.dev"}, f"crds/ lacks kart's CRDs: {names}")
    check(sorted(rendered) == sorted(set(names)), f"{scenario}: rendered CRDs {sorted(rendered)} != crds/ {sorted(names)}")
    for c in source:
        r = rendered.get(c["metadata"]["name"])
        if r is None:
            continue
        check(r["spec"] == c["spec"], f"{scenario}: the rendered {c['metadata']['name']} differs from crds/")
        keep = r["metadata"].get("annotations", {}).get("helm.sh/resource-policy") == "keep"
        check(keep == crds.get("keep", True), f"{scenario}: {c['metadata']['name']} resource-policy keep is {keep}")


def check_monitoring(objects: list[dict], values: dict, scenario: str) -> None:
    service_monitors, pod_monitors = find(objects, "ServiceMonitor"), find(objects, "PodMonitor")
    enabled = values.get("serviceMonitor", {}).get("enabled", False)
    if not check(bool(service_monitors) == enabled == bool(pod_monitors), f"{scenario}: monitors rendered: {enabled=}") or not enabled:
        return
    labels = values.get("serviceMonitor", {}).get("labels", {})
    for m in service_monitors + pod_monitors:
        check(m["apiVersion"] == "monitoring.coreos.com/v1", f"{scenario}: {m['kind']} apiVersion")
        check(labels.items() <= m["metadata"]["labels"].items(), f"{scenario}: {m['metadata']['name']} lacks the labels Prometheus selects by")
        check(set(m["spec"]) <= {"selector", "endpoints", "namespaceSelector", "podMetricsEndpoints", "podTargetLabels"}, f"{scenario}: {m['kind']} spec keys {sorted(m['spec'])}")
    if service_monitors:
        [sm] = service_monitors
        [service] = find(objects, "Service")
        check(sm["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items(), f"{scenario}: the ServiceMonitor does not select the operator Service")
        ports = {p["name"] for p in service["spec"]["ports"]}
        check(all(e["port"] in ports and e["path"] == "/metrics" for e in sm["spec"]["endpoints"]), f"{scenario}: ServiceMonitor endpoints")
    components = sorted(m["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/component", "") for m in pod_monitors)
    check(components == ["retriever", "rollout", "trainer"], f"{scenario}: PodMonitors cover {components}")
    for m in pod_monitors:
        check(m["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/name") == "kart", f"{scenario}: PodMonitor selector")
        check([e["port"] for e in m["spec"]["podMetricsEndpoints"]] == ["http"], f"{scenario}: PodMonitor port")
        check("app.kubernetes.io/instance" in m["spec"]["podTargetLabels"], f"{scenario}: PodMonitor drops the instance label the dashboards use")
        namespaces = values.get("watchNamespaces")
        expected = {"matchNames": namespaces} if namespaces else {"any": True}
        check(m["spec"]["namespaceSelector"] == expected, f"{scenario}: PodMonitor namespaceSelector {m['spec']['namespaceSelector']}")


def check_rules(objects: list[dict], values: dict, notes: str, scenario: str) -> None:
    rendered = find(objects, "PrometheusRule")
    if not check(bool(rendered) == values.get("prometheusRule", {}).get("enabled", False), f"{scenario}: PrometheusRule rendered"):
        return
    for r in rendered:
        check(r["apiVersion"] == "monitoring.coreos.com/v1", f"{scenario}: PrometheusRule apiVersion")
        check(r["spec"] == rules(), f"{scenario}: the PrometheusRule is not deploy/prometheus/rules.yaml")
        check(values["prometheusRule"].get("labels", {}).items() <= r["metadata"]["labels"].items(), f"{scenario}: PrometheusRule labels")
        for group in r["spec"]["groups"]:
            for rule in group["rules"]:
                check(f" {rule['alert']}" in notes, f"{scenario}: NOTES.txt does not list {rule['alert']}")


def check_dashboards(objects: list[dict], values: dict, scenario: str) -> None:
    maps = [c for c in find(objects, "ConfigMap") if c["metadata"]["labels"].get("grafana_dashboard")]
    settings = values.get("grafanaDashboards", {})
    if not check(bool(maps) == settings.get("enabled", False), f"{scenario}: dashboard ConfigMaps rendered") or not maps:
        return
    data = {k: v for c in maps for k, v in c["data"].items()}
    check(data == dashboards(), f"{scenario}: the dashboard ConfigMaps are not deploy/grafana/*.json")
    for c in maps:
        check(c["metadata"]["labels"]["grafana_dashboard"] == "1", f"{scenario}: sidecar label")
        check(c["metadata"]["namespace"] == (settings.get("namespace") or NAMESPACE), f"{scenario}: dashboard namespace")
        check(settings.get("annotations", {}).items() <= c["metadata"].get("annotations", {}).items(), f"{scenario}: dashboard annotations")


def check_network_policies(objects: list[dict], values: dict, scenario: str) -> None:
    policies = find(objects, "NetworkPolicy")
    settings = values.get("networkPolicy", {})
    if not settings.get("enabled", True):
        check(not policies, f"{scenario}: NetworkPolicies rendered while disabled")
        return
    operator = [p for p in policies if p["metadata"]["namespace"] == NAMESPACE and p["spec"]["podSelector"]["matchLabels"].get("app.kubernetes.io/name") == "kart-operator"]
    if check(len(operator) == 1, f"{scenario}: no NetworkPolicy for the operator"):
        [ingress] = operator[0]["spec"]["ingress"]
        check(ingress["ports"] == [{"port": "http", "protocol": "TCP"}], f"{scenario}: operator ingress ports")
        check(ingress["from"] == [{"namespaceSelector": settings.get("metricsNamespaceSelector", {})}], f"{scenario}: operator ingress sources")
    workloads = {p["metadata"]["namespace"] for p in policies if p["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "kart"}}
    expected = set(values.get("watchNamespaces") or [NAMESPACE]) if settings.get("workloads", True) else set()
    check(workloads == expected, f"{scenario}: workload NetworkPolicies in {sorted(workloads)}, expected {sorted(expected)}")


# ---- the scenarios: defaults and each documented option

SCENARIOS = {
    "defaults": {},
    "watchNamespaces": {"watchNamespaces": ["team-a", "team-b"]},
    "crds.install=false": {"crds": {"install": False}},
    "crds.keep=false": {"crds": {"keep": False}},
    "leaderElection.enabled=false": {"leaderElection": {"enabled": False}},
    "kueue.enabled": {"kueue": {"enabled": True}},
    "kueue.enabled, watched namespaces": {"kueue": {"enabled": True}, "watchNamespaces": ["team-a"]},
    "replicaCount=2": {"replicaCount": 2},
    "rbac.create=false": {"rbac": {"create": False}, "serviceAccount": {"create": False, "name": "kart"}},
    "serviceMonitor": {"serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "prometheus"}}},
    "prometheusRule": {"prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}}},
    "grafanaDashboards": {"grafanaDashboards": {"enabled": True, "namespace": "monitoring", "annotations": {"grafana_folder": "kart"}}},
    "networkPolicy": {"networkPolicy": {"enabled": True, "metricsNamespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}},
    "networkPolicy.enabled=false": {"networkPolicy": {"enabled": False}},
    "everything, watched namespaces": {
        "watchNamespaces": ["team-a"],
        "replicaCount": 2,
        "image": {"tag": "0.2.0"},
        "workerImage": {"repository": "registry.example.com/kart", "tag": "dev"},
        "imagePullSecrets": [{"name": "ghcr"}],
        "serviceMonitor": {"enabled": True},
        "prometheusRule": {"enabled": True},
        "grafanaDashboards": {"enabled": True},
        "networkPolicy": {"enabled": True},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        "priorityClassName": "system-cluster-critical",
    },
}

# Values the chart must refuse, and a word of the error it must give.
REJECTED = {
    "misspelt key": ({"serviceMonitor": {"enable": True}}, "enable"),
    "bad namespace name": ({"watchNamespaces": ["Team_A"]}, "watchNamespaces"),
    "two replicas without leader election": ({"replicaCount": 2, "leaderElection": {"enabled": False}}, "leaderElection"),
}


def main() -> None:
    check(os.path.realpath(CHART / "files/grafana") == str(ROOT / "deploy/grafana"), "charts/kart/files/grafana is not a link to deploy/grafana")
    check(os.path.realpath(CHART / "files/prometheus-rules.yaml") == str(ROOT / "deploy/prometheus/rules.yaml"), "charts/kart/files/prometheus-rules.yaml is not a link to deploy/prometheus/rules.yaml")
    check(os.path.realpath(CHART / "files/crds") == str(ROOT / "crds"), "charts/kart/files/crds is not a link to crds/")
    schema = json.loads((CHART / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    defaults = load((CHART / "values.yaml").read_text())
    jsonschema.validate(defaults, schema)
    check_readme_values(defaults)
    check_dashboard_files()
    check_images()

    for scenario, values in SCENARIOS.items():
        with quiet():
            report = helm.lint(CHART, values, strict=True, namespace=NAMESPACE, kube_version=f"v{KUBE_VERSIONS[0]}")
        problems = [m for m in report["messages"] if m["severity"] >= 2] + report["errors"]
        check(not problems, f"{scenario}: helm lint: {problems}")
        objects, notes = render(values)
        validate_kubernetes(objects, scenario)
        check_operator(objects, values, scenario)
        check_rbac(objects, values, scenario)
        check_crds(objects, values, scenario)
        check_monitoring(objects, values, scenario)
        check_rules(objects, values, notes, scenario)
        check_dashboards(objects, values, scenario)
        check_network_policies(objects, values, scenario)
        names = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
        check(len(names) == len(set(names)), f"{scenario}: an object is rendered twice")
        print(f"{scenario}: {len(objects)} objects")

    for case, (values, word) in REJECTED.items():
        try:
            render(values)
            check(False, f"{case}: the chart accepted {values}")
        except (helm.HelmValuesError, helm.HelmRenderError) as e:
            check(word in str(e), f"{case}: the error does not name {word!r}: {e}")

    for f in failures:
        print("FAIL", f)
    sys.exit(1 if failures else 0)


# What issue #9 asks each dashboard to show: panel titles (case-insensitive substrings).
DASHBOARD_PANELS = {
    "training.json": ["reward", "exact match", "kl", "entropy", "clip fraction", "gradient norm", "learning rate",
                      "tokens per second", "step time", "policy version", "staleness", "weight sync"],
    "agent.json": ["tool calls per trajectory", "tool success rate", "turns", "response length", "valid-action ratio",
                   "truncated and aborted"],
    "retriever.json": ["queries per second", "latency percentiles", "cache hit ratio", "errors"],
    "operator.json": ["reconciles", "reconcile errors", "reconcile duration", "trainingjobs by phase"],
}


def check_dashboard_files() -> None:
    boards = {name: json.loads(text) for name, text in dashboards().items()}
    check(sorted(boards) == sorted(DASHBOARD_PANELS), f"deploy/grafana holds {sorted(boards)}")
    uids = [b["uid"] for b in boards.values()]
    check(len(set(uids)) == len(uids), f"dashboard uids repeat: {uids}")
    for name, board in boards.items():
        panels = board["panels"]
        ids = [p["id"] for p in panels]
        check(len(set(ids)) == len(ids), f"{name}: panel ids repeat")
        variables = {v["name"] for v in board["templating"]["list"]}
        check("datasource" in variables, f"{name}: no datasource variable")
        titles = [p["title"].lower() for p in panels if p["type"] != "row"]
        for wanted in DASHBOARD_PANELS.get(name, []):
            check(any(wanted in t for t in titles), f"{name}: no panel about {wanted!r}")
        for p in panels:
            if p["type"] == "row":
                continue
            check(bool(p.get("targets")) and p["datasource"]["uid"] == "${datasource}", f"{name}: panel {p['title']!r} queries nothing or a fixed data source")
            used = set(re.findall(r"\$\{?(\w+)\}?", " ".join(t["expr"] for t in p["targets"])))
            undefined = used - variables - {"__rate_interval", "__interval", "__range"}
            check(not undefined, f"{name}: panel {p['title']!r} uses undefined variables {undefined}")
            grid = p["gridPos"]
            check(grid["x"] + grid["w"] <= 24, f"{name}: panel {p['title']!r} overflows the grid")


def check_images() -> None:
    """The worker image's PyTorch is the one tch needs (scripts/requirements-build.txt)."""
    torch = re.search(r"^torch==(\S+)", (ROOT / "scripts/requirements-build.txt").read_text(), re.M)
    image = re.search(r"^ARG PYTORCH_VERSION=(\S+)", (ROOT / "deploy/Dockerfile.worker").read_text(), re.M)
    check(bool(torch and image) and torch[1] == image[1], f"deploy/Dockerfile.worker PyTorch {image and image[1]} != requirements {torch and torch[1]}")
    operator = (ROOT / "deploy/Dockerfile.operator").read_text()
    check("--target x86_64-unknown-linux-musl" in operator and "distroless/static" in operator, "the operator image is not a static binary on distroless/static")


def check_readme_values(defaults: dict) -> None:
    """Every value the book's chart table documents exists, with the documented default."""
    page = (ROOT / "docs/src/deploying.md").read_text()
    section = page.split("# Deploying on Kubernetes", 1)
    if not check(len(section) == 2, "docs/src/deploying.md has no 'Deploying on Kubernetes' section"):
        return
    rows = re.findall(r"^\| `([a-zA-Z.]+)` \| `([^`]*)` \|", section[1], re.M)
    check(len(rows) >= 10, f"the book documents {len(rows)} chart values")
    for key, default in rows:
        value = defaults
        for part in key.split("."):
            if not check(isinstance(value, dict) and part in value, f"the book documents `{key}`, which values.yaml lacks"):
                break
            value = value[part]
        else:
            check(json.dumps(value) == default or value == default, f"the book: `{key}` defaults to {json.dumps(value)}, not {default}")


if __name__ == "__main__":
    main()
