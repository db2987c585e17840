"""Print one line per record of the given records.jsonl files (for quick looks on the device machine)."""
import json
import sys

for path in sys.argv[1:]:
    for line in open(path):
        r = json.loads(line)
        print(f"{r['problem']:10} {r['submission'].split('/')[-1][:28]:28} {r['status']:16} grad={r['grad_correct']} "
              f"abs={r['max_abs_error']} ms={r['runtime_ms']} ref={r['ref_runtime_ms']} x={r['speedup']} "
              f"compile_s={r['compile_s']} | {(r['error'] or '')[:100]}")
