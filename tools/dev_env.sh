# Source me to import trtfuse from this checkout without installing it:
#   source tools/dev_env.sh
# Used on the GPU machine, whose TensorRT Python has no pip. Builds a tiny tree of symlinks that maps
# the package layout of pyproject.toml (trtfuse <- harness/, trtfuse.models <- models/,
# trtfuse.configs <- configs/) and puts it on PYTHONPATH.
_trtfuse_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
_trtfuse_tree=${TMPDIR:-/tmp}/trtfuse-path-$$
rm -rf "$_trtfuse_tree" && mkdir -p "$_trtfuse_tree/trtfuse"
for _f in "$_trtfuse_root"/harness/*; do ln -s "$_f" "$_trtfuse_tree/trtfuse/"; done
ln -s "$_trtfuse_root/models" "$_trtfuse_tree/trtfuse/models"
ln -s "$_trtfuse_root/configs" "$_trtfuse_tree/trtfuse/configs"
export PYTHONPATH="$_trtfuse_tree${PYTHONPATH:+:$PYTHONPATH}"
unset _f _trtfuse_root _trtfuse_tree
