#!/usr/bin/env bash
# The fault suite (tests/faults.rs) against a CUDA build, on the GPU
# machine: every training stage killed, stopped and damaged on the GPU,
# then resumed and compared with an uninterrupted GPU run.
#
#   cargo test --release --test faults --no-run   # here: the suite's binary
#   scripts/fault-suite-gpu.sh target/release/deps/faults-HASH path/to/cuda/trace-train
#
# The suite's binary only drives the given trace-train, so a CPU build of
# it serves. It prints the table on stderr.
set -euo pipefail
if [ $# -ne 2 ]; then
    echo "usage: $0 FAULTS_TEST_BINARY TRACE_TRAIN_BINARY" >&2
    exit 2
fi
TRACE_TRAIN_BIN=$(realpath "$2") TRACE_TRAIN_FAULT_DEVICE=cuda \
    "$1" --nocapture --test-threads 1
