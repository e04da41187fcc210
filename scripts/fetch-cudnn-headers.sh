#!/usr/bin/env bash
# Fetches the headers the `cudnn` feature compiles against into $CUDNN_ROOT
# (default /opt/cudnn), from PyPI wheels:
#   $CUDNN_ROOT/cudnn/include           cudnn.h, cudnn_graph.h, ...   (nvidia-cudnn-cu13)
#   $CUDNN_ROOT/frontend/include        cudnn_frontend.h, ...         (nvidia-cudnn-frontend)
# Only headers are kept; no cuDNN library is linked (the binary loads
# libcudnn.so.9 at run time). build.rs reads CUDNN_INCLUDE_DIR and
# CUDNN_FRONTEND_INCLUDE_DIR, defaulting to the two folders above.
#
# Usage: bash scripts/fetch-cudnn-headers.sh     (idempotent; the cuDNN wheel is
# several hundred MB, downloaded once into a temporary folder and deleted)
set -euo pipefail
CUDNN_ROOT=${CUDNN_ROOT:-/opt/cudnn}
CUDNN_VERSION=${CUDNN_VERSION:-9.19.0.56}
FRONTEND_VERSION=${FRONTEND_VERSION:-1.18.0}

PIP_ARGS=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64)

fetch() { # fetch <package> <version> <marker header> <destination include dir>
  local package=$1 version=$2 marker=$3 dest=$4
  if [[ -f $dest/$marker && -f $dest/.version && $(cat "$dest/.version") == "$version" ]]; then
    echo "$package $version headers already in $dest"
    return
  fi
  local tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  echo "downloading $package==$version ..."
  python3 -m pip download -q "${PIP_ARGS[@]}" -d "$tmp" "$package==$version"
  local wheel
  wheel=$(ls "$tmp"/*.whl)
  echo "  $(du -h "$wheel" | cut -f1) $(basename "$wheel")"
  mkdir -p "$tmp/x"
  python3 - "$wheel" "$tmp/x" <<'EOF'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.endswith((".h", ".hpp", ".inl")) and "/include/" in "/" + name:
            z.extract(name, out)
EOF
  local found
  found=$(find "$tmp/x" -name "$marker" -path '*include*' | head -1)
  if [[ -z $found ]]; then
    echo "no $marker in $wheel" >&2
    exit 1
  fi
  # The include folder is the ancestor named `include` of the marker header.
  local inc=${found%/"$marker"}
  rm -rf "$dest"
  mkdir -p "$(dirname "$dest")"
  cp -r "$inc" "$dest"
  echo "$version" >"$dest/.version"
  echo "  headers in $dest"
}

fetch nvidia-cudnn-cu13 "$CUDNN_VERSION" cudnn_graph.h "$CUDNN_ROOT/cudnn/include"
fetch nvidia-cudnn-frontend "$FRONTEND_VERSION" cudnn_frontend.h "$CUDNN_ROOT/frontend/include"
