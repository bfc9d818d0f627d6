#!/usr/bin/env bash
# Packs the fuzz targets for a many-core machine without the build's packages (the GPU
# host of a device call; docs/RELIABILITY.md "Fork runs") into DEST/fuzz-pack.tar.xz (xz: the model corpus's
# GGUFs repeat each other, 16 MB in 0.1 MB; gzip kept 12 MB):
#   bin/      the fuzz binaries, debug info stripped (ASan/UBSan/libFuzzer work the same;
#             reports name functions, not lines), and bin/COMMIT
#   lib/      the shared libraries they link that a bare image lacks (gpu-pack.sh's rule)
#   corpus/   <target>/: the committed seeds, plus EXTRA/<target>/ when given (e.g. a
#             merged long-run corpus)
#   tests/fuzz/corpus/fuzz_template/{qwen3,llama31}.jinja (fuzz_chat_json's templates)
#   tests/fuzz/corpus/fuzz_model_gguf/llama-q8_0.gguf (fuzz_http's server model)
#   testdata/tokenizer/ggml-vocab-{llama-spm,gpt-2}.gguf (fuzz_tokenizer's vocabularies)
#   run_fork.sh, max_len.sh
# The build should have neither OpenBLAS nor oneDNN (-DKILN_OPENBLAS=OFF -DKILN_ONEDNN=OFF:
# their libraries are large and no fuzz target needs them).
# usage: scripts/fuzz-pack.sh BUILD_DIR DEST [EXTRA_CORPUS_ROOT] [TARGET...]
#   default targets: the eight slow ones of run_fork.sh
# then, on the device (carry [".carry-fuzz"] when DEST is .carry-fuzz):
#   mkdir -p /tmp/fz && (tar xJf .carry-fuzz/fuzz-pack.tar.xz -C /tmp/fz || python3 -c \
#   'import sys,tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
#   .carry-fuzz/fuzz-pack.tar.xz /tmp/fz) && cd /tmp/fz &&
#   LIB_DIR=$PWD/lib BIN_DIR=$PWD/bin CORPUS_DIRS=$PWD/corpus KILN_SOURCE_DIR=$PWD \
#   KILN_SHARED_DIR=$PWD OUT=$OUT bash run_fork.sh
set -euo pipefail
[ $# -ge 2 ] || { sed -n '2,22p' "$0"; exit 2; }
build=$(cd "$1" && pwd)
dest=$2
extra=${3:-}
shift $(( $# >= 3 ? 3 : 2 ))
src=$(cd "$(dirname "$0")/.." && pwd)
shared=${KILN_SHARED_DIR:-}
if [ -z "$shared" ]; then # beside the checkout, or beside the main checkout of a worktree
  for d in "$src/../shared" "$src/../../shared"; do [ -d "$d/testdata" ] && shared=$d && break; done
fi
[ -d "${shared:-}/testdata/tokenizer" ] || { echo "fuzz-pack: no shared/testdata/tokenizer (set KILN_SHARED_DIR)" >&2; exit 1; }
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(fuzz_chat_json fuzz_perfdb fuzz_hf_tokenizer fuzz_tokenizer
                                     fuzz_model_gguf fuzz_template fuzz_quants fuzz_http)
if grep -qE '^KILN_(OPENBLAS|ONEDNN):BOOL=ON' "$build/CMakeCache.txt"; then
  echo "fuzz-pack: $build has KILN_OPENBLAS or KILN_ONEDNN on (their libraries would travel)" >&2
  exit 1
fi
stage=$(mktemp -d "${TMPDIR:-/tmp}/fuzz-pack-XXXXXX")
trap 'rm -rf "$stage"' EXIT
bins=()
for t in "${targets[@]}"; do bins+=("$build/tests/$t"); done
bash "$src/scripts/gpu-pack.sh" --bins "$stage" "${bins[@]}"
git -C "$src" rev-parse --short HEAD >"$stage/bin/COMMIT"
git -C "$src" diff --quiet HEAD -- src tests/fuzz || echo "+dirty" >>"$stage/bin/COMMIT"
for t in "${targets[@]}"; do
  mkdir -p "$stage/corpus/$t"
  cp "$src/tests/fuzz/corpus/$t"/* "$stage/corpus/$t/"
  if [ -n "$extra" ] && [ -d "$extra/$t" ]; then cp -n "$extra/$t"/* "$stage/corpus/$t/"; fi
done
mkdir -p "$stage/tests/fuzz/corpus/fuzz_template" "$stage/tests/fuzz/corpus/fuzz_model_gguf" \
  "$stage/testdata/tokenizer"
cp "$src/tests/fuzz/corpus/fuzz_template/"{qwen3,llama31}.jinja "$stage/tests/fuzz/corpus/fuzz_template/"
cp "$src/tests/fuzz/corpus/fuzz_model_gguf/llama-q8_0.gguf" "$stage/tests/fuzz/corpus/fuzz_model_gguf/"
cp "$shared/testdata/tokenizer/ggml-vocab-"{llama-spm,gpt-2}.gguf "$stage/testdata/tokenizer/"
cp "$src/tests/fuzz/run_fork.sh" "$src/tests/fuzz/max_len.sh" "$stage/"
mkdir -p "$dest"
rm -f "$dest/fuzz-pack.tgz" "$dest/fuzz-pack.tar.xz"
tar cf - -C "$stage" . | xz -T2 -6 >"$dest/fuzz-pack.tar.xz"
echo "fuzz-pack: $dest/fuzz-pack.tar.xz ($(du -h "$dest/fuzz-pack.tar.xz" | cut -f1); unpacked $(du -sh "$stage" | cut -f1)), commit $(tr '\n' ' ' <"$stage/bin/COMMIT")"
