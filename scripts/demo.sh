#!/usr/bin/env bash
# Main job: set up, judge the bundled examples (CPU, or CUDA when available), print the results and leaderboard.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python run_eval.py batch submissions/examples --run examples "$@"
.venv/bin/python run_eval.py leaderboard results/examples
