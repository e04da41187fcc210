#!/usr/bin/env bash
# Learning on programs never seen, in one go on one GPU (docs/BENCHMARKS.md,
# "Learning on programs never seen" and "Stage 3 on the GPU"): the data
# recipe, Stage 1, Stage 2, then RL from Stage 2 with checkpoints, and the
# held-out evals of every model and checkpoint, summarised per bucket with
# 80% intervals at the end.
#
# Usage: bash scripts/learning-check.sh TRACE_TRAIN BASE_MODEL OUT [RL_STEPS] [ALGORITHM]
#   TRACE_TRAIN  the binary (built with --features cuda or cudnn for a GPU)
#   BASE_MODEL   the untrained model's folder (e.g. `trace-train model
#                import_gguf SmolLM2-135M-Instruct.Q4_1.gguf smol`)
#   OUT          a fresh folder for the data, checkpoints and reports
#   RL_STEPS     Stage 3 steps (default 80; 0 skips Stage 3)
#   ALGORITHM    grpo (default) or ppo
# Environment: REQUIRE_DBG=1 drops transformed rows without a `__DBG_` line;
# HUMANEVAL=path/HumanEval.jsonl.gz adds HumanEval's programs to
# the built-in corpus; DEVICE (default cuda); UNSAFE=1 runs the held-out and
# RL programs without the sandbox (machines where it cannot be set up;
# trusted programs only); SMALL=1 shrinks every budget (a CPU smoke run);
# LAST_BUCKET=2-3 keeps Stage 3's curriculum on the output-line buckets up to
# that one (the held-out short set's answers are one to three lines);
# VARIANTS (default 4) sets how many injection variants of each held-out
# short program the `__DBG_` eval draws (more: narrower intervals);
# SYNTHETIC=N adds N programs made from seed 1 (`synthetic:N:1`) to the
# training data, and Stage 3 then also draws fresh ones (seed 2) that no
# stage trained on; the test splits are then scored in two parts, the
# written corpora (`orig`, `split`) and the synthetic programs (`synorig`,
# `synsplit`);
# UNTIL=1 or 2 stops after that stage and its evals (budgets in calls);
# RL_TIME=S stops Stage 3 with SIGTERM after S seconds (it saves a checkpoint);
# STAGE_TIME=S does the same for Stages 1 and 2;
# RL_DATA replaces the dataset Stage 3 draws from (default: the training
# corpora, and fresh synthetic programs with SYNTHETIC); RL_LR its learning
# rate (default 3e-5), RL_SEED its seed.
# Run it again with the same OUT to go on where it stopped: finished stages
# and reports are kept, a stopped stage resumes from its last checkpoint.
set -euo pipefail
T=$1
BASE=$2
OUT=$3
RL_STEPS=${4:-80}
ALGORITHM=${5:-grpo}
DEVICE=${DEVICE:-cuda}
U=${UNSAFE:+--unsafe_no_sandbox}
mkdir -p "$OUT/data" "$OUT/reports"
R=$OUT/reports

# The data: every output length, four transformed variants a program, a
# quarter of the programs held out by program.
# Transformed variants whose injected prints never ran (no `__DBG_` line in
# the answer) are kept: the environment asks them too, and a Stage 2 set
# without them has no one-line answer at all (REQUIRE_DBG=1 drops them, as
# the peer pipeline's filter does).
require_dbg=false
[ "${REQUIRE_DBG:-0}" = 1 ] && require_dbg=true
echo "{\"test_ratio\": 0.25, \"variants\": 4, \"filters\": {\"max_output_chars\": 1500, \"require_dbg\": $require_dbg}}" > "$OUT/data/generate.json"
sources=(builtin)
[ -n "${HUMANEVAL:-}" ] && sources+=("humaneval:$HUMANEVAL")
[ -n "${SYNTHETIC:-}" ] && sources+=("synthetic:$SYNTHETIC:1")
[ -f "$OUT/data/stage2_transformed_test.jsonl" ] || for s in "${sources[@]}"; do
  name=${s%%:*}
  "$T" generate --config "$OUT/data/generate.json" --dataset "$s" --output_dir "$OUT/data/$name" $U
done
for split in stage1_original_train stage1_original_test stage2_transformed_train stage2_transformed_test; do
  [ -f "$OUT/data/$split.jsonl" ] || cat "$OUT"/data/*/"$split.jsonl" > "$OUT/data/$split.jsonl.part"
done
for split in stage1_original_train stage1_original_test stage2_transformed_train stage2_transformed_test; do
  [ -f "$OUT/data/$split.jsonl.part" ] && mv "$OUT/data/$split.jsonl.part" "$OUT/data/$split.jsonl"
done
# The test splits (Stage 1's originals, Stage 2's transformed rows), scored
# by source kind: the written corpora, the synthetic programs.
orig=$OUT/data/stage1_original_test.jsonl split=$OUT/data/stage2_transformed_test.jsonl synorig="" synsplit=""
if [ -n "${SYNTHETIC:-}" ]; then
  orig=$OUT/data/written_stage1_original_test.jsonl split=$OUT/data/written_stage2_transformed_test.jsonl
  synorig=$OUT/data/synthetic/stage1_original_test.jsonl synsplit=$OUT/data/synthetic/stage2_transformed_test.jsonl
  [ -f "$orig" ] || cat $(ls "$OUT"/data/*/stage1_original_test.jsonl | grep -v /synthetic/) > "$orig"
  [ -f "$split" ] || cat $(ls "$OUT"/data/*/stage2_transformed_test.jsonl | grep -v /synthetic/) > "$split"
fi

# The recipe (LoRA r16 on every projection, lr 1e-3 cosine to 10%).
epochs1=3 epochs2=2 new_short=96 new_dbg=384 new_split=768 variants=${VARIANTS:-4} limit=()
if [ -n "${SMALL:-}" ]; then
  epochs1=1 epochs2=1 new_short=16 new_dbg=32 new_split=32 variants=1 limit=(--limit 16)
fi
recipe() { # recipe EPOCHS EVAL_STEPS
  echo "{\"epochs\": $1, \"batch_size\": 8, \"gradient_accumulation_steps\": 1, \"learning_rate\": 0.001,
 \"warmup_ratio\": 0.05, \"min_lr_ratio\": 0.1, \"lora_r\": 16, \"lora_alpha\": 32, \"lora_dropout\": 0.05,
 \"eval_steps\": $2, \"save_steps\": 1000, \"save_total_limit\": 1, \"seed\": 42}"
}
recipe "$epochs1" 30 > "$OUT/data/warmup.json"
recipe "$epochs2" 50 > "$OUT/data/sft.json"

evals() { # evals NAME MODEL [ADAPTER]: the held-out short set as written and with
          # the environment's injections, and the test splits
          # (a report already written is kept)
  local a=()
  [ -n "${3:-}" ] && a=(--adapter "$3")
  [ -f "$R/$1.short.json" ] || "$T" eval --model "$2" "${a[@]}" --heldout short --max_new_tokens "$new_short" \
    --batch_size 256 --device "$DEVICE" "${limit[@]}" $U --output "$R/$1.short.json"
  [ -f "$R/$1.dbg.json" ] || "$T" eval --model "$2" "${a[@]}" --heldout short --prompt transformed --variants "$variants" \
    --max_new_tokens "$new_dbg" --batch_size 256 --device "$DEVICE" "${limit[@]}" $U --output "$R/$1.dbg.json"
  [ "${4:-}" != "no-split" ] || return 0
  local kind file
  for kind in orig split synorig synsplit; do
    file=${!kind}
    [ -n "$file" ] && [ ! -f "$R/$1.$kind.json" ] || continue
    "$T" eval --model "$2" "${a[@]}" --data "$file" --max_new_tokens "$new_split" \
      --batch_size 256 --device "$DEVICE" "${limit[@]}" --output "$R/$1.$kind.json"
  done
}

no4bit=()
[ "$DEVICE" != cpu ] && no4bit=(--no_4bit)
evals 0-untrained "$BASE"
stage_time=(${STAGE_TIME:+timeout -s TERM "$STAGE_TIME"})
[ -d "$OUT/stage1_warmup/merged" ] || "${stage_time[@]}" "$T" warmup --resume --model "$BASE" --config "$OUT/data/warmup.json" --device "$DEVICE" "${no4bit[@]}" \
  --train_file "$OUT/data/stage1_original_train.jsonl" --eval_file "$OUT/data/stage1_original_test.jsonl" \
  --output_dir "$OUT/stage1_warmup"
evals 1-stage1 "$OUT/stage1_warmup/merged"
[ "${UNTIL:-3}" -le 1 ] && RL_STEPS=0
[ -d "$OUT/stage2_sft/merged" ] || [ "${UNTIL:-3}" -le 1 ] || "${stage_time[@]}" "$T" sft --resume --model "$OUT/stage1_warmup/merged" --config "$OUT/data/sft.json" --device "$DEVICE" "${no4bit[@]}" \
  --train_file "$OUT/data/stage2_transformed_train.jsonl" --eval_file "$OUT/data/stage2_transformed_test.jsonl" \
  --output_dir "$OUT/stage2_sft"
[ "${UNTIL:-3}" -le 1 ] || evals 2-stage2 "$OUT/stage2_sft/merged"
[ "${UNTIL:-3}" -le 2 ] && RL_STEPS=0

if [ "$RL_STEPS" -gt 0 ]; then
  every=$(( RL_STEPS / 4 > 0 ? RL_STEPS / 4 : 1 ))
  rl=(--algorithm "$ALGORITHM" --batch_size 16 --learning_rate "${RL_LR:-3e-5}" --max_new_tokens 256)
  [ "$ALGORITHM" = grpo ] && rl+=(--group_size 8)
  [ -n "${RL_SEED:-}" ] && rl+=(--seed "$RL_SEED")
  [ -n "${SMALL:-}" ] && rl=(--algorithm "$ALGORITHM" --batch_size 2 --learning_rate 3e-5 --max_new_tokens 8)
  # RL draws from every program of the corpora (the held-out short set is
  # never among them).
  rl_data=builtin
  [ -n "${HUMANEVAL:-}" ] && rl_data+="+humaneval:$HUMANEVAL"
  [ -n "${SYNTHETIC:-}" ] && rl_data+="+synthetic:20000:2"
  rl_data=${RL_DATA:-$rl_data}
  [ "$rl_data" != builtin ] && rl+=(--dataset "$rl_data")
  cap=""
  [ -n "${LAST_BUCKET:-}" ] && cap=", \"last_bucket\": \"$LAST_BUCKET\""
  echo "{\"curriculum\": {\"enabled\": true, \"promotion_threshold\": 0.7$cap}}" > "$OUT/data/stage3.json"
  rl+=(--config "$OUT/data/stage3.json")
  [ -f "$OUT/stage3_ppo/metrics.jsonl" ] && rl+=(--resume)
  if [ ! -d "$OUT/stage3_ppo/final" ]; then
    status=0
    ${RL_TIME:+timeout -s TERM "$RL_TIME"} "$T" ppo --model "$OUT/stage2_sft/merged" --output_dir "$OUT/stage3_ppo" \
      --device "$DEVICE" "${no4bit[@]}" "${rl[@]}" --num_train_steps "$RL_STEPS" --save_steps "$every" $U || status=$?
    [ "$status" -eq 0 ] || echo "Stage 3 stopped (exit $status); run this again with the same OUT to resume it"
  fi
  for step in $(ls "$OUT/stage3_ppo" | sed -n 's/^step_//p' | sort -n); do
    evals "3-rl-$(printf %05d "$step")" "$OUT/stage2_sft/merged" "$OUT/stage3_ppo/step_$step/adapter" no-split
  done
fi

python3 - "$R" <<'PY'
# `*`: the 80% interval lies above the untrained model's (`v` below it);
# for Stage 3 checkpoints `^` (`v`) marks the same against Stage 2.
import glob, json, os, sys
def iv(x):
    return f"[{100 * x['interval']['lo']:.1f}-{100 * x['interval']['hi']:.1f}]"
def mark(x, ref, up):
    if x["interval"]["lo"] > ref["interval"]["hi"]:
        return up
    return "v" if x["interval"]["hi"] < ref["interval"]["lo"] else ""
def bucket(x, label):
    return next((b for b in x["by"].get("output_lines", []) if b["bucket"] == label), None)
rows = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    name, kind, _ = os.path.basename(f).rsplit(".", 2)
    rows.setdefault(name, {})[kind] = json.load(open(f))
for kind, title in [("short", "held-out short set"), ("dbg", "held-out short set with __DBG_"),
                    ("orig", "Stage 1 test split (originals)"), ("split", "Stage 2 test split"),
                    ("synorig", "Stage 1 test split, synthetic programs"),
                    ("synsplit", "Stage 2 test split, synthetic programs")]:
    print(f"\n== {title}: exact match [80% interval]; by output lines")
    base = rows.get("0-untrained", {}).get(kind)
    stage2 = rows.get("2-stage2", {}).get(kind)
    for name, r in rows.items():
        if kind not in r:
            continue
        x = r[kind]
        refs = [(base, "*")] + ([(stage2, "^")] if name.startswith("3-") else [])
        def marks(get):
            return "".join(mark(get(x), get(ref), up) for ref, up in refs
                           if ref is not None and get(x) is not None and get(ref) is not None)
        buckets = "; ".join(
            f"{b['bucket']}: {b['correct']}/{b['n']} {iv(b)}{marks(lambda y, l=b['bucket']: bucket(y, l))}"
            for b in x["by"].get("output_lines", []))
        print(f"{name:16} {x['correct']:4}/{x['n']:<4} {100 * x['accuracy']:5.1f}% {iv(x) + marks(lambda y: y):16} {buckets}")
PY
for f in stage1_warmup stage2_sft stage3_ppo; do
  [ ! -f "$OUT/$f/metrics.jsonl" ] || echo "$f: $(wc -l < "$OUT/$f/metrics.jsonl") steps logged, curves in $OUT/$f/curves"
done
