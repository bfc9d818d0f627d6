#!/usr/bin/env bash
# mmf-ab.sh — build bench/mmf_ab.c: the AVX2 float-weight kernel (matmul_f_avx2.c) twice,
# old and new, in one process (see bench/mmf_ab.c). Each side is git revision REV's file
# or the working tree's ("." as REV), compiled with its own -D flags. BUILD: a build dir
# with libkiln.a and bench_cpu_matmul (its link line gives the libraries).
#
#   scripts/mmf-ab.sh OLD_REV "OLD_FLAGS" NEW_REV "NEW_FLAGS" BUILD OUT
#   then   taskset -c 1 OUT f16 5632 2048 128 200 5
set -euo pipefail
[ $# -eq 6 ] || { sed -n '2,8p' "$0"; exit 2; }
OREV=$1 OFL=$2 NREV=$3 NFL=$4 BUILD=$5 OUT=$6
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
CF=(-O3 -g -std=c11 -D_GNU_SOURCE -Iinclude -Isrc)
ISA=(-mavx2 -mfma -mf16c)
side() { # rev, flags, symbol, object
  local src=src/kernels/cpu/matmul_f_avx2.c
  if [ "$1" != . ]; then git show "$1:$src" >"$tmp/$3.c"; src=$tmp/$3.c; fi
  # shellcheck disable=SC2086
  cc "${CF[@]}" "${ISA[@]}" $2 -Dkiln_cpu_mmf_avx2="$3" -c "$src" -o "$4"
}
side "$OREV" "$OFL" old_mmf "$tmp/old.o"
side "$NREV" "$NFL" new_mmf "$tmp/new.o"
cc "${CF[@]}" -Wall -Wextra -Werror -c bench/mmf_ab.c -o "$tmp/ab.o"
libs=$(sed -n 's/.*libkiln.a //p' "$BUILD/bench/CMakeFiles/bench_cpu_matmul.dir/link.txt")
# shellcheck disable=SC2086
cc -o "$OUT" "$tmp/ab.o" "$tmp/old.o" "$tmp/new.o" "$BUILD/libkiln.a" $libs
