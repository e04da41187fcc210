#!/usr/bin/env bash
# Reward curves of Stage 3 on 1 GPU, on N, and on N of which K only sample
# (one-step off-policy), from a policy that already earns reward: whether
# several GPUs learn as one does, step by step (docs/BENCHMARKS.md, "Reward
# curves of one-step off-policy against synchronous GRPO").
#
# Each run is the recipe's own Stage 3 (`ppo --config` its `stage3` block,
# `--pipeline_config` the recipe) from POLICY, the same seed and global batch,
# STEPS steps. The table has each run's reward and seconds a step; off-policy
# runs add the truncated importance weights' mean, capped share and effective
# sample share.
#
# Usage: bash scripts/grpo-curves.sh TRACE_TRAIN RECIPE POLICY OUT [GPUS]
#   RECIPE  a pipeline config (e.g. config/recipes/smollm2-135m/pipeline_config.json)
#   POLICY  a model after Stage 2 of that recipe, e.g. from
#           `trace-train pipeline --config RECIPE --last_stage 2 --checkpoints C`:
#           C/stage2_sft/merged
#   GPUS    runs, separated by spaces: `N` is N GPUs in step, `NsK` N GPUs of
#           which K only sample (`ppo --sampler_ranks K`); default "1 2 2s1"
# Environment: STEPS (default 24), EXTRA (more `ppo` flags, e.g.
# --unsafe_no_sandbox where the sandbox cannot run).
set -euo pipefail
if [ $# -lt 4 ]; then
  echo "usage: bash scripts/grpo-curves.sh TRACE_TRAIN RECIPE POLICY OUT [GPUS] (the header says more)" >&2
  exit 2
fi
T=$1 RECIPE=$2 POLICY=$3 W=$4
GPUS=${5:-"1 2 2s1"}
STEPS=${STEPS:-24}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
mkdir -p "$W"
python3 - "$RECIPE" "$STEPS" > "$W/stage3.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])).get("stage3")
if not isinstance(c, dict):
    sys.exit(f"{sys.argv[1]}: no `stage3` block\nhint: RECIPE is a pipeline config, e.g. config/recipes/smollm2-135m/pipeline_config.json")
c.setdefault("ppo", {})["num_train_steps"] = int(sys.argv[2])
print(json.dumps(c, indent=1))
PY
for gk in $GPUS; do
  n=${gk%%s*} k=0
  [ "$gk" != "$n" ] && k=${gk#*s}
  d=$W/g$gk
  echo "$(date +%T) $n GPU(s), $k sampling only"
  # shellcheck disable=SC2086
  "$T" ppo --config "$W/stage3.json" --pipeline_config "$RECIPE" --model "$POLICY" --output_dir "$d" \
    --num_gpus "$n" --sampler_ranks "$k" --force ${EXTRA:-} > "$d.log" 2>&1 \
    || { echo "  failed: $(tail -3 "$d.log")"; continue; }
  rm -rf "$d/merged"
done
python3 - "$W" $GPUS <<'PY' | tee "$W/curves.txt"
import json, os, sys
w, runs = sys.argv[1], sys.argv[2:]
m = {}
for g in runs:
    p = os.path.join(w, f"g{g}", "metrics.jsonl")
    if os.path.exists(p):
        m[g] = [json.loads(l) for l in open(p)]
if not m:
    sys.exit("no run wrote metrics")
print("step " + " ".join(f"{'reward ' + g:>11} {'s':>5}" for g in m))
for i in range(max(len(v) for v in m.values())):
    cells = []
    for v in m.values():
        cells.append(f"{v[i]['reward']:11.3f} {v[i].get('time_step_s', 0):5.2f}" if i < len(v) else " " * 17)
    print(f"{i + 1:4d} " + " ".join(cells))
for g, v in m.items():
    tail = v[1:] or v
    mean = lambda k: sum(x.get(k, 0.0) for x in tail) / len(tail)
    line = f"{g}: {mean('time_step_s'):.2f} s a step after the first; reward over the last 8 steps {sum(x['reward'] for x in v[-8:]) / len(v[-8:]):.3f}"
    if any("tis_weight_mean" in x for x in v):
        line += (f"; TIS weight mean {mean('tis_weight_mean'):.3f}, capped {mean('tis_capped_fraction'):.4f}, "
                 f"effective sample share {min(x.get('tis_effective_sample_share', 1) for x in v):.3f} at least")
    print(line)
PY
