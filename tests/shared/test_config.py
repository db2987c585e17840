import pytest

from harness.shared.config import Config, ConfigError, PrecisionTolerance, load_config


def test_defaults_match_the_issue():
    config = load_config()
    assert (config.trials, config.atol, config.rtol, config.allow_tf32, config.check_grad) == (5, None, None, False,
                                                                                                True)


def test_precedence_cli_over_yaml_over_defaults(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("trials: 3\ncheck_grad: false\n")
    config = load_config(path, {"trials": 7, "check_grad": None})
    assert config.trials == 7           # CLI wins
    assert config.check_grad is False   # YAML's false is kept, not replaced by the default
    assert config.seed == Config().seed


def test_unknown_key_names_file_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("trails: 3\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml.*'trails'"):
        load_config(path)


def test_wrong_type_names_file_and_key(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("check_grad: 'yes'\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: key 'check_grad' must be bool"):
        load_config(path)


@pytest.mark.parametrize("text, key", [("trials: 0\n", "trials"), ("device: tpu\n", "device"),
                                       ("atol: -1\n", "atol"), ("- a\n", "top level")])
def test_invalid_values(tmp_path, text, key):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=key):
        load_config(path)


def test_missing_file():
    with pytest.raises(ConfigError, match="not found"):
        load_config("/nonexistent/config.yaml")


def test_hash_changes_with_verdict_settings():
    assert load_config(None, {"atol": 1e-2}).hash() != load_config().hash()


def test_precision_defaults_to_fp32_and_must_be_known(tmp_path):
    assert load_config().precision == "fp32" and load_config(None, {"precision": "bf16"}).precision == "bf16"
    path = tmp_path / "bad.yaml"
    path.write_text("precision: fp8\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: key 'precision' must be fp32 \| fp16 \| bf16"):
        load_config(path)


def test_tolerances_set_for_one_precision_keep_every_other_default(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("tolerances:\n  bf16: {atol: 2.0e-2}\n")
    table = dict(load_config(path).tolerances)
    assert table["bf16"] == PrecisionTolerance(atol=2e-2, rtol=1e-2, grad_atol=1e-2, grad_rtol=1e-2)
    assert table["fp32"] == PrecisionTolerance(atol=1e-4, rtol=1e-4, grad_atol=1e-3, grad_rtol=1e-3)
    assert table["fp16"] == dict(Config().tolerances)["fp16"]


@pytest.mark.parametrize("text, message", [
    ("tolerances: 1.0e-2\n", r"key 'tolerances' must map precisions"),
    ("tolerances: {fp8: {atol: 1.0e-2}}\n", r"key 'tolerances': unknown precision 'fp8'"),
    ("tolerances: {bf16: {atoll: 1.0e-2}}\n", r"unknown key 'tolerances.bf16.atoll'"),
    ("tolerances: {bf16: {atol: -1.0}}\n", r"key 'tolerances.bf16.atol' must be a number >= 0"),
    ("tolerances: {bf16: {atol: 1e-2}}\n", r"YAML reads 1e-2 as text: write 1.0e-2"),
])
def test_bad_tolerances_name_the_file_and_the_key(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"bad\.yaml: .*{message}"):
        load_config(path)


def test_precision_keys_at_their_defaults_keep_the_hash_of_existing_records(tmp_path):
    # The hash records judged with configs/default.yaml carry. Keys added with a default that keeps verdicts (the
    # precision and drift keys) leave it as it is; a change that alters verdicts or the timing method changes it, so
    # that older records are not reused (it was c6329406e00a, 47188d21ac53, 6193080bc029, 969cfddc252f,
    # 262ff994b897 and f253e50f2982 before such changes; the last, `run_timeout_s` 180: a candidate whose checks take
    # longer is a timeout now).
    assert load_config().hash() == "4cf815972092"
    stated = tmp_path / "stated.yaml"   # the defaults written out: the same config
    stated.write_text("precision: fp32\ntolerances: {fp32: {atol: 1.0e-4, grad_rtol: 1.0e-3}}\n")
    assert load_config(stated).hash() == Config().hash() == load_config().hash()
    assert load_config(None, {"precision": "bf16"}).hash() != load_config().hash()
    assert load_config(None, {"tolerances": {"bf16": {"atol": 0.05}}}).hash() != load_config().hash()
