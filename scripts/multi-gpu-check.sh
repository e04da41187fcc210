#!/usr/bin/env bash
# Data parallel on one host, in one go: LoRA tokens/s on 1 and on N GPUs at
# the same global batch (`bench train`, random weights of a model's shape),
# then `warmup` of the tiny chat model on 1 and on N GPUs with their loss
# curves side by side, then a run on N GPUs stopped by SIGTERM and resumed
# on 1 GPU; with POLICY, GRPO on the trace environment from that model on 1
# and on N GPUs at the same global batch, step by step.
#
# Usage: bash scripts/multi-gpu-check.sh TRACE_TRAIN DATA_DIR [N] [SHAPE] [BATCH] [POLICY]
#   TRACE_TRAIN  a binary built with --features cuda (or cudnn)
#   DATA_DIR     holds stage1_original_train.jsonl and stage1_original_test.jsonl
#                (from `trace-train generate --quick_test`)
#   N            GPUs to compare with one (default 2)
#   SHAPE        bench model shape (default qwen3-0.6b; qwen3-4b also fits)
#   BATCH        rows a micro-batch (default 4); a step is BATCH x 2N rows of 1024 tokens
#   POLICY       a model folder that earns some reward on the trace task (e.g.
#                Stage 1's merged model of SmolLM2); none: the GRPO part is skipped
# STOP (default 8): the step after which the run on N GPUs gets SIGTERM.
# UNSAFE=1 runs the environment's programs without the sandbox (machines
# where it cannot be set up; trusted programs only).
# NCCL comes from LD_LIBRARY_PATH (libnccl.so.2); NVLink SHARP stays off.
set -euo pipefail
T=$1
DATA=$2
N=${3:-2}
SHAPE=${4:-qwen3-0.6b}
BATCH=${5:-4}
POLICY=${6:-}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
nvidia-smi -L || true

echo "== bench train: $SHAPE, global batch $BATCH x $((2 * N)) x 1024 tokens"
for n in 1 "$N"; do
  "$T" bench train --model "$SHAPE" --batch_size "$BATCH" --seq 1024 --gradient_accumulation_steps $((2 * N)) \
    --steps 5 --gc --num_gpus "$n" --device cuda | tee -a "$WORK/bench.jsonl"
done
python3 - "$WORK/bench.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
one, many = rows[0], rows[-1]
print(f"tokens/s: 1 GPU {one['tokens_per_s']:.0f}, {many['num_gpus']} GPUs {many['tokens_per_s']:.0f}: "
      f"{many['tokens_per_s'] / one['tokens_per_s']:.2f}x (linear {many['num_gpus']}x); "
      f"loss {one['loss']:.5f} vs {many['loss']:.5f}")
PY

"$T" model tiny "$WORK/tiny" >/dev/null
common=(--model "$WORK/tiny" --train_file "$DATA/stage1_original_train.jsonl"
  --eval_file "$DATA/stage1_original_test.jsonl" --batch_size 4
  --gradient_accumulation_steps $((2 * N)) --learning_rate 0.003 --max_steps 40
  --save_steps 10 --device cuda)
echo "== warmup of the tiny model, 40 steps, on 1 and on $N GPUs"
"$T" warmup "${common[@]}" --output_dir "$WORK/w1" --num_gpus 1
"$T" warmup "${common[@]}" --output_dir "$WORK/w$N" --num_gpus "$N"
STOP=${STOP:-8}
echo "== the same on $N GPUs, stopped by SIGTERM after step $STOP, resumed on 1 GPU"
"$T" warmup "${common[@]}" --output_dir "$WORK/stopped" --num_gpus "$N" &
pid=$!
until [ "$(cat "$WORK/stopped/metrics.jsonl" 2>/dev/null | wc -l)" -ge "$STOP" ]; do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
kill -TERM "$pid" 2>/dev/null || true
wait "$pid" || echo "the stopped run exited with $?"
ls "$WORK/stopped"
"$T" warmup "${common[@]}" --output_dir "$WORK/stopped" --num_gpus 1 --resume
python3 - "$WORK" "$N" <<'PY'
import json, sys
work, n = sys.argv[1], sys.argv[2]
def curve(name):
    return [json.loads(l) for l in open(f"{work}/{name}/metrics.jsonl")]
a, b, r = curve("w1"), curve("w" + n), curve("stopped")
print("step  loss(1 GPU)  loss(%s GPUs)  rel.diff   resumed   grad_norm 1 / %s" % (n, n))
worst = 0.0
for x, y, z in zip(a, b, r):
    d = abs(x["loss"] - y["loss"]) / max(abs(x["loss"]), 1e-12)
    worst = max(worst, d)
    ev = f"  eval {x.get('eval_loss', '-')} / {y.get('eval_loss', '-')}" if "eval_loss" in x else ""
    print(f"{x['step']:4d}  {x['loss']:11.5f}  {y['loss']:12.5f}  {d:9.2e}  {z['loss']:8.5f}   "
          f"{x['grad_norm']:.4f} / {y['grad_norm']:.4f}{ev}")
print(f"largest relative loss difference 1 vs {n} GPUs: {worst:.2e}; world sizes in the metrics: "
      f"{sorted({x['world_size'] for x in a})} / {sorted({y['world_size'] for y in b})} / "
      f"resumed run {sorted({z['world_size'] for z in r})}")
PY

if [ -z "$POLICY" ]; then
  echo "== GRPO skipped (no POLICY model given)"
  exit 0
fi
echo "== GRPO from $POLICY on the trace environment, 32 prompts x 8, on 1 and on $N GPUs"
for n in 1 "$N"; do
  "$T" ppo --algorithm grpo --model "$POLICY" --output_dir "$WORK/g$n" --device cuda --num_gpus "$n" \
    --batch_size 32 --group_size 8 --learning_rate 3e-5 --num_train_steps 8 --max_new_tokens 256 \
    --temperature 1.0 --no_4bit --save_steps 0 ${UNSAFE:+--unsafe_no_sandbox}
done
python3 - "$WORK" "$N" <<'PY'
import json, sys
work, n = sys.argv[1], sys.argv[2]
runs = {k: [json.loads(l) for l in open(f"{work}/g{k}/metrics.jsonl")] for k in ("1", n)}
print("step  reward(1 GPU)  reward(%s GPUs)   step s 1 / %s   (sample, environment, train)" % (n, n))
def secs(m):
    return m["time_sample_s"] + m["time_env_s"] + m["time_train_s"]
for a, b in zip(runs["1"], runs[n]):
    print(f"{a['step'] if 'step' in a else '':>4}  {a['reward']:13.3f}  {b['reward']:14.3f}   "
          f"{secs(a):5.2f} / {secs(b):5.2f}   ({a['time_sample_s']:.2f}, {a['time_env_s']:.2f}, {a['time_train_s']:.2f}) / "
          f"({b['time_sample_s']:.2f}, {b['time_env_s']:.2f}, {b['time_train_s']:.2f})")
tail = lambda m: sum(secs(x) for x in m[1:]) / max(len(m) - 1, 1)
print(f"mean step after the first: 1 GPU {tail(runs['1']):.2f} s, {n} GPUs {tail(runs[n]):.2f} s: "
      f"{tail(runs['1']) / tail(runs[n]):.2f}x")
PY
