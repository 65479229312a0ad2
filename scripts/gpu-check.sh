#!/usr/bin/env bash
# kart on GPUs. Three modes:
#
#   scripts/gpu-check.sh                        every GPU of a machine with kart built there (below)
#   scripts/gpu-check.sh --single-gpu OUT       one GPU, from the device kit (.device/, built here by
#                                               scripts/device-kit.sh; the GPU machine's own PyTorch,
#                                               transformers and Python are the anchors)
#   scripts/gpu-check.sh --cpu-rehearsal OUT    the --single-gpu steps on the CPU with tiny shapes and
#                                               the project's venv, so a broken step is found here
#
# --single-gpu and --cpu-rehearsal run these steps (scripts/device/check-steps.sh), each logged,
# timed and bounded, a failure recorded and the rest still run, within 8 minutes in all, then write
# OUT/gpu-check.json (every step's status and figures), OUT/gpu-check.md (the tables) and
# OUT/logs.tar.gz (scripts/device/report.py):
#   doctor        `kart doctor --json`: CUDA, the devices and their memory, NCCL
#   model-f32     logits and greedy tokens of a Qwen2.5-0.5B-shaped random model against transformers
#   model-bf16    on the same GPU, in f32 and in bf16; generation tokens/s at batch 1 and 32
#   step-gpu      one GRPO step's policy loss and gradient norm on the GPU, and the same step on
#   step-cpu      the CPU (f32, the fixture's shape)
#   train-0.5b    a GRPO step (policy + reference, bf16, activation checkpointing) of the 0.5B and
#   train-1.5b    1.5B shapes against the same step in torch: tokens/s and MFU against the bf16 peak
#   memory        `kart bench train --memory --precision bf16` (peak from the CUDA allocator)
#   dense         the dense index's exact scan, 1M x 768 in f16, against torch's matmul + topk
#   local         `kart local --device cuda --steps 2` on a small world: the whole loop on a GPU
#
# Every GPU (no argument), after `make build` (or with KART=/path/to/kart built against this
# machine's torch):
#   1. `kart doctor`: CUDA support loaded, the devices, NCCL, and each component's device.
#   2. 3 GRPO steps (the trainer's update) of a fixture-shaped model on one GPU, and with several
#      GPUs on all of them over NCCL, each against the same steps in PyTorch (DDP under torchrun).
#   3. `kart bench train --device cuda`: the 46.5M-parameter step on one GPU against PyTorch, with
#      tokens/s and model FLOPs utilisation (MFU).
#   4. With 2 GPUs or more, `kart bench train --memory --device cuda`: step time, tokens/s and
#      peak memory per GPU (the caching allocator's) in f32, with activation checkpointing, with
#      ZeRO-2 or full sharding (FSDP) over all GPUs, then bf16 with checkpointing, unsharded and
#      fully sharded; on the benchmark model and on a Qwen2.5-0.5B-shaped one (its last row: bf16,
#      checkpointing and full sharding over all GPUs).
#   5. `kart bench sync`: weight sync by disk, HTTP pull and broadcast to SGLang stand-ins (Gloo).
#      With 2 GPUs or more and the `sglang` package installed, a real SGLang server on GPU 1
#      serving the benchmark model, and the trainer's tensors on GPU 0 broadcast to its worker
#      over NCCL (`/init_weights_update_group`, `/update_weights_from_distributed`), against a
#      reload from disk. With 2 GPUs or more and the `vllm` package, a real vLLM server on GPU 1
#      (`VLLM_SERVER_DEV_MODE=1`, weight-transfer backend nccl) takes the same tensors from GPU 0
#      through kart's NCCL communicator (`/init_weight_transfer_engine`, `/update_weights`).
#   6. `kart bench retriever --dense --device cuda`: the dense index's exact scan in f16, sharded
#      over every GPU, against its HNSW graph on the CPU (1M x 768 synthetic embeddings; faiss's
#      HNSW too when faiss-cpu is installed).
#
# PEAK_TFLOPS sets the card's dense f32 peak for MFU (guessed for H100, H200, A100 and L40S).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
case "${1:-}" in
  --single-gpu|--cpu-rehearsal)
    [ -n "${2:-}" ] || { echo "usage: $0 $1 OUT" >&2; exit 2; }
    exec bash scripts/device/check-steps.sh "${1#--}" "$2" ;;
  "") ;;
  *) echo "usage: $0 [--single-gpu OUT | --cpu-rehearsal OUT]" >&2; exit 2 ;;
esac
source scripts/env.sh
KART="${KART:-${CARGO_TARGET_DIR:-target}/release/kart}"
[ -x "$KART" ] || { echo "gpu-check: $KART is missing; run \`make build\` or set KART" >&2; exit 1; }
command -v nvidia-smi >/dev/null || { echo "gpu-check: nvidia-smi is missing: no NVIDIA driver here" >&2; exit 1; }

GPUS="$(nvidia-smi -L | grep -c '^GPU ')"
CARD="$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n1)"
if [ -z "${PEAK_TFLOPS:-}" ]; then
  case "$CARD" in
    *H100*|*H200*) PEAK_TFLOPS=67 ;;
    *A100*) PEAK_TFLOPS=19.5 ;;
    *L40S*) PEAK_TFLOPS=91.6 ;;
  esac
fi
PEAK=()
[ -n "${PEAK_TFLOPS:-}" ] && PEAK=(--peak-tflops "$PEAK_TFLOPS")
echo "== $(date -u +%F) on $GPUS x $CARD${PEAK_TFLOPS:+ (f32 peak $PEAK_TFLOPS TFLOP/s)}"

echo "== kart doctor"
"$KART" doctor
"$KART" doctor --json | python3 -c 'import json, sys
d = json.load(sys.stdin)
assert d["cuda"]["loaded"] and d["devices"], "CUDA is not loaded or no device is visible: %s" % d'

if [ "$GPUS" -gt 1 ]; then ALL=", and on all $GPUS over NCCL"; else ALL=""; fi
echo "== 3 GRPO steps of a fixture-shaped model on 1 GPU$ALL"
"$KART" bench train --quick --device cuda --ranks "$GPUS" --steps 3 "${PEAK[@]}"

echo "== kart bench train --device cuda"
"$KART" bench train --device cuda "${PEAK[@]}"

if [ "$GPUS" -gt 1 ]; then
  echo "== kart bench train --memory --device cuda --ranks $GPUS"
  "$KART" bench train --memory --device cuda --ranks "$GPUS"
  echo "== the same on a Qwen2.5-0.5B-shaped model (random weights, 8 x 1024 tokens)"
  "$KART" bench train --memory --device cuda --ranks "$GPUS" --shape qwen2.5-0.5b --steps 2
fi

echo "== kart bench sync (SGLang stand-ins, Gloo)"
SYNC="$(mktemp -d)"
trap 'rm -rf "$SYNC"' EXIT
"$KART" bench sync --model-dir "$SYNC/model"
PY="${KART_VENV:-.venv}/bin/python"
# Starts `$@` (a server of $SYNC/model on GPU 1, logging to $SYNC/$NAME.log), waits until
# port $PORT answers /health, runs `kart bench sync --device cuda $BENCH_ARGS`, stops it.
bench_against() {
  CUDA_VISIBLE_DEVICES=1 "$@" >"$SYNC/$NAME.log" 2>&1 &
  local server=$!
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    kill -0 "$server" 2>/dev/null || { cat "$SYNC/$NAME.log"; exit 1; }
    sleep 1
  done
  "$KART" bench sync --device cuda --model-dir "$SYNC/model" --replicas 1 $BENCH_ARGS
  kill "$server"
}
if [ "$GPUS" -gt 1 ] && "$PY" -c 'import sglang' 2>/dev/null; then
  echo "== kart bench sync --device cuda: a real SGLang server on GPU 1, NCCL from GPU 0"
  NAME=sglang PORT=30123 BENCH_ARGS="--urls http://127.0.0.1:30123" bench_against \
    "$PY" -m sglang.launch_server --model-path "$SYNC/model" --port 30123 --mem-fraction-static 0.5
else
  echo "(no NCCL broadcast to SGLang: it needs 2 GPUs and the sglang package in $PY)"
fi
if [ "$GPUS" -gt 1 ] && "$PY" -c 'import vllm' 2>/dev/null; then
  echo "== kart bench sync --device cuda: a real vLLM server on GPU 1, NCCL from GPU 0"
  NAME=vllm PORT=30124 BENCH_ARGS="--vllm-urls http://127.0.0.1:30124" bench_against \
    env VLLM_SERVER_DEV_MODE=1 "$PY" -m vllm.entrypoints.openai.api_server --model "$SYNC/model" \
    --port 30124 --gpu-memory-utilization 0.5 --enforce-eager \
    --weight-transfer-config '{"backend": "nccl"}'
else
  echo "(no NCCL broadcast to vLLM: it needs 2 GPUs and the vllm package in $PY)"
fi
echo "== kart bench retriever --dense --device cuda: the exact scan over $GPUS GPU(s) in f16"
DENSE=(--no-anchor)
"$PY" -c 'import faiss' 2>/dev/null && DENSE=(--python "$PY")
"$KART" bench retriever --dense --device cuda --ann-expansion-search 32,64 "${DENSE[@]}"
