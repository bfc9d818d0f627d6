#!/usr/bin/env bash
# Format every C/CUDA source with clang-format (.clang-format). --check: report files
# that would change and exit 1 (used by the format_check test).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files -co --exclude-standard -- '*.c' '*.h' '*.cu' '*.cuh' 2>/dev/null || true)
[ ${#files[@]} -eq 0 ] && exit 0
existing=()
for f in "${files[@]}"; do [ -f "$f" ] && existing+=("$f"); done
if [ "${1:-}" = "--check" ]; then
  # one clang-format process per batch of files (fast); it names every file off format
  if ! out=$(printf '%s\0' "${existing[@]}" | xargs -0 -n 64 -P 2 clang-format --dry-run -Werror 2>&1); then
    echo "$out" | grep -oE '^[^:]+\.(c|h|cu|cuh):' | sort -u | sed 's/:$//; s/^/needs formatting: /'
    echo "run scripts/format.sh to fix"
    exit 1
  fi
  echo "format: ok (${#existing[@]} files)"
  exit 0
fi
printf '%s\0' "${existing[@]}" | xargs -0 -n 64 -P 2 clang-format -i
