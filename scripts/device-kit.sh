#!/usr/bin/env bash
# Builds the device kit: `kart` for a GPU machine whose PyTorch is not the one this checkout builds
# against (the lent machine, one H100 or H200, has PyTorch 2.11.0 for CUDA 13.0 under Python 3.12,
# transformers 5.17, no Rust, no network), and writes .device/ (git-ignored), which
# `scripts/gpu-check.sh --single-gpu` runs from there:
#
#   .device/kart           the binary, stripped (its libtorch is the GPU machine's own)
#   .device/fixtures/      the fixture models the checks read (../shared does not travel)
#   .device/manifest.json  what it was built against, the stubbed operators, sizes, build time
#
#   scripts/device-kit.sh [--no-verify]
#
# How the version gap is closed: tch 0.26 is generated from PyTorch 2.13 and its C wrapper calls
# every operator of it. The kit builds it against PyTorch $TORCH (the PyPI wheel of the GPU
# machine's version and CUDA build, in a virtualenv of its own) with tch's version check bypassed
# and its wrapper patched (scripts/device/patch_torch_sys.py): each wrapper function that differs
# from torch-sys $TORCH_SYS (the release generated from PyTorch $TORCH) fails naming itself
# instead, and the build stops if kart calls any of them. Everything is cached under
# $KART_DEVICE_CACHE (default ~/.cache/kart/device): the venv, a copy of the working tree (whose
# Cargo.lock takes the patched torch-sys, leaving this checkout's alone) and a target folder.
#
# Unless --no-verify, the kit's binary is then run here with the wheel's own libraries on the
# loader path: `kart doctor --json` must report CUDA support loaded, and every step of
# `scripts/gpu-check.sh --cpu-rehearsal` must pass with that binary and the venv's PyTorch and
# transformers (the GPU machine's versions) as the anchors.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TORCH=2.11.0
# The GPU machine's transformers: the anchors of the rehearsal below are the ones it runs.
TRANSFORMERS=5.17.0
TORCH_SYS=0.24.0
CUDA_HEADERS=("nvidia-cuda-crt==13.0.*" "nvidia-cuda-cccl==13.0.*")
cache="${KART_DEVICE_CACHE:-$HOME/.cache/kart/device}"
venv="$cache/venv-torch-$TORCH"
out="$root/.device"
verify=1
case "${1:-}" in
  "") ;;
  --no-verify) verify="" ;;
  *) echo "usage: $0 [--no-verify]" >&2; exit 2 ;;
esac
started=$SECONDS
die() { echo "device-kit: $*" >&2; exit 1; }

# PyTorch $TORCH and the CUDA headers beside it.
mkdir -p "$cache"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
if ! "$venv/bin/python" -c "import torch, transformers
assert torch.__version__.startswith('$TORCH') and transformers.__version__ == '$TRANSFORMERS'" 2>/dev/null; then
  echo "device-kit: installing PyTorch $TORCH and transformers $TRANSFORMERS into $venv (CUDA libraries, several GB the first time)"
  bash "$root/scripts/pip-install.sh" "$venv/bin/python" "torch==$TORCH" "transformers==$TRANSFORMERS" \
    "${CUDA_HEADERS[@]}" numpy
fi
torch_lib="$("$venv/bin/python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"

# A copy of the working tree (tracked and untracked files git does not ignore).
src="$cache/src"
mkdir -p "$src"
(cd "$root" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$src"
# ../shared beside the copy, for the fixtures the verification reads.
ln -sfn "$root/../shared" "$cache/shared"

# torch-sys 0.26 with its wrapper fitted to PyTorch $TORCH.
source "$root/scripts/env.sh"
(cd "$src" && cargo fetch --locked >/dev/null)
registry="$(dirname "$(cd "$src" && cargo metadata --format-version 1 --locked \
  | python3 -c 'import json, sys; print(next(p["manifest_path"] for p in json.load(sys.stdin)["packages"] if p["name"] == "torch-sys"))')")"
tch="$(dirname "$registry")/tch-$(basename "$registry" | sed 's/^torch-sys-//')"
[ -d "$tch" ] || die "tch's sources are not beside $registry"
patched="$cache/$(basename "$registry")-torch-$TORCH"
reference="$cache/torch-sys-$TORCH_SYS"
if [ ! -d "$reference" ]; then
  curl -fsSL --retry 5 "https://static.crates.io/crates/torch-sys/torch-sys-$TORCH_SYS.crate" | tar -xz -C "$cache"
fi
rm -rf "$patched" && cp -r "$registry" "$patched"
python3 "$root/scripts/device/patch_torch_sys.py" --wrapper "$patched" --reference "$reference" --tch "$tch" \
  --torch-version "$TORCH" --sources "$root/crates" "$root/operator" --list "$cache/stubbed.txt"

# kart against PyTorch $TORCH.
build_started=$SECONDS
(
  cd "$src"
  export CARGO_TARGET_DIR="$cache/target" LIBTORCH_USE_PYTORCH="$venv" VIRTUAL_ENV="$venv" \
    LIBTORCH_BYPASS_VERSION_CHECK=1 PATH="$venv/bin:$PATH"
  cargo build --release -p kart --bin kart --config "patch.crates-io.torch-sys.path=\"$patched\""
)
build_seconds=$((SECONDS - build_started))

# .device/: the stripped binary, the fixtures, the manifest.
rm -rf "$out" && mkdir -p "$out/fixtures"
cp "$cache/target/release/kart" "$out/kart"
strip "$out/kart"
cp -r "$root/../shared/fixtures/models" "$out/fixtures/"
glibc="$(objdump -T "$out/kart" | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -n1)"
bytes="$(du -sb "$out" | cut -f1)"
# A device call carries the working tree (tracked and untracked files git does not ignore) with
# .device/, 64 MiB in all.
tree="$(cd "$root" && git ls-files -z --cached --others --exclude-standard \
  | { du -cb --files0-from=- 2>/dev/null || true; } | tail -n1 | cut -f1)"
[ $((bytes + tree)) -le $((64 << 20)) ] \
  || die ".device ($bytes bytes) and the working tree ($tree bytes) are over the 64 MiB a device call carries"
python3 - "$out/manifest.json" "$TORCH" "$cache/stubbed.txt" "$glibc" "$build_seconds" "$out" <<'EOF'
import json, pathlib, subprocess, sys
path, torch, stubbed, glibc, seconds, out = sys.argv[1:]
files = {str(p.relative_to(out)): p.stat().st_size for p in pathlib.Path(out).rglob("*") if p.is_file()}
commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
json.dump({"torch": torch, "commit": commit, "glibc_required": glibc, "build_seconds": int(seconds),
           "stubbed_operators": pathlib.Path(stubbed).read_text().split(),
           "bytes": sum(files.values()), "kart_bytes": files["kart"]}, open(path, "w"), indent=1)
EOF
echo "device-kit: .device/ is $((bytes >> 20)) MiB (kart $(( $(stat -c %s "$out/kart") >> 20 )) MiB, needs $glibc), $(((bytes + tree) >> 20)) MiB with the working tree; built in ${build_seconds}s, $((SECONDS - started))s in all"

[ -n "$verify" ] || exit 0
# The kit's binary with the wheel's own libraries, as on the GPU machine.
LD_LIBRARY_PATH="$torch_lib" "$out/kart" doctor --json | python3 -c 'import json, sys
d = json.load(sys.stdin)
assert d["cuda"]["loaded"], "CUDA support is not loaded: %s" % d
print("device-kit: kart doctor: CUDA support loaded, torch", d["torch_version"])'
# Every step of the one-GPU check on the CPU, with the kit's binary and the GPU machine's versions
# of PyTorch and transformers as the anchors (CI's rehearsal uses this checkout's build and venv).
rehearsal="$cache/rehearsal"
rm -rf "$rehearsal"
KART="$out/kart" PYTHON="$venv/bin/python" BUDGET_SECONDS=3000 \
  bash "$root/scripts/gpu-check.sh" --cpu-rehearsal "$rehearsal" || die "the kit's CPU rehearsal failed"
python3 -c 'import json, sys
failed = [s["step"] for s in json.load(open(sys.argv[1]))["steps"] if s["rc"] != 0]
assert not failed, "steps of the CPU rehearsal failed with the kit: %s" % failed' "$rehearsal/gpu-check.json"
echo "device-kit: verified (kart doctor; every step of the check on the CPU: $rehearsal/gpu-check.md)"
