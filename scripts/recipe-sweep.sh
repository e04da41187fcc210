#!/usr/bin/env bash
# The SmolLM2-135M recipe's Stage 1-2 settings against held-out exact match
# (issue 23, item 4): config/recipes/smollm2-135m/pipeline_config.json with
# one setting changed at a time, each run as `pipeline --last_stage 2` with
# the gate, on one shared Stage 0. The gate scores every model on the sets
# no stage trains on (the held-out short set, the test splits of the
# original and the transformed programs), so the runs compare on those.
#
# Usage: bash scripts/recipe-sweep.sh TRACE_TRAIN BASE_MODEL OUT
#   BASE_MODEL  SmolLM2-135M-Instruct's folder (`trace-train model import_gguf`)
# Environment: HUMANEVAL=path/HumanEval.jsonl.gz (needed); DEVICE (default
# cuda); RUNS: the settings, `name:lr:rank:epochs1:epochs2` separated by
# spaces (default: the recipe, lr 3e-4 and 3e-3, rank 64, epochs 3 + 2);
# P: runs at a time (default 3; each eval's sampler sizes its cache from
# the memory free when it starts, so starts are spread out); STAGE3: a JSON
# object laid over the recipe's `stage3` section (e.g. DPO rounds), and then
# every run goes on to Stage 3, gated against its Stage 2 like the others;
# SMALL=1 shrinks Stage 0 and the evals (a CPU smoke run on a tiny model).
# Programs run with --unsafe_no_sandbox: our own corpora only. A finished
# run is kept: run again with the same OUT to do only what is missing.
set -u
T=$1 BASE=$2 W=$3
H=${HUMANEVAL:?HUMANEVAL=path/HumanEval.jsonl.gz}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEV=${DEVICE:-cuda}
P=${P:-3}
RUNS=${RUNS:-"recipe:1e-3:16:2:1 lr3e-4:3e-4:16:2:1 lr3e-3:3e-3:16:2:1 r64:1e-3:64:2:1 ep3+2:1e-3:16:3:2"}
mkdir -p "$W/logs"
say() { echo "$(date +%T) $*" | tee -a "$W/logs/sweep"; }

# The recipe with one run's settings (and the shared data, this base model).
config() { # config LR RANK EPOCHS1 EPOCHS2
  python3 - "$ROOT/config/recipes/smollm2-135m/pipeline_config.json" "$BASE" "$H" "$W/data" "$DEV" "$@" \
    "${SMALL:+small}" <<'PY'
import json, os, sys
src, base, he, data, dev, lr, rank, e1, e2 = sys.argv[1:10]
small = len(sys.argv) > 10 and sys.argv[10] == "small"
c = json.load(open(src))
def lay(dst, over):
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(dst.get(k), dict):
            lay(dst[k], v)
        else:
            dst[k] = v
if os.environ.get("STAGE3"):
    lay(c["stage3"], json.loads(os.environ["STAGE3"]))
c["model"]["base_model"] = base
c["hardware"]["device"] = dev
c["stage0"]["dataset"] = c["stage0"]["dataset"].replace("HumanEval.jsonl.gz", he)
c["stage0"]["output_dir"] = data
if small:
    c["stage0"]["max_samples"] = 200
    c["stage0"]["filters"]["max_source_chars"] = 700
    c["stage0"]["test_ratio"] = 0.4
    c["gate"]["limit"] = 4
for stage, epochs in (("stage1", e1), ("stage2", e2)):
    c[stage].update({"learning_rate": float(lr), "lora_r": int(rank), "lora_alpha": 2 * int(rank),
                     "epochs": int(epochs)})
c["gate"]["mode"] = "warn"
json.dump(c, sys.stdout, indent=1)
PY
}

U=--unsafe_no_sandbox
first=${RUNS%% *}
IFS=: read -r _ lr rank e1 e2 <<< "$first"
config "$lr" "$rank" "$e1" "$e2" > "$W/stage0.json"
[ -f "$W/data/stage2_transformed_test.jsonl" ] || "$T" pipeline --config "$W/stage0.json" --checkpoints "$W/stage0" \
  --last_stage 0 --device "$DEV" $U > "$W/logs/stage0.log" 2>&1
say "stage 0 rc=$? ($(wc -l < "$W/data/stage1_original_train.jsonl") original and $(wc -l < "$W/data/stage2_transformed_train.jsonl") transformed training records)"

run() { # run NAME LR RANK EPOCHS1 EPOCHS2
  local name=$1 d=$W/runs/$1
  mkdir -p "$d"
  [ -f "$d/done$last" ] && return 0
  config "$2" "$3" "$4" "$5" > "$d/pipeline_config.json"
  local t0=$SECONDS
  "$T" pipeline --config "$d/pipeline_config.json" --checkpoints "$d/ckpt" --start_stage 1 --last_stage "$last" \
    --resume --device "$DEV" $U ${SMALL:+--max_steps 2} > "$d/pipeline.log" 2>&1
  local rc=$?
  say "$name rc=$rc in $((SECONDS - t0)) s"
  [ $rc -eq 0 ] && touch "$d/done$last"
}
last=2
[ -n "${STAGE3:-}" ] && last=3
n=0
for spec in $RUNS; do
  IFS=: read -r name lr rank e1 e2 <<< "$spec"
  run "$name" "$lr" "$rank" "$e1" "$e2" &
  n=$((n + 1))
  if [ $((n % P)) -eq 0 ]; then wait; else sleep "${STAGGER:-25}"; fi
done
wait

# Each run's models on each held-out set, and where a run differs from the
# first (the recipe) beyond the intervals.
python3 - "$W" $RUNS <<'PY' | tee "$W/sweep.txt"
import json, os, sys
w, specs = sys.argv[1], sys.argv[2:]
names = [s.split(":")[0] for s in specs]
def load(n):
    p = os.path.join(w, "runs", n, "ckpt", "gate.json")
    return json.load(open(p)) if os.path.exists(p) else None
def steps(n, stage):
    p = os.path.join(w, "runs", n, "ckpt", stage, "metrics.jsonl")
    return sum(1 for _ in open(p)) if os.path.exists(p) else 0
ref = load(names[0])
def score(g, stage, s):
    for st in g["stages"]:
        if st["name"] == stage:
            return dict(st["sets"]).get(s)
print("exact match on the held-out sets [80% interval]; + / - : beyond the interval of the first run's model of the same stage")
for stage in ("warmup", "sft", "ppo", "dpo"):
    if not ref or not any(x["name"] == stage for x in ref["stages"]):
        continue
    print(f"\n== after {stage}")
    sets = [s for s, _ in next(x for x in ref["stages"] if x["name"] == stage)["sets"]]
    print(f"{'run':10} {'steps':>5}  " + "  ".join(f"{s:>24}" for s in sets) + "      mean")
    for n, spec in zip(names, specs):
        g = load(n)
        if g is None:
            print(f"{n:10} (no gate report)")
            continue
        cells, accs = [], []
        for s in sets:
            x, r = score(g, stage, s), score(ref, stage, s)
            if x is None:
                cells.append(f"{'-':>24}")
                continue
            mark = ""
            if r is not None and n != names[0]:
                mark = "+" if x["lo"] > r["hi"] else "-" if x["hi"] < r["lo"] else ""
            accs.append(x["accuracy"])
            cells.append(f"{100 * x['accuracy']:5.1f}% [{100 * x['lo']:4.1f}-{100 * x['hi']:4.1f}]{mark:1} ({x['n']:>3})")
        st = {"warmup": "stage1_warmup", "sft": "stage2_sft", "ppo": "stage3_ppo"}.get(stage, "stage3_dpo/round_0")
        mean = 100 * sum(accs) / len(accs) if accs else 0
        print(f"{n:10} {steps(n, st):5}  " + "  ".join(cells) + f"  {mean:6.2f}%")
PY
say "sweep done"
