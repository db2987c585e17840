"""`run_eval.py serve` and `submit` through it (harness/serve.py) on the CPU device: the served record is the one
a submit without a server writes, the reference starts once for several submits, another config is judged by the
submit itself, and a process that looks like a sandboxed child is refused.

One server (a real `run_eval.py serve` process) serves the module; the submission is tests/fixtures/cheap_relu.py
(a load_inline build of about a second)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import FIXTURES, REPO, TEST_SETTINGS

from harness import serve
from harness.shared.record import read_records

SUBMISSION = FIXTURES / "cheap_relu.py"
PROBLEM = "level0/1"


def _cli(*args: str, results: Path, config: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "run_eval.py"), "--results-dir", str(results), *args,
                           "--config", str(config), "--device", "cpu"], capture_output=True, text=True, cwd=REPO,
                          timeout=300)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("serve")
    results, config = folder / "results", folder / "config.yaml"
    config.write_text(yaml.safe_dump(TEST_SETTINGS))
    process = subprocess.Popen([sys.executable, str(REPO / "run_eval.py"), "--results-dir", str(results), "serve",
                                "--config", str(config), "--device", "cpu"], cwd=REPO, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    path = serve.socket_path(results)
    deadline = time.monotonic() + 120
    while not path.exists():
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.2)
    yield process, results, config
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=60) == 0
    assert not path.exists()   # the socket goes with the server


def test_submits_are_judged_by_the_server_with_one_reference_start(server):
    process, results, config = server
    replies = [_cli("submit", "--problem", PROBLEM, "--submission", str(SUBMISSION), "--json", results=results,
                    config=config) for _ in range(2)]
    for reply in replies:
        assert reply.returncode == 0, reply.stderr
        assert "judging here" not in reply.stderr
    first, second = (json.loads(reply.stdout) for reply in replies)
    assert first["status"] == second["status"] == "pass" and first["run"] == "submit"
    # the first call started the reference (or claimed its start); the second found it running
    assert first["phases"]["reference_start"] > 0 and second["phases"].get("reference_start", 0) == 0
    assert "ref_process" in first["phases"] and "ref_process" not in second["phases"]
    # written where a submit without a server writes: records.jsonl (by the server) and results.csv (by submit)
    written = read_records(results / "submit" / "records.jsonl")
    assert [r.submission_hash for r in written][-2:] == [first["submission_hash"]] * 2
    assert (results / "submit" / "results.csv").read_text().count("\n") == 2   # the header and this record
    assert Path(first["log_path"]).is_file()


def test_another_config_is_judged_by_the_submit_itself(server):
    _, results, config = server
    other = config.parent / "other.yaml"
    other.write_text(yaml.safe_dump({**TEST_SETTINGS, "trials": 2}))
    reply = _cli("submit", "--problem", PROBLEM, "--submission", str(SUBMISSION), "--json", "--run", "elsewhere",
                 results=results, config=other)
    assert reply.returncode == 0, reply.stderr
    assert "did not take this submit" in reply.stderr and "judging here" in reply.stderr
    record = json.loads(reply.stdout)
    assert record["status"] == "pass" and record["phases"]["reference_start"] > 0


def test_a_process_with_no_new_privs_is_refused(server):
    """no_new_privs is what the sandbox's Landlock layer sets on every candidate: such a process may not ask."""
    _, results, _ = server
    code = ("import ctypes, json, sys; from pathlib import Path; from harness import serve; "
            "assert ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0) == 0; "
            "print(json.dumps(serve.ask(Path(sys.argv[1]), {'problem': '/x.py', 'submission': '/y.py'})))")
    done = subprocess.run([sys.executable, "-c", code, str(results)], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    reply = json.loads(done.stdout)
    assert "no_new_privs" in reply["refused"]


def test_no_server_means_no_reply(tmp_path):
    assert serve.ask(tmp_path / "nobody-serves-this", {}) is None
    stale = serve.socket_path(tmp_path)
    stale.touch()   # a file where a killed server's socket was: not answered, not an error
    try:
        assert serve.ask(tmp_path, {}) is None
    finally:
        os.unlink(stale)
