#!/usr/bin/env bash
# ab_runtime.sh — the issue-18 speed check: kiln before the runtime contract (cc27cb3) and
# after it (HEAD), built side by side and benchmarked alternately (A B A B ...), so drifts
# and bursts of a shared machine hit both binaries alike.
#
#   bench/ab_runtime.sh [-a BEFORE] [-b AFTER] [-d DIR] [-m MODEL] [-t THREADS] [-p N]
#                       [-n N] [-r REPS] [-R ROUNDS] [-j JOBS] [build|run|all]
#
#   build   export BEFORE and AFTER (git archive, so no worktree is registered) into
#           DIR/before/src and DIR/after/src and build only the kiln-bin target in
#           DIR/{before,after}/build (Release, KILN_CUDA=OFF, -j JOBS). An existing
#           export of the same commit is reused (the commit is in DIR/X/COMMIT) and the
#           build is incremental. The binaries report commit "unknown" (`kiln version`):
#           the export has no git history; DIR/X/COMMIT says which commit they are.
#   run     ROUNDS rounds of: `kiln bench -m MODEL -t T -p P -n N -r REPS` with the
#           before binary, then the after binary. Before every run it prints the load
#           average (/proc/loadavg) so a noisy round can be recognised and discarded.
#           Then a summary table (pp and tg t/s per round, before / after, and the
#           after/before ratio of the medians over rounds).
#   all     build, then run (the default).
#
# Defaults: BEFORE=cc27cb3 AFTER=HEAD DIR=<repo>/build-ab MODEL=~/.cache/kiln/models/
# gemma-3-270m-q4_k_m.gguf THREADS=2 P=512 N=128 REPS=3 ROUNDS=2 JOBS=2.
# Run it on a quiet machine: with a load average above the core count the numbers
# measure the other users, not kiln (docs/PERF.md, "Runtime contract (issue 18)").
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
before=cc27cb3 after=HEAD dir="$root/build-ab"
model="$HOME/.cache/kiln/models/gemma-3-270m-q4_k_m.gguf"
threads=2 n_prompt=512 n_gen=128 reps=3 rounds=2 jobs=2
while getopts "a:b:d:m:t:p:n:r:R:j:h" o; do
  case $o in
    a) before=$OPTARG ;;
    b) after=$OPTARG ;;
    d) dir=$OPTARG ;;
    m) model=$OPTARG ;;
    t) threads=$OPTARG ;;
    p) n_prompt=$OPTARG ;;
    n) n_gen=$OPTARG ;;
    r) reps=$OPTARG ;;
    R) rounds=$OPTARG ;;
    j) jobs=$OPTARG ;;
    *) sed -n '2,25p' "$0"; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
what=${1:-all}
case $what in build | run | all) ;; *) echo "ab_runtime: unknown step '$what' (build|run|all)" >&2; exit 2 ;; esac

build_one() { # name commit
  local name=$1 rev
  rev=$(git -C "$root" rev-parse --verify "$2^{commit}") ||
    { echo "ab_runtime: no commit '$2'" >&2; exit 2; }
  local d="$dir/$name"
  if [ "$(cat "$d/COMMIT" 2>/dev/null)" != "$rev" ]; then
    rm -rf "$d/src" "$d/build"
    mkdir -p "$d/src"
    git -C "$root" archive "$rev" | tar -x -C "$d/src"
    echo "$rev" >"$d/COMMIT"
  fi
  echo "== $name: $rev ($(git -C "$root" log -1 --format=%s "$rev" | cut -c1-70))"
  # the export has no .git: without a ceiling, CMake's `git rev-parse HEAD` would find the
  # enclosing checkout and stamp its commit into the binary (a whole-library define in
  # older commits, so every new commit there would also rebuild everything here)
  GIT_CEILING_DIRECTORIES="$d" \
    cmake -S "$d/src" -B "$d/build" -DCMAKE_BUILD_TYPE=Release -DKILN_CUDA=OFF >"$d/cmake.log" ||
    { cat "$d/cmake.log"; exit 1; }
  cmake --build "$d/build" --target kiln-bin -j "$jobs" >"$d/build.log" 2>&1 ||
    { tail -40 "$d/build.log"; exit 1; }
  echo "   $d/build/kiln"
}

if [ "$what" != run ]; then
  build_one before "$before"
  build_one after "$after"
fi
[ "$what" = build ] && exit 0

for s in before after; do
  [ -x "$dir/$s/build/kiln" ] || { echo "ab_runtime: $dir/$s/build/kiln missing (run '$0 build' first)" >&2; exit 2; }
done
[ -r "$model" ] || { echo "ab_runtime: model $model not readable" >&2; exit 2; }
for pair in "before:$before" "after:$after"; do
  s=${pair%%:*} want=$(git -C "$root" rev-parse --verify "${pair#*:}^{commit}" 2>/dev/null || echo "?")
  [ "$(cat "$dir/$s/COMMIT")" = "$want" ] ||
    echo "ab_runtime: note: the $s binary is of $(cut -c1-12 "$dir/$s/COMMIT"), not ${pair#*:} ($(echo "$want" | cut -c1-12)); '$0 build' rebuilds it"
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "== kiln bench -m $model -t $threads -p $n_prompt -n $n_gen -r $reps; $rounds rounds, before then after"
echo "   $(nproc) cores; before $(cut -c1-12 "$dir/before/COMMIT"), after $(cut -c1-12 "$dir/after/COMMIT")"
for ((i = 1; i <= rounds; i++)); do
  for s in before after; do
    load=$(cut -d' ' -f1-3 /proc/loadavg)
    echo "-- round $i $s (load average $load)"
    "$dir/$s/build/kiln" bench -m "$model" -t "$threads" -p "$n_prompt" -n "$n_gen" -r "$reps" \
      2>"$tmp/$s.$i.err" | tee "$tmp/$s.$i.out" ||
      { cat "$tmp/$s.$i.err" >&2; exit 1; }
    echo "$load" >"$tmp/$s.$i.load"
  done
done

# the t/s cell of a kiln bench table row: "| ... | pp512 | 123.45 ± 1.23 |" -> 123.45
tps() { # file test
  awk -F'|' -v t="$2" '{ for (i = 1; i <= NF; i++) { c = $i; gsub(/ /, "", c); if (c == t) { v = $NF; if (v == "") v = $(NF - 1); split(v, a, "±"); gsub(/ /, "", a[1]); print a[1]; exit } } }' "$1"
}
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "nan"; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo
echo "| round | load before | load after | before pp$n_prompt | after pp$n_prompt | before tg$n_gen | after tg$n_gen |"
echo "|---|---|---|---|---|---|---|"
for ((i = 1; i <= rounds; i++)); do
  echo "| $i | $(cat "$tmp/before.$i.load") | $(cat "$tmp/after.$i.load") |" \
    "$(tps "$tmp/before.$i.out" "pp$n_prompt") | $(tps "$tmp/after.$i.out" "pp$n_prompt") |" \
    "$(tps "$tmp/before.$i.out" "tg$n_gen") | $(tps "$tmp/after.$i.out" "tg$n_gen") |"
done
for t in "pp$n_prompt" "tg$n_gen"; do
  b=$(for ((i = 1; i <= rounds; i++)); do tps "$tmp/before.$i.out" "$t"; done | median)
  a=$(for ((i = 1; i <= rounds; i++)); do tps "$tmp/after.$i.out" "$t"; done | median)
  awk -v t="$t" -v a="$a" -v b="$b" 'BEGIN { printf "%s: median before %s, after %s t/s, after/before %.3f\n", t, b, a, (b > 0 ? a / b : 0) }'
done
echo "load average now: $(cut -d' ' -f1-3 /proc/loadavg)"
