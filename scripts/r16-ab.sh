#!/usr/bin/env bash
# r16-ab.sh — build bench/r16_ab.c: the AVX2 R16 kernel of git revision REV (old) against the
# working tree's (new), in one process (see bench/r16_ab.c). BUILD: a build dir with libkiln.a
# and bench_cpu_matmul (its link line gives the libraries).
#
#   scripts/r16-ab.sh REV BUILD OUT     then   OUT q4_K 2048 2048 128 8
set -euo pipefail
[ $# -eq 3 ] || { sed -n '2,7p' "$0"; exit 2; }
REV=$1 BUILD=$2 OUT=$3
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
CF=(-O3 -g -std=c11 -D_GNU_SOURCE -Iinclude -Isrc)
ISA=(-mavx2 -mfma -mf16c)
git show "$REV:src/kernels/cpu/matmul_r16_avx2.c" > "$tmp/old.c"
cc "${CF[@]}" "${ISA[@]}" -Dkiln_cpu_mmr16_avx2=old_mmr16 -c "$tmp/old.c" -o "$tmp/old.o"
cc "${CF[@]}" "${ISA[@]}" -Dkiln_cpu_mmr16_avx2=new_mmr16 -c src/kernels/cpu/matmul_r16_avx2.c \
  -o "$tmp/new.o"
cc "${CF[@]}" -Wall -Wextra -Werror -c bench/r16_ab.c -o "$tmp/ab.o"
libs=$(sed -n 's/.*libkiln.a //p' "$BUILD/bench/CMakeFiles/bench_cpu_matmul.dir/link.txt")
# shellcheck disable=SC2086
cc -o "$OUT" "$tmp/ab.o" "$tmp/old.o" "$tmp/new.o" "$BUILD/libkiln.a" $libs
