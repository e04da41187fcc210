#!/usr/bin/env bash
# The decode step's products on one GPU (issue 18), in one call of a few
# minutes:
#   1. benches/stream_decode_gemm.cu: src/kernels/stream.cu against cuBLAS
#      on the Qwen3-4B shapes, every configuration (built here with nvcc
#      when no binary is given);
#   2. `bench gen` at the Qwen3-4B shape (random bf16 weights), batch 32,
#      256 + 256, CUDA graph: cuBLAS, then each TRACE_TRAIN_DECODE_PRODUCT
#      plan, each REPEAT times, and the transformers peer in the same call.
# It prints one line a run (`name new_tokens_per_s`) and keeps every JSON
# line in OUT/gen.jsonl.
#
# Usage: bash scripts/decode-product-check.sh TRACE_TRAIN OUT [SDG_BINARY]
# Environment: PLANS (default "stream stream:4:6:3 stream:8:4:2
# stream:8:6:1"), REPEAT (default 2), PEER (default 1: run
# benches/hf_peer.py gen; 0: not).
set -u
T=$(realpath "$1")
OUT=$2
SDG=${3:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
say() { echo "$(date +%T) $*"; }

if [ -z "$SDG" ]; then
  NVCC=${CUDA_HOME:+$CUDA_HOME/bin/}nvcc
  if command -v "$NVCC" > /dev/null; then
    SDG=$OUT/sdg
    "$NVCC" -O3 -arch=sm_90 -std=c++17 -c "$ROOT/benches/stream_decode_gemm.cu" -o "$OUT/sdg.o" \
      && g++ "$OUT/sdg.o" -o "$SDG" -L"${CUDA_HOME:-/usr/local/cuda}/lib64" -lcublas -lcudart \
      || { echo "cannot build benches/stream_decode_gemm.cu"; SDG=; }
  else
    echo "no nvcc and no SDG_BINARY: the product bench is left out"
  fi
fi
if [ -n "$SDG" ]; then
  say "products: stream.cu against cuBLAS"
  "$SDG" | tee "$OUT/products.txt"
fi

gen() { # gen NAME [ENV=VALUE]: one bench gen run
  local name=$1
  shift
  local line
  line=$(env "$@" "$T" bench gen --model qwen3-4b --batch 32 --prompt 256 --new 256 --path graph --device cuda \
    2> "$OUT/gen.$name.err" | tail -1)
  if [ -z "$line" ]; then
    echo "$name: failed ($(tail -3 "$OUT/gen.$name.err" | tr '\n' ' '))"
    return
  fi
  echo "{\"run\": \"$name\", \"result\": $line}" >> "$OUT/gen.jsonl"
  echo "$name $(python3 -c 'import json,sys; print(round(json.loads(sys.argv[1])["new_tokens_per_s"]))' "$line")"
}
say "bench gen, qwen3-4b, batch 32, 256 + 256, bf16"
for r in $(seq "${REPEAT:-2}"); do
  gen "cublas.$r" TRACE_TRAIN_DECODE_PRODUCT=cublas
  for plan in ${PLANS:-stream stream:4:6:3 stream:8:4:2 stream:8:6:1}; do
    gen "$plan.$r" TRACE_TRAIN_DECODE_PRODUCT="$plan"
  done
done
if [ "${PEER:-1}" = 1 ]; then
  say "peer: transformers, the same shape"
  python3 "$ROOT/benches/hf_peer.py" gen --model qwen3-4b --batch 32 --prompt 256 --new 256 2>&1 | tail -2 \
    | tee "$OUT/peer.txt"
fi
say "done"
