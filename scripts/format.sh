#!/usr/bin/env bash
# Format every C/CUDA source with clang-format (.clang-format). --check: report files
# that would change and exit 1 (used by the format_check test).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files -co --exclude-standard -- '*.c' '*.h' '*.cu' '*.cuh' 2>/dev/null || true)
[ ${#files[@]} -eq 0 ] && exit 0
if [ "${1:-}" = "--check" ]; then
  bad=0
  for f in "${files[@]}"; do
    [ -f "$f" ] || continue
    if ! clang-format --dry-run -Werror "$f" >/dev/null 2>&1; then echo "needs formatting: $f"; bad=1; fi
  done
  [ $bad -eq 0 ] && echo "format: ok (${#files[@]} files)"
  exit $bad
fi
for f in "${files[@]}"; do [ -f "$f" ] && clang-format -i "$f"; done
