"""Hostile fixtures: every attack on the judge ends in its exact status with its findings, and the harness and
the other records come through unharmed (tests/fixtures/integrity on CPU, tests/fixtures/gpu_integrity on CUDA)."""
from __future__ import annotations

import errno
import json
import os
import re
import tempfile
import threading
from pathlib import Path
from typing import Optional

import pytest
from conftest import (
    FIXTURES,
    REPO,
    TEST_SETTINGS,
    copy_fixtures,
    expected_flags,
    expected_status,
    header,
    judge_config,
    pipeline_settings,
)

from harness.integrity.profiles import load_profile, status_under
from harness.isolation import policy, sandbox
from harness.judge import warm
from harness.pipeline.batch import run_batch
from harness.shared.problems import resolve_problem
from harness.shared.record import Status, read_records
from harness.shared.settings import SandboxSettings
from harness.submission.submissions import discover

CPU_FIXTURES = FIXTURES / "integrity"
GPU_FIXTURES = FIXTURES / "gpu_integrity"
SECRET = "s3cr3t-planted-by-the-test"
SLEEPER = "731.25"   # the duration 23_fork_native.py gives its detached sleep processes
BOMB_SLEEPER, ESCAPEE = "734.25", "735.75"   # 38_fork_bomb.py's and 39_escape_every_tie.py's
TARGETS_FILE = Path("/tmp/judge-hostile-targets.json")   # where 40_write_judge_files.py learns the judge's paths
SENTINEL = "the judge's own file\n"
# Small limits so the memory and flood fixtures are cheap (a CUDA process alone holds more than 1 GB, so GPU runs
# keep the default memory limit); no gradients (the raw-pointer kernels have none). 2 GB: an honest candidate for
# level0/5 (4M floats) peaks near 0.7 GB and the content-cache fixture near 0.9 GB on CPU; fixture 24 hoards 3 GB.
SETTINGS = {"check_grad": False, "max_log_bytes": 1_000_000, "max_host_memory_gb": 2.0, "run_timeout_s": 30.0}
# The saboteur pair (level0/5, ~30 ms calls on CPU) compares two speedups: with the suite's 0.2 s timing cap each
# median came from 2-3 calls and twin and saboteur read up to 19% apart with nothing inflated (both references
# within 5% of their clean time); at least ten blocks each.
SETTLED_TIMING = {"level0/5": {"timing_cap_s": 2.0, "min_blocks": 10}}


def _judge_all(source: Path, root: Path, device: str, default_problem: str) -> dict:
    """Every fixture, in one batch per distinct settings (named by its first problem's folder): problems judged
    alike share a batch, so that one problem's build (33_gemm_mean_gemv's torch/extension.h, ~20 s on 2 cores) runs
    beside another's evaluations instead of after them."""
    batches: dict[tuple, tuple[Path, list]] = {}
    for problem, folder in copy_fixtures(source, root / "fixtures", default_problem).items():
        submissions, skipped = discover(folder, resolve_problem(problem), REPO / "problems", run="integrity")
        assert not skipped, skipped
        settings = dict(SETTINGS, max_host_memory_gb=SETTINGS["max_host_memory_gb"] if device == "cpu" else 48.0,
                        **SETTLED_TIMING.get(problem, {}))
        batches.setdefault(tuple(sorted(settings.items())), (root / "runs" / folder.name, []))[1].extend(submissions)
    records = {}
    for settings, (run_dir, submissions) in batches.items():
        outcome = run_batch(submissions, pipeline_settings(device=device, **dict(settings)), run_dir)
        records.update({Path(r.submission).name: r for r in outcome.records})
    return records


def _judges_files(root: Path) -> dict[Path, Optional[str]]:
    """Files of the judge's that fixture 40 attacks (path -> the content it must keep; None: must not appear):
    a sentinel in the build cache and in the results folder, a cache entry and a record file of their own making."""
    cache, results = Path(TEST_SETTINGS["build_cache_dir"]), root / "runs"
    results.mkdir(parents=True, exist_ok=True)
    files = {cache / "sentinel.txt": SENTINEL, results / "sentinel.txt": SENTINEL,
             cache / "forged-by-submission.so": None, results / "level0_1" / "forged-by-submission.jsonl": None}
    for path, content in files.items():
        if content is not None:
            path.write_text(content)
    return files


@pytest.fixture(scope="module")
def cpu_records(tmp_path_factory):
    root = tmp_path_factory.mktemp("integrity")
    judges = _judges_files(root)
    # the batch's own record file too: fixture 40 appends a forged record to it while the batch writes it
    targets = [*map(str, judges), str(root / "runs" / "level0_1" / "records.jsonl")]
    TARGETS_FILE.write_text(json.dumps(targets))
    TARGETS_FILE.chmod(0o644)
    os.environ["JUDGE_TEST_SECRET"] = SECRET
    try:
        records = _judge_all(CPU_FIXTURES, root, "cpu", "level0/1")
    finally:
        del os.environ["JUDGE_TEST_SECRET"]
        TARGETS_FILE.unlink(missing_ok=True)
    return records, root, judges


def _assert_fixture(path: Path, record) -> None:
    allowed = expected_status(path).split("|")
    assert record.status.value in allowed, (path.name, record.status, record.error, record.flag_evidence)
    missing = expected_flags(path) - set(record.flags or ())
    assert not missing, (path.name, missing, record.flag_evidence)
    for profile in ("strict", "fusion"):
        wanted = header(path, profile)
        if wanted:
            assert status_under(record, load_profile(profile)).value == wanted, (path.name, profile)


@pytest.mark.parametrize("name", sorted(p.name for p in CPU_FIXTURES.glob("*.py")))
def test_cpu_attack_ends_in_its_status(cpu_records, name):
    _assert_fixture(CPU_FIXTURES / name, cpu_records[0][name])


def test_harness_unharmed_by_cpu_attacks(cpu_records):
    cpu_records, root, judges = cpu_records
    assert sorted(cpu_records) == sorted(p.name for p in CPU_FIXTURES.glob("*.py"))
    # attack 26: nothing was written outside the candidate's temp dir
    for forged in (REPO / "results" / "forged-by-submission.jsonl", REPO / "harness" / "forged_by_submission.py",
                   REPO / "problems" / "forged_by_submission.py",
                   Path(os.path.expanduser("~")) / "forged_by_submission.txt"):
        assert not forged.exists(), forged
    # attack 23b, 38, 39: the detached native processes, the fork bomb's and the one that escaped every tie but its
    # user (and its cgroup) were found and killed
    for sleeper in (SLEEPER, BOMB_SLEEPER, ESCAPEE):
        alive = [pid for pid in os.listdir("/proc") if pid.isdigit() and sleeper in _cmdline(pid)]
        assert not alive, (sleeper, alive)
    # attack 40: the judge's files in the build cache and the results folder are as they were, nothing was added,
    # and no record file carries the forged record
    for path, content in judges.items():
        assert (path.read_text() if path.exists() else None) == content, path
    for records_file in (root / "runs").rglob("records.jsonl"):
        assert '"forged_by"' not in records_file.read_text(), records_file
    writes = Path(cpu_records["40_write_judge_files.py"].log_path).read_text()
    assert writes.count("native write to ") == len(judges) + 1, writes[-2000:]
    assert not re.search(r"errno 0$", writes, re.MULTILINE), writes[-2000:]
    # attack 27: the planted secret never reached the candidate (its printout of the environment is in its log)
    env_log = Path(cpu_records["27_env_secrets.py"].log_path).read_text()
    assert "environment seen by the submission" in env_log and SECRET not in env_log
    # attack 30: the flood was cut to the configured size; the record says so
    flood_log = Path(cpu_records["30_flood.py"].log_path)
    assert flood_log.stat().st_size < SETTINGS["max_log_bytes"] + 4096
    # attack 18: forged events changed nothing else; every record file still parses
    for record in cpu_records.values():
        run_dir = Path(record.log_path).parents[3] if record.log_path else None
        if run_dir is not None:
            assert read_records(run_dir / "records.jsonl")


def test_a_fork_bomb_is_capped_by_the_candidates_own_user(cpu_records):
    # attack 38: where the candidate runs as a user of its own, RLIMIT_NPROC refuses its processes beyond the
    # sandbox's allowance (the cgroup's pids.max, where there is one, lies far above it); elsewhere the record
    # says which user it ran as and why
    bomb = cpu_records[0]["38_fork_bomb.py"]
    started, most, refused = map(int, re.search(r"fork bomb: (\d+) of (\d+) started, refused with errno (\d+)",
                                                Path(bomb.log_path).read_text()).groups())
    unavailable = sandbox.user_unavailable()
    if unavailable is not None:
        assert f"ran as the judge's user ({unavailable})" in bomb.isolation, bomb.isolation
        return
    assert "ran as uid " in bomb.isolation, bomb.isolation
    allowance = policy.submission_limits(SandboxSettings.from_config(judge_config())).extra_processes
    assert refused == errno.EAGAIN and 0 < started <= allowance < most, (started, refused)


FEED_ATTACK = "51_write_the_feed.py"
HONEST_RELU = """import torch.nn as nn

from tests.fixtures import fastkernel

ext = fastkernel.build()


class ModelNew(nn.Module):
    def forward(self, x):
        return fastkernel.relu(ext, x)
"""


def test_a_candidate_cannot_change_the_feed_that_the_next_candidate_of_its_problem_gets(monkeypatch):
    # attack 51 and an honest candidate after it, against one reference (a judge keeps it between calls); meanwhile
    # the temporary folder, where the reference's and each candidate's folders are, is watched for a feed or truth file.
    # That folder is made in the session's temporary root, which a candidate under a uid of its own can pass through
    # (pytest's tmp_path sits under a folder of mode 0700)
    from harness import Judge

    tmp_path = Path(tempfile.mkdtemp(prefix="feed-attack-"))
    os.chmod(tmp_path, 0o711)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.02):
            for folder, _, names in os.walk(tmp_path):   # folders removed meanwhile are skipped
                seen.update(f"{folder}/{name}" for name in {"feed.pt", "truth.pt"} & set(names))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        # one candidate process started ahead, for the attack (a kept judge's default of two would start one more
        # that no call here takes: the honest one starts on demand)
        with Judge(device="cpu", config="default", overrides={**TEST_SETTINGS, **SETTINGS, "warm_candidates": 1},
                   results_dir=tmp_path / "results") as judge:
            attack = judge.evaluate("level0/1", (CPU_FIXTURES / FEED_ATTACK).read_text())
            # the attack ran in a process started ahead (its feed lent with its submission); the next one starts on
            # demand (its feed lent at its start): both ways a candidate is handed the feed
            monkeypatch.setattr(warm, "pool_for", lambda config, device, env: None)
            honest = judge.evaluate("level0/1", HONEST_RELU)
    finally:
        done.set()
        watcher.join()
    assert not seen, seen
    _assert_fixture(CPU_FIXTURES / FEED_ATTACK, attack)
    assert honest.status == Status.PASS, (honest.status, honest.error)   # the oracle's inputs, unchanged
    assert "ref_process" in attack.phases and "ref_process" not in honest.phases   # the same reference
    assert "started_ahead_wait" in attack.phases and "started_ahead_wait" not in honest.phases
    log = Path(attack.log_path).read_text()
    assert "feed fds: 1; truth fds: 0" in log and "judge files in its folder: []" in log, log[-3000:]
    attempts = dict(re.findall(r"^feed attack (.+)=(\d+)$", log, re.MULTILINE))
    attempts.pop("reopen read-write")   # allowed or not (Landlock, the file's mode): no write by itself
    assert len(attempts) >= 7 and all(errno_ != "0" for errno_ in attempts.values()), attempts


def test_rotation_and_spot_checks_catch_replays(cpu_records):
    cpu_records = cpu_records[0]
    replay = cpu_records["17_warmup_detect.py"]
    assert replay.check_status == Status.INCORRECT and "during timing" in replay.error
    cached = cpu_records["14_content_cache.py"]
    assert cached.correct is True and cached.fresh_runtime_ms > 3 * cached.runtime_ms


def test_native_saboteurs_do_not_inflate_the_speedup(cpu_records):
    cpu_records = cpu_records[0]
    # attack 31/32: threads and a forked helper that burn the CPU while the candidate's forward is idle; the
    # candidate is stopped while its reference is timed, so its speedup stays near its honest twin's
    twin = cpu_records["31_native_saboteur_twin.py"]
    assert twin.status == Status.PASS and twin.ref_clean_ms is not None and twin.speedup is not None
    for name in ("31_native_saboteur.py", "32_saboteur_escapes.py"):
        record = cpu_records[name]
        assert record.isolation and "stopped while its reference was timed" in record.isolation, record.isolation
        if record.check_status == Status.TIMING_INTERFERENCE:
            assert "alone again" in record.error
            continue
        assert record.check_status == Status.PASS, (name, record.check_status, record.error)
        # Not inflated: its speedup (paired blocks, so a load that moves both sides cancels) is no higher than its
        # twin's. Lower is possible: the threads also take CPU from the candidate's own calls. Absolute times of two
        # evaluations are not compared: on a loaded 2-core machine they differ by more than the attack could add.
        assert record.speedup <= 1.15 * twin.speedup, (
            f"{name}: speedup {record.speedup:.4g} (its reference {record.ref_runtime_ms} ms, clean "
            f"{record.ref_clean_ms} ms, drift {record.ref_drift}, {record.ref_source}; itself {record.runtime_ms} ms) "
            f"vs the twin's {twin.speedup:.4g} (reference {twin.ref_runtime_ms} ms, itself {twin.runtime_ms} ms)")


def _assert_saboteur_near_twin(saboteur, twin) -> None:
    """The CUDA saboteur (issue: timing_interference, or a speedup within 15% of its honest twin's)."""
    print(f"saboteur {saboteur.status.value} {saboteur.speedup} (ref {saboteur.ref_runtime_ms} ms, clean "
          f"{saboteur.ref_clean_ms} ms, hold {saboteur.hold_ms} ms); twin {twin.status.value} {twin.speedup} (ref "
          f"{twin.ref_runtime_ms} ms)")
    assert twin.status == Status.PASS, (twin.status, twin.error)
    if saboteur.status == Status.TIMING_INTERFERENCE:
        return
    assert saboteur.status == Status.PASS, (saboteur.status, saboteur.error)
    assert abs(saboteur.speedup / twin.speedup - 1) <= 0.15, (saboteur.speedup, twin.speedup)


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.gpu
def test_gpu_attacks_end_in_their_status(tmp_path):
    records = _judge_all(GPU_FIXTURES, tmp_path, "cuda", "level0/5")
    for path in sorted(GPU_FIXTURES.glob("*.py")):
        _assert_fixture(path, records[path.name])
    _assert_saboteur_near_twin(records["31_gpu_saboteur.py"], records["31_gpu_saboteur_twin.py"])
    side = records["05_side_stream.py"]
    assert side.own_kernels and side.own_kernels >= 1
