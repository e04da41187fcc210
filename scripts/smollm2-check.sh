#!/usr/bin/env bash
# SmolLM2's learning checks beyond Stages 1-2, in one go on one GPU
# (docs/BENCHMARKS.md, "SmolLM2-135M on one H100 ... session 13"):
#   A. the learning check N (scripts/learning-check.sh to Stage 2), and beside
#      it the pipeline of config/recipes/smollm2-135m with the gate, plus the
#      held-out `__DBG_` set for each of its models;
#   B. from A's Stage 2, one after another (several at once run out of GPU
#      memory: each sampler sizes its cache from the free memory): GRPO
#      single-turn and two-turn (`line` and `first_diff` feedback) with
#      held-out evals by turn; two DPO rounds in the pipeline with held-out
#      evals; a GRPO mixture of environments with `eval --environment` and
#      `compare`;
#   C. ours and TRL's DPOTrainer on round 0's pairs, alone on the GPU;
#   D. the sibling tasks (issue 20): from A's Stage 2, SFT on SAT, ABD and
#      DED demonstrations (`generate --environment`, training tasks only;
#      rows up to 4,096 tokens, so SAT's fit), then GRPO on a mixture of
#      all four environments with room for SAT's prompts; `eval
#      --environment` on the held-out tasks of the untrained model and of
#      each stage's, and `compare`; then (D2) GRPO on the same mixture
#      straight from A's Stage 2, its eval, and `compare` of the
#      untrained model, Stage 2 and that Stage 3.
#
# Usage: bash scripts/smollm2-check.sh TRACE_TRAIN BASE_MODEL OUT
#   BASE_MODEL  SmolLM2-135M-Instruct's folder (`trace-train model import_gguf`)
# Environment: HUMANEVAL=path/HumanEval.jsonl.gz (needed); PEER=1 runs the TRL
# peer (transformers, PEFT, TRL and datasets importable); PHASES (default ABC;
# D on its own after A); DPO_LR and DPO_EPOCHS (default 5e-5 and 1) and
# DPO_PROMPTS (prompts a round) set phase B's DPO rounds and phase C's runs,
# DPO_ROWS the rows its sampler decodes at once (default 0: all that fit),
# DPO_DEMOS=1 pairs the environment's answer where every sampled one is wrong;
# STAGE2: the Stage 2 run phases B-D start from (default OUT/n/stage2_sft, phase
# A's; any run folder holding merged/, e.g. a pipeline's stage2_sft);
# B_PARTS (default "mt dpo mix") picks phase B's parts; MT (default "single
# line first_diff") its GRPO runs, all at once, each with a fixed training
# budget (MT_TOKENS tokens a micro-batch, default 16384) so that no run sizes
# itself from memory another is about to take; PEER=1 also scores the peer's
# DPO adapter and ours from phase C on the held-out set;
# SMALL=1 DEVICE=cpu shrinks every budget (a CPU smoke run on a tiny model).
# Programs run with --unsafe_no_sandbox: our own corpora only. Each part
# keeps its outputs; run again with the same OUT to redo only what is missing.
set -u
T=$1 BASE=$2 W=$3
H=${HUMANEVAL:?HUMANEVAL=path/HumanEval.jsonl.gz}
PHASES=${PHASES:-ABC}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
L=$W/logs
mkdir -p "$L"
say() { echo "$(date +%T) $*" | tee -a "$L/phases"; }
HO=$W/heldout_short.jsonl
# The held-out short set as rl-python rows, for `eval --environment`.
[ -s "$HO" ] || python3 - "$ROOT/datasets/heldout_short/programs" "$HO" <<'PY'
import json, os, sys
d, out = sys.argv[1:]
names = sorted({f.rsplit(".", 1)[0] for f in os.listdir(d)})
with open(out, "w") as o:
    for n in names:
        read = lambda ext: open(f"{d}/{n}.{ext}").read() if os.path.exists(f"{d}/{n}.{ext}") else ""
        o.write(json.dumps({"id": n, "program": read("py"), "inputs": read("in"), "output": read("out")}) + "\n")
PY
U=--unsafe_no_sandbox
DEV=(--device "${DEVICE:-cuda}")
NO4=(--no_4bit)
[ "${DEVICE:-cuda}" = cpu ] && NO4=()
steps=40 batch=16 group=8 tasks=300 prompts=256 samples=8 limit=()
[ -n "${SMALL:-}" ] && steps=2 batch=2 group=2 tasks=4 prompts=4 samples=2 limit=(--limit 4)
dbg() { # dbg MODEL OUT [eval flags]: the held-out short set with `__DBG_`, 4 variants
  local m=$1 o=$2; shift 2
  [ -f "$o" ] || "$T" eval --model "$m" --heldout short --prompt transformed --variants 4 \
    --max_new_tokens 256 --batch_size 256 "${DEV[@]}" "${limit[@]}" $U --output "$o" "$@" >> "$L/evals.log" 2>&1
}

if [[ $PHASES == *A* ]]; then
  say "A start"
  ( UNSAFE=1 VARIANTS=4 HUMANEVAL=$H UNTIL=2 DEVICE=${DEVICE:-cuda} bash "$ROOT/scripts/learning-check.sh" "$T" "$BASE" "$W/n" 0 \
      > "$L/n.log" 2>&1; say "A learning check rc=$?" ) &
  mkdir -p "$W/c"
  sed -e "s|\"models/smollm2-135m\"|\"$BASE\"|" -e "s|humaneval:HumanEval.jsonl.gz|humaneval:$H|g" \
      -e "s|\"datasets/trace_training\"|\"$W/c/data\"|" ${SMALL:+-e 's|"limit": null|"limit": 4|'} \
      "$ROOT/config/recipes/smollm2-135m/pipeline_config.json" > "$W/c/pipeline_config.json"
  [ -f "$W/c/ckpt/stage2_sft/merged/config.json" ] || "$T" pipeline --config "$W/c/pipeline_config.json" \
    --checkpoints "$W/c/ckpt" --last_stage 2 --resume "${DEV[@]}" ${SMALL:+--max_steps 2} $U > "$L/c.log" 2>&1
  say "A pipeline rc=$?"
  dbg "$BASE" "$W/c/dbg.base.json"
  dbg "$W/c/ckpt/stage1_warmup/merged" "$W/c/dbg.s1.json"
  dbg "$W/c/ckpt/stage2_sft/merged" "$W/c/dbg.s2.json"
  wait
  say "A done"
fi

STAGE2=${STAGE2:-$W/n/stage2_sft}
S2=$STAGE2/merged
B_PARTS=${B_PARTS:-mt dpo mix}
MT=${MT-single line first_diff}
# GRPO's settings in every Stage 3 run below (the steps are each run's).
grpo=(--algorithm grpo --batch_size $batch --group_size $group --learning_rate 5e-5 --max_new_tokens 256
    --save_steps 1000 "${DEV[@]}" "${NO4[@]}" $U)
rl=("${grpo[@]}" --num_train_steps $steps)
if [[ $PHASES == *B* ]]; then
  [ -f "$S2/config.json" ] || { say "no Stage 2 model at $S2: run phase A first"; exit 1; }
  cur() { echo "{\"ppo\": {$1}, \"curriculum\": {\"enabled\": true, \"promotion_threshold\": 0.7, \"last_bucket\": \"1\"}}"; }
  mkdir -p "$W/mt" "$W/mix" "$W/dpo/ckpt"
fi
if [[ $PHASES == *B* && " $B_PARTS " == *" mt "* ]]; then
  tok="\"micro_batch_tokens\": ${MT_TOKENS:-16384}"
  cur "$tok" > "$W/mt/single.json"
  cur "$tok, \"max_turns\": 2, \"feedback\": \"line\"" > "$W/mt/line.json"
  cur "$tok, \"max_turns\": 2, \"feedback\": \"first_diff\"" > "$W/mt/first_diff.json"
  for k in $MT; do
    [ -f "$W/mt/$k/merged/config.json" ] && continue
    ( "$T" ppo --model "$S2" --output_dir "$W/mt/$k" --config "$W/mt/$k.json" \
        "${rl[@]}" --dataset "builtin+humaneval:$H" --force > "$L/mt.$k.log" 2>&1
      say "B grpo $k rc=$?" ) &
    sleep "${STAGGER:-20}"
  done
  wait
  for fb in $MT; do
    [ "$fb" = single ] && continue
    for m in s2:$S2 single:$W/mt/single/merged $fb:$W/mt/$fb/merged; do
      dbg "${m#*:}" "$W/mt/$fb.${m%%:*}.json" --max_turns 2 --feedback $fb &
      sleep 5
    done
  done
  wait
  say "B multi-turn evals done"
fi
if [[ $PHASES == *B* && " $B_PARTS " == *" dpo "* ]]; then
  demos=false
  [ -n "${DPO_DEMOS:-}" ] && demos=true
  cat > "$W/dpo/pipeline_config.json" <<JSON
{"model": {"base_model": "$BASE", "dtype": "bf16", "max_length": 2048},
 "hardware": {"gradient_checkpointing": false, "no_4bit": true},
 "stage3": {"algorithm": "dpo", "ppo": {"dataset": "builtin+humaneval:$H", "sample_max_rows": ${DPO_ROWS:-0}},
            "dpo": {"rounds": 2, "num_prompts": ${DPO_PROMPTS:-$prompts}, "num_samples": $samples, "temperature": 1.0,
                    "max_new_tokens": 256, "max_pairs_per_prompt": 4, "demonstrations": $demos,
                    "train": {"learning_rate": ${DPO_LR:-5e-5}, "epochs": ${DPO_EPOCHS:-1}, "batch_size": 8, "nll_coef": 1.0, "beta": 0.1}}},
 "gate": {"mode": "off"}}
JSON
  ln -sfn "$STAGE2" "$W/dpo/ckpt/stage2_sft"
  "$T" pipeline --config "$W/dpo/pipeline_config.json" --checkpoints "$W/dpo/ckpt" --start_stage 3 --last_stage 3 \
    --resume "${DEV[@]}" $U > "$L/dpo.log" 2>&1
  say "B dpo rounds rc=$?"
  dbg "$S2" "$W/dpo/dbg.s2.json"
  for r in 0 1; do
    m=$W/dpo/ckpt/stage3_dpo/round_$r/merged
    [ -f "$m/config.json" ] && dbg "$m" "$W/dpo/dbg.r$r.json"
  done
  say "B dpo evals done"
fi
if [[ $PHASES == *B* && " $B_PARTS " == *" mix "* ]]; then
  echo '{"ppo": {"max_prompt_tokens": 1536}, "curriculum": {"enabled": true, "promotion_threshold": 0.7, "last_bucket": "1"}}' \
    > "$W/mix/stage3.json"
  [ -f "$W/mix/ppo/merged/config.json" ] || "$T" ppo --model "$S2" --output_dir "$W/mix/ppo" --config "$W/mix/stage3.json" \
    "${rl[@]}" --environment "${MIXTURE:-trace:2+abd}" --dataset "builtin+humaneval:$H" --force > "$L/mix.log" 2>&1
  say "B mixture rc=$?"
  for m in base:$BASE s2:$S2 s3:$W/mix/ppo/merged; do
    o=$W/mix/env.${m%%:*}.json
    [ -f "$o" ] || "$T" eval --model "${m#*:}" --environment trace+sat+abd+ded --tasks $tasks --trace_dataset "$HO" \
      --abd_dataset "$HO" --max_new_tokens 384 --batch_size 256 "${DEV[@]}" $U --output "$o" >> "$L/evals.log" 2>&1
  done
  "$T" compare "$W/mix/env.base.json" "$W/mix/env.s2.json" "$W/mix/env.s3.json" --level 0.8 \
    --output "$W/mix/compare.json" --plot "$W/mix/frontier.png" > "$W/mix/compare.txt" 2>&1
  say "B done"
fi

P=$W/dpo/ckpt/stage3_dpo/round_0/pairs.jsonl
if [[ $PHASES == *C* ]] && [ -s "$P" ]; then
  rm -rf "$W/dpo/speed_ours"
  dlr=${DPO_LR:-5e-5} dep=${DPO_EPOCHS:-1}
  "$T" dpo --model "$S2" --pairs "$P" --output_dir "$W/dpo/speed_ours" --learning_rate "$dlr" --epochs "$dep" \
    --batch_size 8 --nll_coef 1.0 --beta 0.1 "${DEV[@]}" "${NO4[@]}" > "$L/dpo.speed.ours.log" 2>&1
  say "C ours rc=$?"
  if [ -n "${PEER:-}" ]; then
    rm -rf "$W/dpo/peer_adapter"
    PYTHONUNBUFFERED=1 python3 "$ROOT/benches/trl_dpo_peer.py" --model "$S2" --pairs "$P" --lr "$dlr" --epochs "$dep" \
      --batch_size 8 --nll_coef 1.0 --beta 0.1 --device cuda --output_dir "$W/dpo/speed_peer" \
      --save_adapter "$W/dpo/peer_adapter" > "$W/dpo/peer.jsonl" 2> "$L/dpo.speed.peer.log"
    say "C peer rc=$?"
    # The two models trained on the same pairs, on the same held-out set.
    rm -f "$W/dpo/dbg.ours.json" "$W/dpo/dbg.peer.json"
    dbg "$W/dpo/speed_ours/merged" "$W/dpo/dbg.ours.json" &
    dbg "$S2" "$W/dpo/dbg.peer.json" --adapter "$W/dpo/peer_adapter"
    wait
    say "C evals done"
  fi
fi
if [[ $PHASES == *D* ]]; then
  [ -f "$S2/config.json" ] || { say "no Stage 2 model at $S2: run phase A first"; exit 1; }
  D=$W/sib
  mkdir -p "$D"
  [ -s "$D/data/mixture_sft.jsonl" ] || "$T" generate --environment sat+abd+ded --tasks $tasks --output_dir "$D/data" \
    --ded_dataset "humaneval:$H" $U > "$L/sib.generate.log" 2>&1
  say "D demonstrations rc=$?"
  [ -f "$D/sft/merged/config.json" ] || "$T" sft --model "$S2" --train_file "$D/data/mixture_sft.jsonl" \
    --output_dir "$D/sft" --epochs 1 --learning_rate 1e-4 --max_length 4096 "${DEV[@]}" "${NO4[@]}" ${SMALL:+--max_steps 2} \
    > "$L/sib.sft.log" 2>&1
  say "D sft rc=$?"
  echo '{"ppo": {"max_prompt_tokens": 4096}, "curriculum": {"enabled": false}}' > "$D/stage3.json"
  sib_ppo() { # sib_ppo MODEL OUT STEPS LOG: GRPO on the mixture, with room for SAT's prompts
    [ -f "$2/merged/config.json" ] || "$T" ppo --model "$1" --output_dir "$2" --config "$D/stage3.json" \
      "${grpo[@]}" --num_train_steps "$3" --environment "${SIB_MIXTURE:-trace+sat+abd+ded}" \
      --dataset "builtin+humaneval:$H" --ded_dataset "humaneval:$H" --force > "$4" 2>&1
  }
  sib_eval() { # sib_eval MODEL OUT: every environment's held-out tasks
    [ -f "$2" ] || "$T" eval --model "$1" --environment trace+sat+abd+ded --tasks $tasks --trace_dataset "$HO" \
      --ded_dataset "humaneval:$H" --max_new_tokens 512 --batch_size 256 "${DEV[@]}" $U --output "$2" \
      >> "$L/evals.log" 2>&1
  }
  sib_ppo "$D/sft/merged" "$D/ppo" "$steps" "$L/sib.ppo.log"
  say "D mixture rc=$?"
  for m in base:$BASE s2:$S2 sft:$D/sft/merged s3:$D/ppo/merged; do
    sib_eval "${m#*:}" "$D/env.${m%%:*}.json"
  done
  "$T" compare "$D/env.base.json" "$D/env.s2.json" "$D/env.sft.json" "$D/env.s3.json" --level 0.8 \
    --output "$D/compare.json" --plot "$D/frontier.png" > "$D/compare.txt" 2>&1
  say "D with sibling SFT done"
  # GRPO on the same mixture straight from A's Stage 2, no sibling SFT
  # (D2_STEPS steps, default 12): what Stage 3 alone moves.
  E=$W/sib_rl
  mkdir -p "$E"
  sib_ppo "$S2" "$E/ppo" "${D2_STEPS:-$((steps < 12 ? steps : 12))}" "$L/sib_rl.ppo.log"
  say "D2 mixture from Stage 2 rc=$?"
  sib_eval "$E/ppo/merged" "$E/env.s3.json"
  "$T" compare "$D/env.base.json" "$D/env.s2.json" "$E/env.s3.json" --level 0.8 \
    --output "$E/compare.json" --plot "$E/frontier.png" > "$E/compare.txt" 2>&1
  say "D done"
fi
say "all done"
