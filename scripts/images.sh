#!/usr/bin/env bash
# kart's images for the one-machine cluster of scripts/control-plane.sh, built with buildah from
# Debian's packages (no image registry is reachable here) and written as OCI archives that the
# node's containerd imports:
#
#   scripts/images.sh node     what every node runs: the Pod sandbox's image (Kubernetes' pause
#                              program, built by gcc) and the Debian base (localhost/kart-base)
#   scripts/images.sh all      those, and kart's worker and operator images from the production
#                              Dockerfiles (deploy/Dockerfile.*) with BUILD=prebuilt (the binaries
#                              of the cargo target folder) on local bases
#
# Prints the folder of the archives (pause, kart-base, kart and kart-operator .oci.tar).
#
# The bases stand in for the production ones, of the same Debian release (bookworm):
# localhost/kart-base (mmdebstrap's minbase with passwd and ca-certificates) for distroless/static,
# and localhost/kart-torch-runtime (the base with Debian's python3 and the PyTorch wheel of the
# project venv: torch, its CUDA libraries and the modules `import torch` needs) for
# pytorch/pytorch's runtime image. Everything is cached in $KART_IMAGE_CACHE (default
# ~/.cache/kart/images): buildah's storage (bases and layers), and each archive beside the key of
# its inputs; an unchanged input builds nothing. The build's RUN steps run under the node's own runc
# (scripts/control-plane.sh build-node), so buildah needs no runtime of the machine's.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${KART_IMAGE_CACHE:-$HOME/.cache/kart/images}"
target="${KART_BIN_DIR:-${CARGO_TARGET_DIR:-$root/target}/release}"
venv="${KART_VENV:-$root/.venv}"
release=bookworm
mirror=http://deb.debian.org/debian
base_packages=passwd,ca-certificates
version="$(sed -n 's/^appVersion: "\(.*\)"/\1/p' "$root/charts/kart/Chart.yaml")"
pause_source="$(go env GOMODCACHE 2>/dev/null)/k8s.io/kubernetes@v1.37.2/build/pause/linux/pause.c"

die() { echo "images: $*" >&2; exit 1; }
for tool in buildah mmdebstrap; do
  command -v "$tool" >/dev/null || die "'$tool' is required (Debian package $tool; scripts/setup.sh installs it)"
done
mkdir -p "$cache/archives"
BUILDAH_RUNTIME="$(bash "$root/scripts/control-plane.sh" build-node)/runc"
export BUILDAH_RUNTIME
# A lock: two runs (two test binaries) build one at a time, the second finding the first's work.
exec 9>"$cache/lock"
flock 9

b() { buildah --root "$cache/storage/root" --runroot "$cache/storage/run" --storage-driver overlay "$@"; }
# Working containers an interrupted build left behind (mounted, holding their layers).
b rm -a >/dev/null 2>&1 || true
key() { sha256sum | cut -c1-16; }
have() { b inspect --type image "$1" >/dev/null 2>&1; }

# Writes image `ref` to archives/NAME.oci.tar unless the archive of input key `k` is there.
archive() {
  local name="$1" ref="$2" k="$3" out="$cache/archives/$1.oci.tar"
  [ -f "$out" ] && [ "$(cat "$out.key" 2>/dev/null)" = "$k" ] && return 0
  rm -f "$out" "$out.key"
  # Layers as buildah keeps them, not compressed again: containerd reads the archive once, and gzip
  # of gigabytes costs minutes of one core.
  b push -q --disable-compression "$ref" "oci-archive:$out.partial:$ref" >/dev/null
  mv "$out.partial" "$out" && echo "$k" >"$out.key"
}

pause() {
  local ref=registry.k8s.io/pause:3.10 k
  [ -f "$pause_source" ] || die "no $pause_source: scripts/control-plane.sh build downloads the Kubernetes module"
  k="$(cat "$pause_source" | key)"
  if [ "$(cat "$cache/archives/pause.oci.tar.key" 2>/dev/null)" != "$k" ]; then
    local tmp c
    tmp="$(mktemp -d)"
    gcc -Os -static -DVERSION=3.10-kart -o "$tmp/pause" "$pause_source"
    c="$(b from scratch)"
    b copy "$c" "$tmp/pause" /pause >/dev/null
    b config --entrypoint '["/pause"]' --user 65535:65535 "$c"
    b commit -q --rm "$c" "$ref" >/dev/null
    rm -rf "$tmp"
  fi
  archive pause "$ref" "$k"
}

# localhost/kart-base:KEY, made by mmdebstrap; echoes its name.
base() {
  local ref="localhost/kart-base:$(echo "$release $mirror $base_packages" | key)"
  if ! have "$ref"; then
    echo "images: making a Debian $release base (mmdebstrap)" >&2
    local tmp c
    tmp="$(mktemp -d)"
    mmdebstrap -q --variant=minbase --include="$base_packages" "$release" "$tmp/rootfs.tar" "$mirror" >&2
    c="$(b from scratch)"
    b add "$c" "$tmp/rootfs.tar" / >/dev/null
    b config --cmd /bin/bash "$c"
    b commit -q --rm "$c" "$ref" >/dev/null
    rm -rf "$tmp"
  fi
  echo "$ref"
}

# The top-level modules of the venv's site-packages that `import torch` loads (torch's own among them).
imported_by_torch='import os, sys, sysconfig, torch
site = sysconfig.get_paths()["purelib"]
files = (getattr(m, "__file__", None) or "" for m in list(sys.modules.values()))
tops = {os.path.relpath(f, site).split("/")[0] for f in files if f.startswith(site + "/")}
print(" ".join(sorted(t for t in tops if not t.startswith("_"))))'

# localhost/kart-torch-runtime:KEY: the base, python3, and the venv's PyTorch; echoes its name.
torch_runtime() {
  local from="$1" site torch modules ref
  site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  torch="$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))')"
  # torch, its CUDA libraries (nvidia/), and every other module of the venv that `import torch`
  # imports.
  modules="nvidia $("$venv/bin/python" -c "$imported_by_torch")"
  ref="localhost/kart-torch-runtime:$(echo "$from $torch $modules .libs" | key)"
  if ! have "$ref"; then
    echo "images: adding python3 and PyTorch $torch to the base" >&2
    local c module
    c="$(b from "$from")"
    b run --network host "$c" -- sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends python3 >/dev/null && rm -rf /var/lib/apt/lists/*' >&2
    for module in $modules; do
      b copy "$c" "$site/$module" "/usr/local/lib/python3.11/dist-packages/$module" >/dev/null
      # A wheel's bundled shared libraries (numpy's OpenBLAS) sit beside it.
      if [ -d "$site/$module.libs" ]; then
        b copy "$c" "$site/$module.libs" "/usr/local/lib/python3.11/dist-packages/$module.libs" >/dev/null
      fi
    done
    b commit -q --rm "$c" "$ref" >/dev/null
  fi
  echo "$ref"
}

# Builds `image` (NAME:VERSION) from deploy/Dockerfile.FILE with the binary BIN on RUNTIME.
kart_image() {
  local name="$1" file="$2" bin="$3" runtime="$4" ref="ghcr.io/kart-dev/$1:$version" k ctx
  [ -x "$target/$bin" ] || die "no $target/$bin: build it first (make build)"
  k="$( (sha256sum "$target/$bin" "$root/deploy/Dockerfile.$file"; echo "$runtime") | key)"
  if [ "$(cat "$cache/archives/$name.oci.tar.key" 2>/dev/null)" != "$k" ]; then
    echo "images: building $ref" >&2
    ctx="$(mktemp -d)"
    ln "$target/$bin" "$ctx/$bin" 2>/dev/null || cp "$target/$bin" "$ctx/$bin"
    b bud -q --layers --network host --build-arg BUILD=prebuilt --build-arg RUNTIME_IMAGE="$runtime" \
      -f "$root/deploy/Dockerfile.$file" -t "$ref" "$ctx" >/dev/null
    rm -rf "$ctx"
  fi
  archive "$name" "$ref" "$k"
}

# The images every node needs: pause, and the Debian base as localhost/kart-base:bookworm (the
# storage provisioner's helper Pods run it).
node_images() {
  local ref
  pause
  ref="$(base)"
  b tag "$ref" "localhost/kart-base:$release"
  archive kart-base "localhost/kart-base:$release" "${ref##*:}"
}

case "${1:-}" in
  node) node_images ;;
  all)
    node_images
    base_ref="$(base)"
    kart_image kart-operator operator kart-operator "$base_ref"
    kart_image kart worker kart "$(torch_runtime "$base_ref")"
    # Layers no image names any more (earlier builds of the binaries).
    b rmi --prune >/dev/null 2>&1 || true
    ;;
  *) die "usage: $0 node | all" ;;
esac
echo "$cache/archives"
