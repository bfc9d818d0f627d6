#!/usr/bin/env bash
# carry-pieces.sh — bring files larger than one device call can carry (64 MiB with the
# checkout) to the lent GPU machine in pieces over consecutive calls to the same warm
# machine (the real Gemma 3 270M and SmolLM2 files for issue 17's real-model runs; the GPU
# machine has no network).
#   here:  scripts/carry-pieces.sh split DIR BYTES FILE...
#          writes DIR/p00/, DIR/p01/, ... (each at most BYTES of the files' bytes) and
#          DIR/manifest (name, size, sha256 per file). Carry one piece folder per call:
#          run(carry [".cm/p00"], "bash scripts/carry-pieces.sh stash .cm/p00"), the next
#          call within the machine's warm window (30 s), ...
#   there: scripts/carry-pieces.sh stash DIR   copies a piece to /tmp/kiln-pieces
#          scripts/carry-pieces.sh join MANIFEST DEST   joins the pieces into DEST/name and
#          checks each file's size and sha256 (exit 1, naming the file, on a mismatch or a
#          missing piece: the machine was not the same warm one).
set -euo pipefail
STASH=/tmp/kiln-pieces
case ${1:-} in
  split)
    dir=$2 bytes=$3; shift 3
    rm -rf "$dir"; mkdir -p "$dir"
    : >"$dir/manifest"
    cat "$@" | split -b "$bytes" -d -a 2 - "$dir/piece."
    for f in "$@"; do
      printf '%s %s %s\n' "$(basename "$f")" "$(stat -c %s "$f")" \
        "$(sha256sum "$f" | cut -d' ' -f1)" >>"$dir/manifest"
    done
    for p in "$dir"/piece.*; do
      n=${p##*.}; mkdir -p "$dir/p$n"; mv "$p" "$dir/p$n/"
    done
    cp "$dir/manifest" "$dir/p00/"
    ls "$dir" ;;
  stash)
    mkdir -p $STASH; cp "$2"/* $STASH/
    echo "stashed $(ls $STASH | wc -l) files, $(du -sb $STASH | cut -f1) bytes" ;;
  join)
    man=$2 dest=$3; mkdir -p "$dest"
    all=$(mktemp); cat $STASH/piece.* >"$all"
    off=0
    while read -r name size sum; do
      dd if="$all" of="$dest/$name" iflag=skip_bytes,count_bytes skip="$off" count="$size" \
        bs=4M status=none
      got=$(sha256sum "$dest/$name" | cut -d' ' -f1)
      if [ "$got" != "$sum" ]; then echo "join: $name: sha256 mismatch (pieces missing?)"; rm -f "$all"; exit 1; fi
      echo "join: $dest/$name ok ($size bytes)"
      off=$((off + size))
    done <"$man"
    rm -f "$all" ;;
  *) echo "usage: $0 split DIR BYTES FILE... | stash DIR | join MANIFEST DEST" >&2; exit 2 ;;
esac
