#!/usr/bin/env bash
# GRPO on 1 and on N GPUs at the same global batch, for several global
# batches: where Stage 3's data parallelism stands at a model's shape
# (docs/BENCHMARKS.md, "GRPO at the Qwen3-4B shape on several GPUs").
#
# Each run is `ppo --algorithm grpo` on the word environment from MODEL
# (random weights of a real shape: make_random_model.py; such a model never
# ends an answer, so every completion is NEW tokens, and it earns no reward,
# so dynamic sampling is off: one sampling round a step). The table gives
# the mean of the steps after the first, phase by phase, and each batch's
# speed-up of N GPUs over one.
#
# Usage: bash scripts/grpo-scaling.sh TRACE_TRAIN MODEL OUT [N] [SPECS]
#   MODEL   a model folder (e.g. make_random_model.py's qwen3-4b)
#   N       GPUs to compare with one (default 2)
#   SPECS   global batches, `PROMPTSxGROUP:MINIBATCH` separated by spaces
#           (default "32x4:32 64x4:32 128x4:32")
# Environment: NEW (new tokens a completion, default 256), STEPS (steps a
# run, default 3), GPUS (which counts to run, default "1 N"; `NsK` is N GPUs
# of which K only sample, one-step off-policy: `ppo --sampler_ranks K`), DEVICE (default
# cuda; cpu with GPUS=1 for a smoke run on a tiny model), KEEP=1 keeps
# each run's merged model (removed by default: as large as MODEL).
set -euo pipefail
T=$1 MODEL=$2 W=$3
N=${4:-2}
SPECS=${5:-"32x4:32 64x4:32 128x4:32"}
NEW=${NEW:-256}
STEPS=${STEPS:-3}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
mkdir -p "$W"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
for spec in $SPECS; do
  pg=${spec%%:*} mb=${spec#*:}
  p=${pg%%x*} g=${pg#*x}
  echo "{\"ppo\": {\"mini_batch_size\": $mb, \"dynamic_sampling\": false}, \"curriculum\": {\"enabled\": false}}" \
    > "$W/$spec.json"
  for gk in ${GPUS:-1 $N}; do
    n=${gk%%s*} k=0
    [ "$gk" != "$n" ] && k=${gk#*s}
    d=$W/$pg.mb$mb.g$gk
    [ -s "$d/metrics.jsonl" ] && [ "$(wc -l < "$d/metrics.jsonl")" -ge "$STEPS" ] && continue
    echo "$(date +%T) $p prompts x $g, minibatch $mb, $n GPU(s), $k sampling only"
    "$T" ppo --algorithm grpo --environment word --model "$MODEL" --output_dir "$d" --config "$W/$spec.json" \
      --num_gpus "$n" --sampler_ranks "$k" --batch_size "$p" --group_size "$g" --learning_rate 1e-5 --max_new_tokens "$NEW" \
      --num_train_steps "$STEPS" --save_steps 0 --no_4bit --device "${DEVICE:-cuda}" --force > "$d.log" 2>&1 \
      || { echo "  failed: $(tail -3 "$d.log")"; continue; }
    [ -n "${KEEP:-}" ] || rm -rf "$d/merged"  # a speed run's merged model: the size of the base
  done
done
python3 - "$W" "${GPUS:-1 $N}" $SPECS <<'PY' | tee "$W/scaling.txt"
import json, os, sys
w, gpus, specs = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
def run(spec, gpus):
    pg, mb = spec.split(":")
    p = os.path.join(w, f"{pg}.mb{mb}.g{gpus}", "metrics.jsonl")
    if not os.path.exists(p):
        return None
    m = [json.loads(l) for l in open(p)]
    tail = m[1:] or m
    mean = lambda k: sum(x.get(k, 0.0) for x in tail) / len(tail)
    keys = ("time_step_s", "time_sample_s", "time_env_s", "time_train_s", "time_wait_s", "reward")
    return {k: mean(k) for k in keys} | {
        "peak": max(x.get("peak_mem_gib", 0.0) for x in m), "steps": len(tail)}
# Off-policy rows (NsK): sampling overlaps training; wait is the trainer's
# wait for each batch.
print(f"{'batch':>14} {'GPUs':>5} {'step s':>7} {'sample s':>8} {'env s':>6} {'train s':>7} {'wait s':>6} {'peak GiB':>8}  speed-up")
for spec in specs:
    one = run(spec, "1")
    for g in gpus:
        r = run(spec, g)
        if r is None:
            print(f"{spec:>14} {g:>5}  (no run)")
            continue
        up = f"{one['time_step_s'] / r['time_step_s']:.2f}x" if one and g != "1" else ""
        print(f"{spec:>14} {g:>5} {r['time_step_s']:7.2f} {r['time_sample_s']:8.2f} {r['time_env_s']:6.2f} "
              f"{r['time_train_s']:7.2f} {r['time_wait_s']:6.2f} {r['peak']:8.2f}  {up}")
PY
