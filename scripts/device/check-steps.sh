#!/usr/bin/env bash
# The steps of `scripts/gpu-check.sh --single-gpu OUT` and `--cpu-rehearsal OUT` (see there).
#
#   scripts/device/check-steps.sh single-gpu|cpu-rehearsal OUT
#
# single-gpu: kart from the device kit ($KART, default .device/kart) with the libraries of the
# GPU machine's PyTorch on the loader path; anchors in $PYTHON (default python3, the machine's).
# cpu-rehearsal: kart of this checkout's build ($KART, default the cargo target folder's) and the
# project venv's Python ($PYTHON); every step on the CPU with tiny shapes.
#
# Each step runs with its output in a log, bounded by what is left of the budget ($BUDGET_SECONDS,
# default 480); a failure is recorded and the next step runs. scripts/device/report.py then writes
# OUT/gpu-check.json, OUT/gpu-check.md and OUT/logs.tar.gz (three files: what comes back from a
# device call is limited in number).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
mode="$1"
out="$(mkdir -p "$2" && cd "$2" && pwd)"
budget="${BUDGET_SECONDS:-480}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
cd "$root"

case "$mode" in
  single-gpu)
    PYTHON="${PYTHON:-python3}"
    KART="${KART:-$root/.device/kart}"
    device=cuda
    # A quick workload (--quick) only where the rehearsal says so.
    quick=()
    shape05=(--shape qwen2.5-0.5b)
    shape15=(--shape qwen2.5-1.5b)
    dense=(--passages 1000000 --dim 768 --queries 10000)
    card="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1)"
    # Dense bf16 peak of the card (spec sheets), for the model FLOPs utilisation.
    case "$card" in
      *H100*|*H200*) peak="${PEAK_TFLOPS:-989}" ;;
      *A100*) peak="${PEAK_TFLOPS:-312}" ;;
      *L40S*) peak="${PEAK_TFLOPS:-362}" ;;
      *) peak="${PEAK_TFLOPS:-}" ;;
    esac
    ;;
  cpu-rehearsal)
    source scripts/env.sh
    PYTHON="${PYTHON:-$KART_VENV/bin/python}"
    KART="${KART:-${CARGO_TARGET_DIR:-$root/target}/release/kart}"
    device=cpu
    quick=(--quick)
    shape05=()
    shape15=()
    dense=(--passages 4000 --dim 64 --queries 100)
    card="CPU rehearsal"
    peak="${PEAK_TFLOPS:-1}"
    ;;
  *) echo "usage: $0 single-gpu|cpu-rehearsal OUT" >&2; exit 2 ;;
esac
[ -x "$KART" ] || { echo "check-steps: $KART is missing (scripts/device-kit.sh builds the kit)" >&2; exit 1; }
# kart runs with the libtorch of $PYTHON's PyTorch (the kit's binary was built against the GPU
# machine's; the rehearsal may run it with a venv of that version, as scripts/device-kit.sh does).
torch_lib="$("$PYTHON" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')" \
  || { echo "check-steps: $PYTHON has no torch" >&2; exit 1; }
export LD_LIBRARY_PATH="$torch_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
peak_flag=()
[ -n "$peak" ] && peak_flag=(--peak-tflops "$peak")
started=$SECONDS
: >"$work/steps.jsonl"

# step NAME COMMAND...: runs COMMAND with its output in $work/NAME.log, within what is left of the
# budget; records its exit code and seconds in $work/steps.jsonl.
step() {
  local name="$1"; shift
  local left=$((budget - (SECONDS - started))) begun=$SECONDS rc
  if [ "$left" -lt 15 ]; then
    echo "== $name: skipped (the budget of ${budget}s is spent)"
    printf '{"step": "%s", "rc": null, "seconds": 0, "skipped": true}\n' "$name" >>"$work/steps.jsonl"
    return
  fi
  echo "== $name ($((SECONDS - started))s of ${budget}s): $*"
  timeout --kill-after=10 "$left" "$@" >"$work/$name.log" 2>&1
  rc=$?
  printf '{"step": "%s", "rc": %d, "seconds": %d}\n' "$name" "$rc" $((SECONDS - begun)) >>"$work/steps.jsonl"
  [ "$rc" -eq 0 ] || { echo "   failed ($rc):"; tail -n 5 "$work/$name.log" | sed 's/^/   /'; }
}

anchor=(--python "$PYTHON")
step doctor sh -c '"$0" doctor --json > "$1/doctor.json"' "$KART" "$work"
step model-f32 "$KART" bench model --device "$device" --precision f32 "${shape05[@]}" "${quick[@]}" \
  --runs 1 --steps 1 "${anchor[@]}" --json "$work/model-f32.json"
step model-bf16 "$KART" bench model --device "$device" --precision bf16 "${shape05[@]}" "${quick[@]}" \
  --runs 1 --steps 1 "${anchor[@]}" --json "$work/model-bf16.json"
step step-gpu "$KART" bench train --quick --device "$device" --precision f32 --steps 1 "${anchor[@]}" \
  --json "$work/step-gpu.json"
step step-cpu "$KART" bench train --quick --device cpu --precision f32 --steps 1 "${anchor[@]}" \
  --json "$work/step-cpu.json"
step train-0.5b "$KART" bench train --device "$device" "${shape05[@]}" "${quick[@]}" --precision bf16 \
  --activation-checkpointing --steps 2 "${peak_flag[@]}" "${anchor[@]}" --json "$work/train-0.5b.json"
step train-1.5b "$KART" bench train --device "$device" "${shape15[@]}" "${quick[@]}" --precision bf16 \
  --activation-checkpointing --steps 2 "${peak_flag[@]}" "${anchor[@]}" --json "$work/train-1.5b.json"
step memory "$KART" bench train --memory --precision bf16 --device "$device" "${shape05[@]}" "${quick[@]}" \
  --steps 1 --json "$work/memory.json"
step dense "$KART" bench retriever --dense --exact-only --device "$device" "${dense[@]}" \
  --python "$PYTHON" --work "$work/dense" \
  --json "$work/dense.json"
step local "$KART" local --device "$device" --steps 2 --out "$work/local" --persons 300 --rl-questions 64 \
  --warm-steps 40 --copy-drills 20 --fact-drills 10 --probe-rounds 0 --prompts 4 --n 4 --eval-questions 16 --eval-samples 0 \
  --dynamic-sampling false
[ -f "$work/local/summary.json" ] && cp "$work/local/summary.json" "$work/local.json"

python3 "$root/scripts/device/report.py" --work "$work" --out "$out" --mode "$mode" --card "$card" \
  --peak "${peak:-}" --seconds $((SECONDS - started))
