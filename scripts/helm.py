"""`helm install` / `helm uninstall` through Helm's own Go library (PyPI `helm-python-sdk`, in the
project venv), for machines without the helm binary: the tests install charts/kart into the real
control plane with it, and a user can do the same by hand.

    .venv/bin/python scripts/helm.py install kart charts/kart --namespace kart-system \
        --create-namespace [--set key=value ...]
    .venv/bin/python scripts/helm.py uninstall kart --namespace kart-system

The cluster is the one `KUBECONFIG` (or `--kubeconfig`) names. Prints the release's status.
"""

import argparse
import sys

import helm_python as helm


def main() -> int:
    parser = argparse.ArgumentParser(prog="helm.py", description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", help="the cluster's kubeconfig (default: KUBECONFIG)")
    commands = parser.add_subparsers(dest="command", required=True)
    install = commands.add_parser("install", help="install a chart as a release")
    install.add_argument("name")
    install.add_argument("chart")
    install.add_argument("--namespace", default="default")
    install.add_argument("--create-namespace", action="store_true")
    install.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="a value, as helm's --set reads it (repeatable)")
    uninstall = commands.add_parser("uninstall", help="uninstall a release")
    uninstall.add_argument("name")
    uninstall.add_argument("--namespace", default="default")
    args = parser.parse_args()

    with helm.Config(kubeconfig_path=args.kubeconfig, namespace=args.namespace) as config:
        try:
            if args.command == "install":
                values: dict = {}
                for expression in args.set:
                    merge(values, helm.parse_set_string(expression))
                release = config.install(
                    args.chart,
                    args.name,
                    values,
                    namespace=args.namespace,
                    create_namespace=args.create_namespace,
                )
                print(f"{release['name']}: {release['status']} (revision {release['revision']})")
            else:
                config.uninstall(args.name)
                print(f"{args.name}: uninstalled")
        except helm.HelmError as error:
            print(f"helm.py {args.command} {args.name}: {error}", file=sys.stderr)
            return 1
    return 0


def merge(into: dict, values: dict) -> None:
    """Merges `values` into `into`, maps key by key (as repeated --set flags combine)."""
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value)
        else:
            into[key] = value


if __name__ == "__main__":
    sys.exit(main())
