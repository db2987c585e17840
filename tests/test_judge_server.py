"""`run_eval.py serve` and `submit` through it (harness/serve.py) on the CPU device: the served record is the one
a submit without a server writes, the reference starts once for several submits, another config is judged by the
submit itself, and a process that looks like a sandboxed child is refused. The background judge: two first submits
start one, later submits go to it, another config and `--no-server` are judged by the submit itself, `--no-background`
starts none, and it stops after its idle timeout.

One server (a real `run_eval.py serve` process) serves the module; the submission is tests/fixtures/cheap_relu.py
(a load_inline build of about a second)."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from conftest import FIXTURES, REPO, TEST_SETTINGS

from harness import cli, serve
from harness.shared.record import read_records

SUBMISSION = FIXTURES / "cheap_relu.py"
PROBLEM = "level0/1"


def _command(*args: str, results: Path, config: Path) -> list[str]:
    return [sys.executable, str(REPO / "run_eval.py"), "--results-dir", str(results), *args, "--config", str(config),
            "--device", "cpu"]


def _cli(*args: str, results: Path, config: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(_command(*args, results=results, config=config), capture_output=True, text=True, cwd=REPO,
                          timeout=300, env=env)


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


# ---------------------------------------------------------------- the background judge

BACKGROUND = {**os.environ, "KERNEL_JUDGE_BACKGROUND": "1"}   # the test session turns it off (conftest.py)
SERVED_BY = re.compile(r"judged by the background judge, pid (\d+)")


def _alive(pid: int) -> bool:
    """Running (a zombie left unreaped by whoever adopted it has stopped all the same)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_first_submit_starts_a_background_judge_that_serves_later_ones_and_stops_when_idle(tmp_path):
    results, config = tmp_path / "results", tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(TEST_SETTINGS))
    results.mkdir()
    path = serve.socket_path(results)
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)   # a killed server's socket: nobody answers on it
    stale.bind(str(path))
    stale.close()
    idle_s = 15   # the submits below that must still find it come within a few seconds of the one before
    submit = ("submit", "--problem", PROBLEM, "--submission", str(SUBMISSION), "--json", "--idle-timeout", str(idle_s))
    pids: set = set()
    try:
        # two first submits at once: one background judge, which judges both
        firsts = [subprocess.Popen(_command(*submit, results=results, config=config), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, cwd=REPO, env=BACKGROUND) for _ in range(2)]
        outputs = [process.communicate(timeout=300) for process in firsts]
        for process, (_, err) in zip(firsts, outputs):
            assert process.returncode == 0, err
            pids.update(int(pid) for pid in SERVED_BY.findall(err))
        assert len(pids) == 1, [err for _, err in outputs]
        (pid,) = pids
        assert sum("started a background judge" in err for _, err in outputs) == 1
        assert _alive(pid) and f"kill {pid}" in outputs[0][1] and f"{idle_s:g} s without a submit" in outputs[0][1]
        assert {json.loads(out)["status"] for out, _ in outputs} == {"pass"}

        served = _cli(*submit, results=results, config=config, env=BACKGROUND)
        assert served.returncode == 0, served.stderr
        assert SERVED_BY.findall(served.stderr) == [str(pid)] and "started" not in served.stderr
        record = json.loads(served.stdout)
        assert record["status"] == "pass" and record["phases"].get("reference_start", 0) == 0   # it was running
        # the server's log, in the results folder, has a line for each submission it judged
        assert serve.log_path(results).read_text().count(f"{PROBLEM}: pass in") == 3

        other = tmp_path / "other.yaml"
        other.write_text(yaml.safe_dump({**TEST_SETTINGS, "trials": 2}))
        mismatch = _cli(*submit, "--run", "other", results=results, config=other, env=BACKGROUND)
        assert mismatch.returncode == 0, mismatch.stderr
        assert "did not take this submit" in mismatch.stderr and "judging here" in mismatch.stderr
        assert "started a background judge" not in mismatch.stderr and not SERVED_BY.search(mismatch.stderr)
        assert json.loads(mismatch.stdout)["phases"]["reference_start"] > 0   # judged in the submit's process

        here = _cli(*submit, "--no-server", "--run", "here", results=results, config=config, env=BACKGROUND)
        assert here.returncode == 0, here.stderr
        assert "judge" not in here.stderr
        in_process = json.loads(here.stdout)
        assert in_process["phases"]["reference_start"] > 0 and in_process["run"] == "here"
        assert set(in_process) == set(record)   # the served record has every field an in-process one has
        for key in ("status", "problem", "submission_hash", "config_hash", "device", "correct", "grad_correct"):
            assert in_process[key] == record[key], key

        # neither judging above touched it: it stops idle_s after its last submission, and takes its socket along
        deadline = time.monotonic() + idle_s + 60
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _alive(pid)
        assert not path.exists()
        assert "stopping: no submission for" in serve.log_path(results).read_text()
    finally:
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGTERM)


def test_no_background_starts_no_judge(tmp_path):
    results, config = tmp_path / "results", tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(TEST_SETTINGS))
    no_code = FIXTURES / "cpu" / "no_code.md"
    judged = {cli.TEXT_VERDICT_ENV: "0"}   # the judge's path (its text alone would decide it without one)
    for flag, env in (("--no-background", {**BACKGROUND, **judged}), ("--json", {**os.environ, **judged})):
        done = _cli("submit", "--problem", PROBLEM, "--submission", str(no_code), "--json", flag, results=results,
                    config=config, env=env)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["status"] == "no_code"
        assert "judge" not in done.stderr
        assert not serve.socket_path(results).exists() and not serve.log_path(results).exists()


class _IdleJudge:
    """What serve() needs of a Judge when no request comes."""

    def __init__(self):
        self.config = SimpleNamespace()
        self.closed = threading.Event()

    def close(self):
        self.closed.set()


def test_serve_stops_after_its_idle_timeout_and_leaves_another_servers_socket(tmp_path):
    judge = _IdleJudge()
    began = time.monotonic()
    serve.serve(judge, tmp_path, idle_timeout_s=0.5)
    assert 0.5 <= time.monotonic() - began < 10
    assert judge.closed.is_set() and not serve.socket_path(tmp_path).exists()

    def replaced(path: Path) -> None:   # as if a submit had found this server gone and started the next one
        path.unlink()
        path.write_text("the next server's")

    serve.serve(_IdleJudge(), tmp_path, idle_timeout_s=0.5, on_ready=replaced)
    assert serve.socket_path(tmp_path).read_text() == "the next server's"
    serve.socket_path(tmp_path).unlink()


def test_a_probe_gets_no_reply_and_does_not_keep_the_server_up(tmp_path):
    answers = []

    def probe() -> None:
        deadline = time.monotonic() + 10
        while not serve.answering(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.05)
        for _ in range(6):   # until about 1.8 s after the start: counted as activity, they would keep it to 3.8 s
            answers.append(serve.answering(tmp_path))
            time.sleep(0.3)

    prober = threading.Thread(target=probe)
    prober.start()
    judge = _IdleJudge()
    began = time.monotonic()
    serve.serve(judge, tmp_path, idle_timeout_s=2.0)   # in the main thread: it sets signal handlers
    prober.join()
    assert answers == [True] * 6 and judge.closed.is_set()
    assert time.monotonic() - began < 3.5
