"""The narrow settings the timing, integrity, isolation and pipeline parts take: each field is its config key's
value."""
import dataclasses

import pytest

from harness.shared.config import Config, load_config
from harness.shared.rule import Rule
from harness.shared.settings import IntegritySettings, PipelineSettings, SandboxSettings, TimingSettings

# Every key the settings read, set away from its default, so a field read from the wrong key (or left at a
# default) shows.
NOT_DEFAULT = {"warmup_ms": 7.0, "block_ms": 3.0, "min_blocks": 9, "target_ci": 0.05, "timing_cap_s": 1.5,
               "max_block_reps": 77, "l2_flush": False, "timing": "events-sync", "timer_host_ahead": False,
               "cuda_graph": True, "timing_placements": 3, "ref_timing": "sequential", "spot_checks": 5,
               "ref_drift_margin": 0.25, "ref_drift_margin_cpu": 0.75, "ref_drift_retries": 4,
               "profile": "mine", "forbid": ["no_custom_kernel"], "check_grad": False, "grad_failure_fails": True,
               "grad_mismatch_fails": False, "atol": 0.02, "rtol": 0.03,
               "compile_timeout_s": 11.0, "run_timeout_s": 13.0, "max_host_memory_gb": 2.5, "max_log_bytes": 999,
               "device": "cpu", "gpus": "0,2", "build_jobs": 5, "oracles_per_gpu": 7, "oracle_timeout_s": 120.0,
               "build_cache_dir": "/somewhere/builds", "backend": "triton"}


@pytest.fixture(scope="module")
def config() -> Config:
    config = load_config(None, NOT_DEFAULT)
    defaults = Config()
    assert all(getattr(config, key) != getattr(defaults, key) for key in NOT_DEFAULT)
    return config


@pytest.mark.parametrize("settings", [TimingSettings, IntegritySettings, SandboxSettings, PipelineSettings])
def test_every_field_but_the_rule_is_the_config_key_of_its_name(settings, config):
    derived = settings.from_config(config)
    # the method's sync and the pipeline's hash and Config: below
    fields = {f.name for f in dataclasses.fields(settings)} - {"rule", "timer_sync", "config_hash", "judge_config"}
    assert fields <= set(NOT_DEFAULT)
    assert {name: getattr(derived, name) for name in fields} == {name: getattr(config, name) for name in fields}
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(derived, next(iter(fields)), None)


def test_the_timing_rule_is_built_from_the_config_s_timing_keys(config):
    assert TimingSettings.from_config(config).rule == Rule(warmup_ms=7.0, block_ms=3.0, min_blocks=9, target_ci=0.05,
                                                           cap_s=1.5, max_block_reps=77)
    assert TimingSettings.from_config(Config()).rule == Rule()   # the rule's defaults are the config's


def test_the_sandbox_settings_hold_what_policy_reads(config):
    assert SandboxSettings.from_config(config) == SandboxSettings(compile_timeout_s=11.0, run_timeout_s=13.0,
                                                                  max_host_memory_gb=2.5, max_log_bytes=999)


def test_a_profile_s_inputs_load_by_name():
    strict, default = IntegritySettings.load("strict"), IntegritySettings.load("default")
    assert strict.profile == "strict" and default.profile == "default"
    assert strict.grad_failure_fails and not default.grad_failure_fails
    assert IntegritySettings.from_config(load_config(None, {"forbid": ["no_custom_kernel"]})).forbid == \
        ("no_custom_kernel",)



def test_the_timing_method_decides_the_sync_the_graph_and_the_head_start():
    for method, sync in (("events", "checked"), ("events-sync", "device"), ("kernelbench", "kernelbench")):
        assert TimingSettings.from_config(load_config(None, {"timing": method})).timer_sync == sync
    graph = TimingSettings.from_config(load_config(None, {"timing": "cuda-graph"}))
    assert graph.cuda_graph and graph.timer_sync == "checked" and graph.timer_host_ahead
    assert not TimingSettings.from_config(load_config(None, {"timing": "kernelbench"})).timer_host_ahead


def test_the_pipeline_settings_carry_the_config_s_hash_and_the_config_itself(config):
    settings = PipelineSettings.from_config(config)
    assert settings.config_hash == config.hash() != Config().hash()   # the resume key's part
    assert settings.judge_config is config                             # handed on to the judging layer as it is
    assert "judge_config" not in repr(settings) and "oracles_per_gpu=7" in repr(settings)
