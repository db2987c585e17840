"""A reward for reinforcement learning on kernel writing, built on the judge's Python API (harness/api.py).

    reward = 0                                  no usable code: too_large, no_code, syntax_error, needs_cuda,
                                                compile_error, load_error
             0                                  rule_violation: it passed by gaming the measurement or the rules
             WRONG (0.1)                        it ran, but wrong or broken: incorrect, shape/dtype mismatch,
                                                runtime_error, timeout, crash, ... (compiling is worth something)
             CORRECT (1) + SPEEDUP_WEIGHT (0.5) * clip(log2(speedup), -1, 2)
                                                pass: 0.5 at half the reference's speed, 1 at par, 2 at 4x or
                                                faster (the cap keeps a lucky timing from dominating a batch);
                                                1 when the config does not time (time_candidates: false)

Which statuses exist, and whether a wrong gradient fails, is the config's business: under `default` a wrong
backward still passes (grad_correct false); under `grad-required` or `strict` it does not.

Run it on the bundled CPU examples (the level0 C++ kernels: three right, three with planted defects, two more),
plus two raw model replies (one without code, one with the code inside prose and a <think> block):

    .venv/bin/python examples/rl_reward.py                  # --device cpu --config default
    .venv/bin/python examples/rl_reward.py --calls 3        # and time 3 warm calls of each afterwards

The first run compiles eight extensions (a few minutes on 2 cores; cached in build-cache/ for later runs).
"""
from __future__ import annotations

import argparse
import math
import statistics
import time
from pathlib import Path

from harness import Judge
from harness.shared.record import NOT_RUN, Record, Status

CORRECT = 1.0           # a pass, at the reference's speed
WRONG = 0.1             # ran and was wrong: more than no code at all, far less than right
SPEEDUP_WEIGHT = 0.5    # reward per doubling of speed ...
LOG2_SPEEDUP_RANGE = (-1.0, 2.0)   # ... counted from half as fast up to 4x as fast

EXAMPLES = Path(__file__).resolve().parent.parent / "submissions" / "examples" / "level0"


def reward(record: Record) -> float:
    """The reward of one judged submission (a pure function of its record)."""
    if record.status in NOT_RUN or record.status == Status.RULE_VIOLATION:
        return 0.0
    if record.status != Status.PASS:
        return WRONG
    if record.speedup is None or record.speedup <= 0:
        return CORRECT
    low, high = LOG2_SPEEDUP_RANGE
    return CORRECT + SPEEDUP_WEIGHT * min(max(math.log2(record.speedup), low), high)


def bundled_items() -> list[tuple[str, object, str]]:
    """(problem, submission, name) for every level0 example, and two raw replies to level0/1."""
    items = []
    for path in sorted(EXAMPLES.glob("*/*.py")):
        problem = f"level0/{path.parent.name.split('_')[0]}"
        items.append((problem, path, f"{problem} {path.name}"))
    relu = (EXAMPLES / "1_Tiny_ReLU" / "correct_cpp.py").read_text()
    items.append(("level0/1", "I would fuse this, but the answer is left as an exercise.", "level0/1 reply, no code"))
    items.append(("level0/1", f"<think>ReLU is one pass.</think>\nMy kernel:\n\n```python\n{relu}```\n",
                  "level0/1 reply with code"))
    return items


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--config", default="default", help="a name in configs/ or a YAML path")
    parser.add_argument("--calls", type=int, default=0, help="then time this many warm calls of each (default 0)")
    args = parser.parse_args()
    items = bundled_items()
    names = [name for _, _, name in items]
    with Judge(device=args.device, config=args.config) as judge:
        began = time.monotonic()
        print(f"{'submission':34} {'status':15} {'speedup':>8} {'reward':>6}")
        # The sample_id given is each item's position, so that records (which finish in any order) are matched.
        for record in judge.evaluate_many([(problem, submission, str(i)) for i, (problem, submission, _)
                                           in enumerate(items)]):
            speedup = f"{record.speedup:.2f}x" if record.speedup is not None else "-"
            print(f"{names[int(record.sample_id)]:34} {record.status.value:15} {speedup:>8} {reward(record):6.2f}")
        print(f"{len(items)} judged in {time.monotonic() - began:.1f} s; builds {judge.builds}")
        if args.calls:
            warm_latency(judge, items, args.calls)


def warm_latency(judge: Judge, items: list, calls: int) -> None:
    """Seconds per `evaluate` once the builds are cached, by outcome: each item `calls` times in a row, problem by
    problem, so that a call finds its problem's reference running (a worker keeps `oracles_per_gpu` of them; the
    first call of a problem whose reference was closed to make room starts it again, hence the max)."""
    seconds: dict[str, list[float]] = {}
    for problem, submission, _ in sorted(items, key=lambda item: item[0]):
        for _ in range(calls):
            began = time.monotonic()
            record = judge.evaluate(problem, submission)
            kind = "pass" if record.status == Status.PASS else "no code" if record.status in NOT_RUN else "wrong"
            seconds.setdefault(kind, []).append(time.monotonic() - began)
    for kind, values in sorted(seconds.items()):
        print(f"warm calls, {kind}: {len(values)} calls, median {statistics.median(values):.3f} s, "
              f"max {max(values):.3f} s")


if __name__ == "__main__":
    main()
