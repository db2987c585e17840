#!/usr/bin/env bash
# Main job: set up, judge the bundled examples, print the results tables and the leaderboard.
# The level0 examples are C++ kernels for the CPU device; the level2 ones are CUDA and run on the GPU when there
# is one (on a machine without CUDA they are reported as needs_cuda). Each batch is its own run, so the
# leaderboard counts every record once. Extra arguments go to both batches (e.g. --config strict);
# JUDGE_RESULTS_DIR writes the runs somewhere other than results/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
results="${JUDGE_RESULTS_DIR:-results}"
device=$(.venv/bin/python -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
.venv/bin/python run_eval.py batch submissions/examples/level0 --device cpu --run examples-level0-cpu \
  --results-dir "$results" "$@"
.venv/bin/python run_eval.py batch submissions/examples/level2 --device "$device" --run "examples-level2-$device" \
  --results-dir "$results" "$@"
.venv/bin/python run_eval.py leaderboard "$results/examples-level0-cpu" "$results/examples-level2-$device" \
  --output "$results/leaderboard-examples.csv"
