#!/usr/bin/env bash
# Runs on the GPU machine: keeps each carried payload piece outside the work tree; once every piece has
# arrived, unpacks the payload (ResNet-50 bundle, images0, MLCommons scripts, native wheels) into /tmp/payload
# and the bundle into /tmp/trtfuse-e2e (`trtfuse bench bundle`'s STASH).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
keep=/tmp/pay-pieces
mkdir -p "$keep"
if [ -f /tmp/payload/.ready ]; then echo "PAYLOAD READY (already)"; exit 0; fi
for p in "$here"/piece??; do [ -f "$p" ] && cp "$p" "$keep/"; done
n=$(head -1 "$here/MANIFEST"); sum=$(sed -n 2p "$here/MANIFEST")
missing=$(for i in $(seq 0 $((n-1))); do f=$(printf 'piece%02d' "$i"); [ -f "$keep/$f" ] || printf '%s ' "$f"; done)
if [ -n "$missing" ]; then echo "payload: $(ls "$keep" | wc -l) of $n pieces; missing: $missing"; exit 0; fi
got=$(cat "$keep"/piece?? | sha256sum | cut -d' ' -f1)
[ "$got" = "$sum" ] || { echo "payload checksum mismatch" >&2; exit 1; }
mkdir -p /tmp/payload /tmp/trtfuse-e2e
cat "$keep"/piece?? | "$here/../stage/zstd" -d -q --long=27 | tar -C /tmp/payload -xf -
cp -r /tmp/payload/e2e/. /tmp/trtfuse-e2e/
rm -rf "$keep"
touch /tmp/payload/.ready
echo "PAYLOAD READY: $(ls /tmp/payload)"
