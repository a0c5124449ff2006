#!/usr/bin/env bash
# Runs on the GPU machine, as .devcache/pay/unpack.sh (tools/stage_payload.sh puts it there after tools/pieces.sh):
# keeps each carried payload piece outside the work tree, which every call replaces; once every piece has arrived
# and their sha256 is MANIFEST's, unpacks the payload (ResNet-50 bundle, images0, MLCommons scripts, native wheels)
# into /tmp/payload and the bundle into /tmp/trtfuse-e2e (`trtfuse bench bundle`'s STASH).
# Idempotent: a second run after READY does nothing. The folders can be moved for a dry run here:
# PAYLOAD_DEST, PAYLOAD_PIECES, TRTFUSE_E2E_STASH.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
declare -F extract_pieces > /dev/null || source "$here/pieces.sh"   # run from tools/ itself
dest=${PAYLOAD_DEST:-/tmp/payload}
keep=${PAYLOAD_PIECES:-/tmp/pay-pieces}
stash=${TRTFUSE_E2E_STASH:-/tmp/trtfuse-e2e}
if [ -f "$dest/.ready" ]; then echo "PAYLOAD READY (already)"; exit 0; fi
extract_pieces "$here" "$keep" payload "$dest.tmp"   # exits unless every piece is there
mkdir -p "$stash"
cp -r "$dest.tmp/e2e/." "$stash/"
rm -rf "$dest" "$keep"
mv "$dest.tmp" "$dest"
touch "$dest/.ready"
echo "PAYLOAD READY: $(ls "$dest" | tr '\n' ' ')"
