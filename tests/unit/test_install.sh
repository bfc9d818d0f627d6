#!/usr/bin/env bash
# test_install.sh — the library others embed: `cmake --install` into a temporary prefix
# puts libkiln (shared and static), include/kiln/kiln.h and lib/pkgconfig/kiln.pc there;
# examples/generate.c (public API only) builds against it with
# `pkg-config --cflags --libs kiln` (shared) and `--static` (static), and both binaries
# generate the same greedy text as `kiln run --temp 0` on a kiln-gen model.
# $1 is the kiln binary (its build directory is the one installed).
set -euo pipefail
KILN=$1
[ -n "${KILN_SANITIZED:-}" ] && { echo "SKIP: sanitizer build (an installed ASan/UBSan libkiln needs the sanitizer runtime in every program linking it; the plain build runs this test)"; exit 0; }
BUILD=$(dirname "$KILN")
GEN="$BUILD/kiln-gen"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

cmake --install "$BUILD" --prefix "$T/prefix" >"$T/install.log" 2>&1 || fail "cmake --install: $(tail -5 "$T/install.log")"
for f in include/kiln/kiln.h lib/pkgconfig/kiln.pc lib/libkiln.a; do
  [ -f "$T/prefix/$f" ] || fail "$f not installed"
done
ls "$T/prefix/lib"/libkiln.so* >/dev/null 2>&1 || fail "libkiln.so not installed"
export PKG_CONFIG_PATH="$T/prefix/lib/pkgconfig"
pkg-config --exists kiln || fail "pkg-config does not find kiln"
SRC="$KILN_SOURCE_DIR/examples/generate.c"
# shared: only the public header and -lkiln
cc -std=c11 -Wall -Wextra -Werror "$SRC" $(pkg-config --cflags --libs kiln) \
   -Wl,-rpath,"$T/prefix/lib" -o "$T/gen_shared" 2>"$T/cc.log" || fail "shared build: $(cat "$T/cc.log")"
# the example must not reach past the public header
grep -q '#include "' "$SRC" && fail "examples/generate.c includes a private header"

"$GEN" -q -p tiny -f llama -t q8_0 -s 7 -o "$T/m.gguf"
want=$("$KILN" run -m "$T/m.gguf" -p "hello world" -n 16 --temp 0 --backend cpu 2>/dev/null)
got=$("$T/gen_shared" "$T/m.gguf" "hello world" 16 2>"$T/err") || fail "example failed: $(cat "$T/err")"
[ "$got" = "hello world$want" ] || [ "$got" = "$want" ] || fail "example printed '$got', kiln run printed '$want'"
grep -q "generated" "$T/err" || fail "no token count on stderr"
"$T/gen_shared" "$T/missing.gguf" "x" 2>"$T/err2" && fail "a missing model must fail"
grep -qi "error" "$T/err2" || fail "no error message for a missing model"
echo "ok: installed library, pkg-config and the example agree with kiln run"
