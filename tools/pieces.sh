# Pieces of an archive that ride in device calls (each call replaces the tree and carries at most 64 MiB).
# Here, sourced by tools/stage_payload.sh and tools/stage_triton.sh: write_pieces. On the GPU machine: extract_pieces
# (gather_pieces, then pieces_zstd to unpack), for the payloads' unpackers (tools/payload_unpack.sh, tools/triton_unpack.sh), which write_pieces
# puts after this file in the one unpack.sh that travels beside the pieces.

# write_pieces ARCHIVE OUT UNPACK FIRST PIECE: ARCHIVE split into OUT/piece00 (FIRST bytes) and OUT/piece01.. (PIECE
# bytes each), beside OUT/unpack.sh (this file, then UNPACK) and OUT/MANIFEST (the piece count, then the sha256 of the
# whole); OUT replaced whole at the end, so an interrupted staging leaves the old one.
write_pieces() {
    local archive=$1 out=$2 unpack=$3 first=$4 piece=$5
    rm -rf "$out.tmp"
    mkdir -p "$out.tmp"
    head -c "$first" "$archive" > "$out.tmp/piece00"
    if [ "$(stat -c %s "$archive")" -gt "$first" ]; then
        tail -c +$((first + 1)) "$archive" | split -b "$piece" -a 2 --numeric-suffixes=1 - "$out.tmp/piece"
    fi
    { echo '#!/usr/bin/env bash'; cat "${BASH_SOURCE[0]}"; tail -n +2 "$unpack"; } > "$out.tmp/unpack.sh"
    chmod +x "$out.tmp/unpack.sh"
    { ls "$out.tmp" | grep -c '^piece'; sha256sum "$archive" | cut -d' ' -f1; } > "$out.tmp/MANIFEST"
    rm -rf "$out"
    mv "$out.tmp" "$out"
    echo "== staged $(head -1 "$out/MANIFEST") piece(s) in $out ($(stat -c %s "$archive") bytes):"
    ls -l "$out" | tail -n +2
}

# gather_pieces HERE KEEP LABEL: HERE's pieces kept in KEEP (outside the tree). Returns when every piece of
# HERE/MANIFEST is there and their sha256 is its (`cat KEEP/piece??` is the archive); else ends the unpacker: exit 0
# while some are still missing (said on stdout), exit 1 on a checksum mismatch (said on stderr, with the fix).
gather_pieces() {
    local here=$1 keep=$2 label=$3 n sum missing p
    mkdir -p "$keep"
    for p in "$here"/piece??; do [ -f "$p" ] && cp "$p" "$keep/"; done
    n=$(head -1 "$here/MANIFEST"); sum=$(sed -n 2p "$here/MANIFEST")
    missing=$(for i in $(seq 0 $((n - 1))); do p=$(printf 'piece%02d' "$i"); [ -f "$keep/$p" ] || printf '%s ' "$p"; done)
    if [ -n "$missing" ]; then echo "$label: $(ls "$keep" | grep -c '^piece') of $n pieces; missing: $missing"; exit 0; fi
    [ "$(cat "$keep"/piece?? | sha256sum | cut -d' ' -f1)" = "$sum" ] && return 0
    echo "$label checksum mismatch: pieces of different stagings? rm -rf $keep and carry them again" >&2
    exit 1
}

# extract_pieces HERE KEEP LABEL INTO: gather_pieces, then the archive unpacked into INTO, made afresh (an earlier
# interrupted unpacking's is removed first).
extract_pieces() {
    local here=$1 keep=$2 label=$3 into=$4 zstd
    gather_pieces "$here" "$keep" "$label"   # exits unless every piece is there
    zstd=$(pieces_zstd "$here")
    rm -rf "$into"
    mkdir -p "$into"
    cat "$keep"/piece?? | "$zstd" -d -q --long=27 | tar -C "$into" -xf -
}

# pieces_zstd HERE: the zstd to unpack with: a carried .devcache/stage/zstd, the one the TensorRT staging left in
# /tmp, or the machine's.
pieces_zstd() {
    local z=$1/../stage/zstd
    [ -x "$z" ] || z=/tmp/zstd
    [ -x "$z" ] || z=$(command -v zstd) || { echo "no zstd: carry .devcache/stage/zstd too" >&2; return 1; }
    echo "$z"
}
