#!/bin/bash
# Reproducibility of one submission's speedup under several configs, the arms alternated round by round so that the
# machine's drift falls on all of them alike (the target: five fresh submits within 3% on a GPU, 1.25x on CPU).
#
#   bash bench/repro_arms.sh OUT_DIR ROUNDS NAME=CONFIG.yaml [NAME=CONFIG.yaml ...]
#        [env: PROBLEM=level2/62 SUBMISSION=path DEVICE=cuda]
#
# Each submit is a fresh `run_eval.py submit --no-server` (its own reference and candidate processes); the first,
# untimed, builds into the cache. Writes OUT_DIR/submit-NAME-i.json (the record), timing-NAME-i.json (every timed
# block, docs/timing.md) and summary.txt: per submit speedup, both medians, the timing method, the host's median
# enqueue time per call (launch_ms) and each side's synchronize gap and own round trip a span; per arm the speedups and their spread (max / min - 1).
set -u
OUT=$1; ROUNDS=$2; shift 2
PROBLEM=${PROBLEM:-level2/62}
SUBMISSION=${SUBMISSION:-submissions/examples/level2/62_Matmul_GroupNorm_LeakyReLU_Sum/fused_cuda.py}
DEVICE=${DEVICE:-cuda}
cd "$(dirname "$0")/.."; mkdir -p "$OUT"
submit() {   # config, record file
  timeout 300 python run_eval.py --results-dir "$OUT/results" submit --no-server --json --device "$DEVICE" \
    --problem "$PROBLEM" --submission "$SUBMISSION" --config "$1" > "$2" 2> "${2%.json}.err"
}
submit "${1#*=}" "$OUT/build.json"
for i in $(seq "$ROUNDS"); do
  for arm in "$@"; do
    name=${arm%%=*}
    submit "${arm#*=}" "$OUT/submit-$name-$i.json"
    python3 -c "import json,shutil,sys;from pathlib import Path;r=json.loads(Path(sys.argv[1]).read_text());shutil.copy(Path(r['log_path']).with_name('timing.json'),sys.argv[2])" \
      "$OUT/submit-$name-$i.json" "$OUT/timing-$name-$i.json" 2>/dev/null
  done
done
python3 - "$OUT" "$ROUNDS" "$@" > "$OUT/summary.txt" <<'PY'
import json, statistics, sys
from pathlib import Path
out, rounds, arms = Path(sys.argv[1]), int(sys.argv[2]), [a.split("=", 1)[0] for a in sys.argv[3:]]
for arm in arms:
    speed = []
    for i in range(1, rounds + 1):
        try:
            r = json.loads((out / f"submit-{arm}-{i}.json").read_text())
        except (OSError, ValueError) as exc:
            print(f"{arm}{i}: no record ({exc})")
            continue
        if r.get("speedup") is None:
            print(f"{arm}{i}: {r.get('status')} {r.get('error')}")
            continue
        speed.append(r["speedup"])
        launch = ""
        timing = out / f"timing-{arm}-{i}.json"
        if timing.exists():
            sides = json.loads(timing.read_text())["sides"]
            launch = " launch/call " + " ".join(
                f"{s} {statistics.median(b.get('launch_ms', 0) / (b['calls'] + 1) for b in d['blocks']):.3f} ms"
                for s, d in sides.items())
            us = lambda ms: "-" if ms is None else f"{ms * 1e3:.1f}"  # noqa: E731
            launch += " gap/own us " + " ".join(f"{s} {us(d.get('synced_gap_ms'))}/{us(d.get('null_gap_ms'))}"
                                                 for s, d in sides.items())
        print(f"{arm}{i} {r['status']} speedup {r['speedup']:.4f} cand {r['runtime_ms']:.4f} ref "
              f"{r['ref_runtime_ms']:.4f} method '{r.get('timing_method')}'{launch}")
    if speed:
        print(f"{arm}: " + " ".join(f"{x:.4f}" for x in speed) + f"  spread {max(speed) / min(speed) - 1:.1%}")
PY
cat "$OUT/summary.txt"
