# Source me to import trtfuse from this checkout without installing it:
#   source tools/dev_env.sh
# Used on the GPU machine, whose TensorRT Python has no pip. The package is src/trtfuse/ (src layout), so
# putting src/ on PYTHONPATH is all an import needs.
_trtfuse_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONPATH="$_trtfuse_root/src${PYTHONPATH:+:$PYTHONPATH}"
unset _trtfuse_root
