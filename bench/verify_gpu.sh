#!/usr/bin/env bash
# One prepared run of `trainledger verify` on a CUDA machine (issue 7). Writes every JSON result
# under bench/results/verify-<gpu>-<date>/ and a summary; commit that folder with this script.
# Usage: bench/verify_gpu.sh            (uses .venv/bin/trainledger; about 5-8 min on one H200)
set -uo pipefail
cd "$(dirname "$0")/.."
TL=${TL:-.venv/bin/trainledger}
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-' | tr -cd 'A-Za-z0-9-')
NGPU=$(nvidia-smi -L | wc -l)
OUT=bench/results/verify-${GPU}-$(date -u +%Y%m%d)
mkdir -p "$OUT"
export TRAINLEDGER_LEDGER="$OUT/ledger.db"
run() {  # name, then the trainledger arguments
  local name=$1; shift
  echo "== $name: trainledger $*" | tee -a "$OUT/summary.txt"
  timeout 600 "$TL" "$@" --json > "$OUT/$name.json" 2> "$OUT/$name.log"
  echo "   exit $?" | tee -a "$OUT/summary.txt"
}
run probe verify probe --require-gpu
# real-size memory measurements: measured vs predicted, term by term
run memory-llama-3.2-1b-full verify memory --model llama-3.2-1b --seq-len 2048 --micro-batch 2 --precision bf16-mixed --device cuda
run memory-llama-3.2-1b-recompute verify memory --model llama-3.2-1b --seq-len 4096 --micro-batch 4 --recompute full --device cuda
run memory-llama-3.1-8b-lora verify memory --model llama-3.1-8b --method lora --precision bf16 --seq-len 4096 --device cuda
run memory-llama-3.2-3b-fused verify memory --model llama-3.2-3b --optimizer adamw-fused --seq-len 2048 --device cuda
run comm verify comm --nproc "$NGPU" --device cuda --max-size 1GiB --gpu h200
run accept-tiny verify accept --model tiny-llama-debug --precision bf16-mixed --gpus "$NGPU" --nproc "$NGPU" --device cuda
run accept-1b verify accept --model llama-3.2-1b --precision bf16-mixed --seq-len 2048 --gpus "$NGPU" --nproc "$NGPU" --device cuda
"$TL" calibrate --json > "$OUT/calibration.json" 2>> "$OUT/summary.txt"
"$TL" ledger export --format jsonl --out "$OUT/ledger.jsonl"
echo "results in $OUT"
