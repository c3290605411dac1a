#!/usr/bin/env bash
# ViT-B/16 training at 224 in bf16 on one NVIDIA GPU: bf16 matmul rate, images/s, MFU.
#
#   bash benchmarks/gpu_bench.sh                 # from the repository root, on the GPU machine
#   bash benchmarks/gpu_bench.sh --dry-run       # on a CPU: a tiny model through the same code paths
#   OUT=/some/dir bash benchmarks/gpu_bench.sh   # also writes $OUT/gpu_bench.json
#
# Installs nothing: it runs the repository's sources (PYTHONPATH=src) with the Python that already has
# torch (the project's .venv if there is one, else $PYTHON, else python3). Extra arguments go to
# benchmarks/gpu_bench.py (--batch-size, --steps, --no-compile, --peak-tflops 989, ...).
# Cost: ~1-3 minutes on an H100/H200, most of it torch.compile's first compilation.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ -x .venv/bin/python ]]; then
  PY=.venv/bin/python
else
  PY=${PYTHON:-python3}
fi
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "error: $PY has no torch; point PYTHON at an interpreter that has it (this script installs nothing)" >&2
  exit 2
fi

if [[ " $* " != *" --dry-run "* ]]; then
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader || true
fi

JSON_ARGS=()
if [[ -n "${OUT:-}" ]]; then
  JSON_ARGS=(--json "$OUT/gpu_bench.json")
fi
PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} "$PY" benchmarks/gpu_bench.py "${JSON_ARGS[@]}" "$@"
