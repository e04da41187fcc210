#!/usr/bin/env bash
# Downloads into .whl/ (git-ignored) the wheels that benches/trl_rl_peer.py needs
# and the GPU machine lacks, for Python 3.12 on x86-64 Linux. The machine has
# PyTorch 2.11, transformers 5.17, PEFT 0.21, accelerate, pyarrow, pandas, xxhash,
# fsspec, huggingface-hub, numpy, requests, tqdm, pyyaml, packaging, filelock,
# aiohttp, multidict, yarl, rich, safetensors, tokenizers (and torch's jinja2,
# accelerate's psutil). What TRL and datasets require beyond that (their
# Requires-Dist, read from the wheels):
#   trl 1.16.0     accelerate, datasets>=4.7, huggingface_hub, jinja2, numpy,
#                  packaging, pandas, psutil, pyarrow>=21, pyyaml, transformers
#   datasets 4.8.5 dill<0.4.2, multiprocess<0.70.20, httpx<1, requests,
#                  fsspec[http], huggingface-hub<2 (>=0.25), pyarrow>=21, ...
#   multiprocess   dill>=0.4.1
# so: trl, datasets, dill, multiprocess (about 1.8 MB in all). datasets 4.8.5
# rather than 5.x: 5.2 asks for pyarrow>=24 and huggingface-hub>=1.31, newer
# than transformers 5.17 itself needs (hub>=1.5); 4.8.5 fits any machine that
# runs transformers 5.17. DATASETS_VERSION overrides it.
#
#   bash scripts/fetch-rl-peer-wheels.sh            # trl, datasets, dill, multiprocess
#   bash scripts/fetch-rl-peer-wheels.sh --4bit     # and bitsandbytes 0.50.2 (43 MB) for --4bit
#   bash scripts/fetch-rl-peer-wheels.sh --liger    # and liger-kernel 0.8.5 (0.9 MB) for
#                                                   # benches/hf_learn.py --liger
#
# On the GPU machine (the folder travels with the run):
#   pip install --no-index --no-deps --target /tmp/site .whl/*.whl
#   PYTHONPATH=/tmp/site python3 benches/trl_rl_peer.py ...
set -euo pipefail
cd "$(dirname "$0")/.."

with_bnb=0
with_liger=0
for a in "$@"; do
    case "$a" in
        --4bit) with_bnb=1 ;;
        --liger) with_liger=1 ;;
        -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
        *) echo "error: unknown argument \`$a\`" >&2
           echo "hint: the flags are --4bit (adds bitsandbytes) and --liger (adds liger-kernel)" >&2; exit 2 ;;
    esac
done

pkgs=(
    "trl==1.16.0"
    "datasets==${DATASETS_VERSION:-4.8.5}"
    "dill==0.4.1"
    "multiprocess==0.70.19"
)
if [ "$with_bnb" = 1 ]; then
    pkgs+=("bitsandbytes==0.50.2")
fi
if [ "$with_liger" = 1 ]; then
    pkgs+=("liger-kernel==0.8.5")
fi

mkdir -p .whl
python3 -m pip download --no-deps --only-binary=:all: \
    --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${pkgs[@]}" >&2

echo "wheels in .whl/:" >&2
ls -l .whl/*.whl | awk '{ t += $5; printf "  %8.1f KiB  %s\n", $5 / 1024, $NF }
    END { printf "  %8.1f MiB  in all (a GPU run carries at most 64 MiB)\n", t / 1048576 }' >&2
