#!/usr/bin/env bash
# A new user's path through the tool, run from a fresh folder outside the
# checkout on the CPU: init, edit the model and the data, the pipeline,
# merge, GGUF export and import back, eval of both (same accuracy), push
# to a local server that records the requests, serve with two adapters.
# Each step's command is printed before it runs; any failure stops the
# script with a non-zero exit.
#
#   scripts/new-user-check.sh [path/to/trace-train]
set -euo pipefail
BIN=$(realpath "${1:-target/release/trace-train}")
REPO=$(cd "$(dirname "$0")/.." && pwd)
WORK=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
cd "$WORK"
step() { printf '\n$ %s\n' "$*"; "$@"; }

step "$BIN" init mine
cd mine
# A base model of the user's own (here the tiny one the tool makes) and a
# small part of the corpus.
step "$BIN" model tiny base
python3 - <<'EOF'
import json
p = "config/pipeline_config.json"
c = json.load(open(p))
c["model"]["base_model"] = "base"
# The tiny model's tokens are bytes: a corpus prompt is a few thousand.
c["model"]["max_length"] = 4096
c["stage0"]["max_samples"] = 24
json.dump(c, open(p, "w"), indent=2)
EOF
step "$BIN" config config/pipeline_config.json
# The whole pipeline, a few steps a stage, from this folder.
step "$BIN" pipeline --device cpu --max_steps 3 --set stage3.ppo.batch_size=2 \
    --set stage3.ppo.max_new_tokens=8 --set stage3.ppo.mini_batch_size=4
ls checkpoints
SFT=checkpoints/stage2_sft/final
RL=checkpoints/stage3_ppo/final
step "$BIN" model merge --base base --adapter "$SFT" --output_dir merged --force
step "$BIN" model export --gguf merged --output merged.gguf --outtype f32
step "$BIN" model import_gguf merged.gguf back
step "$BIN" eval --model merged --device cpu --limit 8 --max_new_tokens 16 --output a.json
step "$BIN" eval --model back --device cpu --limit 8 --max_new_tokens 16 --output b.json
python3 - <<'EOF'
import json
a, b = json.load(open("a.json")), json.load(open("b.json"))
# Every answer the same, so every score the same.
def answers(r):
    return [(x.get("id"), x.get("output"), x.get("correct")) for x in r.get("items", r.get("results", []))]
print("merged:", {k: a[k] for k in a if k in ("accuracy", "exact_match", "n")},
      "round trip through GGUF:", {k: b[k] for k in b if k in ("accuracy", "exact_match", "n")})
assert a.get("accuracy") == b.get("accuracy") and answers(a) == answers(b), "the GGUF round trip changed the answers"
EOF
# Push to a local server that records what it is sent.
python3 "$REPO/scripts/fake_hub.py" 8765 hub.log &
sleep 1
step "$BIN" push merged --repo me/tiny-trace --endpoint http://127.0.0.1:8765 --token t
grep -c . hub.log
# Serve the base with both adapters; ask each by name.
"$BIN" serve --model base --name base --adapter sft="$SFT" --adapter rl="$RL" \
    --port 0 --device cpu > url.txt 2> serve.log &
for _ in $(seq 100); do [ -s url.txt ] && break; sleep 0.1; done
URL=$(head -1 url.txt)
curl -s "$URL/models"; echo
for m in base sft rl; do
    curl -s "$URL/chat/completions" -H 'Content-Type: application/json' \
        -d "{\"model\": \"$m\", \"messages\": [{\"role\": \"user\", \"content\": \"print(1)\"}], \"max_tokens\": 8, \"temperature\": 0}" \
        | python3 -c "import json,sys; r=json.load(sys.stdin); print(r['model'], repr(r['choices'][0]['message']['content']))"
done
echo
echo "new-user check: every step passed in $WORK/mine"
