#!/usr/bin/env bash
# Installs what the client tests of `kiln serve` need and prints the PYTHONPATH to use:
# the official `openai` Python package and `websockets` (Chrome DevTools for the web page
# test) from PyPI, into a private folder of kiln's cache
# (never the system Python). CI calls it before the serve tests; they call it themselves
# too and skip, saying why, when it fails (no network).
#   PYTHONPATH=$(scripts/serve-test-deps.sh) python3 tests/serve/openai_client.py ...
set -euo pipefail
dir=${XDG_CACHE_HOME:-$HOME/.cache}/kiln/pip/openai
PY=${PYTHON:-python3}
if ! PYTHONPATH=$dir "$PY" -c "import openai, websockets" 2>/dev/null; then
  mkdir -p "$dir"
  args=(-m pip install --quiet --disable-pip-version-check --no-warn-script-location
        --target "$dir" openai websockets)
  "$PY" "${args[@]}" >&2 || "$PY" "${args[@]}" --break-system-packages >&2
fi
echo "$dir"
