"""Confinement per kind of child: candidates sandboxed and capped, builds without a GPU, references unconfined."""
import os

from conftest import judge_config

from harness.isolation import policy
from harness.shared.settings import SandboxSettings


def sandbox(**overrides) -> SandboxSettings:
    """The sandbox settings of the tests' config with `overrides`."""
    return SandboxSettings.from_config(judge_config(**overrides))


def test_candidates_and_builds_are_sandboxed_to_their_folder(tmp_path):
    settings = sandbox(max_host_memory_gb=2.0, max_log_bytes=1000)
    evaluation = policy.for_candidate(settings, tmp_path, {"CUDA_VISIBLE_DEVICES": "1"})
    build = policy.for_build(settings, tmp_path, "9.0", nice=10)
    for confinement in (evaluation, build):
        assert confinement.policy.writable == (str(tmp_path),) and confinement.policy.block_network
        assert confinement.max_rss_bytes == 2 * 2**30 and confinement.max_log_bytes == 1000
    assert evaluation.env == {"CUDA_VISIBLE_DEVICES": "1"}
    assert build.env == {"CUDA_VISIBLE_DEVICES": "", "TORCH_CUDA_ARCH_LIST": "9.0"} and build.nice == 10
    assert evaluation.policy.limits.cpu_s >= settings.compile_timeout_s + 3 * settings.run_timeout_s


def test_references_run_unconfined_but_with_the_log_cap():
    trusted = policy.for_trusted(sandbox(max_log_bytes=1234), {"CUDA_VISIBLE_DEVICES": "0"})
    assert trusted.policy is None and trusted.max_rss_bytes is None and trusted.max_log_bytes == 1234
    assert trusted.options()["env"] == {"CUDA_VISIBLE_DEVICES": "0"}


def test_children_see_only_allowlisted_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("JUDGE_TEST_SECRET", "s3cr3t")
    monkeypatch.setenv("CUDNN_LOGINFO_DBG", "1")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    env = policy.child_environment(tmp_path, {"EXTRA": "x"})
    assert "JUDGE_TEST_SECRET" not in env and env["CUDNN_LOGINFO_DBG"] == "1" and env["EXTRA"] == "x"
    assert env["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"   # both sides' allocator alike
    assert env["HOME"] == env["TMPDIR"] == str(tmp_path)


def test_both_sides_of_a_cpu_timing_share_one_core_and_nothing_else_is_pinned(tmp_path):
    settings = sandbox()
    core = max(os.sched_getaffinity(0))
    assert policy.for_candidate(settings, tmp_path, {}, "cpu").cpus == (core,)
    assert policy.for_trusted(settings, {}, "cpu").cpus == (core,)
    assert policy.for_candidate(settings, tmp_path, {}, "cuda").cpus is None
    assert policy.for_trusted(settings, {}, "cuda").cpus is None and policy.for_trusted(settings).cpus is None
    assert policy.for_build(settings, tmp_path, None).cpus is None   # builds use every core
