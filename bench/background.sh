#!/usr/bin/env bash
# A long bench on the GPU machine, whose calls are limited to minutes: started in the background by one call and
# polled by the next ones, each of which copies what the bench has written so far to $OUT (the machine may be
# given back between two calls, and takes the bench's folder with it).
#
#   bash bench/background.sh start DIR SECS -- COMMAND...   start COMMAND (its output under DIR), then poll
#   bash bench/background.sh poll DIR SECS                  wait until it ends or SECS pass, then copy
#
# A poll on a machine where nothing was started (a fresh one) says so and exits 3 at once, rather than waiting.
# Copied to $OUT: DIR/bench.log, DIR/*.json, and DIR's logs/ and results/*/{records.jsonl,batch.json} as tarballs.
set -u
what=${1:?start or poll}; dir=${2:?DIR}; secs=${3:?SECS}
shift 3
mkdir -p "$dir"
if [ "$what" = start ]; then
  [ "${1:-}" = "--" ] && shift
  [ -f "$dir/bench.log" ] && ! grep -q "^BENCH-DONE" "$dir/bench.log" && { echo "a bench already runs in $dir"; exit 3; }
  setsid nohup bash -c '"$@"; echo "BENCH-DONE rc=$?"' bench "$@" > "$dir/bench.log" 2>&1 < /dev/null &
elif [ ! -f "$dir/bench.log" ]; then
  echo "nothing was started in $dir on this machine (a fresh one?)"; exit 3
fi
end=$((SECONDS + secs))
while [ $SECONDS -lt $end ] && ! grep -q "^BENCH-DONE" "$dir/bench.log"; do sleep 5; done
out=${OUT:-/tmp}
cp "$dir/bench.log" "$dir"/*.json "$out/" 2>/dev/null
[ -d "$dir/logs" ] && tar czf "$out/logs.tgz" -C "$dir" logs
(cd "$dir" && ls results/*/records.jsonl > /dev/null 2>&1 && \
  tar czf "$out/records.tgz" results/*/records.jsonl $(ls results/*/batch.json 2>/dev/null))
tail -30 "$dir/bench.log"
