#!/usr/bin/env bash
# Main job: set up, judge the bundled examples, print the results tables and the leaderboard.
# The level0 examples are C++ kernels for the CPU device; the level2 ones are CUDA and run on the GPU when there
# is one (on a machine without CUDA they are reported as needs_cuda).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
device=$(.venv/bin/python -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
.venv/bin/python run_eval.py batch submissions/examples/level0 --device cpu --run examples-cpu "$@"
.venv/bin/python run_eval.py batch submissions/examples/level2 --device "$device" --run "examples-$device" "$@"
.venv/bin/python run_eval.py leaderboard results/examples-cpu "results/examples-$device"
